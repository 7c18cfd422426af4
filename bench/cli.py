"""`attnserve bench {latency,endpoints,attention,load,peers,oip,perf-analyzer,containers,
report}`: benchmarks and the load generator."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnserve.model.config import ModelConfig

PERF_ANALYZER_TOOLS = Path(".tools/perf_analyzer")  # the binary and its libraries, made once


def add_commands(root: argparse._SubParsersAction) -> None:
    parser = root.add_parser(
        "bench",
        help="benchmarks and the load generator",
        description="attnserve benchmarks and load generator",
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
    load = commands.add_parser("load", help="load-test a running server (open or closed loop)")
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

    peers = commands.add_parser(
        "peers",
        help="attnserve beside KServe's model server on the same graphs: latency, "
        "saturated mixed lengths, an open loop",
    )
    peers.add_argument("--out", type=Path, required=True, help="for peers.json/.md")
    peers.add_argument("--model", type=Path, help="model directory (default: the default model)")
    peers.add_argument(
        "--venv",
        type=Path,
        default=Path(".venv-peers"),
        help="KServe's own virtual environment, made on first use (.venv-peers)",
    )
    peers.add_argument("--duration", type=float, default=10.0, help="seconds per loaded run")
    peers.add_argument("--rounds", type=int, default=3, help="saturation rounds (medians)")
    peers.add_argument("--blocks", type=int, default=5, help="alternating latency blocks")

    oip = commands.add_parser(
        "oip",
        help="the Open Inference Protocol (KServe V2) beside Encode; attention through "
        "shared memory against the runtime",
    )
    oip.add_argument("--out", type=Path, required=True, help="for oip.json/.md")
    oip.add_argument("--model", type=Path, help="model directory (default: the default model)")
    oip.add_argument("--venv", type=Path, default=Path(".venv-peers"), help="tritonclient's")
    oip.add_argument("--blocks", type=int, default=5, help="alternating blocks")

    perf = commands.add_parser(
        "perf-analyzer",
        help="Triton's perf_analyzer against the V2 endpoint (fetched into --tools once)",
    )
    perf.add_argument("--out", type=Path, required=True, help="for perf_analyzer.json/.md")
    perf.add_argument("--model", type=Path, help="model directory (default: the default model)")
    perf.add_argument("--tools", type=Path, default=PERF_ANALYZER_TOOLS, help="its files")

    containers = commands.add_parser(
        "containers",
        help="the compose stack under load: host process vs 1 container vs 2 replicas",
    )
    containers.add_argument("--out", type=Path, required=True, help="for containers.json/.md")
    containers.add_argument("--duration", type=float, default=10.0, help="seconds per load")

    report = commands.add_parser(
        "report", help="run every benchmark and regenerate docs/BENCHMARKS.md"
    )
    report.add_argument("--out", type=Path, default=Path("bench-results"), help="raw results")
    report.add_argument("--doc", type=Path, default=Path("docs/BENCHMARKS.md"))
    report.add_argument("--quick", action="store_true", help="short lengths and runs (smoke)")
    report.add_argument(
        "--render-only", action="store_true", help="rewrite the page from --out's existing results"
    )
    parser.set_defaults(run=run_bench)


def run_bench(args: argparse.Namespace) -> int:
    command = args.bench_command
    if command == "report":
        from attnserve.bench.render import write_page

        if not args.render_only:
            from attnserve.bench.suite import run_suite

            run_suite(args.out, args.quick)
        write_page(args.out, args.doc)
        print(f"wrote {args.doc}", file=sys.stderr)
        return 0
    if command == "containers":
        from attnserve.bench.containers import run_containers
        from attnserve.bench.results import progress

        results = run_containers(args.out, args.duration, progress)
        return 1 if results.get("skipped") else 0
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
    # The rest serve a model directory: the one given, or the default model.
    from attnserve.bench.default_model import model_dir_or_default
    from attnserve.bench.results import progress

    with model_dir_or_default(args.model, progress) as model_dir:
        if command == "peers":
            from attnserve.bench.peers import run_peers

            run_peers(
                args.out, model_dir, args.venv, args.duration, args.blocks, args.rounds, progress
            )
        elif command == "oip":
            from attnserve.bench.oip import run_oip

            run_oip(args.out, model_dir, args.venv, args.blocks, progress)
        elif command == "perf-analyzer":
            from attnserve.bench.perf_analyzer import run_perf_analyzer

            run_perf_analyzer(args.out, model_dir, args.tools, progress)
        else:
            from attnserve.bench.endpoints import run_endpoints

            run_endpoints(args.out, model_dir, log=progress)
    return 0
