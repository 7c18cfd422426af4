"""`attnserve graph`: circuit-tracer's attribution graph of a prompt, computed by the server
with a transcoder set, written as circuit-tracer's graph file (its viewer and Neuronpedia
load it), with a progress line on stderr while the server works."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from attnserve.client.client import EncoderClient

# the whole call's default: a graph takes minutes where a call of the other commands
# takes seconds (--timeout)
GRAPH_TIMEOUT_S = 3600.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--text", help="the prompt (a special token is put first)")
    source.add_argument("--ids", help="the prompt's comma-separated token ids")
    parser.add_argument(
        "--transcoders", required=True, help="a transcoder set added with `attnserve sae add`"
    )
    parser.add_argument("--out", type=Path, default=Path("graph.json"), help="the graph file")
    parser.add_argument("--slug", default="graph", help="the graph's name in its metadata")
    knobs = parser.add_argument_group("circuit-tracer's arguments (unset: its defaults)")
    knobs.add_argument("--max-n-logits", type=int, help="logit targets at most (10)")
    knobs.add_argument("--desired-logit-prob", type=float, help="their probability (0.95)")
    knobs.add_argument("--max-feature-nodes", type=int, help="features visited (all)")
    knobs.add_argument("--batch-size", type=int, help="rows per backward pass (512)")
    knobs.add_argument("--node-threshold", type=float, help="pruning's nodes (0.8)")
    knobs.add_argument("--edge-threshold", type=float, help="pruning's edges (0.98)")
    parser.add_argument(
        "--include-adjacency", action="store_true", help="also the unpruned graph, in the file"
    )
    parser.add_argument(
        "--graph-timeout", type=float, default=GRAPH_TIMEOUT_S, help="seconds for the graph"
    )


def run(client: EncoderClient, args: argparse.Namespace) -> int:
    prompt = args.text if args.text is not None else [int(i) for i in args.ids.split(",")]
    started = time.monotonic()

    def progress(rows: int, total: int) -> None:
        elapsed = time.monotonic() - started
        left = f", ~{elapsed * (total - rows) / rows:.0f} s left" if rows else ""
        print(f"\rattribution: {rows}/{total} rows{left}   ", end="", file=sys.stderr)

    graph = client.graph(
        prompt,
        args.transcoders,
        timeout=args.graph_timeout,
        progress=progress,
        model=args.model,
        max_n_logits=args.max_n_logits,
        desired_logit_prob=args.desired_logit_prob,
        max_feature_nodes=args.max_feature_nodes,
        batch_size=args.batch_size,
        node_threshold=args.node_threshold,
        edge_threshold=args.edge_threshold,
        slug=args.slug,
        include_adjacency=args.include_adjacency,
    )
    scores = graph["scores"]
    args.out.write_text(json.dumps(graph))
    print(
        f"\rwrote {args.out}: {len(graph['nodes'])} nodes, {len(graph['links'])} links; "
        f"replacement {scores['replacement']:.3f}, completeness {scores['completeness']:.3f} "
        f"({time.monotonic() - started:.1f} s)",
        file=sys.stderr,
    )
    return 0
