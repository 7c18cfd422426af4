"""What a gradient graph (export/gradient.py) costs in memory as the server opens it, against
the two ways it could be: its products through Transpose nodes of the stored weights (which
ONNX Runtime folds into transposed copies at load), and prepacked.

    .venv/bin/python research/gradient-memory/measure.py MODEL_DIR [T]

MODEL_DIR: a float32 export (copied: the graphs are written into the copies). Each variant
is opened and run in a fresh process: its resident memory once open, after six runs, and
at peak, and a run's time.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import attnserve.export.gradient as gradient
from attnserve.export import weights

PROBE = """
import sys, time
import numpy as np, onnxruntime as ort
def rss(): return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
def peak():  # VmHWM: this process's own (ru_maxrss is inherited from the parent on exec)
    line = next(l for l in open("/proc/self/status") if l.startswith("VmHWM"))
    return int(line.split()[1]) / 1024
path, T, packed = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
so = ort.SessionOptions()
if not packed:
    so.add_session_config_entry("session.disable_prepacking", "1")
session = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
opened = rss()
feeds = dict(input_ids=np.arange(T, dtype=np.int64)[None], position=np.array([T - 1]),
             target=np.array([5]), contrast=np.array([9]))
session.run(None, feeds)
start = time.perf_counter()
for _ in range(5):
    session.run(None, feeds)
ms = (time.perf_counter() - start) / 5 * 1e3
print(f"open {opened:.0f} MiB, after runs {rss():.0f} MiB, peak {peak():.0f} MiB, {ms:.0f} ms")
"""


def write(source: Path, work: Path, name: str, folded: bool, length: int) -> Path:
    """A copy of `source` with its gradient graph of `length`; `folded`: the backward's
    products through Transpose nodes of the stored weights, as before export/weights.py
    products_read_as_stored was applied to them."""
    target = work / name
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("gradient_*"))
    real = weights.products_read_as_stored

    def some(model, file=None):  # the first call (the tied table) only
        return real(model, file) if file is not None else None

    gradient.products_read_as_stored = some if folded else real
    try:
        gradient.write_gradients(target, [length], log=lambda _: None)
    finally:
        gradient.products_read_as_stored = real
    return target / f"gradient_{length}.onnx"


def main() -> None:
    source, length = Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 20
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        stored = write(source, work, "stored", False, length)
        folded = write(source, work, "folded", True, length)
        for label, path, packed in (
            ("as stored, unpacked (served)", stored, "0"),
            ("as stored, prepacked", stored, "1"),
            ("transposes folded, unpacked", folded, "0"),
        ):
            probe = [sys.executable, "-c", PROBE, str(path), str(length), packed]
            line = subprocess.run(probe, check=True, capture_output=True, text=True).stdout
            print(f"{label}: {line.strip()}")


if __name__ == "__main__":
    main()
