"""The error table (docs/api.md, gRPC codes and HTTP statuses) through the real server; after
each error it keeps serving."""

import grpc
import numpy as np
import pytest

from attnserve.client import ClientOptions, EncoderClient, build_request
from attnserve.service.core.errors import InvalidInputError, UnsupportedError, fields_named
from attnserve.service.ort.runtime import OrtRuntime
from attnserve.v1 import encoder_service_pb2 as pb
from attnserve.v1 import encoder_service_pb2_grpc as pb_grpc
from tests.conftest import ServerThread


def raw_request(**fields) -> pb.EncodeRequest:
    return pb.EncodeRequest(**fields)


def with_attention(**attention) -> pb.EncodeRequest:
    request = build_request("abc")
    request.options.attention.CopyFrom(pb.AttentionRequest(**attention))
    return request


INVALID = {
    "no inputs": (raw_request(), "inputs: at least one input is required"),
    "empty input": (raw_request(inputs=[pb.Input()]), "inputs[0]: set either text or token_ids"),
    "empty ids": (
        raw_request(inputs=[pb.Input(token_ids=pb.TokenIds(ids=[]))]),
        "inputs[0].token_ids: the sequence is empty",
    ),
    "id outside vocabulary": (
        build_request(["ok", [1, 2, 259]]),
        "inputs[1].token_ids: token id 259 is outside the vocabulary [0, 259)",
    ),
    "negative id": (build_request([[-4]]), "token id -4 is outside the vocabulary"),
    "too long": (
        build_request([[1] * 301]),
        "inputs[0].token_ids has 301 tokens, more than max_seq_len=300; send fewer or set "
        "options.truncation=TRUNCATION_RIGHT",
    ),
    "unknown layer": (with_attention(layers=[2]), "options.attention.layers: 2 is outside [-2, 2)"),
    "unknown head": (with_attention(heads=[0, 4]), "options.attention.heads: 4 is outside [-4, 4)"),
    "repeated head": (with_attention(heads=[1, 1]), "options.attention.heads: [1, 1] repeats"),
    "bad dtype": (
        with_attention(dtype=7),
        "options.attention.dtype: 7 is not DTYPE_FLOAT32 or DTYPE_FLOAT16",
    ),
    "bad layout": (with_attention(layout=9), "options.attention.layout: 9 is not one of"),
    "int32 weights": (
        with_attention(dtype=pb.DTYPE_INT32),
        "options.attention.dtype: 3 is not DTYPE_FLOAT32 or DTYPE_FLOAT16",
    ),
    "top_k of 0 keys": (
        with_attention(top_k=-1),
        "options.attention.top_k: -1 is outside [1, max_seq_len=300]",
    ),
    "top_k over max_seq_len": (
        with_attention(top_k=301),
        "options.attention.top_k: 301 is outside [1, max_seq_len=300]",
    ),
    "row past the end": (
        with_attention(query_positions=[0, 4]),
        "options.attention.query_positions: 4 is outside [-4, 4) for inputs[0], which has 4",
    ),
    "row before the start": (
        with_attention(query_positions=[-5]),
        "options.attention.query_positions: -5 is outside [-4, 4)",
    ),
    "the same row twice": (
        with_attention(query_positions=[-1, 3]),
        "options.attention.query_positions: [-1, 3] name the same position twice in inputs[0]",
    ),
    "packed top_k": (
        with_attention(layout=pb.ATTENTION_LAYOUT_CAUSAL_PACKED, top_k=2),
        "options.attention.layout: ATTENTION_LAYOUT_CAUSAL_PACKED cannot hold "
        "options.attention.top_k",
    ),
    "packed rows": (
        with_attention(layout=pb.ATTENTION_LAYOUT_CAUSAL_PACKED, query_positions=[-1]),
        "ATTENTION_LAYOUT_CAUSAL_PACKED needs every row; leave options.attention.query_positions",
    ),
    "rollout of separate heads": (
        with_attention(rollout=True, head_reduction=pb.HEAD_REDUCTION_NONE),
        "options.attention.rollout needs the heads combined",
    ),
    "bad head_reduction": (
        with_attention(head_reduction=8),
        "options.attention.head_reduction: 8 is not one of",
    ),
    "nothing left to return": (
        with_attention(omit_weights=True),
        "options.attention.omit_weights leaves nothing to return: set "
        "options.attention.head_entropy, options.attention.row_entropy, "
        "options.attention.received or options.attention.top_k too",
    ),
    "a tile past the text": (
        with_attention(key_start=2, key_end=9),
        "options.attention.key_start/key_end: [2, 9) is not a tile of inputs[0]'s keys: "
        "0 <= key_start < key_end <= 4",
    ),
    "an empty tile": (
        with_attention(key_start=3, key_end=3),
        "options.attention.key_start/key_end: [3, 3) is not a tile",
    ),
    "a tile's top_k": (
        with_attention(key_end=2, top_k=1),
        "options.attention.key_start/key_end: a tile holds every weight of its keys",
    ),
    "received rollout": (
        with_attention(received=True, rollout=True),
        "options.attention: received, row_entropy and key_start/key_end are per row of each "
        "head; leave options.attention.rollout unset",
    ),
    "received under changes": (
        build_request("abc", received=True, hidden_states=True),
        "options.attention: received, row_entropy and key_start/key_end are computed from "
        "the model as it is",
    ),
    "bad pooling": (
        raw_request(inputs=[pb.Input(text="x")], options=pb.EncodeOptions(pooling=5)),
        "options.pooling: 5 is not one of",
    ),
    "unknown hidden state": (
        build_request("abc", hidden_states={"layers": [3]}),
        "options.hidden_states.layers: 3 is outside [-3, 3)",
    ),
    "hidden state position": (
        build_request("abc", hidden_states={"positions": [-5]}),
        "options.hidden_states.positions: -5 is outside [-4, 4) for inputs[0], which has 4",
    ),
    "nothing of the hidden states": (
        build_request("abc", hidden_states={"omit_states": True}),
        "options.hidden_states.omit_states leaves nothing to return: set "
        "options.hidden_states.norms too",
    ),
    "predictions of a layer": (
        build_request("abc", predictions={"layers": [0]}),
        "options.predictions.layers: predictions read the last layer; ask options.logit_lens",
    ),
    "lens top_k": (
        build_request("abc", logit_lens={"top_k": 260}),
        "options.logit_lens.top_k: 260 is outside [1, 259]",
    ),
    "lens target": (
        build_request("abc", logit_lens={"target_ids": [259]}),
        "options.logit_lens.target_ids: 259 is outside the vocabulary [0, 259)",
    ),
    "attribution without targets": (
        build_request("abc", attribution={"positions": [-1]}),
        "options.attribution.target_ids: 0 ids; give 1 to 64",
    ),
    "attribution of too many targets": (
        build_request("abc", attribution={"target_ids": range(65)}),
        "options.attribution.target_ids: 65 ids; give 1 to 64",
    ),
    "attribution contrasts": (
        build_request("abc", attribution={"target_ids": [1, 2], "contrast_ids": [3]}),
        "options.attribution.contrast_ids: 1 ids for 2 target_ids; give one per target, or none",
    ),
    "attribution contrast outside the vocabulary": (
        build_request("abc", attribution={"target_ids": [1], "contrast_ids": [-1]}),
        "options.attribution.contrast_ids: -1 is outside the vocabulary [0, 259)",
    ),
    "attribution position": (
        build_request("abc", attribution={"target_ids": [1], "positions": [4]}),
        "options.attribution.positions: 4 is outside [-4, 4) for inputs[0], which has 4",
    ),
    "a mean of the wrong width": (
        build_request("abc", head_means={(0, 0): [0.0] * 3}),
        "options.head_mask[0].mean: 3 floats; a head's output has head_dim=16",
    ),
    "a mean that is not finite": (
        build_request("abc", head_means={(1, 3): [float("inf")] * 16}),
        "options.head_mask[0].mean: not every value is a finite number",
    ),
    "masked layer": (
        build_request("abc", head_mask={(2, 0): 0.0}),
        "options.head_mask[0].layer: 2 is outside [0, 2)",
    ),
    "masked head": (
        build_request("abc", head_mask={(0, 4): 0.0}),
        "options.head_mask[0].head: 4 is outside [0, 4)",
    ),
    "head masked twice": (
        raw_request(
            inputs=[pb.Input(text="x")],
            options=pb.EncodeOptions(
                head_mask=[pb.HeadScale(layer=1, head=2), pb.HeadScale(layer=1, head=2)]
            ),
        ),
        "options.head_mask[1]: layer 1 head 2 is listed twice",
    ),
    "masked by nan": (
        build_request("abc", head_mask={(0, 0): float("nan")}),
        "options.head_mask[0].scale: nan is not a finite number",
    ),
}


