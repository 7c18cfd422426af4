"""Prometheus metrics, in a registry of their own (one per server, so tests can run several).

Every series of a model's work carries its `model` and `version` labels; a model's batcher
and data plane see only `ModelMetrics`, the children bound to their labels. The memory
budget is the process's, so its two gauges have no model.
"""

from __future__ import annotations

from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_TOKEN_BUCKETS = (8, 32, 128, 512, 1024, 2048, 4096, 8192, 16384)
MODEL = ("model", "version")


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "attnserve_requests",
            "Requests answered, by method and status code",
            ["method", "code", *MODEL],
            registry=r,
        )
        self.request_latency = Histogram(
            "attnserve_request_latency_seconds",
            "Time from receiving a request to answering it",
            ["method", *MODEL],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_time = Histogram(
            "attnserve_queue_seconds",
            "Time a sequence waited before its batch ran",
            MODEL,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.inference_time = Histogram(
            "attnserve_inference_seconds",
            "ONNX Runtime time per batch",
            MODEL,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "attnserve_batch_size", "Sequences per batch", MODEL, buckets=_SIZE_BUCKETS, registry=r
        )
        self.batch_tokens = Histogram(
            "attnserve_batch_tokens",
            "Padded tokens (batch x longest) per batch",
            MODEL,
            buckets=_TOKEN_BUCKETS,
            registry=r,
        )
        self.tokens = Counter("attnserve_tokens", "Real tokens encoded", MODEL, registry=r)
        self.sequences = Counter(
            "attnserve_sequences", "Sequences run by ONNX Runtime", MODEL, registry=r
        )
        self.generated_tokens = Counter(
            "attnserve_generated_tokens", "Tokens generated", MODEL, registry=r
        )
        self.expired = Counter(
            "attnserve_expired_in_queue",
            "Sequences dropped unrun: deadline passed in the queue",
            MODEL,
            registry=r,
        )
        self.in_flight = Gauge(
            "attnserve_requests_in_flight",
            "Requests admitted and not yet answered",
            MODEL,
            registry=r,
        )
        self.queue_depth = Gauge(
            "attnserve_queue_depth", "Sequences waiting for a batch", MODEL, registry=r
        )
        self.inflight_bytes = Gauge(
            "attnserve_inflight_bytes",
            "Bytes of the memory budget reserved by admitted requests",
            registry=r,
        )
        self.budget_waiting = Gauge(
            "attnserve_budget_waiting", "Requests waiting for room in the memory budget", registry=r
        )

    def for_model(self, name: str, version: str) -> ModelMetrics:
        """The series of one model version."""
        return ModelMetrics(self, name, version)

    def forget(self, name: str, version: str) -> None:
        """Drop the series of a version that is no longer served (a reload or an unload)."""
        for family in (
            self.queue_time,
            self.inference_time,
            self.batch_size,
            self.batch_tokens,
            self.tokens,
            self.sequences,
            self.generated_tokens,
            self.expired,
            self.in_flight,
            self.queue_depth,
        ):
            family.remove(name, version)

    def serve(self, port: int, host: str = "0.0.0.0") -> WSGIServer:
        """Expose /metrics over HTTP on a thread; returns the server (its .server_port is bound)."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        return server


class ModelMetrics:
    """One model version's series: what its batcher and data plane record."""

    def __init__(self, metrics: Metrics, name: str, version: str) -> None:
        self.labels = (name, version)
        self.queue_time = metrics.queue_time.labels(name, version)
        self.inference_time = metrics.inference_time.labels(name, version)
        self.batch_size = metrics.batch_size.labels(name, version)
        self.batch_tokens = metrics.batch_tokens.labels(name, version)
        self.tokens = metrics.tokens.labels(name, version)
        self.sequences = metrics.sequences.labels(name, version)
        self.generated_tokens = metrics.generated_tokens.labels(name, version)
        self.expired = metrics.expired.labels(name, version)
        self.in_flight = metrics.in_flight.labels(name, version)
        self.queue_depth = metrics.queue_depth.labels(name, version)
