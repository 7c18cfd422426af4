"""`python -m perf BENCHMARK` (peers, oip, perf-analyzer, families, sizes, readouts,
features, interventions, generate, together, long, graphs, repository, ray, containers,
report), from the repository's root with attnserve installed (`make install`): `make
benchmarks` runs `report`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnserve.bench.default_model import model_dir_or_default
from attnserve.bench.results import progress
from perf.peer_env import PEERS_VENV
from perf.perf_analyzer import TOOLS


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="python -m perf", description=__doc__)
    commands = root.add_subparsers(dest="command", required=True, metavar="BENCHMARK")
    peers = commands.add_parser(
        "peers",
        help="attnserve beside KServe's model server, MLServer and PyTriton on the same graphs: "
        "latency, full maps against the runtime plus an echo, saturated mixed lengths, an "
        "open loop, SmolLM2-135M's 1024-token map",
    )
    peers.add_argument(
        "--no-big-map", action="store_true", help="skip SmolLM2-135M's map (a minute to import)"
    )
    peers.add_argument("--duration", type=float, default=10.0, help="seconds per loaded run")
    peers.add_argument("--rounds", type=int, default=3, help="saturation rounds (medians)")
    peers.add_argument("--blocks", type=int, default=5, help="alternating latency blocks")
    oip = commands.add_parser(
        "oip",
        help="the Open Inference Protocol (KServe V2) beside Encode; attention through "
        "shared memory against the runtime",
    )
    oip.add_argument("--blocks", type=int, default=5, help="alternating blocks")
    commands.add_parser(
        "perf-analyzer", help=f"Triton's perf_analyzer against the V2 endpoint ({TOOLS})"
    )
    families = commands.add_parser(
        "families",
        help="SmolLM2-135M's and Pythia-160M's shapes: ONNX Runtime against transformers eager "
        "across lengths, the server end to end; importing a 0.5B model",
    )
    families.add_argument(
        "--quick", action="store_true", help="two layers, three lengths, no 0.5B import (smoke)"
    )
    families.add_argument(
        "--second-round",
        nargs="*",
        metavar="SHAPE",
        help="instead: gemma-2-2b's, Llama-3.2-1B's, Qwen3-0.6B's and gemma-3-1b's shapes (or "
        "those named): import, serve, ORT against eager at T = 8, 128, 1024",
    )
    sizes = commands.add_parser(
        "sizes",
        help="checkpoints in 0.5B to 9B models' shapes: import and serve memory and time "
        "beside transformers' own load and forward",
    )
    sizes.add_argument("--shapes", nargs="*", help="a subset of the shapes (default: all)")
    sizes.add_argument("--quick", action="store_true", help="a few-MB model instead (smoke)")
    readouts = commands.add_parser(
        "readouts",
        help="SmolLM2-135M's shape: the logit lens, predictions, hidden states and a head mask "
        "beside the embeddings alone; a plain request before and after",
    )
    readouts.add_argument(
        "--ref", default="7f71806", help="the commit to compare a plain request with"
    )
    readouts.add_argument("--repeats", type=int, default=20, help="calls per block")
    features = commands.add_parser(
        "features",
        help="gemma-2-2b's shape: SAE features per width and of every layer beside the plain "
        "request, memory with a 16k SAE per layer; a plain request before and after",
    )
    features.add_argument(
        "--ref", default="bba3bb5", help="the commit to compare a plain request with"
    )
    features.add_argument("--repeats", type=int, default=10, help="calls per block")
    features.add_argument(
        "--llama-8b",
        action="store_true",
        help="Llama-3.1-8B's shape in int8 with a 32k Llama Scope-shaped SAE instead",
    )
    generate = commands.add_parser(
        "generate",
        help="generation on TinyLlama-1.1B's shape: attnserve float32 and int8, one request "
        "and 8 at once, beside onnxruntime-genai and transformers' generate",
    )
    generate.add_argument(
        "--ref", default="e2a94b1", help="the commit before generation (a plain Encode's peer)"
    )
    generate.add_argument("--repeats", type=int, default=3, help="runs per engine (medians)")
    generate.add_argument("--quick", action="store_true", help="a two-layer model (smoke)")
    long = commands.add_parser(
        "long",
        help="Llama-3.2-1B's shape at 1k-8k tokens: the embeddings alone, the attention "
        "statistics by query blocks, transformers' eager attention where it fits",
    )
    long.add_argument("--quick", action="store_true", help="a two-layer model (smoke)")
    together = commands.add_parser(
        "together",
        help="SmolLM2-135M's shape: Encodes while texts generate and texts while Encodes "
        "arrive, this checkout's engine against --ref's two schedulers",
    )
    together.add_argument(
        "--ref", default="ed4f6bb", help="the commit before the engine (two schedulers)"
    )
    together.add_argument("--rounds", type=int, default=3, help="alternating rounds (medians)")
    together.add_argument("--quick", action="store_true", help="a two-layer model (smoke)")
    together.add_argument(
        "--one-export", action="store_true", help="both serve --ref's export (same graphs)"
    )
    long.add_argument("--lengths", type=int, nargs="+", help="instead of 1k, 2k, 4k and 8k")
    long.add_argument("--no-eager", action="store_true", help="without transformers' runs")
    interventions = commands.add_parser(
        "interventions",
        help="GPT-2 small's shape: activation patching grids in one call against "
        "TransformerLens' patching functions; a plain request before and after",
    )
    interventions.add_argument(
        "--ref", default="365f584", help="the commit to compare a plain request with"
    )
    interventions.add_argument("--repeats", type=int, default=1, help="calls per block")
    graphs = commands.add_parser(
        "graphs",
        help="attribution graphs on a Llama-shaped checkpoint with transcoders, against "
        "circuit-tracer 0.5.0 in its own environment",
    )
    graphs.add_argument("--rounds", type=int, default=2, help="alternating rounds (medians)")
    graphs.add_argument(
        "--case",
        choices=("llama-8", "gemma-2-2b"),
        default="llama-8",
        help="llama-8: against circuit-tracer; gemma-2-2b: its shape, attnserve alone",
    )
    repository = commands.add_parser(
        "repository",
        help="a second model loaded: its cost to the first; a reload under a closed loop",
    )
    repository.add_argument("--seconds", type=float, default=15.0, help="per closed loop")
    repository.add_argument("--blocks", type=int, default=3, help="alternating blocks")
    ray = commands.add_parser(
        "ray", help="Ray Serve's proxies against the direct server; two replicas against one"
    )
    ray.add_argument("--seconds", type=float, default=15.0, help="per closed loop")
    ray.add_argument("--blocks", type=int, default=3, help="alternating blocks")
    containers = commands.add_parser(
        "containers", help="the compose stack under load: host process vs 1 container vs 2 replicas"
    )
    containers.add_argument("--duration", type=float, default=10.0, help="seconds per load")
    for command in (peers, oip, commands.choices["perf-analyzer"], repository, ray):
        command.add_argument("--model", type=Path, help="model directory (default: the default)")
    report = commands.add_parser(
        "report", help="run every benchmark and regenerate docs/BENCHMARKS.md"
    )
    report.add_argument("--doc", type=Path, default=Path("docs/BENCHMARKS.md"))
    report.add_argument("--quick", action="store_true", help="short lengths and runs (smoke)")
    report.add_argument(
        "--render-only", action="store_true", help="rewrite the page from --out's existing results"
    )
    for command in commands.choices.values():
        command.add_argument(
            "--out", type=Path, default=Path("bench-results"), help="results folder (bench-results)"
        )
    return root


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "report":
        from perf.render import write_page
        from perf.suite import run_suite

        if not args.render_only:
            run_suite(args.out, args.quick)
        write_page(args.out, args.doc)
        progress(f"wrote {args.doc}")
        return 0
    if args.command == "families":
        from perf.families import run_families, run_second_round

        if args.second_round is not None:
            run_second_round(args.out, args.second_round or None, progress)
        else:
            run_families(args.out, args.quick, progress)
        return 0
    if args.command == "graphs":
        from perf.graphs import run_graphs

        run_graphs(args.out, args.rounds, args.case, progress)
        return 0
    if args.command == "sizes":
        from perf.sizes import run_sizes

        run_sizes(args.out, progress, args.shapes, args.quick)
        return 0
    if args.command == "readouts":
        from perf.readouts import run_readouts

        run_readouts(args.out, args.ref, args.repeats, progress)
        return 0
    if args.command == "features":
        from perf.features import run_features, run_llama_scope

        if args.llama_8b:
            run_llama_scope(args.out, 1, progress)
        else:
            run_features(args.out, args.ref, args.repeats, progress)
        return 0
    if args.command == "generate":
        from perf.generate import run_generate

        run_generate(args.out, args.ref, args.repeats, args.quick, progress)
        return 0
    if args.command == "together":
        from perf.together import run_together

        run_together(args.out, args.ref, args.rounds, args.quick, progress, args.one_export)
        return 0
    if args.command == "long":
        from perf.long import run_long

        lengths = tuple(args.lengths) if args.lengths else None
        run_long(args.out, args.quick, progress, lengths, not args.no_eager)
        return 0
    if args.command == "interventions":
        from perf.interventions import run_interventions

        run_interventions(args.out, args.ref, args.repeats, progress)
        return 0
    if args.command == "containers":
        from perf.containers import run_containers

        return 1 if run_containers(args.out, args.duration, progress).get("skipped") else 0
    with model_dir_or_default(args.model, progress) as model_dir:
        if args.command == "peers":
            from perf.peers import run_peers

            run_peers(
                args.out,
                model_dir,
                duration=args.duration,
                blocks=args.blocks,
                rounds=args.rounds,
                log=progress,
                big_map=not args.no_big_map,
            )
        elif args.command == "ray":
            from perf.ray_serve import run_ray

            run_ray(args.out, model_dir, args.blocks, args.seconds, progress)
        elif args.command == "repository":
            from perf.repository import run_repository

            run_repository(args.out, model_dir, args.blocks, args.seconds, progress)
        elif args.command == "oip":
            from perf.oip import run_oip

            run_oip(args.out, model_dir, PEERS_VENV, args.blocks, progress)
        else:
            from perf.perf_analyzer import run_perf_analyzer

            run_perf_analyzer(args.out, model_dir, TOOLS, progress)
    return 0


if __name__ == "__main__":
    sys.exit(main())
