"""SIGTERM while requests are in flight: they all complete, new ones are refused, exit 0."""

import signal
import threading
import time

import grpc

from client import ClientOptions, EncoderClient
from tests.conftest import start_cli_server

GRACE_SECONDS = 30


def test_sigterm_drains_in_flight_requests(small_model_dir):
    process, address = start_cli_server(small_model_dir, "--grace-seconds", str(GRACE_SECONDS))
    try:
        client = EncoderClient(address, ClientOptions(retries=0, timeout_s=60))
        client.wait_until_serving(60)
        results, errors = [], []

        def call():
            try:
                results.append(client.encode([[1] * 300] * 13, attention=True))
            except grpc.RpcError as exc:
                errors.append(exc)

        threads = [threading.Thread(target=call) for _ in range(8)]
        for t in threads:
            t.start()
        time.sleep(0.3)  # they are on the wire and queued
        process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        time.sleep(0.2)
        late = EncoderClient(address, ClientOptions(retries=0, timeout_s=5))
        try:
            late.encode("after SIGTERM")
            refused = None
        except grpc.RpcError as exc:
            refused = exc.code()
        for t in threads:
            t.join(60)
        returncode = process.wait(GRACE_SECONDS + 10)
        elapsed = time.monotonic() - signalled
    finally:
        if process.poll() is None:
            process.kill()
    assert errors == []
    assert len(results) == 8 and all(len(r) == 13 for r in results)
    assert refused == grpc.StatusCode.UNAVAILABLE
    assert returncode == 0
    assert elapsed < GRACE_SECONDS