@pytest.mark.parametrize("case", INVALID)
def test_invalid_argument_names_field_and_limit(server, client, case):
    request, message = INVALID[case]
    with grpc.insecure_channel(server.address) as channel, pytest.raises(grpc.RpcError) as excinfo:
        pb_grpc.EncoderServiceStub(channel).Encode(request, timeout=30)
    assert excinfo.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in excinfo.value.details()
    assert client.encode("still serving")[0].embeddings.shape == (14, 64)  # <bos> + 13 bytes


def test_truncation_is_opt_in(client):
    out = client.encode([[1] * 301], truncate=True)
    assert out[0].truncated and len(out[0].token_ids) == 300


def test_an_answer_over_the_message_limit_says_what_to_ask_for(small_model_dir, small_runtime):
    # Full float32 attention at 300 tokens: 2 layers x 4 heads x 300^2 x 4 B = 2.9 MB.
    small = ServerThread(small_model_dir, small_runtime, max_message_bytes=1_000_000)
    try:
        with EncoderClient(small.address, ClientOptions(max_message_bytes=1_000_000)) as c:
            with pytest.raises(grpc.RpcError) as excinfo:
                c.encode([[1] * 300], attention=True)
            assert excinfo.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            details = excinfo.value.details()
            assert "more than the 1,000,000-byte message limit" in details
            assert "DTYPE_FLOAT16" in details and "ATTENTION_LAYOUT_CAUSAL_PACKED" in details
            assert small.metric("attnserve_sequences_total") == 0  # refused before any work
            # What it suggests works: float16 causal-packed is 4x smaller (0.72 MB).
            out = c.encode(
                [[1] * 300],
                attention=True,
                attention_dtype="float16",
                attention_layout="causal-packed",
            )
            assert out[0].attention.shape == (2, 4, 300, 300)
    finally:
        small.stop()


