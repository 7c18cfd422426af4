"""How far over the idle server a burst of long attention requests takes its memory, run after
run, and what one such request holds against what the memory budget reserves for it.

    .venv/bin/python research/burst-peak/measure.py --model models/default --runs 4 \
        --out bench-results/burst-peak [--variant NAME='--flag value ...']

Each run starts a fresh server (`attnserve serve`, the variant's flags), reads its RSS when
idle, sends 48 concurrent 1024-token requests for every layer's and head's weights (float16,
causal-packed) and samples the RSS every 10 ms (bench/attention.py's burst); then, alone,
one such request at a time. Variants alternate within each run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import onnx

from attnserve.bench.attention import BURST, BURST_LENGTH, BURST_REQUESTS, _burst, _rss_mib
from attnserve.bench.attention import _RssSampler as RssSampler
from attnserve.client import ClientOptions, EncoderClient, build_request
from attnserve.model.artifacts import CONFIG_METADATA_KEY
from attnserve.model.config import ModelConfig
from attnserve.model.tokenizer import ByteTokenizer
from attnserve.service.core.budget import request_bytes
from attnserve.service.core.plan import plan_request
from attnserve.service.core.view import ModelView
from attnserve.service.process import spawn_server
from attnserve.service.v1.options import inputs_of, options_of

MIB = 1024 * 1024


def reserved_mib(model_dir: Path, seq_len: int) -> float:
    """What the budget reserves for one request of the burst."""
    proto = onnx.load(str(model_dir / "model.onnx"), load_external_data=False)
    config = ModelConfig.from_json(
        next(p.value for p in proto.metadata_props if p.key == CONFIG_METADATA_KEY)
    )
    request = build_request([[1] * seq_len], **BURST)
    plan = plan_request(
        inputs_of(request), options_of(request.options), ModelView(config, ByteTokenizer(config))
    )
    return request_bytes(plan, config) / MIB


def one_run(model_dir: Path, flags: list[str]) -> dict:
    server = spawn_server(model_dir, *flags)
    try:
        pid = server.process.pid
        time.sleep(1.0)
        idle = _rss_mib(pid)
        sampler = RssSampler(pid)
        start = time.perf_counter()
        errors = asyncio.run(_burst(server.address, BURST_REQUESTS, BURST_LENGTH))
        seconds = time.perf_counter() - start
        burst_peak = sampler.stop()
        # one request at a time, after the burst's memory was given back
        time.sleep(15)
        before_one = _rss_mib(pid)
        sampler = RssSampler(pid)
        ids = np.random.default_rng(2).integers(1, 256, size=BURST_LENGTH).tolist()
        with EncoderClient(server.address, ClientOptions(timeout_s=600)) as client:
            client.encode([ids], **BURST)
        one_peak = sampler.stop()
    finally:
        server.process.terminate()
        server.process.wait(30)
    return {
        "errors": errors,
        "seconds": round(seconds, 1),
        "idle_mib": round(idle),
        "burst_over_idle_mib": round(burst_peak - idle),
        "one_over_idle_mib": round(one_peak - before_one),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", type=Path, default=Path("models/default"))
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path("bench-results/burst-peak"))
    parser.add_argument("--variant", action="append", default=[], help="NAME='--flag value'")
    args = parser.parse_args()
    variants = {"default": []} | {
        v.partition("=")[0]: shlex.split(v.partition("=")[2]) for v in args.variant
    }
    reserved = reserved_mib(args.model, BURST_LENGTH)
    print(f"the budget reserves {reserved:.0f} MiB per request", file=sys.stderr)
    rows = []
    for run in range(args.runs):
        for name, flags in variants.items():
            row = {"run": run, "variant": name, "flags": " ".join(flags)}
            row |= one_run(args.model, flags)
            print(json.dumps(row), file=sys.stderr)
            rows.append(row)
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"reserved_mib_per_request": round(reserved), "rows": rows}
    (args.out / "burst-peak.json").write_text(json.dumps(result, indent=1))
    print("| variant | run | errors | time | idle | burst peak - idle | one request peak - idle |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['variant']} | {r['run']} | {r['errors']} | {r['seconds']} s | "
            f"{r['idle_mib']} MiB | {r['burst_over_idle_mib']:+d} MiB | "
            f"{r['one_over_idle_mib']:+d} MiB |"
        )


if __name__ == "__main__":
    main()
