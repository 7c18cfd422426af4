"""Attribution graphs from the client's side: a GraphRequest of circuit-tracer's arguments,
and its answer (the graph file as a dict, as circuit-tracer writes it, with its scores)."""

from __future__ import annotations

import json

from attnserve.client.request import Input
from attnserve.v1 import encoder_service_pb2 as pb


def build_graph_request(
    prompt: Input,
    transcoders: str,
    *,
    model: str = "",
    max_n_logits: int | None = None,
    desired_logit_prob: float | None = None,
    max_feature_nodes: int | None = None,
    batch_size: int | None = None,
    update_interval: int | None = None,
    node_threshold: float | None = None,
    edge_threshold: float | None = None,
    slug: str = "",
    include_adjacency: bool = False,
    top_logits: int = 0,
) -> pb.GraphRequest:
    """A GraphRequest: the prompt a text or its token ids; None: circuit-tracer's default.
    top_logits: each feature's tokens its decoder raises most, as "feature_logits"."""
    request = pb.GraphRequest(
        model=model,
        transcoders=transcoders,
        slug=slug,
        include_adjacency=include_adjacency,
        top_logits=top_logits,
    )
    if isinstance(prompt, str):
        request.prompt.text = prompt
    else:
        request.prompt.token_ids.ids.extend(int(i) for i in prompt)
    knobs = {
        "max_n_logits": max_n_logits,
        "desired_logit_prob": desired_logit_prob,
        "max_feature_nodes": max_feature_nodes,
        "batch_size": batch_size,
        "update_interval": update_interval,
        "node_threshold": node_threshold,
        "edge_threshold": edge_threshold,
    }
    for name, value in knobs.items():
        if value is not None:
            setattr(request, name, value)
    return request


def parse_graph(result: pb.GraphResult) -> dict:
    """circuit-tracer's graph file (metadata, qParams, nodes, links), with `scores` and,
    where it came, `adjacency` (the unpruned graph)."""
    graph = json.loads(result.graph_json)
    graph["scores"] = {
        "replacement": result.replacement_score,
        "completeness": result.completeness_score,
    }
    if result.adjacency_json:
        graph["adjacency"] = json.loads(result.adjacency_json)
    return graph
