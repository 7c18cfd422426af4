"""PyTorch vs ONNX Runtime on the same inputs: the gate every exported model must pass.

The PyTorch side runs first (`reference_outputs`): its few outputs are kept, so that
the model's weights can be freed before ONNX Runtime opens a graph of them.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
import torch.nn.functional as F

from attnserve.export import DEFAULT_TOLERANCE
from attnserve.model.artifacts import (
    ATTRIBUTION_INPUTS,
    ATTRIBUTION_OUTPUTS,
    LENS_INPUTS,
    LOGITS_NAME,
    PARTS_NAMES,
    PREDICTION_INPUTS,
    PREDICTION_OUTPUTS,
    RESIDUAL_STREAM_NAME,
    cache_names,
    query_key_sites,
    unchanged,
)
from attnserve.model.config import ModelConfig
from attnserve.model.encoder import Encoder
from attnserve.model.footprint import parameter_count
from attnserve.model.hook_points import captured, stacked
from attnserve.model.readout_sites import readout_sites

LENS_TOP_K = 5  # the parity case of the lens' predictions


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
    # per output name, what the gate judges (scaled_diff): the absolute difference of
    # bounded outputs, the difference relative to its row's scale for the others
    scaled_diff: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Reference:
    """What PyTorch computed for one shape: every input and output by name."""

    shape: tuple[int, int]  # (batch, seq_len) of the ids
    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]


# The longest parity case holds every layer's and head's T x T weights at most this large,
# and costs at most this many parameter-tokens (about 2.3 TFLOP: ~5 s a graph on 2 cores).
LONGEST_CASE_BYTES = 2**28
LONGEST_CASE_PARAMETER_TOKENS = 2**37


# Outputs whose values are bounded (probabilities) are judged by their absolute difference.
BOUNDED_OUTPUTS = frozenset(PREDICTION_OUTPUTS[1:])


def scaled_diff(got: np.ndarray, want: np.ndarray, bounded: bool) -> float:
    """How far `got` is from `want`, as the parity gate judges it.

    Bounded values (attention weights, probabilities): the largest absolute difference.
    The rest (embeddings, the residual stream and its parts, logits, attributions) run to
    whatever scale the model's activations have: a trained model's residual stream reaches
    hundreds, with outlier dimensions in the thousands, where float32's own rounding is
    above 1e-4. Each row (the last axis: one token's vector) is judged relative to its own
    largest magnitude, and absolutely where that is below 1, so small activations keep the
    absolute gate and one token's outlier does not loosen the others'. NaN never passes.
    """
    diff = np.abs(got.astype(np.float64) - want)  # NaN stays NaN through max
    if not bounded:
        diff /= np.maximum(np.abs(want).max(axis=-1, keepdims=True, initial=0.0), 1.0)
    return float(diff.max(initial=0.0))


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
    """PyTorch's embeddings, attentions, residual stream and its parts on random ids of
    each shape (every head kept), and where the model has an unembedding its logit lens
    (and attribution) of the first sequence of the first multi-token shape, at its first,
    middle and last layers (and every position)."""
    config = model.config
    rng = np.random.default_rng(seed)
    references = []
    for batch, seq_len in shapes or default_shapes(config):
        ids = rng.integers(0, config.vocab_size, size=(batch, seq_len), dtype=np.int64)
        sites, queries = readout_sites(config), query_key_sites(config)
        reads = [site for names in sites.values() for site in names] + list(queries.values())
        with torch.inference_mode(), captured(model, reads) as values:
            embeddings, attentions = model(torch.from_numpy(ids))
        assert attentions is not None
        readouts = {name: value.numpy() for name, value in stacked(values, sites).items()}
        readouts |= {name: values[site].numpy() for name, site in queries.items()}
        inputs = {config.input_name: ids} | unchanged(config)
        outputs = {
            config.embeddings_name: embeddings.numpy(),
            config.attentions_name: attentions.numpy(),
            **readouts,
        }
        references.append(Reference((batch, seq_len), inputs, outputs))
    if config.unembedding != "none":
        references.append(_lens_reference(model, references))
    if config.attribution_refusal is None:
        references.append(_attribution_reference(model, references))
    if config.unembedding != "none" and config.max_seq_len >= 2:
        references.append(_decode_reference(model, seed + 1))
    return references


def _lens_reference(model: Encoder, references: list[Reference]) -> Reference:
    case = next((r for r in references if r.shape[1] > 1), references[0])
    stream = case.outputs[RESIDUAL_STREAM_NAME][0]  # (L+1, T, D) of its first sequence
    layers = sorted({0, len(stream) // 2, len(stream) - 1})
    residual = stream[layers].reshape(-1, stream.shape[-1])  # (rows, D)
    last = np.broadcast_to(stream[-1], stream[layers].shape).reshape(residual.shape)
    targets = np.stack([np.arange(len(residual)) % model.config.vocab_size] * 2, axis=1)
    with torch.inference_mode():
        logits = model.lens(torch.from_numpy(residual), torch.from_numpy(last.copy()))
        probabilities = logits.softmax(-1)
        top = probabilities.topk(LENS_TOP_K).values
        chosen = probabilities.gather(-1, torch.from_numpy(targets))
    inputs = dict(zip(LENS_INPUTS, (residual, np.ascontiguousarray(last)), strict=True))
    inputs |= dict(zip(PREDICTION_INPUTS, (np.array([LENS_TOP_K]), targets), strict=True))
    # top_ids are not compared: where two probabilities are within rounding, either order
    # is right; their probabilities, sorted, are compared instead.
    outputs = {LOGITS_NAME: logits.numpy()}
    outputs |= dict(zip(PREDICTION_OUTPUTS[1:], (top.numpy(), chosen.numpy()), strict=True))
    return Reference(case.shape, inputs, outputs)


def _attribution_reference(model: Encoder, references: list[Reference]) -> Reference:
    case = next((r for r in references if r.shape[1] > 1), references[0])
    stream = case.outputs[RESIDUAL_STREAM_NAME][0]  # (L+1, T, D) of its first sequence
    heads, mlps = (case.outputs[name][0].swapaxes(0, 1) for name in PARTS_NAMES)  # (T, L, .)
    targets = np.stack([np.arange(len(heads)) % model.config.vocab_size] * 2, axis=1)
    inputs = [heads, mlps, stream[0], stream[-1], targets]
    inputs = [np.ascontiguousarray(x) for x in inputs]
    with torch.inference_mode():
        parts = model.attribution(*(torch.from_numpy(x) for x in inputs))
    outputs = dict(zip(ATTRIBUTION_OUTPUTS.values(), (p.numpy() for p in parts), strict=True))
    return Reference(case.shape, dict(zip(ATTRIBUTION_INPUTS, inputs, strict=True)), outputs)


def _decode_reference(model: Encoder, seed: int) -> Reference:
    """One decode step of two texts after a prompt each, the second one token shorter where
    the context allows (its cache padded in front): the step's logits and the keys and
    values it returns."""
    config = model.config
    T = min(17, config.max_seq_len)  # a prompt and the step's token fit in the context
    ids = torch.from_numpy(
        np.random.default_rng(seed).integers(0, config.vocab_size, size=(1, T), dtype=np.int64)
    )
    empty = (torch.zeros(1, config.kv_heads, 0, config.head_dim),) * 2
    no_past = torch.zeros(1, 0, dtype=torch.int64)
    caches, masks = [], []
    lengths = (T - 1, max(T - 2, 1))
    with torch.inference_mode():
        for length in lengths:
            _, presents = model.decode(ids[:, :length], no_past, [empty] * config.n_layers)
            pad = T - 1 - length
            caches.append([F.pad(x, (0, 0, pad, 0)) for layer in presents for x in layer])
            masks.append([0] * pad + [1] * length)
        past = [torch.cat(pair) for pair in zip(*caches, strict=True)]
        step = torch.cat([ids[:, length : length + 1] for length in lengths])  # (2, 1)
        past_mask = torch.tensor(masks)
        layers = list(zip(past[::2], past[1::2], strict=True))
        logits, presents = model.decode(step, past_mask, layers)
    inputs = {config.input_name: step.numpy(), "past_mask": past_mask.numpy()}
    names = cache_names(config, "past_key_values")
    inputs |= dict(zip(names, (x.numpy() for x in past), strict=True))
    outputs = {LOGITS_NAME: logits.numpy()}
    new = (x.numpy() for layer in presents for x in layer)
    outputs |= dict(zip(cache_names(config, "present"), new, strict=True))
    return Reference((2, T), inputs | unchanged(config), outputs)


def compare(
    references: list[Reference],
    onnx_path: str | Path,
    config: ModelConfig,
    tolerance: float = DEFAULT_TOLERANCE,
    min_cosine: float | None = None,
    gated: Collection[str] | None = None,
    prepacked: bool = False,
) -> list[ParityCase]:
    """Run the graph on each reference's ids and compare every output it has.

    Raises ParityError at the first shape where an output's scaled_diff passes `tolerance`
    (or is NaN). min_cosine (8-bit weights, whose hidden states differ by more than their
    attention does): the tolerance gates the attention only, and each token's embedding
    must keep at least this cosine with PyTorch's. gated: the only outputs the tolerance
    may gate (None: every one); the others' differences are recorded in the cases alone.
    prepacked: let ONNX Runtime repack the weights, as the server does. An 8-bit graph
    must be checked so: MatMulNBits multiplies in int8 (accuracy_level 4) only from
    prepacked weights, and in float32 otherwise, which is about twice as exact.
    """
    options = ort.SessionOptions()
    if not prepacked:
        # The matrices are read where the weights file is mapped, never repacked into a
        # second copy: the check of a model costs its weights once, and runs a few shapes.
        options.add_session_config_entry("session.disable_prepacking", "1")
    session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    inputs = [i.name for i in session.get_inputs()]
    cases = []
    for reference in references:
        compared = [name for name in names if name in reference.outputs]
        if not set(inputs) <= set(reference.inputs) or not compared:
            continue  # a reference of another graph (the lens' of the model's)
        batch, seq_len = reference.shape
        values = session.run(compared, {name: reference.inputs[name] for name in inputs})
        got = dict(zip(compared, values, strict=True))
        diffs = {
            name: float(np.abs(value - reference.outputs[name]).max())
            for name, value in got.items()
        }
        bounded = BOUNDED_OUTPUTS | {config.attentions_name}
        judged = {
            name: scaled_diff(value, reference.outputs[name], name in bounded)
            for name, value in got.items()
        }
        cosine = 1.0
        if config.embeddings_name in got:
            cosine = _min_cosine(
                got[config.embeddings_name], reference.outputs[config.embeddings_name]
            )
        judged_by_gate = [config.attentions_name] if min_cosine is not None else compared
        if gated is not None:
            judged_by_gate = [name for name in judged_by_gate if name in gated]
        # `not <=` and `not >=` also catch NaN
        failed = [n for n in judged_by_gate if n in judged and not judged[n] <= tolerance]
        problems = []
        if failed:
            problems.append(
                ", ".join(
                    f"{name} {judged[name]:.3g}{'' if name in bounded else ' of its scale'} "
                    f"(max abs diff {diffs[name]:.3g})"
                    for name in failed
                )
                + f" > tolerance {tolerance:g}"
            )
        if not cosine >= (min_cosine or -1.0):
            problems.append(f"embedding cosine {cosine:.4f} < {min_cosine}")
        if problems:
            raise ParityError(
                f"ONNX Runtime ({Path(onnx_path).name}) disagrees with PyTorch at batch={batch}, "
                f"seq_len={seq_len}: {'; '.join(problems)}"
            )
        cases.append(
            ParityCase(Path(onnx_path).name, batch, seq_len, diffs, round(cosine, 6), judged)
        )
    if not cases:
        raise ParityError(f"no reference has the inputs and outputs of {Path(onnx_path).name}")
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
