"""EncodeAnswer: results with spliced tensors, serialized as protobuf's parser reads them."""

from __future__ import annotations

import numpy as np

from attnserve.service.v1.response import EncodeAnswer
from attnserve.v1 import encoder_service_pb2 as pb
from attnserve.v1.wire import SPLICE_MIN_BYTES, SplicedMessage


def answer() -> EncodeAnswer:
    """Two results, the second with a map large enough to be spliced."""
    message = pb.EncodeResponse(model_version="v", request_id="r")
    message.timings.inference_ns = 7
    results = [SplicedMessage(message.results.add()) for _ in range(2)]
    results[0].put("pooled", np.ones(4))
    large = np.random.default_rng(0).random((1, SPLICE_MIN_BYTES // 4 + 1))
    results[1].put("attention", large)
    results[1].message.attention_layers[:] = [0]
    assert results[1].spliced and not results[0].spliced
    return EncodeAnswer(message, results)


def test_a_serialized_answer_parses_as_its_filled_message():
    parsed = pb.EncodeResponse.FromString(answer().serialize())
    assert parsed == answer().filled()
    assert [len(r.attention.data) for r in parsed.results] == [0, (SPLICE_MIN_BYTES // 4 + 1) * 4]
    assert parsed.request_id == "r" and parsed.timings.inference_ns == 7


def test_a_stream_answer_wraps_the_same_bytes():
    envelope = pb.EncodeStreamResponse(request_id="s1")
    parsed = pb.EncodeStreamResponse.FromString(answer().serialize_in(envelope, "response"))
    assert parsed.request_id == "s1" and parsed.WhichOneof("outcome") == "response"
    assert parsed.response == answer().filled()
