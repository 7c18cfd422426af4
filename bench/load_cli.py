"""`attnserve bench load`: turns flags into a LoadGenerator run and a JSON report."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time

import httpx
import numpy as np

from attnserve.bench.load import (
    LoadGenerator,
    RequestKind,
    find_max_rate,
    load_spec,
    records_json,
    summarize,
)
from attnserve.client import ClientOptions, EncoderClient


def _rates(args: argparse.Namespace) -> list[float] | None:
    if args.rates:
        return [float(r) for r in args.rates.split(",")]
    if args.ramp:
        start, stop, step = (float(x) for x in args.ramp.split(":"))
        return [float(r) for r in np.arange(start, stop + step / 2, step)]
    return None


def _print_summary(summary: dict) -> None:
    lat, server = summary["latency_ms"], summary["server_ms"]["total"]
    print(
        f"{summary['ok']}/{summary['requests']} ok in {summary['elapsed_s']:.1f}s, "
        f"achieved {summary['achieved_rate']:.1f} req/s"
        + (f" (offered {summary['offered_rate']:g})" if summary["offered_rate"] else "")
    )
    if lat:
        print("latency ms: " + ", ".join(f"{k} {v:.2f}" for k, v in lat.items()))
        if server:
            print("server-side total ms: " + ", ".join(f"{k} {v:.2f}" for k, v in server.items()))
    if summary["errors"]:
        print("errors: " + ", ".join(f"{k} {v}" for k, v in summary["errors"].items()))


def _wait_ready(target: str, protocol: str, options: ClientOptions, timeout: float) -> None:
    """Until the target reports SERVING: the gRPC health service, or GET /health."""
    if protocol == "grpc":
        with EncoderClient(target, options) as client:
            client.wait_until_serving(timeout=timeout)
        return
    end = time.monotonic() + timeout
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(target.rstrip("/") + "/health", timeout=2).status_code == 200:
                return
        if time.monotonic() >= end:
            raise TimeoutError(f"server not SERVING after {timeout:.0f}s")
        time.sleep(0.1)


def run_load(args: argparse.Namespace) -> int:
    try:
        if args.spec:
            mix = load_spec(args.spec)
        else:
            mix = [RequestKind(int(t), args.attention) for t in args.lengths.split(",")]
        rates = _rates(args)
    except (OSError, ValueError, TypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    options = ClientOptions(
        tls_root_cert=args.tls_root_cert, token=args.token, round_robin=args.round_robin
    )
    if args.wait_ready > 0:
        try:
            _wait_ready(args.target, args.protocol, options, args.wait_ready)
        except TimeoutError as exc:
            print(f"error: {args.target}: {exc}", file=sys.stderr)
            return 1
    try:
        generator = LoadGenerator(
            args.target, mix, options, args.seed, args.timeout, protocol=args.protocol
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    report: dict = {
        "target": args.target,
        "protocol": args.protocol,
        "mode": args.mode,
        "mix": [vars(k) for k in mix],
    }
    if rates:
        report["search"] = find_max_rate(
            generator, rates, args.duration, args.p99_target_ms, max_in_flight=args.max_in_flight
        )
        best = report["search"]["max_rate_within_target"]
        print(
            f"highest rate with p99 <= {args.p99_target_ms:g} ms: "
            + (f"{best:g} req/s" if best is not None else "none of those tried")
        )
    else:
        if args.mode == "open":
            run = generator.open_loop(args.rate, args.duration, args.max_in_flight)
        else:
            run = generator.closed_loop(args.concurrency, args.duration)
        records, elapsed = asyncio.run(run)
        open_loop = args.mode == "open"
        summary = summarize(records, elapsed, args.rate if open_loop else None, args.duration)
        _print_summary(summary)
        report["summary"] = summary
        report["records"] = records_json(records)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0
