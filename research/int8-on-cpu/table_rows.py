"""Which precision the token table's rows can take in an int8 model: a 2-layer checkpoint
in Llama-3.1-8B's shape (export/studied.py; its vocabulary cut to 32,000, which changes
no row), exported int8 by this checkout, its attention and embeddings against PyTorch
float32 over the parity cases (the gate lifted to measure past it).

    PYTHONPATH=. .venv/bin/python research/int8-on-cpu/table_rows.py as-is float32-rows

`as-is`: the checkout's conversion; `float32-rows`: its table Gather left in float32.
"""

import json
import shutil
import sys
from pathlib import Path

from attnserve.export import int8, model_dir
from attnserve.export.hf_import import load_hf
from attnserve.export.studied import STUDIED
from perf.hf_checkpoints import build_streamed_checkpoint

model_dir.INT8_TOLERANCE = 1.0  # measure, do not gate
WORK = Path("/tmp/int8-table-rows")
source = WORK / "hf"
if not source.exists():
    build_streamed_checkpoint(
        dict(STUDIED["Llama-3.1-8B"], num_hidden_layers=2, vocab_size=32000), source
    )
for variant in sys.argv[1:]:
    if variant == "float32-rows":
        int8._Conversion.to_float16_gather = lambda self, node: None
    model, _ = load_hf(source, log=lambda _: None)
    out = WORK / variant
    shutil.rmtree(out, ignore_errors=True)
    report = model_dir.write_model_dir(model, out, precisions=("int8",), log=lambda _: None)
    print(variant, json.dumps(report.fidelity["model_int8.onnx"]))
