"""`attnserve bench {latency,endpoints,attention,load}`: what a user points at their own model
or deployment. (The suite behind docs/BENCHMARKS.md, with the peers, runs from a checkout:
`python -m perf`.)"""

from __future__ import annotations

import argparse
from pathlib import Path

from attnserve.model.config import ModelConfig


def add_commands(root: argparse._SubParsersAction) -> None:
    parser = root.add_parser(
        "bench",
        help="the load generator; latency, endpoint and attention costs of a model",
        description="The load generator, and what a model costs on this machine. (The suite "
        "behind docs/BENCHMARKS.md, with the peers, runs from a checkout: python -m perf)",
    )
    commands = parser.add_subparsers(dest="bench_command", required=True, metavar="BENCHMARK")
    latency = commands.add_parser(
        "latency", help="every engine's latency across sequence lengths and batch sizes"
    )
    latency.add_argument(
        "--out", type=Path, required=True, help="directory for latency.json/.csv/.md/.png"
    )
    latency.add_argument(
        "--max-seq-len", type=int, help="longest length to sweep (default: model's)"
    )
    latency.add_argument("--batch-sizes", default="1,8", help="comma-separated (default 1,8)")
    latency.add_argument("--engines", help="comma-separated subset (default: all that work here)")
    latency.add_argument("--quick", action="store_true", help="few repeats, for smoke tests")

    endpoints = commands.add_parser(
        "endpoints", help="one request at a time through gRPC, HTTP and V2 vs the runtime alone"
    )
    endpoints.add_argument("--out", type=Path, required=True, help="for endpoints.json/.md")
    endpoints.add_argument("--model", type=Path, help="model directory (default: the default)")
    attention = commands.add_parser(
        "attention",
        help="each attention option's bytes and time on the wire; RSS under a burst",
    )
    attention.add_argument("--out", type=Path, required=True, help="for attention.json/.md")
    attention.add_argument("--model", type=Path, required=True, help="model directory")
    attention.add_argument("--quick", action="store_true", help="short lengths (smoke)")
    _load_arguments(
        commands.add_parser("load", help="load-test a running server (open or closed loop)")
    )
    parser.set_defaults(run=run_bench)


def _load_arguments(load: argparse.ArgumentParser) -> None:
    load.add_argument(
        "--target",
        required=True,
        help="HOST:PORT of the gRPC server; with --protocol http the base URL (http://HOST:8080)",
    )
    load.add_argument(
        "--protocol",
        choices=["grpc", "http"],
        default="grpc",
        help="grpc: EncoderService.Encode; http: POST /v1/embeddings (embeddings only)",
    )
    load.add_argument(
        "--mode",
        choices=["open", "closed"],
        default="open",
        help="open: Poisson arrivals at --rate; closed: --concurrency in flight",
    )
    load.add_argument("--rate", type=float, default=20.0, help="requests/s (open loop)")
    load.add_argument("--concurrency", type=int, default=8, help="requests in flight (closed)")
    load.add_argument("--duration", type=float, default=10.0, help="seconds per run or step")
    load.add_argument(
        "--lengths",
        default="16,128",
        help="comma-separated sequence lengths, mixed uniformly (default 16,128)",
    )
    load.add_argument(
        "--attention",
        choices=["none", "float32-full", "float16-packed"],
        default="none",
        help="attention asked of every request",
    )
    load.add_argument(
        "--spec",
        type=Path,
        help='JSON mix instead: [{"seq_len": 16, "attention": "none", "weight": 3}]',
    )
    steps = load.add_mutually_exclusive_group()
    steps.add_argument("--rates", help="step schedule: comma-separated rates to try in order")
    steps.add_argument("--ramp", help="ramp schedule START:STOP:STEP in requests/s")
    load.add_argument(
        "--p99-target-ms",
        type=float,
        default=100.0,
        help="with --rates/--ramp: the p99 a rate must stay under",
    )
    load.add_argument(
        "--max-in-flight",
        type=int,
        default=0,
        help="open loop: cap on outstanding requests (0: none)",
    )
    load.add_argument("--timeout", type=float, default=30.0, help="deadline per request (s)")
    load.add_argument("--seed", type=int, default=0)
    load.add_argument("--tls-root-cert", type=Path, help="PEM roots: connect with TLS")
    load.add_argument("--token", help="bearer token, if the server asks for one")
    load.add_argument(
        "--round-robin",
        action="store_true",
        help="spread requests over every address the target's DNS name resolves to",
    )
    load.add_argument(
        "--wait-ready",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="first wait up to this long for the target to report SERVING (0: don't)",
    )
    load.add_argument("--out", type=Path, help="write the report (and every request) as JSON")


def run_bench(args: argparse.Namespace) -> int:
    command = args.bench_command
    if command == "attention":
        from attnserve.bench.attention import run_attention

        run_attention(args.out, args.model, args.quick)
        return 0
    if command == "load":
        from attnserve.bench.load_cli import run_load  # grpc client only: no torch needed

        return run_load(args)
    if command == "latency":
        from attnserve.bench.latency import run_latency  # torch import deferred past --help

        run_latency(
            args.out,
            ModelConfig(),
            args.max_seq_len,
            [int(b) for b in args.batch_sizes.split(",")],
            args.quick,
            args.engines.split(",") if args.engines else None,
        )
        return 0
    from attnserve.bench.default_model import model_dir_or_default  # endpoints
    from attnserve.bench.endpoints import run_endpoints
    from attnserve.bench.results import progress

    with model_dir_or_default(args.model, progress) as model_dir:
        run_endpoints(args.out, model_dir, log=progress)
    return 0
