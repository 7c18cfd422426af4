"""The client retries UNAVAILABLE (warming up, draining) and nothing else."""

import threading
import time

import grpc
import pytest

from client import ClientOptions, EncoderClient
from tests.conftest import ServerThread


def test_unavailable_is_retried_until_the_server_is_warm(small_model_dir, small_runtime):
    cold = ServerThread(small_model_dir, small_runtime, warm_up=False)
    try:
        warmer = threading.Timer(0.5, lambda: cold.call(cold.running.warm_up()))
        warmer.start()
        options = ClientOptions(retries=8, backoff_s=0.05, timeout_s=30)
        with EncoderClient(cold.address, options) as c:
            start = time.monotonic()
            out = c.encode("patience")
        warmer.join()
        assert len(out.encodings) == 1
        assert time.monotonic() - start >= 0.4  # it really waited for the warm-up
        refused = cold.metric(
            "attnserve_requests_total", {"method": "Encode", "code": "UNAVAILABLE"}
        )
        assert refused >= 1
    finally:
        cold.stop()


def test_invalid_argument_is_not_retried(server):
    labels = {"method": "Encode", "code": "INVALID_ARGUMENT"}
    before = server.metric("attnserve_requests_total", labels)
    c = EncoderClient(server.address, ClientOptions(retries=5))
    with c, pytest.raises(grpc.RpcError) as excinfo:
        c.encode([[999]])
    assert excinfo.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert server.metric("attnserve_requests_total", labels) - before == 1


def test_retries_stop_at_the_call_timeout(small_model_dir, small_runtime):
    cold = ServerThread(small_model_dir, small_runtime, warm_up=False)
    try:
        options = ClientOptions(retries=100, backoff_s=0.05, timeout_s=0.6)
        with EncoderClient(cold.address, options) as c:
            start = time.monotonic()
            with pytest.raises(grpc.RpcError) as excinfo:
                c.encode("never warm")
        assert excinfo.value.code() == grpc.StatusCode.UNAVAILABLE
        assert time.monotonic() - start < 5  # bounded by the timeout, not by 100 retries
    finally:
        cold.stop()
