"""The translation between the protocol's tensors and the data plane (service/oip/
tensors.py) on its own, field by field: no server."""

from __future__ import annotations

import numpy as np
import pytest

from attnserve.oip import grpc_service_pb2 as oip
from attnserve.service.core.batcher import SequenceResult
from attnserve.service.core.errors import InvalidInputError
from attnserve.service.core.plan import EncodePlan
from attnserve.service.grpc.oip import infer_request
from attnserve.service.oip.tensors import (
    OUTPUT_DATATYPES,
    READOUT_OUTPUTS,
    output_rows,
    stack_into,
    stacked_shape,
    translate,
)
from attnserve.v1 import encoder_service_pb2 as pb
from tests.conftest import SMALL_CONFIG

MODEL = SMALL_CONFIG.name


def _request(**inputs) -> oip.ModelInferRequest:
    request = oip.ModelInferRequest(model_name=MODEL, id="r1")
    for name, (datatype, values) in inputs.items():
        values = np.asarray(values)
        request.inputs.add(name=name, datatype=datatype, shape=values.shape)
        request.raw_input_contents.append(values.astype("<i8").tobytes())
    return request


def test_ragged_rows_become_one_input_each():
    request = _request(
        input_ids=("INT64", [[1, 2, 3], [4, 5, 256]]), input_lengths=("INT64", [3, 2])
    )
    plan = translate(infer_request(request), SMALL_CONFIG)
    assert [i.tolist() for i in plan.inputs] == [[1, 2, 3], [4, 5]]
    assert all(i.dtype == np.int64 for i in plan.inputs)
    # "Optional, if not specified all outputs produced by the model will be returned"
    # (attention_indices only with top_k, the readouts only when named)
    assert plan.outputs == [
        n for n in OUTPUT_DATATYPES if n != "attention_indices" and n not in READOUT_OUTPUTS
    ]


def test_text_elements_use_the_protocols_length_prefixed_bytes():
    request = oip.ModelInferRequest(model_name=MODEL)
    request.inputs.add(name="text", datatype="BYTES", shape=[2])
    request.raw_input_contents.append(b"\x02\x00\x00\x00hi\x03\x00\x00\x00you")
    plan = translate(infer_request(request), SMALL_CONFIG)
    assert plan.inputs == ["hi", "you"]


@pytest.mark.parametrize(
    ("lengths", "message"),
    [([3, 4], "input_lengths must be in [1, 3]"), ([3], "input_ids has 2 rows")],
)
def test_input_lengths_are_checked_against_the_rows(lengths, message):
    request = _request(
        input_ids=("INT64", [[1, 2, 3], [4, 5, 6]]), input_lengths=("INT64", lengths)
    )
    with pytest.raises(InvalidInputError, match=message.replace("[", r"\[")):
        translate(infer_request(request), SMALL_CONFIG)


def test_outputs_are_stacked_with_ragged_rows_zero_padded():
    sequences = [np.arange(3, dtype=np.int64), np.arange(1, dtype=np.int64)]
    plan = EncodePlan(sequences, [False, False], pb.POOLING_MEAN, True, None, False)
    results = [SequenceResult(np.ones((len(s), 2), np.float32), None, 0, 0) for s in sequences]
    stacked = {}
    for name in ("embeddings", "token_ids", "lengths", "pooled"):
        rows = output_rows(name, plan, results)
        stacked[name] = np.empty(stacked_shape(rows), rows[0].dtype)
        stack_into(stacked[name], rows, name)
    assert stacked["embeddings"].shape == (2, 3, 2)
    assert stacked["embeddings"][1].tolist() == [[1, 1], [0, 0], [0, 0]]
    assert stacked["token_ids"].tolist() == [[0, 1, 2], [0, 0, 0]]
    assert stacked["lengths"].tolist() == [3, 1]
    assert stacked["pooled"].tolist() == [[1, 1], [1, 1]]
