"""The echo servers' handlers: the answer is sized as asked and stamped with the handler's
start and end; each way of running the model answers the embeddings it really ran."""

import asyncio
import struct

import numpy as np
import pytest

from attnserve.bench.echo import _echo, _ModelAnswer, request_for
from attnserve.client.codec import build_request


def _stamps(answer: bytes) -> tuple[int, int]:
    return struct.unpack_from("<qq", answer)


def test_echo_answers_the_asked_size_stamped():
    answer = asyncio.run(_echo(request_for(b"payload", 1000), None))
    assert len(answer) == 1000 and answer[16:] == bytes(984)
    start, end = _stamps(answer)
    assert 0 < start <= end


@pytest.fixture(scope="module")
def model_answer(small_model_dir):
    return _ModelAnswer(small_model_dir)


@pytest.mark.parametrize(
    "run",
    [
        lambda m, request: asyncio.run(m.answer(request, None)),  # Model: a worker thread
        lambda m, request: asyncio.run(m.answer_inline(request, None)),  # ModelInline
        lambda m, request: m.answer_here(request, None),  # Model of the --sync server
    ],
    ids=["worker-thread", "event-loop", "handler-thread"],
)
def test_model_answers_the_embeddings_it_ran(model_answer, small_runtime, run):
    ids = np.array([3, 1, 4, 1, 5, 9], dtype=np.int64)
    expected = small_runtime.embed(ids[None]).ravel()
    size = expected.nbytes - 8  # cut to the size asked for
    request = request_for(build_request([ids]).SerializeToString(), size)
    answer = run(model_answer, request)
    assert len(answer) == size
    # After the 16 bytes of stamps (4 floats): the embeddings, but for the last 2 floats cut.
    np.testing.assert_allclose(np.frombuffer(answer[16:], np.float32), expected[4:-2], atol=1e-6)
    start, end = _stamps(answer)
    assert 0 < start <= end
