"""Neuronpedia's inference API for feature activations, over the data plane: what
`/v1/activation/topk-by-token`, `/v1/activation/all` and `/v1/activation/single` answer,
as Neuronpedia's own server (apps/inference) computes it, without a transport.

Its conventions, kept: a prompt gets a BOS in front unless it has one; a `source` is an
SAE (here: its name in the model directory), and a `source_set` the SAEs named
`LAYER-SET` (name them as Neuronpedia does, e.g. `6-res-jb`); `ignore_bos` leaves the first
position out. Feature activations come from the same ONNX Runtime run as attnserve.v1's
features (core/features.py). Where Neuronpedia lists k features of a token whatever their
activation, only the active ones are listed here (at most k).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from attnserve.model.tokenizer import VISIBLE_SPACE
from attnserve.service.core.backend import Features
from attnserve.service.core.dataplane import DataPlane
from attnserve.service.core.errors import InvalidInputError
from attnserve.service.core.features import MAX_TOP_K
from attnserve.service.core.request import EncodeOptions, FeaturesOptions

DEFAULT_TOP_K = 5  # Neuronpedia's, per token
DEFAULT_NUM_RESULTS, MAX_NUM_RESULTS = 25, 1000  # /activation/all's
# /activation/all runs the model once per group of SAEs whose dense activations fit in this
GROUP_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class Prompt:
    """A prompt as Neuronpedia reads it: its ids with a BOS in front, and each token's text."""

    ids: np.ndarray  # int64 (T,)
    tokens: list[str]
    special: list[bool]  # each token one of the tokenizer's special ones (BOS, EOS, pad)


def prompt_of(plane: DataPlane, text: str) -> Prompt:
    config = plane.view.config
    ids = list(plane.tokenizer.encode(text))
    if not ids or ids[0] != config.bos_id:
        ids.insert(0, config.bos_id)
    special = {config.bos_id, config.eos_id, config.pad_id}
    # the tokens' own text: attnserve's display strings show a space as VISIBLE_SPACE
    tokens = [t.replace(VISIBLE_SPACE, " ") for t in plane.tokenizer.token_strings(ids)]
    return Prompt(np.asarray(ids, dtype=np.int64), tokens, [i in special for i in ids])


def check_sources(plane: DataPlane, field: str, sources: Sequence[str]) -> None:
    """Each source must be an SAE the model serves; the error names Neuronpedia's field."""
    served = plane.view.saes
    for source in sources:
        if source not in served:
            listed = ", ".join(sorted(served)) or "none (add one with `attnserve sae add`)"
            raise InvalidInputError(
                f"{field}: {source!r} is not an SAE of {plane.name}; it serves {listed}"
            )


async def features_of(
    plane: DataPlane, prompt: Prompt, options: FeaturesOptions, timeout: float | None
) -> Features:
    """The prompt's features, as options asks for them."""
    request = EncodeOptions(token_embeddings=False, features=options)
    async with plane.results([prompt.ids], request, timeout) as (_, results):
        readouts = results[0].readouts
        assert readouts is not None and readouts.features is not None  # asked for
        return readouts.features


async def topk_by_token(
    plane: DataPlane,
    text: str,
    source: str,
    top_k: int | None,
    ignore_bos: bool,
    timeout: float | None = None,
) -> dict:
    """Each token's strongest features of one SAE (ActivationTopkByTokenResponse)."""
    check_sources(plane, "source", [source])
    prompt = prompt_of(plane, text)
    width = plane.view.saes[source].d_sae
    k = max(1, min(DEFAULT_TOP_K if top_k is None else top_k, width, MAX_TOP_K))  # clamped
    features = await features_of(
        plane, prompt, FeaturesOptions((source,), top_k=k, skip_error_norm=True), timeout
    )
    first = 1 if ignore_bos else 0
    ids, activations = features.top_ids[0], features.top_activations[0]  # (T, k)
    results = [
        {
            "token_position": position,
            "token": prompt.tokens[position],
            "is_special": prompt.special[position],
            "top_features": [
                {"feature_index": int(i), "activation_value": float(a)}
                for i, a in zip(ids[position], activations[position], strict=True)
                if i >= 0
            ],
        }
        for position in range(first, len(prompt.ids))
    ]
    return {"results": results, "tokens": prompt.tokens[first:]}


