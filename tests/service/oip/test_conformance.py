"""The Open Inference Protocol and the Triton extensions the server advertises, from their text.

Each test quotes the sentence it checks: the protocol's REST and gRPC specifications
(kserve/open-inference-protocol, specification/protocol/inference_rest.md and
inference_grpc.md) and Triton's extension documents (triton-inference-server/server,
docs/protocol/extension_*.md). Real server on port 0, raw HTTP (httpx) and the protocol's
own gRPC stubs, real POSIX shared memory; after every refusal the server keeps serving.
"""

from __future__ import annotations

import json
import os
import uuid

import grpc
import httpx
import numpy as np
import pytest

from attnserve.oip import grpc_service_pb2 as oip
from attnserve.oip import grpc_service_pb2_grpc as oip_grpc
from attnserve.oip.wire import pack_bytes
from attnserve.service.oip.outputs import OUTPUT_DATATYPES, READOUT_OUTPUTS, STATISTICS_OUTPUTS
from tests.conftest import SMALL_CONFIG

MODEL = SMALL_CONFIG.name
IDS = [[5, 6, 7, 8]]


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.http_url, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def stub(server):
    channel = grpc.insecure_channel(server.address)
    yield oip_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


@pytest.fixture
def region(stub):
    """A registered 64 KiB POSIX shared-memory object: (name, file descriptor)."""
    name = f"conformance-{uuid.uuid4().hex[:8]}"
    fd = os.open(f"/dev/shm/{name}", os.O_CREAT | os.O_RDWR, 0o600)
    os.ftruncate(fd, 1 << 16)
    register = oip.SystemSharedMemoryRegisterRequest(name=name, key=f"/{name}", byte_size=1 << 16)
    stub.SystemSharedMemoryRegister(register)
    yield name, fd
    stub.SystemSharedMemoryUnregister(oip.SystemSharedMemoryUnregisterRequest(name=name))
    os.close(fd)
    os.unlink(f"/dev/shm/{name}")


def infer(http: httpx.Client, body: dict, **kwargs) -> httpx.Response:
    return http.post(f"/v2/models/{MODEL}/infer", json=body, **kwargs)


def ids_input(**extra) -> dict:
    return {"name": "input_ids", "datatype": "INT64", "shape": [1, 4], "data": IDS[0]} | extra


def embeddings(response: httpx.Response) -> np.ndarray:
    assert response.status_code == 200, response.text
    (output,) = [o for o in response.json()["outputs"] if o["name"] == "embeddings"]
    return np.array(output["data"], dtype=np.float32).reshape(output["shape"])


