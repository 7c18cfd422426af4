"""Attention on the wire: what each option costs, and what a burst of long requests does
to the server's memory.

`modes`: per attention option at T = 512 and 1024, the answer's bytes and gRPC Encode
(decoded by the client) against the runtime alone (the full graph in-process),
alternating. `burst`: 48 concurrent 1024-token requests of every layer's and head's
weights (float16 causal-packed) against a server process, with and without the
memory budget: its RSS before, at the peak and ten seconds after, errors and time.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from pathlib import Path

import grpc
import numpy as np

from attnserve.bench.results import progress, save
from attnserve.bench.timing import alternate
from attnserve.client import AsyncEncoderClient, ClientOptions, EncoderClient
from attnserve.service.ort.runtime import OrtRuntime
from attnserve.service.process import spawn_server
from attnserve.service.settings import Settings

F16_PACKED = dict(attention=True, attention_dtype="float16", attention_layout="causal-packed")
MODES = {  # every layer and head, then reduced as named
    "all heads, f32 full": dict(attention=True),
    "all heads, f16 packed": F16_PACKED,
    "last row": dict(rows=[-1]),
    "head mean": dict(head_reduction="mean"),
    "rollout": dict(rollout=True),
    "top-k 8": dict(top_k=8),
    "entropy only": dict(head_entropy=True, omit_weights=True),
}
BURST = F16_PACKED
BURST_VARIANTS = {  # name: extra `attnserve serve` flags
    "no budget": ["--max-inflight-bytes", "0", "--release-memory", "false"],
    "budget 1 GiB": ["--release-memory", "false"],
    "budget 1 GiB + release memory (default)": [],
}
# How long after the burst the RSS is read again: past the server's idle wait before it
# gives memory back, with time for the release itself.
AFTER_S = Settings.release_after_idle_s + 5.0
BURST_REQUESTS, BURST_LENGTH = 48, 1024


def measure_modes(model_dir: Path, lengths: list[int], quick: bool, log) -> list[dict]:
    runtime = OrtRuntime(model_dir)
    server = spawn_server(model_dir)
    rows = []
    try:
        client = EncoderClient(server.address, ClientOptions(timeout_s=600))
        rng = np.random.default_rng(0)
        for t in lengths:
            ids = rng.integers(1, runtime.config.vocab_size, size=(1, t), dtype=np.int64)
            sequence = ids[0].tolist()
            calls = {"runtime": lambda ids=ids: runtime.run(ids)}
            for name, options in MODES.items():
                calls[name] = lambda o=options, s=sequence: client.encode([s], **o)
            samples, skipped = alternate(
                calls, least=3 if quick else 9, most=3 if quick else 30, skip_on=grpc.RpcError
            )
            runtime_ms = 1e3 * statistics.median(samples["runtime"])
            for name, options in MODES.items():
                if name in skipped:  # float32 full at 1024 is over the message limit
                    log(f"  {t} tokens, {name}: refused by the server, not measured")
                    continue
                p50 = 1e3 * statistics.median(samples[name])
                wire = client.encode([sequence], **options).wire_bytes
                rows.append(
                    {
                        "seq_len": t,
                        "mode": name,
                        "response_bytes": wire,
                        "grpc_p50_ms": round(p50, 2),
                        "runtime_p50_ms": round(runtime_ms, 2),
                        "ratio_to_runtime": round(p50 / runtime_ms, 2),
                    }
                )
                log(
                    f"  {t} tokens, {name}: {wire / 1e6:.2f} MB, {p50:.1f} ms "
                    f"({p50 / runtime_ms:.2f}x the runtime's {runtime_ms:.1f} ms)"
                )
        client.close()
    finally:
        server.process.terminate()
        server.process.wait(30)
    return rows


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


class _RssSampler:
    """The peak RSS of a process, sampled every 10 ms on a thread."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak = pid, _rss_mib(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, _rss_mib(self.pid))

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak


def measure_burst(model_dir: Path, requests: int, seq_len: int, log) -> list[dict]:
    rows = []
    for name, extra in BURST_VARIANTS.items():
        server = spawn_server(model_dir, *extra)
        try:
            pid = server.process.pid
            baseline = _rss_mib(pid)
            sampler = _RssSampler(pid)
            start = time.perf_counter()
            errors = asyncio.run(_burst(server.address, requests, seq_len))
            seconds = time.perf_counter() - start
            peak = sampler.stop()
            time.sleep(AFTER_S)
            after = _rss_mib(pid)
        finally:
            server.process.terminate()
            server.process.wait(30)
        rows.append(
            {
                "variant": name,
                "flags": " ".join(extra),
                "requests": requests,
                "seq_len": seq_len,
                "errors": errors,
                "seconds": round(seconds, 2),
                "baseline_mib": round(baseline),
                "peak_mib": round(peak),
                "after_mib": round(after),
                "peak_over_baseline_mib": round(peak - baseline),
                "after_over_baseline_mib": round(after - baseline),
            }
        )
        log(
            f"  burst {requests} x {seq_len}, {name}: {errors} errors, {seconds:.1f} s, RSS "
            f"{baseline:.0f} -> peak {peak:.0f} -> {after:.0f} MiB {AFTER_S:.0f} s after"
        )
    return rows


async def _burst(address: str, requests: int, seq_len: int) -> int:
    rng = np.random.default_rng(1)
    async with AsyncEncoderClient(address, ClientOptions(timeout_s=900, retries=0)) as client:
        calls = [
            client.encode([rng.integers(1, 256, size=seq_len).tolist()], **BURST)
            for _ in range(requests)
        ]
        answers = await asyncio.gather(*calls, return_exceptions=True)
    return sum(isinstance(a, BaseException) for a in answers)


def markdown(result: dict) -> str:
    lines = [
        "| seq len | attention | response bytes | gRPC Encode p50 | runtime alone p50 | ratio |",
        "|---|---|---|---|---|---|",
    ]
    for r in result["modes"]:
        lines.append(
            f"| {r['seq_len']} | {r['mode']} | {r['response_bytes'] / 1e6:.2f} MB | "
            f"{r['grpc_p50_ms']:.1f} ms | {r['runtime_p50_ms']:.1f} ms | "
            f"{r['ratio_to_runtime']:.2f}x |"
        )
    lines += [
        "",
        f"| server | errors | time | RSS before | peak | {AFTER_S:g} s after | peak - before "
        "| after - before |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["burst"]:
        lines.append(
            f"| {r['variant']} | {r['errors']} | {r['seconds']:.1f} s | {r['baseline_mib']} MiB "
            f"| {r['peak_mib']} MiB | {r['after_mib']} MiB | {r['peak_over_baseline_mib']:+d} MiB "
            f"| {r['after_over_baseline_mib']:+d} MiB |"
        )
    return "\n".join(lines)


def run_attention(out: Path, model_dir: Path, quick: bool) -> dict:
    lengths = [64] if quick else [512, 1024]
    result = {
        "modes": measure_modes(model_dir, lengths, quick, progress),
        "burst": measure_burst(
            model_dir, 4 if quick else BURST_REQUESTS, 64 if quick else BURST_LENGTH, progress
        ),
    }
    save(out, "attention", result, markdown(result))
    return result
