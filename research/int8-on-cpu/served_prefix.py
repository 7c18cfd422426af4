"""int8 fidelity as served, on the 2-layer prefixes the streamed import checks: a 2-layer
checkpoint in each shape (export/studied.py's config fields, the vocabulary whole),
exported int8 by this checkout with each arithmetic (`--int8-arithmetic`), its attention
and embeddings against PyTorch float32 over the parity cases, the graphs run prepacked as
the server runs them (the gate lifted to measure past it).

    PYTHONPATH=. .venv/bin/python research/int8-on-cpu/served_prefix.py gemma-2-9b Llama-3.1-8B

`--blocks 16,32` measures each block size (export/int8.py's BLOCK_SIZE) with int8 arithmetic.
"""

import json
import shutil
import sys
from pathlib import Path

from attnserve.export import INT8_ARITHMETICS, int8, model_dir
from attnserve.export.hf_import import load_hf
from attnserve.export.studied import STUDIED
from perf.hf_checkpoints import build_streamed_checkpoint

model_dir.INT8_TOLERANCE = 1.0  # measure, do not gate
model_dir.INT8_MIN_COSINE = 0.0
WORK = Path("/tmp/int8-served-prefix")
args = sys.argv[1:]
variants = [(arithmetic, int8.BLOCK_SIZE) for arithmetic in INT8_ARITHMETICS]
if args[0] == "--blocks":
    variants = [("int8", int(block)) for block in args[1].split(",")]
    args = args[2:]
for shape in args:
    source = WORK / shape / "hf"
    if not source.exists():
        build_streamed_checkpoint(dict(STUDIED[shape], num_hidden_layers=2), source)
    for arithmetic, int8.BLOCK_SIZE in variants:
        model, _ = load_hf(source, log=lambda _: None)
        out = WORK / shape / arithmetic
        shutil.rmtree(out, ignore_errors=True)
        report = model_dir.write_model_dir(
            model, out, precisions=("int8",), log=lambda _: None, int8_arithmetic=arithmetic
        )
        del model
        print(
            shape,
            arithmetic,
            int8.BLOCK_SIZE,
            json.dumps(report.fidelity["model_int8.onnx"]),
            flush=True,
        )
        shutil.rmtree(out)
    shutil.rmtree(source)
