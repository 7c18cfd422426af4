"""EncodeStream: pipelined (a stream's requests run, and batch, together), answers in order,
and any failure, even a bug, answered in-stream while the stream goes on."""

import asyncio
import logging
from dataclasses import replace

import grpc

from attnserve.client import AsyncEncoderClient, build_request
from tests.conftest import ServerThread
from tests.service.fakes import FakeBackend


def test_a_streams_requests_are_in_flight_together_and_answered_in_order(small_model_dir):
    backend = FakeBackend()
    server = ServerThread(small_model_dir, backend)
    n = 12
    try:

        async def scenario():
            async with AsyncEncoderClient(server.address) as client:
                backend.gate.clear()
                requests = [build_request([[i + 1] * 4], request_id=f"r{i}") for i in range(n)]
                answers = []

                async def consume():
                    async for response in client.encode_stream(requests):
                        answers.append(response)

                consuming = asyncio.ensure_future(consume())
                await asyncio.to_thread(backend.wait_calls, 1)  # the first is in the model,
                for _ in range(10_000):  # and all the others queued at once
                    if server.running.engine.depth == n - 1:
                        break
                    await asyncio.sleep(0.001)
                queued = server.running.engine.depth
                backend.gate.set()
                await consuming
                return answers, queued

        answers, queued = asyncio.run(scenario())
        assert queued == n - 1
        assert [a.request_id for a in answers] == [f"r{i}" for i in range(n)]
        for i, answer in enumerate(answers):
            assert answer.WhichOneof("outcome") == "response"
            assert list(answer.response.results[0].token_ids) == [i + 1] * 4
        assert len(backend.calls) == 2  # the first alone, the eleven others in one batch
    finally:
        server.stop()


class ExplodingTokenizer:
    """A bug stand-in: text "boom" raises an error that is not one of the service's own."""

    def __init__(self, tokenizer) -> None:
        self.kind, self._tokenizer = tokenizer.kind, tokenizer

    def encode(self, text: str) -> list[int]:
        if text == "boom":
            raise RuntimeError("an unexpected bug")
        return self._tokenizer.encode(text)

    def token_strings(self, ids):
        return self._tokenizer.token_strings(ids)


def test_a_bug_in_a_stream_is_logged_counted_answered_internal_and_the_stream_goes_on(
    small_model_dir, caplog
):
    server = ServerThread(small_model_dir, FakeBackend())
    dataplane = server.running.dataplane
    dataplane.view = replace(dataplane.view, tokenizer=ExplodingTokenizer(dataplane.tokenizer))
    try:

        async def scenario():
            async with AsyncEncoderClient(server.address) as client:
                texts = ["one", "boom", "three"]
                requests = [build_request(t, request_id=t) for t in texts]
                return [a async for a in client.encode_stream(requests)]

        with caplog.at_level(logging.ERROR):
            answers = asyncio.run(scenario())
        outcomes = [a.WhichOneof("outcome") for a in answers]
        assert outcomes == ["response", "error", "response"]
        assert answers[1].error.code == grpc.StatusCode.INTERNAL.value[0]
        assert "an unexpected bug" in answers[1].error.message
        assert "EncodeStream failed unexpectedly" in caplog.text
        assert "Traceback" in caplog.text or "RuntimeError" in caplog.text
        labels = {"method": "EncodeStream", "code": "INTERNAL"}
        assert server.metric("attnserve_requests_total", labels) == 1
    finally:
        server.stop()
