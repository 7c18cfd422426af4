"""The client retries UNAVAILABLE (warming up, draining) and nothing else."""

import threading
import time

import grpc
import pytest

from attnserve.client import ClientOptions, EncoderClient
from tests.conftest import ServerThread

UNAVAILABLE = {"method": "Encode", "code": "UNAVAILABLE"}


def test_unavailable_is_retried_until_the_server_is_warm(small_model_dir, small_runtime):
    cold = ServerThread(small_model_dir, small_runtime, warm_up=False)
    try:

        def warm_after_the_first_refusal():  # waits on the server's metric, not a timer
            while cold.metric("attnserve_requests_total", UNAVAILABLE) < 1:
                time.sleep(0.005)
            cold.call(cold.running.warm_up())

        warmer = threading.Thread(target=warm_after_the_first_refusal)
        warmer.start()
        options = ClientOptions(retries=50, backoff_s=0.01, timeout_s=60)
        with EncoderClient(cold.address, options) as c:
            out = c.encode("patience")
        warmer.join()
        assert len(out.encodings) == 1
        # It was refused while cold and answered after retrying, within one call.
        assert cold.metric("attnserve_requests_total", UNAVAILABLE) >= 1
        assert cold.metric("attnserve_requests_total", {"method": "Encode", "code": "OK"}) == 1
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
        # 100 retries with backoff from 0.05 s doubling would take years; the 0.6 s timeout
        # allows a handful: the call must give up when its deadline does.
        options = ClientOptions(retries=100, backoff_s=0.05, timeout_s=0.6)
        with EncoderClient(cold.address, options) as c, pytest.raises(grpc.RpcError) as excinfo:
            c.encode("never warm")
        assert excinfo.value.code() == grpc.StatusCode.UNAVAILABLE
        attempts = cold.metric("attnserve_requests_total", UNAVAILABLE)
        assert 1 <= attempts < 20
    finally:
        cold.stop()