def refused(response: httpx.Response, status: int, *words: str) -> None:
    """A refusal in the protocol's error object, naming what was wrong."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and isinstance(body["error"], str)
    for word in words:
        assert word in body["error"], body["error"]


def grpc_refused(call, code: grpc.StatusCode, *words: str) -> None:
    with pytest.raises(grpc.RpcError) as error:
        call()
    assert error.value.code() == code
    for word in words:
        assert word in error.value.details(), error.value.details()


@pytest.fixture(scope="module")
def reference(http) -> np.ndarray:
    """The embeddings of IDS sent as JSON data: what every other way of sending must give."""
    return embeddings(infer(http, {"inputs": [ids_input()], "outputs": [{"name": "embeddings"}]}))


# --- the request object ---------------------------------------------------------------


def test_the_id_is_returned(http, stub):
    """ "id" : An identifier for this request. Optional, but if specified this identifier
    must be returned in the response."""
    response = infer(http, {"id": "req-7", "inputs": [ids_input()]})
    assert response.json()["id"] == "req-7"
    request = oip.ModelInferRequest(model_name=MODEL, id="req-8")
    request.inputs.add(name="input_ids", datatype="INT64", shape=[1, 4])
    request.raw_input_contents.append(np.array(IDS, "<i8").tobytes())
    assert stub.ModelInfer(request, timeout=60).id == "req-8"


def test_an_id_that_is_not_a_string_is_refused(http):
    """$inference_request = { "id" : $string #optional, ... }"""
    refused(infer(http, {"id": 7, "inputs": [ids_input()]}), 400, "id")


def test_without_outputs_every_output_is_returned(http):
    """ "outputs" : ... Optional, if not specified all outputs produced by the model will be
    returned using default $request_output settings.

    What the model produces unasked: attention_indices only with top_k, and the attention
    statistics by query blocks and the readouts (hidden states, logits, predictions, the
    lens: other graphs) only when named."""
    unasked = [n for n in OUTPUT_DATATYPES if n not in READOUT_OUTPUTS + STATISTICS_OUTPUTS]
    response = infer(http, {"inputs": [ids_input()]})
    names = [o["name"] for o in response.json()["outputs"]]
    assert names == [n for n in unasked if n != "attention_indices"]
    with_top_k = infer(http, {"inputs": [ids_input()], "parameters": {"top_k": 2}})
    assert [o["name"] for o in with_top_k.json()["outputs"]] == unasked
    named = infer(http, {"inputs": [ids_input()], "outputs": [{"name": "logits"}]})
    assert [o["name"] for o in named.json()["outputs"]] == ["logits"]


@pytest.mark.parametrize(
    "shape",
    [[1, -4], [1, 4.0], [1, True], [1, 2**64], "4", [2**40, 2**40]],
    ids=["negative", "float", "bool", "over-uint64", "not-a-list", "overflowing-product"],
)
def test_each_dimension_must_be_a_non_negative_integer(http, shape):
    """ "shape" : The shape of the input tensor. Each dimension must be an integer
    representable as an unsigned 64-bit integer value. (A product past int64 is refused,
    not computed: sizes are Python integers.)"""
    refused(infer(http, {"inputs": [ids_input(shape=shape)]}), 400, "inputs[0]")


def test_the_data_must_hold_the_whole_batch(http, stub):
    """If the input is batched, the shape and data must represent the full shape and
    contents of the entire batch."""
    refused(infer(http, {"inputs": [ids_input(shape=[2, 4])]}), 400, "inputs[0].data", "8")
    request = oip.ModelInferRequest(model_name=MODEL)
    request.inputs.add(name="input_ids", datatype="INT64", shape=[2, 4])
    request.raw_input_contents.append(np.array(IDS, "<i8").tobytes())
    grpc_refused(
        lambda: stub.ModelInfer(request, timeout=60),
        grpc.StatusCode.INVALID_ARGUMENT,
        "64 bytes",
    )


@pytest.mark.parametrize("element", [True, 1.5, "5", None])
def test_elements_of_the_wrong_json_type_are_refused(http, element):
    """ "datatype" : The data-type of the input tensor elements as defined in Tensor Data
    Types. (An INT64 element is a JSON integer: true, 1.5 or "5" is not converted.)"""
    data = [element, 6, 7, 8]
    refused(infer(http, {"inputs": [ids_input(data=data)]}), 400, "inputs[0].data")


def test_an_unknown_model_is_an_error_object(http, stub):
    """A failed model metadata request must be indicated by an HTTP error status (typically
    400). The HTTP body must contain the $metadata_model_error_response object."""
    refused(http.get("/v2/models/nope"), 404, "nope")
    refused(http.post("/v2/models/nope/infer", json={"inputs": [ids_input()]}), 404, "nope")
    grpc_refused(
        lambda: stub.ModelMetadata(oip.ModelMetadataRequest(name="nope")),
        grpc.StatusCode.NOT_FOUND,
        "nope",
    )


def test_model_ready_names_the_model(http):
    """$ready_model_response = { "name" : $string, "ready": $bool }"""
    assert http.get(f"/v2/models/{MODEL}/ready").json() == {"name": MODEL, "ready": True}


# --- parameters: each of its type, never coerced --------------------------------------


@pytest.mark.parametrize(
    ("name", "value"),
    [("truncate", 1), ("top_k", True), ("top_k", "3"), ("pooling", 2), ("rollout", "yes")],
)
def test_a_parameter_of_the_wrong_type_is_refused_by_name(http, stub, name, value):
    """ "parameters" : An object containing zero or more parameters for this inference
    request expressed as key/value pairs. (Each of the model's parameters has one type.)"""
    body = {"inputs": [ids_input()], "outputs": [{"name": "attention"}]}
    refused(infer(http, body | {"parameters": {name: value}}), 400, f"parameters.{name}")
    request = oip.ModelInferRequest(model_name=MODEL)
    request.inputs.add(name="input_ids", datatype="INT64", shape=[1, 4])
    request.raw_input_contents.append(np.array(IDS, "<i8").tobytes())
    request.outputs.add(name="attention")
    parameter = request.parameters[name]
    if isinstance(value, bool):
        parameter.bool_param = value
    elif isinstance(value, int):
        parameter.int64_param = value
    else:
        parameter.string_param = value
    grpc_refused(
        lambda: stub.ModelInfer(request, timeout=60),
        grpc.StatusCode.INVALID_ARGUMENT,
        f"parameters.{name}",
    )


@pytest.mark.parametrize("value", [[1], {"a": 1}, None, 2**64])
def test_a_parameter_value_must_be_a_bool_number_or_string(http, value):
    """$parameters = { $parameter, ... }; $parameter = $string : $string | $number | $boolean"""
    refused(infer(http, {"inputs": [ids_input()], "parameters": {"top_k": value}}), 400, "top_k")


# --- the binary tensor data extension -------------------------------------------------


def test_binary_inputs_and_outputs_follow_the_json_object(http, reference):
    """When one or more tensors are communicated as binary data, the HTTP body of the request
    or response will contain the JSON inference request or response object followed by the
    binary tensor data ... the Inference-Header-Content-Length header must be provided to
    give the length of the JSON object."""
    raw = np.array(IDS, "<i8").tobytes()
    tensor = ids_input(parameters={"binary_data_size": len(raw)})
    del tensor["data"]
    header = json.dumps(
        {
            "inputs": [tensor],
            "outputs": [{"name": "embeddings", "parameters": {"binary_data": True}}],
        }
    ).encode()
    response = http.post(
        f"/v2/models/{MODEL}/infer",
        content=header + raw,
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert response.status_code == 200, response.text
    length = int(response.headers["inference-header-content-length"])
    (output,) = json.loads(response.content[:length])["outputs"]
    assert output["parameters"] == {"binary_data_size": len(response.content) - length}
    array = np.frombuffer(response.content[length:], "<f4").reshape(output["shape"])
    np.testing.assert_array_equal(array, reference)


def test_binary_data_on_an_output_overrides_binary_data_output(http):
    """If "binary_data" is specified on an output it overrides this setting."""
    body = {
        "inputs": [ids_input()],
        "parameters": {"binary_data_output": True},
        "outputs": [
            {"name": "lengths", "parameters": {"binary_data": False}},
            {"name": "token_ids"},
        ],
    }
    response = infer(http, body)
    length = int(response.headers["inference-header-content-length"])
    lengths, token_ids = json.loads(response.content[:length])["outputs"]
    assert lengths["data"] == [4] and "data" not in token_ids
    assert token_ids["parameters"]["binary_data_size"] == 4 * 8


@pytest.mark.parametrize(
    ("where", "value"),
    [("binary_data", "yes"), ("binary_data_output", 1), ("binary_data_size", True)],
)
def test_the_extensions_parameters_have_their_types(http, where, value):
    """ "binary_data_size" : int64 parameter ...; "binary_data" : bool parameter ...;
    "binary_data_output" : bool parameter ..."""
    body: dict = {"inputs": [ids_input()], "outputs": [{"name": "lengths"}]}
    if where == "binary_data":
        body["outputs"][0]["parameters"] = {where: value}
    elif where == "binary_data_output":
        body["parameters"] = {where: value}
    else:
        body["inputs"][0]["parameters"] = {where: value}
    refused(infer(http, body), 400, where)


# --- the system shared memory extension -----------------------------------------------


def test_an_input_in_shared_memory_gives_the_same_answer(http, stub, region, reference):
    """The shared-memory parameters may be used in the $request_input parameters to indicate
    that the corresponding input is being communicated via shared memory."""
    name, fd = region
    raw = np.array(IDS, "<i8").tobytes()
    os.pwrite(fd, raw, 256)
    where = {"shared_memory_region": name, "shared_memory_offset": 256}
    tensor = ids_input(parameters=where | {"shared_memory_byte_size": len(raw)})
    del tensor["data"]
    body = {"inputs": [tensor], "outputs": [{"name": "embeddings"}]}
    np.testing.assert_array_equal(embeddings(infer(http, body)), reference)

    request = oip.ModelInferRequest(model_name=MODEL)
    tensor = request.inputs.add(name="input_ids", datatype="INT64", shape=[1, 4])
    tensor.parameters["shared_memory_region"].string_param = name
    tensor.parameters["shared_memory_offset"].int64_param = 256
    tensor.parameters["shared_memory_byte_size"].int64_param = len(raw)
    request.outputs.add(name="embeddings")
    response = stub.ModelInfer(request, timeout=60)
    array = np.frombuffer(response.raw_output_contents[0], "<f4").reshape(reference.shape)
    np.testing.assert_array_equal(array, reference)


def test_text_in_shared_memory_uses_the_bytes_layout(http, region):
    """For BYTES type an element is represented by a 4-byte unsigned integer giving the
    length followed by the actual bytes. (The binary layout, in a region as on the wire.)"""
    name, fd = region
    data = pack_bytes([b"The cat sat.", b"Hi"])
    os.pwrite(fd, data, 0)
    where = {"shared_memory_region": name, "shared_memory_byte_size": len(data)}
    tensor = {"name": "text", "datatype": "BYTES", "shape": [2], "parameters": where}
    shm = infer(http, {"inputs": [tensor], "outputs": [{"name": "lengths"}]})
    texts = {"name": "text", "datatype": "BYTES", "shape": [2], "data": ["The cat sat.", "Hi"]}
    wire = infer(http, {"inputs": [texts], "outputs": [{"name": "lengths"}]})
    assert shm.json()["outputs"] == wire.json()["outputs"]


def test_an_input_in_shared_memory_must_not_carry_data(http, region):
    """When these parameters are set for an input tensor the "data" field of $request_input
    must not be set. If the "data" field is set Triton will return an error."""
    name, _ = region
    where = {"shared_memory_region": name, "shared_memory_byte_size": 32}
    refused(infer(http, {"inputs": [ids_input(parameters=where)]}), 400, "inputs[0]", "data")


@pytest.mark.parametrize("given", ["shared_memory_region", "shared_memory_byte_size"])
def test_region_and_byte_size_come_together(http, region, given):
    """The "shared_memory_offset" parameter is optional and defaults to zero. The other two
    parameters are required. If only one of the two is given Triton will return an error."""
    name, _ = region
    value = name if given == "shared_memory_region" else 32
    tensor = ids_input(parameters={given: value})
    del tensor["data"]
    missing = ({"shared_memory_region", "shared_memory_byte_size"} - {given}).pop()
    refused(infer(http, {"inputs": [tensor]}), 400, missing)
    output = {"name": "lengths", "parameters": {given: value}}
    refused(infer(http, {"inputs": [ids_input()], "outputs": [output]}), 400, missing)


@pytest.mark.parametrize(
    ("key", "value"),
    [("shared_memory_region", 5), ("shared_memory_offset", "0"), ("shared_memory_byte_size", -8)],
)
def test_shared_memory_parameters_have_their_types(http, region, key, value):
    """ "shared_memory_region" : string value ...; "shared_memory_offset" : int64 value ...;
    "shared_memory_byte_size" : int64 value is the size, in bytes, of the data."""
    name, _ = region
    where = {"shared_memory_region": name, "shared_memory_byte_size": 32} | {key: value}
    tensor = ids_input(parameters=where)
    del tensor["data"]
    refused(infer(http, {"inputs": [tensor]}), 400, key)


def test_an_output_in_shared_memory_has_no_data(http, region):
    """When these parameters are set for a requested output tensor the returned
    $response_output must not define the "data" field."""
    name, fd = region
    where = {"shared_memory_region": name, "shared_memory_byte_size": 8}
    response = infer(
        http, {"inputs": [ids_input()], "outputs": [{"name": "lengths", "parameters": where}]}
    )
    (output,) = response.json()["outputs"]
    assert "data" not in output and output["parameters"] == where
    assert np.frombuffer(os.pread(fd, 8, 0), "<i8").tolist() == [4]


# --- the model repository extension -----------------------------------------------------


def test_the_index_can_list_only_ready_models(http, stub):
    """ "ready" : Optional, default is false. If true return only models ready for
    inferencing."""
    everything = http.post("/v2/repository/index", json={}).json()
    assert http.post("/v2/repository/index", json={"ready": True}).json() == everything
    refused(http.post("/v2/repository/index", json={"ready": "yes"}), 400, "ready")
    ready = stub.RepositoryIndex(oip.RepositoryIndexRequest(ready=True)).models
    assert [m.name for m in ready] == [e["name"] for e in everything]


def test_a_failed_load_is_an_error_object(http, stub):
    """A failed load request must be indicated by an HTTP error status (typically 400). The
    HTTP body must contain the $repository_load_error_response object. (This server serves
    one directory, --model: it loads nothing, and says to serve a repository.)"""
    refused(http.post("/v2/repository/models/nope/load"), 400, "cannot load 'nope'")
    grpc_refused(
        lambda: stub.RepositoryModelLoad(oip.RepositoryModelLoadRequest(model_name="nope")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "--model-repository",
    )


def test_a_load_parameter_that_is_not_taken_is_refused(http):
    """The load API accepts the following parameters: "config" : string parameter that
    contains a JSON representation of the model configuration ... (attnserve loads what the
    model directory holds: it refuses "config" by name rather than ignore it)."""
    body = {"parameters": {"config": "{}"}}
    refused(http.post(f"/v2/repository/models/{MODEL}/load", json=body), 400, "parameters.config")


# --- gRPC ------------------------------------------------------------------------------


def test_raw_contents_exclude_typed_contents(stub):
    """If this field [raw_input_contents] is specified then InferInputTensor::contents must
    not be specified for any input tensor."""
    request = oip.ModelInferRequest(model_name=MODEL)
    tensor = request.inputs.add(name="input_ids", datatype="INT64", shape=[1, 4])
    tensor.contents.int64_contents.extend(IDS[0])
    request.raw_input_contents.append(np.array(IDS, "<i8").tobytes())
    grpc_refused(
        lambda: stub.ModelInfer(request, timeout=60),
        grpc.StatusCode.INVALID_ARGUMENT,
        "inputs[0].contents",
    )


def test_typed_contents_give_the_same_answer(stub, reference):
    """contents: The tensor contents using a data-type format. (INT64 in int64_contents.)"""
    request = oip.ModelInferRequest(model_name=MODEL)
    tensor = request.inputs.add(name="input_ids", datatype="INT64", shape=[1, 4])
    tensor.contents.int64_contents.extend(IDS[0])
    request.outputs.add(name="embeddings")
    response = stub.ModelInfer(request, timeout=60)
    array = np.frombuffer(response.raw_output_contents[0], "<f4").reshape(reference.shape)
    np.testing.assert_array_equal(array, reference)


# --- what the server advertises, it implements ----------------------------------------


def test_every_advertised_extension_answers(http, stub):
    """ "extensions" : The extensions supported by the server. (Each one listed answers on
    both transports; nothing else is listed.)"""
    extensions = http.get("/v2").json()["extensions"]
    assert set(extensions) == {
        "model_configuration",
        "model_repository",
        "statistics",
        "system_shared_memory",
        "binary_tensor_data",
    }
    assert list(stub.ServerMetadata(oip.ServerMetadataRequest()).extensions) == extensions
    assert http.get(f"/v2/models/{MODEL}/config").json()["name"] == MODEL
    config = stub.ModelConfig(oip.ModelConfigRequest(name=MODEL)).config
    assert config.name == MODEL and config.input[0].name == "input_ids"
    stats = http.get(f"/v2/models/{MODEL}/stats").json()["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] > 0
    grpc_stats = stub.ModelStatistics(oip.ModelStatisticsRequest(name=MODEL)).model_stats[0]
    assert grpc_stats.inference_stats.success.count >= stats["inference_stats"]["success"]["count"]
    assert http.get("/v2/systemsharedmemory/status").status_code == 200
    index = http.post("/v2/repository/index", json={}).json()
    assert index == [{"name": MODEL, "version": "1", "state": "READY", "reason": ""}]
    grpc_index = stub.RepositoryIndex(oip.RepositoryIndexRequest()).models
    assert [(m.name, m.state) for m in grpc_index] == [(MODEL, "READY")]
