"""An attribution graph as circuit-tracer 0.5.0 writes it (utils/create_graph_files.py,
frontend/graph_models.py): the pruned graph's nodes and links as its viewer and Neuronpedia
load them, field for field, and the unpruned graph under its Graph's names.

Node ids are circuit-tracer's, collisions included: a layer-0 feature f at position p and
layer f's error at p are both `0_f_p` (its viewer keys on jsNodeId, which differ).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from attnserve.service.circuits.attribute import Attribution
from attnserve.service.circuits.graph import AttributionGraph
from attnserve.service.circuits.influence import Pruned
from attnserve.service.core.errors import InvalidInputError

SCHEMA_VERSION = 1
JSON_NUMBER_BYTES, JSON_ZERO_BYTES = 24, 5  # a float32 as JSON writes it, "0.0, "
Decode = Callable[[list[int]], str]  # token ids -> text, special tokens written out


def _cantor(x: int, y: int) -> int:
    """circuit-tracer's feature number of (layer, feature): Cantor's pairing."""
    return (x + y) * (x + y + 1) // 2 + y


def _node(
    node_id: str, feature: int, layer: str, position: int, kind: str, js_id: str, **fields: Any
) -> dict[str, Any]:
    """A node with every field of circuit-tracer's Node, in its order, its defaults."""
    node: dict[str, Any] = {
        "node_id": node_id,
        "feature": feature,
        "layer": layer,
        "ctx_idx": position,
        "feature_type": kind,
        "token_prob": 0.0,
        "is_target_logit": False,
        "run_idx": 0,
        "reverse_ctx_idx": 0,
        "jsNodeId": js_id,
        "clerp": "",
        "influence": None,
        "activation": None,
    }
    return node | fields


def nodes(
    graph: AttributionGraph, kept: np.ndarray, cumulative: np.ndarray, decode: Decode
) -> dict[int, dict[str, Any]]:
    """The kept nodes by index, as circuit-tracer's create_nodes makes them."""
    made = {}
    for index in np.flatnonzero(kept).tolist():
        kind, layer, position, which = graph.node(index)
        influence = float(cumulative[index])
        if kind == "feature":
            made[index] = _node(
                f"{layer}_{which}_{position}",
                _cantor(layer, which),
                str(layer),
                position,
                "cross layer transcoder",
                f"{layer}_{which}-0",
                influence=influence,
                activation=float(graph.activation_values[graph.selected_features[index]]),
            )
        elif kind == "error":
            made[index] = _node(
                f"0_{layer}_{position}",
                -1,
                str(layer),
                position,
                "mlp reconstruction error",
                f"{layer}_{position}-0",
                influence=influence,
            )
        elif kind == "token":
            made[index] = _node(
                f"E_{which}_{position}",
                position,
                "E",
                position,
                "embedding",
                f"E_{which}-{position}",
                influence=influence,
            )
        else:
            k = index - (len(graph.adjacency_matrix) - len(graph.logit_targets))
            p = float(graph.logit_probabilities[k])
            made[index] = _node(
                f"{layer + 1}_{which}_{position}",
                which,
                str(layer + 1),
                position,
                "logit",
                f"L_{which}-{position}",
                token_prob=p,
                is_target_logit=k == 0,
                clerp=f'Output "{decode([which])}" (p={p:.3f})',
            )
    return made


def graph_file(
    graph: AttributionGraph,
    pruned: Pruned,
    decode: Decode,
    slug: str,
    scan: str,
    node_threshold: float,
) -> dict[str, Any]:
    """circuit-tracer's graph JSON (its create_graph_files' `{slug}.json`)."""
    made = nodes(graph, pruned.node_mask, pruned.cumulative_scores, decode)
    targets, sources = np.nonzero(pruned.edge_mask)  # row-major: by target, then source
    links = [
        {"source": made[s]["node_id"], "target": made[t]["node_id"], "weight": float(w)}
        for t, s, w in zip(
            targets.tolist(),
            sources.tolist(),
            graph.adjacency_matrix[targets, sources].tolist(),
            strict=True,
        )
        if s in made and t in made
    ]
    linked = {link["source"] for link in links} | {link["target"] for link in links}
    kept = [
        node
        for node in made.values()
        if node["node_id"] in linked or node["feature_type"] in ("embedding", "logit")
    ]
    tokens = graph.input_tokens.tolist()
    return {
        "metadata": {
            "slug": slug,
            "scan": scan,
            "transcoder_list": [],
            "prompt_tokens": [decode([t]) for t in tokens],
            "prompt": decode(tokens),
            "node_threshold": node_threshold,
            "schema_version": SCHEMA_VERSION,
        },
        "qParams": {
            "pinnedIds": [],
            "supernodes": [],
            "linkType": "both",
            "clickedId": "",
            "sg_pos": "",
        },
        "nodes": kept,
        "links": links,
    }


def unpruned(graph: AttributionGraph, decode: Decode) -> dict[str, Any]:
    """The unpruned graph under circuit-tracer's Graph field names (its to_pt's), as JSON:
    the adjacency as rows of lists, logit targets as (token, id) pairs."""
    return {
        "input_string": decode(graph.input_tokens.tolist()),
        "input_tokens": graph.input_tokens.tolist(),
        "logit_targets": [
            {"token_str": decode([t]), "vocab_idx": t} for t in graph.logit_targets.tolist()
        ],
        "logit_probabilities": graph.logit_probabilities.tolist(),
        "active_features": graph.active_features.tolist(),
        "activation_values": graph.activation_values.tolist(),
        "selected_features": graph.selected_features.tolist(),
        "adjacency_matrix": graph.adjacency_matrix.tolist(),
    }


def answer(
    done: Attribution,
    decode: Decode,
    slug: str,
    include_adjacency: bool = False,
    max_bytes: int | None = None,
) -> dict[str, Any]:
    """The graph file with `scores` (replacement, completeness), with its features' top
    tokens as `feature_logits` where the job found them (by jsNodeId), and, asked,
    `adjacency` (the unpruned graph, refused where its JSON would pass `max_bytes`): what
    every API answers."""
    options = done.options
    made = graph_file(done.graph, done.pruned, decode, slug, done.scan, options.node_threshold)
    replacement, completeness = done.scores
    made["scores"] = {"replacement": replacement, "completeness": completeness}
    if done.top_logits is not None:
        linked = {node["jsNodeId"] for node in made["nodes"]}
        made["feature_logits"] = {
            node: [
                {"token": decode([t]), "logit": v}
                for t, v in zip(tokens.tolist(), values.tolist(), strict=True)
            ]
            for node, (tokens, values) in done.top_logits.items()
            if node in linked
        }
    if include_adjacency:
        A = done.graph.adjacency_matrix
        nonzero = int(np.count_nonzero(A))
        size = nonzero * JSON_NUMBER_BYTES + (A.size - nonzero) * JSON_ZERO_BYTES
        if max_bytes is not None and size > max_bytes:
            raise InvalidInputError(
                f"include_adjacency: the unpruned graph of {len(A)} nodes is about "
                f"{size / 2**20:.0f} MiB of JSON, more than the server's "
                f"{max_bytes / 2**20:.0f} MiB messages: ask without it, or with fewer "
                "max_feature_nodes"
            )
        made["adjacency"] = unpruned(done.graph, decode)
    return made
