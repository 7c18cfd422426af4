"""One block of the statistics graph under ONNX Runtime's profiler: time per op (see README).

.venv/bin/python research/long-attention/profile_block.py
"""

import collections
import json
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort

from attnserve.service.ort.block_graph import BlockRecipe, build_block_graph

H, H_KV, D, KEYS, ROWS, RUNS = 32, 8, 64, 8192, 32, 5


def main() -> None:
    recipe = BlockRecipe(scale=D**-0.5, groups=H // H_KV, top_k=True, entropy=True, received=True)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.enable_profiling = True
    options.profile_file_prefix = str(Path(tempfile.mkdtemp()) / "block")
    graph = build_block_graph(recipe).SerializeToString()
    session = ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = {
        "queries": rng.standard_normal((ROWS, H, D), dtype=np.float32),
        "keys": rng.standard_normal((H_KV, KEYS, D), dtype=np.float32),
        "rows": np.arange(KEYS - ROWS, KEYS),  # the last rows: every key seen
        "window": np.array([0]),
        "k": np.array([8]),
    }
    for _ in range(RUNS):
        session.run(None, feeds)
    events = json.loads(Path(session.end_profiling()).read_text())
    per_op: collections.Counter = collections.Counter()
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("kernel_time"):
            per_op[event["args"]["op_name"]] += event["dur"]
    for op, microseconds in per_op.most_common(10):
        print(f"{op:<14} {microseconds / RUNS / 1000:7.1f} ms")


if __name__ == "__main__":
    main()
