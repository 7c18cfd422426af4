"""Prometheus metrics, in a registry of their own (one per server, so tests can run several)."""

from __future__ import annotations

from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_TOKEN_BUCKETS = (8, 32, 128, 512, 1024, 2048, 4096, 8192, 16384)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "attnserve_requests",
            "RPCs answered, by method and status code",
            ["method", "code"],
            registry=r,
        )
        self.request_latency = Histogram(
            "attnserve_request_latency_seconds",
            "Time from receiving an RPC to answering it",
            ["method"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_time = Histogram(
            "attnserve_queue_seconds",
            "Time a sequence waited before its batch ran",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.inference_time = Histogram(
            "attnserve_inference_seconds",
            "ONNX Runtime time per batch",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "attnserve_batch_size", "Sequences per batch", buckets=_SIZE_BUCKETS, registry=r
        )
        self.batch_tokens = Histogram(
            "attnserve_batch_tokens",
            "Padded tokens (batch x longest) per batch",
            buckets=_TOKEN_BUCKETS,
            registry=r,
        )
        self.tokens = Counter("attnserve_tokens", "Real tokens encoded", registry=r)
        self.sequences = Counter("attnserve_sequences", "Sequences run by ONNX Runtime", registry=r)
        self.expired = Counter(
            "attnserve_expired_in_queue",
            "Sequences dropped unrun: deadline passed in the queue",
            registry=r,
        )
        self.in_flight = Gauge(
            "attnserve_requests_in_flight", "Requests admitted and not yet answered", registry=r
        )
        self.queue_depth = Gauge(
            "attnserve_queue_depth", "Sequences waiting for a batch", registry=r
        )
        self.inflight_bytes = Gauge(
            "attnserve_inflight_bytes",
            "Bytes of the memory budget reserved by admitted requests",
            registry=r,
        )
        self.budget_waiting = Gauge(
            "attnserve_budget_waiting", "Requests waiting for room in the memory budget", registry=r
        )

    def serve(self, port: int, host: str = "0.0.0.0") -> WSGIServer:
        """Expose /metrics over HTTP on a thread; returns the server (its .server_port is bound)."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        return server
