"""SIGTERM while requests are in flight: they all complete, new ones are refused, exit 0;
behind a round-robin client no call is lost."""

import collections
import json
import signal
import threading
import time

import grpc
import httpx
import pytest

from attnserve.client import ClientOptions, EncoderClient
from tests.conftest import ServerThread, start_cli_server

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


def _wait_for(condition, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.01)


def test_a_drain_behind_round_robin_loses_no_call(small_model_dir):
    """The README's scale-out recipe: two servers behind a round-robin client under Encode
    load; one killed and restarted, then the other sent SIGTERM. Every call is answered:
    the killed server's calls are retried, the drained one's finish or are refused with
    UNAVAILABLE before they start, and none is cancelled as it stops."""
    metrics = ("--metrics-port", "0", "--http-port", "-1")
    servers = [start_cli_server(small_model_dir, *metrics) for _ in range(2)]
    target = "ipv4:" + ",".join(s.address for s in servers)
    client = EncoderClient(target, ClientOptions(round_robin=True, timeout_s=60))
    codes: collections.Counter[str] = collections.Counter()
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            try:
                client.encode("The cat sat on the mat.", pooling="mean")
                codes["OK"] += 1
            except grpc.RpcError as exc:
                codes[exc.code().name] += 1

    def served(server) -> float:
        return server.metric("attnserve_requests_total", method="Encode", code="OK")

    def serves_more(server, n: int = 200):
        start = served(server)
        _wait_for(lambda: served(server) >= start + n, f"{server.address} serves {n} more")

    threads = [threading.Thread(target=load) for _ in range(6)]
    try:
        client.wait_until_serving(60)
        for t in threads:
            t.start()
        for server in servers:
            serves_more(server)
        killed, drained = servers
        killed.process.kill()
        killed.process.wait(30)
        serves_more(drained)
        servers[0] = killed = start_cli_server(
            small_model_dir, *metrics, "--port", killed.address.rsplit(":", 1)[1]
        )
        serves_more(killed)  # back in the client's round robin
        drained.process.send_signal(signal.SIGTERM)
        assert drained.process.wait(60) == 0
        serves_more(killed)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
        for server in servers:
            if server.process.poll() is None:
                server.process.terminate()
                server.process.wait(30)
    assert set(codes) == {"OK"}, codes
    assert "grace period over" not in drained.log()


def test_streams_cut_by_a_stop_past_the_grace_period_end_with_an_error(
    small_model_dir, small_runtime
):
    """A stop with texts still being written: the HTTP stream ends with an error event
    (OpenAI's shape, naming the shutdown) and no [DONE], the gRPC stream with UNAVAILABLE;
    neither is cut without a word."""
    server = ServerThread(small_model_dir, small_runtime)
    body = {"prompt": "The cat", "max_tokens": 280, "temperature": 0, "ignore_eos": True}
    stopped = threading.Thread(target=server.stop, kwargs={"grace": 0.0})
    with (
        httpx.Client(base_url=server.http_url, timeout=60) as http,
        EncoderClient(server.address, ClientOptions(retries=0, timeout_s=60)) as client,
        http.stream("POST", "/v1/completions", json=body | {"stream": True}) as answer,
    ):
        lines = answer.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))  # it is running
        tokens = client.generate("The cat", max_tokens=280, temperature=0, ignore_eos=True)
        next(tokens)
        stopped.start()
        events = [line for line in lines if line.startswith("data: ")]
        with pytest.raises(grpc.RpcError) as caught:
            list(tokens)
    stopped.join(60)
    assert events[-1] != "data: [DONE]"
    error = json.loads(events[-1][len("data: ") :])["error"]
    assert "shutting down" in error["message"] and error["code"] == "service_unavailable"
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "shutting down" in caught.value.details()
