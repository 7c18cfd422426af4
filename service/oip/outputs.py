"""The V2 outputs of an Encode: their datatypes, the options each set of them asks for,
and each sequence's values stacked into a tensor (service/oip/tensors.py translates the
request, service/oip/model.py answers with these)."""

from __future__ import annotations

import numpy as np

from attnserve.service.core.batching import SequenceResult
from attnserve.service.core.plan import EncodePlan, pooled
from attnserve.service.core.readouts import READOUTS
from attnserve.service.core.request import AttentionOptions

OUTPUT_DATATYPES = {
    "embeddings": "FP32",
    "pooled": "FP32",
    "token_ids": "INT64",
    "lengths": "INT64",
    "attention": "FP32",  # FP16 with attention_dtype=FP16
    "attention_indices": "INT32",
    "head_entropy": "FP32",
    "attention_received": "FP32",
    "attention_row_entropy": "FP32",
    "hidden_states": "FP32",
    "hidden_state_norms": "FP32",
    "logits": "FP32",
    "next_token_ids": "INT32",
    "next_token_probabilities": "FP32",
    "target_probabilities": "FP32",
    "lens_token_ids": "INT32",
    "lens_probabilities": "FP32",
    "lens_target_probabilities": "FP32",
    "attribution_heads": "FP32",
    "attribution_attention_biases": "FP32",
    "attribution_mlps": "FP32",
    "attribution_embeddings": "FP32",
    "attribution_constants": "FP32",
    "sae_top_ids": "INT64",
    "sae_top_activations": "FP32",
    "sae_l0": "INT64",
    "sae_error_norm": "FP32",
    "sae_feature_activations": "FP32",
    "sae_activations": "FP32",
    "patching": "FP32",
    "patching_clean": "FP32",
    "patching_corrupted": "FP32",
    "patching_saliency": "FP32",
}
# the statistics only query blocks compute, returned only when named
STATISTICS_OUTPUTS = ("attention_received", "attention_row_entropy")
ATTENTION_OUTPUTS = ("attention", "attention_indices", "head_entropy", *STATISTICS_OUTPUTS)
# each readout's outputs, as its row of the readout table names them
_OUTPUTS_OF = {kind.option: kind.v2 for kind in READOUTS}
HIDDEN_OUTPUTS = _OUTPUTS_OF["hidden_states"]
# attribution_<field> is the field of the data plane's Attribution
ATTRIBUTION_V2_OUTPUTS = _OUTPUTS_OF["attribution"]
# sae_<field> is the field of the data plane's Features, of the one SAE asked for
SAE_V2_OUTPUTS = _OUTPUTS_OF["features"]
PATCHING_OUTPUTS = _OUTPUTS_OF["patching"]
READOUT_OUTPUTS = tuple(name for kind in READOUTS for name in kind.v2)
_INDEX_OUTPUTS = ("attention_indices", "next_token_ids", "lens_token_ids", "sae_top_ids")
# An output's field of the data plane's Predictions (its layers axis dropped where "next").
_PREDICTION_FIELDS = {
    "logits": ("predictions", "logits"),
    "next_token_ids": ("predictions", "top_ids"),
    "next_token_probabilities": ("predictions", "top_probabilities"),
    "target_probabilities": ("predictions", "target_probabilities"),
    "lens_token_ids": ("lens", "top_ids"),
    "lens_probabilities": ("lens", "top_probabilities"),
    "lens_target_probabilities": ("lens", "target_probabilities"),
}
# The group of options (a field of EncodeOptions) each set of outputs asks for: a group is
# computed when one of its outputs is asked, and its parameters are refused otherwise.
OPTION_GROUPS = {"attention": (ATTENTION_OUTPUTS, AttentionOptions)} | {
    kind.option: (kind.v2, kind.options) for kind in READOUTS if kind.v2
}


def output_rows(name: str, plan: EncodePlan, results: list[SequenceResult]) -> list[np.ndarray]:
    """Output `name` of each sequence, as the data plane's arrays (no copies)."""
    if name == "embeddings":
        return [r.embeddings for r in results]
    if name == "pooled":
        return [pooled(r.embeddings, plan.pooling) for r in results]
    if name == "token_ids":
        return [np.asarray(ids, dtype=np.int64) for ids in plan.sequences]
    if name == "lengths":
        return [np.array(len(ids), dtype=np.int64) for ids in plan.sequences]
    if name in HIDDEN_OUTPUTS:
        return [getattr(r.readouts, name) for r in results]
    if name in _PREDICTION_FIELDS:
        kind, field = _PREDICTION_FIELDS[name]
        values = [getattr(getattr(r.readouts, kind), field) for r in results]
        return [v[0] for v in values] if kind == "predictions" else values  # one layer: L
    if name in ATTRIBUTION_V2_OUTPUTS:
        part = name.removeprefix("attribution_")
        attributions = [r.readouts.attribution if r.readouts else None for r in results]
        return [getattr(a, part) for a in attributions]
    if name in PATCHING_OUTPUTS:
        grids = [r.readouts.patching for r in results if r.readouts and r.readouts.patching]
        if name == "patching":
            return [grid.values for grid in grids]
        part = name.removeprefix("patching_")
        return [np.array(getattr(grid, part), dtype=np.float32) for grid in grids]
    if name in SAE_V2_OUTPUTS:  # the first axis is over the SAEs asked: one
        features = [getattr(r.readouts, "features", None) for r in results]
        return [getattr(f, name.removeprefix("sae_"))[0] for f in features]
    fields = {"attention": "weights", "attention_indices": "indices", "head_entropy": "entropy"}
    fields |= {"attention_received": "received", "attention_row_entropy": "row_entropy"}
    return [getattr(r.attention, fields[name]) for r in results]


def stacked_shape(rows: list[np.ndarray]) -> tuple[int, ...]:
    """[batch, ...]: every axis as long as the longest row's."""
    return (len(rows), *(max(sizes) for sizes in zip(*(r.shape for r in rows), strict=True)))


def stack_into(out: np.ndarray, rows: list[np.ndarray], name: str) -> None:
    """Write the rows into `out` (stacked_shape), zero-padded (-1 for attention_indices).
    A row as large as `out`'s rows is written once, without padding first."""
    for i, row in enumerate(rows):
        if row.shape != out.shape[1:]:
            out[i].fill(-1 if name in _INDEX_OUTPUTS else 0)
        region: tuple[int | slice, ...] = (i, *(slice(0, n) for n in row.shape))
        out[region] = row
