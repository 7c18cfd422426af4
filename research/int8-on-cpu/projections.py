"""Which projections' int8 arithmetic moves attention: Llama-3.1-8B's 2-layer prefix (as
served_prefix.py builds it) exported int8 with the projections whose weight name contains
one of a variant's comma-separated parts multiplied in float32 (accuracy_level 1), the
rest in int8, against PyTorch float32 over the parity cases, prepacked as served.

    PYTHONPATH=. .venv/bin/python research/int8-on-cpu/projections.py Llama-3.1-8B \
        none attn.qkv attn.proj,mlp mlp.fc blocks.0
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
model_dir.INT8_MIN_COSINE = 0.0
in_float32: list[str] = []
convert = int8._Conversion.to_matmul_nbits


def to_matmul_nbits(self, node) -> None:
    """The conversion's own, at accuracy 1 for the weights the variant names."""
    accuracy = self.accuracy
    if any(part in str(node.inputs[1].name) for part in in_float32):
        self.accuracy = int8.FLOAT32_ACCURACY_LEVEL
    try:
        convert(self, node)
    finally:
        self.accuracy = accuracy


int8._Conversion.to_matmul_nbits = to_matmul_nbits
shape, variants = sys.argv[1], sys.argv[2:]
source = Path("/tmp/int8-projections") / shape / "hf"
if not source.exists():
    build_streamed_checkpoint(dict(STUDIED[shape], num_hidden_layers=2), source)
for variant in variants:
    in_float32[:] = [part for part in variant.split(",") if part != "none"]
    model, _ = load_hf(source, log=lambda _: None)
    out = source.parent / "out"
    shutil.rmtree(out, ignore_errors=True)
    report = model_dir.write_model_dir(model, out, precisions=("int8",), log=lambda _: None)
    del model
    print(variant, json.dumps(report.fidelity["model_int8.onnx"]), flush=True)
    shutil.rmtree(out)
shutil.rmtree(source.parent)