async def single(
    plane: DataPlane, text: str, source: str, index: str, timeout: float | None = None
) -> dict:
    """One feature's activation at every token (ActivationSingleResponse): a BOS position
    reads 0 and, where there is one, the first position is left out."""
    check_sources(plane, "source", [source])
    width = plane.view.saes[source].d_sae
    if not index.isdigit() or int(index) >= width:
        raise InvalidInputError(f"index: {index!r} is not a feature of {source} (0 to {width - 1})")
    prompt = prompt_of(plane, text)
    options = FeaturesOptions((source,), top_k=1, feature_ids=(int(index),), skip_error_norm=True)
    features = await features_of(plane, prompt, options, timeout)
    assert features.feature_activations is not None  # asked for
    values = features.feature_activations[0, :, 0].copy()  # (T,)
    bos = prompt.ids == plane.view.config.bos_id
    values[bos] = 0
    first = 1 if bos.any() else 0
    values = values[first:]
    return {
        "activation": {
            "values": values.tolist(),
            "max_value": float(values.max()),
            "max_value_index": int(values.argmax()),
        },
        "tokens": prompt.tokens[first:],
        "tokens_is_special": prompt.special[first:],
    }


async def all_features(
    plane: DataPlane,
    text: str,
    source_set: str,
    selected_sources: Sequence[str],
    sort_by_token_indexes: Sequence[int],
    ignore_bos: bool,
    num_results: int | None,
    timeout: float | None = None,
) -> dict:
    """The features of a source set that fire most on the prompt, each with its activation
    at every token (ActivationAllResponse): ranked by their largest activation, or by
    their sum over `sort_by_token_indexes`; ties keep the sources' order."""
    members = [n for n in sorted(plane.view.saes, key=_layer_first) if _set_of(n) == source_set]
    if not members:
        sets = sorted({s for s in map(_set_of, plane.view.saes) if s})
        raise InvalidInputError(
            f"source_set: {source_set!r} is not a set of SAEs named LAYER-{source_set} "
            f"in {plane.name}; its sets: {', '.join(sets) or 'none'}"
        )
    sources = list(selected_sources) or members
    check_sources(plane, "selected_sources", sources)
    prompt = prompt_of(plane, text)
    length = len(prompt.ids)
    for position in sort_by_token_indexes:
        if not 0 <= position < length:
            raise InvalidInputError(
                f"sort_by_token_indexes: {position} is outside the prompt's {length} tokens"
            )
    keep = min(DEFAULT_NUM_RESULTS if num_results is None else num_results, MAX_NUM_RESULTS)
    rows: list[tuple[float, int, str, int, np.ndarray]] = []  # (key, order, source, index, values)
    for group in _groups(plane, sources, length):
        options = FeaturesOptions(tuple(group), top_k=1, dense=True, skip_error_norm=True)
        dense = (await features_of(plane, prompt, options, timeout)).activations
        assert dense is not None  # asked for
        for source, activations in zip(group, dense, strict=True):
            acts = activations.T.copy()  # (S, T)
            if ignore_bos:
                acts[:, 0] = 0
            by = list(sort_by_token_indexes)
            key = acts[:, by].sum(1) if by else acts.max(1)
            for index in np.argsort(-key, kind="stable")[:keep]:
                rows.append((float(key[index]), len(rows), source, int(index), acts[index]))
    rows.sort(key=lambda row: (-row[0], row[1]))
    return {
        "activations": [
            {
                "source": source,
                "index": index,
                "values": values.tolist(),
                "sum_values": float(values[list(sort_by_token_indexes)].sum()),
                "max_value": float(values.max()),
                "max_value_index": int(values.argmax()),
            }
            for _, _, source, index, values in rows[:keep]
        ],
        "tokens": prompt.tokens,
    }


def _groups(plane: DataPlane, sources: list[str], length: int) -> list[list[str]]:
    """The sources in runs of one width whose dense activations (float32, `length`
    positions) weigh at most GROUP_BYTES: one model run serves each run."""
    groups: list[list[str]] = []
    for source in sources:
        width = plane.view.saes[source].d_sae
        room = max(1, GROUP_BYTES // (width * length * 4))
        last = groups[-1] if groups else None
        if last and plane.view.saes[last[0]].d_sae == width and len(last) < room:
            last.append(source)
        else:
            groups.append([source])
    return groups


def _set_of(name: str) -> str | None:
    """The source set of an SAE named LAYER-SET (Neuronpedia's ids), else None."""
    layer, _, rest = name.partition("-")
    return rest if layer.isdigit() and rest else None


def _layer_first(name: str) -> tuple[int, str]:
    layer = name.partition("-")[0]
    return (int(layer) if layer.isdigit() else -1, name)
