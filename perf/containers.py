"""`python -m perf containers`: the compose stack's encoder under load, side by side with
the same server as a host process, then scaled out to two replicas.

One run, one model file (the stack's own export), the same closed-loop loads for every
target:
  host process   attnserve serve on this machine
  1 container    the compose encoder through its published port
  2 containers   --scale encoder=2, gRPC round_robin over both published ports
Every server runs ORT with one thread, so that two replicas do not oversubscribe a
2-core machine, and the load generator runs on the host.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

from attnserve.bench.load import LoadGenerator, RequestKind, summarize
from attnserve.client import ClientOptions
from attnserve.service.process import spawn_server
from perf.compose import ComposeProject, find_engine, wait_serving

# (name, requests in flight, sequence lengths mixed uniformly)
LOADS = [("latency", 1, [16]), ("throughput", 16, [16, 128])]
THREADS = 1


def _measure(target_name: str, target: str, duration: float, round_robin: bool) -> list[dict]:
    rows = []
    for load, concurrency, lengths in LOADS:
        generator = LoadGenerator(
            target, [RequestKind(n) for n in lengths], ClientOptions(round_robin=round_robin)
        )
        records, elapsed = asyncio.run(generator.closed_loop(concurrency, duration, False))
        summary = summarize(records, elapsed, None, duration)
        rows.append(
            {
                "target": target_name,
                "load": load,
                "concurrency": concurrency,
                "lengths": lengths,
                "achieved_rate": summary["achieved_rate"],
                "p50_ms": summary["latency_ms"]["p50"],
                "p99_ms": summary["latency_ms"]["p99"],
                "errors": summary["errors"],
            }
        )
    return rows


def run_containers(out: Path, duration: float, log: Callable[[str], None]) -> dict:
    """Measure, write containers.json and containers.md into `out`, return the results."""
    out.mkdir(parents=True, exist_ok=True)
    engine, why_not = find_engine()
    results: dict = {"engine": engine, "threads": THREADS, "duration_s": duration, "rows": []}
    if engine is None:
        results["skipped"] = why_not
        log(f"containers: not run: {why_not}")
    else:
        project = ComposeProject.on_this_machine(
            engine, "attnserve-bench", ATTNSERVE_TAG="bench", ATTNSERVE_THREADS="1"
        )
        try:
            log(f"containers: building the images and starting the stack ({engine})...")
            project.compose("build", timeout=1800)
            project.compose("up", "-d", "encoder", timeout=900)
            (first,) = project.containers("encoder")
            container = project.published(first, 50051)
            wait_serving(container)
            host = spawn_server(
                project.volume_path("models") / "default", "--threads", str(THREADS)
            )
            try:
                wait_serving(host.address)
                log("containers: host process...")
                results["rows"] += _measure("host process", host.address, duration, False)
            finally:
                host.process.terminate()
                host.process.wait(30)
            log("containers: 1 container...")
            results["rows"] += _measure("1 container", container, duration, False)
            project.compose("up", "-d", "--scale", "encoder=2", "encoder", timeout=600)
            replicas = [project.published(n, 50051) for n in project.containers("encoder")]
            for address in replicas:
                wait_serving(address)
            log("containers: 2 containers...")
            both = "ipv4:" + ",".join(replicas)
            results["rows"] += _measure("2 containers", both, duration, True)
        finally:
            project.down()
    (out / "containers.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "containers.md").write_text(markdown(results))
    print(markdown(results))
    return results


def _row(results: dict, target: str, load: str) -> dict:
    return next(r for r in results["rows"] if (r["target"], r["load"]) == (target, load))


def markdown(results: dict) -> str:
    if results.get("skipped"):
        return f"Not run: {results['skipped']}.\n"
    lines = [
        "| target | load | in flight | lengths | req/s | p50 | p99 | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results["rows"]:
        lengths = ",".join(map(str, r["lengths"]))
        errors = sum(r["errors"].values())
        lines.append(
            f"| {r['target']} | {r['load']} | {r['concurrency']} | {lengths} "
            f"| {r['achieved_rate']:.0f} | {r['p50_ms']:.2f} ms | {r['p99_ms']:.2f} ms "
            f"| {errors} |"
        )
    return "\n".join(lines) + "\n"


def ratios(results: dict) -> dict[str, float]:
    """Container latency over host latency (p50, one in flight), and the throughput of two
    replicas over one."""
    host, one = _row(results, "host process", "latency"), _row(results, "1 container", "latency")
    single = _row(results, "1 container", "throughput")["achieved_rate"]
    double = _row(results, "2 containers", "throughput")["achieved_rate"]
    return {"container_latency": one["p50_ms"] / host["p50_ms"], "scale_out": double / single}
