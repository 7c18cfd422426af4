"""Two model directories' graphs in ONNX Runtime alone, in alternating blocks: whether a
change of the traced graphs costs a request anything.

    python research/hook-points-cost/graphs_ab.py BEFORE_DIR AFTER_DIR [GRAPH ...]

GRAPH: model_embeddings.onnx (a plain Encode's) and model.onnx (with attention) by default.
"""

import sys
import time

import numpy as np
import onnxruntime as ort

BLOCKS, RUNS = 20, 20


def session(path: str) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def main() -> None:
    before, after, *graphs = sys.argv[1:]
    rng = np.random.default_rng(0)
    for graph in graphs or ["model_embeddings.onnx", "model.onnx"]:
        sessions = {"before": session(f"{before}/{graph}"), "after": session(f"{after}/{graph}")}
        for t in (8, 16, 128):
            ids = {"input_ids": rng.integers(0, 256, (1, t), dtype=np.int64)}
            times: dict[str, list[float]] = {name: [] for name in sessions}
            for block in range(BLOCKS):
                order = list(sessions.items())
                for name, s in order if block % 2 == 0 else order[::-1]:
                    for _ in range(RUNS):
                        start = time.perf_counter()
                        s.run(None, ids)
                        times[name].append(time.perf_counter() - start)
            b, a = (float(np.median(times[name])) * 1e3 for name in ("before", "after"))
            print(f"{graph} T={t:4d}: before {b:.3f} ms, after {a:.3f} ms, ratio {a / b:.3f}")


if __name__ == "__main__":
    main()
