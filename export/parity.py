"""PyTorch vs ONNX Runtime on the same inputs: the gate every exported model must pass.

The PyTorch side runs first (`reference_outputs`): its few outputs are kept, so that
the model's weights can be freed before ONNX Runtime opens a graph of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from attnserve.export import DEFAULT_TOLERANCE
from attnserve.model.config import ModelConfig
from attnserve.model.encoder import Encoder
from attnserve.model.footprint import parameter_count


class ParityError(RuntimeError):
    """ONNX Runtime disagrees with PyTorch; the message says at which shape and output."""


@dataclass(frozen=True)
class ParityCase:
    graph: str  # the ONNX file's name
    batch: int
    seq_len: int
    max_abs_diff: dict[str, float]  # per output name
    # the smallest cosine between a token's embedding and PyTorch's, over the batch's tokens
    embedding_cosine: float = 1.0


@dataclass(frozen=True)
class Reference:
    """What PyTorch computed for one shape: the input ids and every output by name."""

    input_ids: np.ndarray  # (B, T) int64
    outputs: dict[str, np.ndarray]


# The longest parity case holds every layer's and head's T x T weights at most this large,
# and costs at most this many parameter-tokens (about 2.3 TFLOP: ~5 s a graph on 2 cores).
LONGEST_CASE_BYTES = 2**28
LONGEST_CASE_PARAMETER_TOKENS = 2**37


def default_shapes(config: ModelConfig) -> list[tuple[int, int]]:
    """(batch, seq_len) pairs: length 1, 2, an odd length and the longest affordable one,
    several batch sizes. The longest is max_seq_len unless its attention weights (layers x
    heads x T^2 floats, 18 GB for a 30-layer model at 4096) would pass LONGEST_CASE_BYTES,
    or its forward pass LONGEST_CASE_PARAMETER_TOKENS (a 1B model checks 128 tokens: each
    graph runs it, and at 300 the checks were a fifth of an import's time)."""
    per_square = config.n_layers * config.n_heads * 4
    longest = min(
        config.max_seq_len,
        math.isqrt(LONGEST_CASE_BYTES // per_square),
        max(17, LONGEST_CASE_PARAMETER_TOKENS // parameter_count(config)),
    )
    shapes = [(1, 1), (2, 2), (3, min(17, longest)), (1, longest)]
    return list(dict.fromkeys(shapes))  # drop duplicates when max_seq_len is tiny


def reference_outputs(
    model: Encoder, shapes: list[tuple[int, int]] | None = None, seed: int = 0
) -> list[Reference]:
    """PyTorch's embeddings and attentions on random ids of each shape."""
    config = model.config
    rng = np.random.default_rng(seed)
    references = []
    for batch, seq_len in shapes or default_shapes(config):
        ids = rng.integers(0, config.vocab_size, size=(batch, seq_len), dtype=np.int64)
        with torch.inference_mode():
            embeddings, attentions = model(torch.from_numpy(ids))
        outputs = {config.embeddings_name: embeddings.numpy()}
        outputs[config.attentions_name] = attentions.numpy()  # type: ignore[union-attr]
        references.append(Reference(ids, outputs))
    return references


def compare(
    references: list[Reference],
    onnx_path: str | Path,
    config: ModelConfig,
    tolerance: float = DEFAULT_TOLERANCE,
    min_cosine: float | None = None,
) -> list[ParityCase]:
    """Run the graph on each reference's ids and compare every output it has.

    Raises ParityError at the first shape where an output differs by more than `tolerance`
    (or is NaN). min_cosine (8-bit weights, whose hidden states differ by more than their
    attention does): the tolerance gates the attention only, and each token's embedding
    must keep at least this cosine with PyTorch's.
    """
    options = ort.SessionOptions()
    # The matrices are read where the weights file is mapped, never repacked into a second
    # copy: the check of a model costs its weights once, and runs a few shapes only.
    options.add_session_config_entry("session.disable_prepacking", "1")
    session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    cases = []
    for reference in references:
        batch, seq_len = reference.input_ids.shape
        values = session.run(names, {config.input_name: reference.input_ids})
        got = dict(zip(names, values, strict=True))
        diffs = {
            name: float(np.abs(value - reference.outputs[name]).max())
            for name, value in got.items()
        }
        cosine = _min_cosine(got[config.embeddings_name], reference.outputs[config.embeddings_name])
        gated = [config.attentions_name] if min_cosine is not None else names
        # `not <=` and `not >=` also catch NaN
        if not all(diffs[name] <= tolerance for name in gated if name in diffs) or not (
            cosine >= (min_cosine or -1.0)
        ):
            detail = ", ".join(f"{name} {d:.3g}" for name, d in diffs.items())
            floor = "" if min_cosine is None else f", embedding cosine {cosine:.4f} >= {min_cosine}"
            raise ParityError(
                f"ONNX Runtime ({Path(onnx_path).name}) disagrees with PyTorch at batch={batch}, "
                f"seq_len={seq_len}: max abs diff {detail} > tolerance {tolerance:g}{floor}"
            )
        cases.append(ParityCase(Path(onnx_path).name, batch, seq_len, diffs, round(cosine, 6)))
    return cases


def _min_cosine(got: np.ndarray, want: np.ndarray) -> float:
    """The smallest cosine between corresponding vectors of the last axis."""
    dot = (got * want).sum(-1)
    norms = np.linalg.norm(got, axis=-1) * np.linalg.norm(want, axis=-1)
    return float((dot / np.maximum(norms, 1e-30)).min())


def check_parity(
    model: Encoder,
    onnx_path: str | Path,
    shapes: list[tuple[int, int]] | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    seed: int = 0,
) -> list[ParityCase]:
    """Compare every output of the graph with PyTorch on random ids of each shape."""
    references = reference_outputs(model, shapes, seed)
    return compare(references, onnx_path, model.config, tolerance)
