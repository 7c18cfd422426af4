"""How close each imported family comes to transformers' eager implementation, per path.

For every family, the tiny checkpoint the tests build (tests/export/families.py FAMILY_SHAPES),
a right-padded batch of 3 at 40, 23 and 9 tokens (past every sliding window), and the
largest absolute difference of the last hidden state and of the attention probabilities
on real positions: the PyTorch import, then the exported graphs in ONNX Runtime (the
attention graph the CPU serves, and the embeddings-only graph).

    PYTHONPATH=. .venv/bin/python research/family-parity/measure.py   # from the repository root
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import torch

from attnserve.export.hf_import import load_hf
from attnserve.export.model_dir import write_model_dir
from attnserve.service.ort.runtime import OrtRuntime, RuntimeOptions
from perf.hf_checkpoints import build_checkpoint, reference_outputs
from tests.export.families import FAMILY_SHAPES
from tests.export.test_hf_families import padded_batch


def largest(got, want, lengths, square: bool = False) -> float:
    """The largest |got - want| on each row's real positions (keys too, for attention)."""
    return float(
        max(
            np.abs(got[r, ..., :t, :t] - want[r, ..., :t, :t]).max()
            if square
            else np.abs(got[r, :t] - want[r, :t]).max()
            for r, t in enumerate(lengths)
        )
    )


def main() -> None:
    print(
        "| family | PyTorch embeddings | PyTorch attention | ORT embeddings | ORT attention "
        "| ORT embeddings-only graph |"
    )
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as scratch:
        for family in sorted(FAMILY_SHAPES):
            directory = Path(scratch) / family
            reference = build_checkpoint(family, directory, **FAMILY_SHAPES[family])
            model, _ = load_hf(directory, log=lambda _: None)
            ids, lengths = padded_batch(model.config.vocab_size)
            want_emb, want_att = reference_outputs(reference, ids)
            with torch.no_grad():
                emb, att = (x.numpy() for x in model(torch.from_numpy(ids)))
            write_model_dir(model, Path(scratch) / f"{family}-model", log=lambda _: None)
            runtime = OrtRuntime(Path(scratch) / f"{family}-model", RuntimeOptions(provider="cpu"))
            ort_emb, ort_att = runtime.run(ids)
            diffs = [
                largest(emb, want_emb, lengths),
                largest(att, want_att, lengths, square=True),
                largest(ort_emb, want_emb, lengths),
                largest(ort_att, want_att, lengths, square=True),
                largest(runtime.embed(ids), want_emb, lengths),
            ]
            print(f"| {family} | " + " | ".join(f"{d:.1e}" for d in diffs) + " |")


if __name__ == "__main__":
    main()