class FailsOn13:
    """The real runtime, except that a batch holding token id 13 is fed to ONNX Runtime as
    int32, which ORT itself rejects: a genuine ORT failure, through the public API."""

    def __init__(self, runtime: OrtRuntime) -> None:
        self.runtime = runtime
        self.config, self.version = runtime.config, runtime.version
        self.provider, self.precision = runtime.provider, runtime.precision
        self.graphs, self.saes = runtime.graphs, runtime.saes
        self.gradient_lengths = runtime.gradient_lengths
        self.run, self.warmup = runtime.run, runtime.warmup

    def embed(self, input_ids):
        if (input_ids == 13).any():
            input_ids = input_ids.astype(np.int32)
        return self.runtime.embed(input_ids)


def test_a_failed_batch_is_internal_and_the_server_keeps_serving(
    small_model_dir, small_runtime, caplog
):
    failing = ServerThread(small_model_dir, FailsOn13(small_runtime))
    try:
        with EncoderClient(failing.address, ClientOptions(retries=0)) as c:
            with pytest.raises(grpc.RpcError) as excinfo:
                c.encode([[13, 14]])
            assert excinfo.value.code() == grpc.StatusCode.INTERNAL
            assert "ONNX Runtime failed" in excinfo.value.details()
            assert "batch of 1 sequences" in caplog.text  # logged with its cause
            assert len(c.encode([[1, 2]]).encodings) == 1
    finally:
        failing.stop()


def test_a_protocol_names_the_field_path_in_its_own_words():
    """AttnserveError.named renames the field a message names first, by the longest path of
    a protocol's names it begins with, on a path's boundary; the rest of the message stays."""
    names = {
        "options.interventions": "interventions",
        "options.interventions[0].values": "inputs.steering",
        "options.truncate": "parameters.truncate",
    }
    error = InvalidInputError("options.interventions[1].hook: blocks.9 is not a site")
    renamed = error.named(names)
    assert type(renamed) is InvalidInputError and renamed.field == "interventions[1].hook"
    assert str(renamed) == "interventions[1].hook: blocks.9 is not a site"
    steering = InvalidInputError("options.interventions[0].values: 3 floats, want 8")
    assert str(steering.named(names)) == "inputs.steering: 3 floats, want 8"
    # not a path that merely begins with the same letters, nor a path in the message's body
    for message in ("options.truncation: 3 is not one of", "inputs[0]: set options.truncate"):
        error = InvalidInputError(message)
        assert error.named(names) is error
    match = r"^interventions\[0\]\.op: no"
    with pytest.raises(UnsupportedError, match=match) as caught, fields_named(names):
        raise UnsupportedError("options.interventions[0].op: no")
    assert isinstance(caught.value.__cause__, UnsupportedError)
