"""How a served model can hold its weights once, and what each way costs in speed.

ONNX Runtime's CPU provider prepacks every MatMul weight into a copy of its own per
session (the weights file itself is memory-mapped, and released once packed). A model
served with two graphs (embeddings only, and with attention) and instances holds one copy
per session. Three ways to hold one copy, timed on the embeddings a request asks for:
  - prepacked: the embeddings graph, as served today (one copy per session);
  - no prepacking (`session.disable_prepacking`): every session reads the mapped file,
    and could share one buffer through SessionOptions.add_initializer;
  - one session: the fused graph with attention also answers embeddings requests.

    .venv/bin/python research/weights-in-memory/measure.py --model DIR
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort


def session(path: Path, prepack: bool) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.add_session_config_entry("session.intra_op.allow_spinning", "1")
    if not prepack:
        options.add_session_config_entry("session.disable_prepacking", "1")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def rss_mib() -> float:
    status = Path("/proc/self/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--lengths", type=int, nargs="*", default=[8, 32, 128, 512])
    args = parser.parse_args()
    ways = {
        "prepacked embeddings graph": (args.model / "model_embeddings.onnx", True),
        "no prepacking": (args.model / "model_embeddings.onnx", False),
        "one session: fused graph": (args.model / "model_fused.onnx", True),
    }
    sessions = {}
    for name, (path, prepack) in ways.items():
        before = rss_mib()
        sessions[name] = session(path, prepack)
        print(f"{name}: the session added {rss_mib() - before:.0f} MiB")
    for t in args.lengths:
        ids = np.ones((1, t), np.int64)
        times: dict[str, list[float]] = {}
        for _ in range(3):  # alternating blocks
            for name, s in sessions.items():
                runs = []
                for _ in range(15 if t < 512 else 4):
                    start = time.perf_counter()
                    s.run(["embeddings"], {"input_ids": ids})
                    runs.append(time.perf_counter() - start)
                times.setdefault(name, []).append(statistics.median(runs))
        base = min(times["prepacked embeddings graph"])
        cells = [
            f"{name} {min(v) * 1e3:.2f} ms ({min(v) / base:.2f}x)" for name, v in times.items()
        ]
        print(f"T={t}: " + "; ".join(cells))


if __name__ == "__main__":
    main()
