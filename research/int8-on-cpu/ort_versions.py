"""int8 on two ONNX Runtime versions: the graphs with attention (model.onnx) of a float32
model directory converted by this checkout's export/int8.py at several MatMulNBits
accuracy levels, and by onnxruntime's dynamic quantization (int8 weights per channel),
then each run by every ONNX Runtime given, each in its own process, alternating rounds:
attention's largest difference and embeddings' smallest cosine against float32 at 128
random ids, and the median time at T = 8 / 128 / 512 (two threads).

    .venv/bin/python research/int8-on-cpu/ort_versions.py --model DIR \\
        --ort 1.31=  --ort 1.32=/tmp/ort132     # NAME=a directory put first on the path

(`pip install --target /tmp/ort132 --no-deps onnxruntime==1.32.0` makes the second.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

LENGTHS = (8, 128, 512)
ACCURACY_LEVELS = (4, 1)  # int8 x int8; float32 arithmetic


def convert(model: Path) -> dict[str, Path]:
    """The variants' graphs beside the model's (research_*.onnx)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    import attnserve.export.int8 as int8
    from attnserve.export.weights import WeightsFile

    graphs = {"fp32": model / "model.onnx"}
    for level in ACCURACY_LEVELS:
        int8.ACCURACY_LEVEL = level
        path = model / f"research_nbits_a{level}.onnx"
        if not path.exists():
            with WeightsFile(model / f"research_nbits_a{level}.data") as weights:
                int8.convert_to_int8(model / "model.onnx", path, weights)
        graphs[f"MatMulNBits 8 bits, block 32, accuracy {level}"] = path
    path = model / "research_dynamic.onnx"
    if not path.exists():
        quantize_dynamic(
            model / "model.onnx", path, weight_type=QuantType.QInt8, per_channel=True,
            op_types_to_quantize=["MatMul"], use_external_data_format=True,
            extra_options={"MatMulConstBOnly": True},
        )  # fmt: skip
    graphs["dynamic int8, per channel"] = path
    return graphs


def run(graphs: dict[str, str]) -> dict:
    """In this process's ONNX Runtime: fidelity and timings of each graph."""
    import numpy as np
    import onnxruntime as ort

    def session(path: str) -> ort.InferenceSession:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 2
        return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])

    sessions = {name: session(path) for name, path in graphs.items()}
    ids = np.random.default_rng(0).integers(3, 250, (1, 128))  # within any vocabulary here
    want_embeddings, want_attentions = sessions["fp32"].run(None, {"input_ids": ids})[:2]
    result: dict = {"version": ort.__version__, "graphs": {}}
    for name, s in sessions.items():
        embeddings, attentions = s.run(None, {"input_ids": ids})[:2]
        cosine = (embeddings * want_embeddings).sum(-1) / (
            np.linalg.norm(embeddings, axis=-1) * np.linalg.norm(want_embeddings, axis=-1)
        )
        p50 = {}
        for t in LENGTHS:
            inputs = {"input_ids": np.ones((1, t), np.int64)}
            runs = []
            for _ in range(8 if t < 512 else 3):
                start = time.perf_counter()
                s.run(None, inputs)
                runs.append(time.perf_counter() - start)
            p50[t] = statistics.median(runs)
        result["graphs"][name] = {
            "attention_max_abs_diff": float(np.abs(attentions - want_attentions).max()),
            "embedding_cosine_min": float(cosine.min()),
            "p50_s": p50,
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", type=Path)
    parser.add_argument("--ort", action="append", default=[], help="NAME=PATH (PATH may be empty)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--run", help=argparse.SUPPRESS)  # a child: JSON of graphs
    args = parser.parse_args()
    if args.run:
        print(json.dumps(run(json.loads(args.run))))
        return
    graphs = {name: str(path) for name, path in convert(args.model).items()}
    results: dict[str, list[dict]] = {}
    for _ in range(args.rounds):
        for spec in args.ort:
            name, _, path = spec.partition("=")
            env = dict(os.environ)
            if path:
                env["PYTHONPATH"] = os.pathsep.join(filter(None, [path, env.get("PYTHONPATH")]))
            out = subprocess.run(
                [sys.executable, __file__, "--run", json.dumps(graphs)],
                env=env, capture_output=True, text=True, check=True,
            )  # fmt: skip
            results.setdefault(name, []).append(json.loads(out.stdout.splitlines()[-1]))
    print("| ONNX Runtime | graph | attention diff | cosine min | T = 8 / 128 / 512 (ms) |")
    print("|---|---|---|---|---|")
    for runs in results.values():
        for graph in graphs:
            best = {t: min(r["graphs"][graph]["p50_s"][str(t)] for r in runs) for t in LENGTHS}
            first = runs[0]["graphs"][graph]
            times = " / ".join(f"{best[t] * 1e3:.0f}" for t in LENGTHS)
            print(
                f"| {runs[0]['version']} | {graph} | {first['attention_max_abs_diff']:.4f} | "
                f"{first['embedding_cosine_min']:.5f} | {times} |"
            )


if __name__ == "__main__":
    main()
