"""Load generator for any attnserve deployment: open loop (Poisson) or closed loop.

Open loop sends on a precomputed Poisson schedule and measures every latency
from the request's *intended* send time, so a stalled server (or a client
held back by --max-in-flight) cannot hide its queueing: the coordinated
omission of closed-loop tools. Closed loop keeps a fixed number of requests
in flight, for throughput at a given concurrency. A step or ramp schedule of
rates finds the highest rate whose p99 stays under a target.

`protocol="grpc"` calls EncoderService.Encode; `protocol="http"` posts the same
token ids to the OpenAI-compatible `/v1/embeddings` (embeddings only; the
target is then a base URL such as http://host:8080).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc
import httpx
import numpy as np
from tqdm import tqdm

from attnserve.client import ClientOptions, build_request
from attnserve.v1 import encoder_service_pb2 as pb
from attnserve.v1 import encoder_service_pb2_grpc as pb_grpc

ATTENTION_CHOICES = {
    "none": {},
    "float32-full": {"attention": True},
    "float16-packed": {
        "attention": True,
        "attention_dtype": "float16",
        "attention_layout": "causal-packed",
    },
}
PERCENTILES = {"p50": 50, "p90": 90, "p99": 99, "p99.9": 99.9}
PROTOCOLS = ("grpc", "http")
# One request of the mix: its status ("OK", a gRPC code name or HTTP_<status>) and, when the
# answer carries them, the server's timings (queue, inference, total) in ms.
Send = Callable[[int], Awaitable[tuple[str, tuple[float, float, float] | None]]]


@dataclass(frozen=True)
class RequestKind:
    """One kind of request in the mix."""

    seq_len: int
    attention: str = "none"  # a key of ATTENTION_CHOICES
    weight: float = 1.0  # relative frequency in the mix

    def __post_init__(self) -> None:
        if self.seq_len < 1:
            raise ValueError(f"seq_len must be >= 1, got {self.seq_len}")
        if self.attention not in ATTENTION_CHOICES:
            raise ValueError(f"attention must be one of {list(ATTENTION_CHOICES)}")
        if self.weight <= 0:
            raise ValueError(f"weight must be > 0, got {self.weight}")


def load_spec(path: Path) -> list[RequestKind]:
    """A JSON list of {"seq_len": N, "attention": "...", "weight": W} objects."""
    return [RequestKind(**item) for item in json.loads(path.read_text())]


@dataclass
class Record:
    """One request: times in seconds from the start of the run."""

    kind: int  # index in the mix
    intended: float  # when the schedule said to send it
    sent: float  # when it was sent (later than intended if the client was held back)
    done: float
    status: str  # "OK" or the gRPC status code name
    server_queue_ms: float | None = None
    server_inference_ms: float | None = None
    server_total_ms: float | None = None

    @property
    def latency(self) -> float:
        """From the intended send time: what a user of an open system waits."""
        return self.done - self.intended

    @property
    def service_time(self) -> float:
        """From the actual send time: what a closed-loop tool would report."""
        return self.done - self.sent


class LoadGenerator:
    def __init__(
        self,
        target: str,
        mix: list[RequestKind],
        options: ClientOptions | None = None,
        seed: int = 0,
        timeout_s: float = 30.0,
        protocol: str = "grpc",
    ) -> None:
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
        if protocol == "http" and any(k.attention != "none" for k in mix):
            raise ValueError("--protocol http drives /v1/embeddings: attention must be 'none'")
        self.protocol = protocol
        self.target = target
        self.mix = mix
        self.options = options or ClientOptions()
        self.timeout_s = timeout_s
        self.started_at = 0.0  # time.perf_counter() at the start of the last run
        # Separate streams: the schedule does not depend on the mix, nor the mix on the data.
        self._schedule_rng = np.random.default_rng([seed, 0])
        self._kind_rng = np.random.default_rng([seed, 1])
        data_rng = np.random.default_rng([seed, 2])
        weights = np.array([k.weight for k in mix], dtype=float)
        self._p = weights / weights.sum()
        # Requests are built once: the generator's own CPU time must not limit the rate.
        sequences = [data_rng.integers(0, 256, size=k.seq_len).tolist() for k in mix]
        self._requests = [
            build_request([ids], **ATTENTION_CHOICES[k.attention])
            for ids, k in zip(sequences, mix, strict=True)
        ]
        self._http_inputs = [[ids] for ids in sequences]

    @contextlib.asynccontextmanager
    async def _connect(self) -> AsyncIterator[Send]:
        """One connection to the target, and the function that sends request `kind` over it."""
        if self.protocol == "http":
            headers = dict(self.options.metadata())
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
            async with httpx.AsyncClient(
                base_url=self.target, headers=headers, timeout=self.timeout_s, limits=limits
            ) as http:
                models = await http.get("/v1/models")  # the served model's name
                models.raise_for_status()
                model = models.json()["data"][0]["id"]
                bodies = [{"model": model, "input": inputs} for inputs in self._http_inputs]

                async def post(kind: int):
                    response = await http.post("/v1/embeddings", json=bodies[kind])
                    ok = response.status_code == 200
                    return ("OK" if ok else f"HTTP_{response.status_code}"), None

                yield post
            return
        async with self.options.open_channel(self.target, grpc.aio) as channel:
            stub = pb_grpc.EncoderServiceStub(channel)

            async def encode(kind: int):
                try:
                    response: pb.EncodeResponse = await stub.Encode(
                        self._requests[kind],
                        timeout=self.timeout_s,
                        metadata=self.options.metadata(),
                    )
                except grpc.aio.AioRpcError as exc:
                    return exc.code().name, None
                t = response.timings
                return "OK", (t.queue_ns / 1e6, t.inference_ns / 1e6, t.total_ns / 1e6)

            yield encode

    async def _call(self, send: Send, kind: int, start: float, intended: float | None) -> Record:
        """One request; `intended` None means "now" (closed loop has no schedule)."""
        sent = time.perf_counter() - start
        intended = sent if intended is None else intended
        try:
            status, timings = await send(kind)
        except httpx.HTTPError as exc:  # connection refused or reset, timeout
            status, timings = type(exc).__name__, None
        return Record(kind, intended, sent, time.perf_counter() - start, status, *(timings or ()))

    def schedule(self, rate: float, duration: float) -> np.ndarray:
        """Poisson arrival times in [0, duration): exponential gaps of mean 1 / rate."""
        gaps = self._schedule_rng.exponential(1.0 / rate, size=int(rate * duration * 2) + 16)
        times = np.cumsum(gaps)
        return times[times < duration]

    async def open_loop(
        self, rate: float, duration: float, max_in_flight: int = 0, progress: bool = True
    ) -> tuple[list[Record], float]:
        """Send on a Poisson schedule; returns the records and the wall time of the run."""
        arrivals = self.schedule(rate, duration)
        kinds = self._kind_rng.choice(len(self.mix), size=len(arrivals), p=self._p)
        limit = asyncio.Semaphore(max_in_flight) if max_in_flight else None
        records: list[Record] = []
        bar = tqdm(
            total=len(arrivals),
            desc=f"open loop {rate:g}/s",
            disable=not progress,
            unit="req",
            leave=False,
        )

        async def one(send: Send, kind: int, start: float, intended: float) -> None:
            try:
                record = await self._call(send, kind, start, intended)
            finally:
                if limit:
                    limit.release()
            records.append(record)
            bar.update()
            if record.status != "OK":
                bar.set_postfix_str(f"errors {sum(r.status != 'OK' for r in records)}")

        async with self._connect() as send:
            tasks = []
            start = self.started_at = time.perf_counter()
            for intended, kind in zip(arrivals, kinds, strict=True):
                delay = start + intended - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                if limit:  # held back: sent late, but its latency still counts from `intended`
                    await limit.acquire()
                tasks.append(asyncio.create_task(one(send, int(kind), start, float(intended))))
            await asyncio.gather(*tasks)
            elapsed = time.perf_counter() - start
        bar.close()
        return records, elapsed

    async def closed_loop(
        self, concurrency: int, duration: float, progress: bool = True
    ) -> tuple[list[Record], float]:
        """`concurrency` workers, each sending its next request when the last one returns."""
        records: list[Record] = []
        bar = tqdm(
            total=None,
            desc=f"closed loop x{concurrency}",
            disable=not progress,
            unit="req",
            leave=False,
        )
        async with self._connect() as send:
            start = self.started_at = time.perf_counter()

            async def worker() -> None:
                while time.perf_counter() - start < duration:
                    kind = int(self._kind_rng.choice(len(self.mix), p=self._p))
                    records.append(await self._call(send, kind, start, intended=None))
                    bar.update()

            await asyncio.gather(*(worker() for _ in range(concurrency)))
            elapsed = time.perf_counter() - start
        bar.close()
        return records, elapsed


def _percentiles(values: list[float], scale: float = 1e3) -> dict[str, float]:
    if not values:
        return {}
    array = np.asarray(values) * scale
    out = {name: round(float(np.percentile(array, q)), 3) for name, q in PERCENTILES.items()}
    out["max"] = round(float(array.max()), 3)
    return out


def summarize(
    records: list[Record],
    elapsed: float,
    offered_rate: float | None = None,
    duration: float | None = None,
) -> dict:
    """Latency percentiles (ms) of the successful requests, rates and errors by status.

    offered_rate is the Poisson rate asked for; scheduled_rate what the random
    schedule actually held over `duration`; achieved_rate the successes per
    second of wall time, tail included.
    """
    ok = [r for r in records if r.status == "OK"]
    return {
        "requests": len(records),
        "ok": len(ok),
        "errors": dict(Counter(r.status for r in records if r.status != "OK")),
        "elapsed_s": round(elapsed, 3),
        "offered_rate": offered_rate,
        "scheduled_rate": round(len(records) / duration, 3) if duration else None,
        "achieved_rate": round(len(ok) / elapsed, 3) if elapsed > 0 else 0.0,
        "latency_ms": _percentiles([r.latency for r in ok]),
        "service_time_ms": _percentiles([r.service_time for r in ok]),
        "server_ms": {
            name: _percentiles(
                [v for r in ok if (v := getattr(r, f"server_{name}_ms")) is not None], scale=1.0
            )
            for name in ("queue", "inference", "total")
        },
    }


def find_max_rate(
    generator: LoadGenerator,
    rates: list[float],
    duration: float,
    p99_target_ms: float,
    max_error_rate: float = 0.01,
    max_in_flight: int = 0,
    progress: bool = True,
) -> dict:
    """Step through `rates` (ascending) until p99 or errors break the target."""
    steps, best = [], None
    for rate in rates:
        records, elapsed = asyncio.run(generator.open_loop(rate, duration, max_in_flight, progress))
        summary = summarize(records, elapsed, rate, duration)
        errors = summary["requests"] - summary["ok"]
        p99 = summary["latency_ms"].get("p99", float("inf"))
        summary["within_target"] = p99 <= p99_target_ms and errors <= max_error_rate * max(
            1, summary["requests"]
        )
        steps.append(summary)
        if progress:
            tqdm.write(
                f"rate {rate:g}/s: achieved {summary['achieved_rate']:.1f}/s, p99 {p99:.1f} ms, "
                f"errors {errors} -> {'ok' if summary['within_target'] else 'over target'}"
            )
        if not summary["within_target"]:
            break
        best = rate
    return {"p99_target_ms": p99_target_ms, "max_rate_within_target": best, "steps": steps}


def records_json(records: list[Record]) -> list[dict]:
    return [asdict(r) for r in records]
