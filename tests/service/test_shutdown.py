"""SIGTERM while requests are in flight: they all complete, new ones are refused, exit 0."""

import signal
import threading
import time

import grpc

from attnserve.client import ClientOptions, EncoderClient
from tests.conftest import start_cli_server

GRACE_SECONDS = 30
REQUESTS, SEQUENCES, LENGTH = 6, 4, 1024  # ~2 s of model work for the default model


def test_sigterm_drains_in_flight_requests(default_export):
    model_dir, _ = default_export
    server = start_cli_server(
        model_dir, "--grace-seconds", str(GRACE_SECONDS), "--metrics-port", "0"
    )
    process = server.process
    try:
        client = EncoderClient(server.address, ClientOptions(retries=0, timeout_s=120))
        client.wait_until_serving(60)
        results, errors = [], []

        def call():
            try:
                results.append(client.encode([[1] * LENGTH] * SEQUENCES))
            except grpc.RpcError as exc:
                errors.append(exc)

        threads = [threading.Thread(target=call) for _ in range(REQUESTS)]
        for t in threads:
            t.start()
        # Every request is inside the server, none answered yet, when the signal comes.
        deadline = time.monotonic() + 60
        while server.metric("attnserve_requests_in_flight") < REQUESTS:
            assert time.monotonic() < deadline and not results, "requests never all in flight"
            time.sleep(0.005)
        process.send_signal(signal.SIGTERM)
        # Draining has begun once the health service says so (the requests are still running).
        while client.health() == "SERVING":
            assert time.monotonic() < deadline, "health never left SERVING after SIGTERM"
        late = EncoderClient(server.address, ClientOptions(retries=0, timeout_s=5))
        try:
            late.encode("after SIGTERM")
            refused = None
        except grpc.RpcError as exc:
            refused = exc
        for t in threads:
            t.join(60)
        returncode = process.wait(GRACE_SECONDS + 10)
    finally:
        if process.poll() is None:
            process.kill()
    assert errors == []
    assert len(results) == REQUESTS and all(len(r) == SEQUENCES for r in results)
    assert refused is not None and refused.code() == grpc.StatusCode.UNAVAILABLE
    assert "shutting down" in refused.details()
    assert returncode == 0
    log = server.log()
    assert "draining" in log and "stopped" in log
    assert "grace period over" not in log  # everything finished within the grace period
