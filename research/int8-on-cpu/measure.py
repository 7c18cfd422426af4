"""Which 8-bit (or 4-bit) weights ONNX Runtime runs best on this CPU, and what they cost in
fidelity: MatMulNBits at several bits / block sizes / accuracy levels (attnserve's own
converter, export/int8.py, with its constants varied) and onnxruntime's dynamic
quantization (int8 weights per channel, activations quantized per tensor at run time:
DynamicQuantizeMatMul), against the float32 embeddings graph of a model directory.

    .venv/bin/python research/int8-on-cpu/measure.py --model DIR [--variants 8,32,4 ...]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization import QuantType, quantize_dynamic

import attnserve.export.int8 as int8
from attnserve.export.weights import WeightsFile


def session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.add_session_config_entry("session.intra_op.allow_spinning", "1")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def nbits(model: Path, bits: int, block: int, accuracy: int) -> Path:
    int8.BITS, int8.BLOCK_SIZE, int8.ACCURACY_LEVEL = bits, block, accuracy
    tag = f"nbits_b{bits}_k{block}_a{accuracy}"
    with WeightsFile(model / f"research_{tag}.data") as weights:
        int8.convert_to_int8(
            model / "model_embeddings.onnx", model / f"research_{tag}.onnx", weights
        )
    return model / f"research_{tag}.onnx"


def dynamic(model: Path) -> Path:
    out = model / "research_dynamic.onnx"
    quantize_dynamic(
        model / "model_embeddings.onnx",
        out,
        weight_type=QuantType.QInt8,
        per_channel=True,
        op_types_to_quantize=["MatMul"],
        use_external_data_format=True,
        extra_options={"MatMulConstBOnly": True},
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--variants", nargs="*", default=["8,32,4", "8,128,4", "8,128,1", "4,32,4"])
    args = parser.parse_args()
    onnx.checker.check_model(str(args.model / "model_embeddings.onnx"))
    graphs = {"fp32": args.model / "model_embeddings.onnx", "dynamic int8": dynamic(args.model)}
    for variant in args.variants:
        bits, block, accuracy = map(int, variant.split(","))
        graphs[f"MatMulNBits {bits} bits, block {block}, accuracy {accuracy}"] = nbits(
            args.model, bits, block, accuracy
        )
    sessions = {name: session(path) for name, path in graphs.items()}
    ids = np.random.default_rng(0).integers(3, 400, (1, 128))
    reference = sessions["fp32"].run(None, {"input_ids": ids})[0]
    for name, s in sessions.items():
        got = s.run(None, {"input_ids": ids})[0]
        cosine = (got * reference).sum(-1) / (
            np.linalg.norm(got, axis=-1) * np.linalg.norm(reference, axis=-1)
        )
        print(f"{name}: embedding cosine min {cosine.min():.5f}")
    for t in (8, 128, 512):
        ids = np.ones((1, t), np.int64)
        times: dict[str, list[float]] = {}
        for _ in range(3):  # alternating blocks
            for name, s in sessions.items():
                runs = []
                for _ in range(8 if t < 512 else 3):
                    start = time.perf_counter()
                    s.run(None, {"input_ids": ids})
                    runs.append(time.perf_counter() - start)
                times.setdefault(name, []).append(statistics.median(runs))
        base = min(times["fp32"])
        for name, values in times.items():
            print(
                f"T={t} {name}: {min(values) * 1e3:.1f} ms, {base / min(values):.2f}x fp32's speed"
            )


if __name__ == "__main__":
    main()
