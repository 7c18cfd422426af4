"""The translation between the protocol's tensors and the data plane (service/oip/
tensors.py) on its own, field by field: no server."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from attnserve.oip import grpc_service_pb2 as oip
from attnserve.service.core.batching import SequenceResult
from attnserve.service.core.errors import InvalidInputError
from attnserve.service.core.plan import EncodePlan
from attnserve.service.core.request import (
    AttentionOptions,
    EncodeOptions,
    Intervention,
    Layout,
    LensNorm,
    Pooling,
    PredictionsOptions,
)
from attnserve.service.grpc.oip import infer_request
from attnserve.service.oip.outputs import (
    OPTION_GROUPS,
    OUTPUT_DATATYPES,
    READOUT_OUTPUTS,
    STATISTICS_OUTPUTS,
    output_rows,
    stack_into,
    stacked_shape,
)
from attnserve.service.oip.parameters import PARAMETERS
from attnserve.service.oip.tensors import translate
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
        n
        for n in OUTPUT_DATATYPES
        if n != "attention_indices" and n not in READOUT_OUTPUTS + STATISTICS_OUTPUTS
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
    plan = EncodePlan(sequences, [False, False], Pooling.MEAN, True, None, False)
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


def _translated(outputs: list[str], **parameters) -> EncodeOptions:
    request = _request(input_ids=("INT64", [[1, 2, 3]]))
    request.outputs.extend(
        oip.ModelInferRequest.InferRequestedOutputTensor(name=n) for n in outputs
    )
    for name, value in parameters.items():
        kind = {bool: "bool_param", int: "int64_param", str: "string_param"}[type(value)]
        setattr(request.parameters[name], kind, value)
    return translate(infer_request(request), SMALL_CONFIG).options


def test_every_parameter_sets_an_option_that_exists():
    """The one table names real options: each field is one of EncodeOptions' or of the
    group its outputs make."""
    for name, spec in PARAMETERS.items():
        assert spec.fields, name
        for field in spec.fields:
            group, _, option = field.removeprefix("options.").rpartition(".")
            if group == "interventions[0]":  # the steering input's one intervention
                options = Intervention
            else:
                options = OPTION_GROUPS[group][1] if group else EncodeOptions
            assert option in {f.name for f in dataclasses.fields(options)}, (name, field)


def test_parameters_set_the_options_of_the_outputs_asked():
    options = _translated(
        ["attention", "lens_probabilities", "next_token_ids"],
        attention_layers="-1",
        attention_layout="CAUSAL_PACKED",
        attention_dtype="fp16",
        lens_norm="own",
        top_tokens=3,
        target_ids="5,6",
        truncate=True,
    )
    assert options.truncate and not options.token_embeddings
    assert options.pooling == Pooling.NONE  # pooled was not asked
    assert options.attention == AttentionOptions(
        layers=(-1,), float16=True, layout=Layout.CAUSAL_PACKED
    )
    assert options.logit_lens == PredictionsOptions(
        top_k=3, target_ids=(5, 6), lens_norm=LensNorm.OWN
    )
    assert options.predictions == PredictionsOptions(top_k=3, target_ids=(5, 6))
    assert options.hidden_states is None and options.attribution is None


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"attention_heads": "0"}, "attention_heads needs one of the outputs attention, "),
        ({"rollout": True}, "rollout needs one of the outputs attention, "),
        ({"lens_norm": "own"}, "lens_norm needs one of the outputs lens_token_ids, "),
        ({"top_tokens": 2}, "top_tokens needs one of the outputs logits, "),
        ({"head_reduction": "sum"}, "head_reduction must be one of ['none', 'mean', 'max']"),
        ({"attention_dtype": "int8"}, "attention_dtype must be one of ['FP32', 'FP16']"),
    ],
)
def test_a_parameter_without_its_output_or_its_word_is_refused(parameters, message):
    with pytest.raises(InvalidInputError, match=re.escape(message)):
        _translated(["embeddings"], **parameters)
