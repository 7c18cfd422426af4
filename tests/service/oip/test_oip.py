"""The Open Inference Protocol (KServe V2) over gRPC and HTTP.

tritonclient, unmodified (tritonclient_driver.py), calls a real server (its own process,
port 0) with its gRPC and its HTTP client; its numbers must equal Encode's. The
translation on its own, field by field: test_tensors.py.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from attnserve.client import EncoderClient
from attnserve.service.oip.outputs import (
    READOUT_OUTPUTS,
)
from attnserve.service.process import spawn_server
from tests.conftest import SMALL_CONFIG
from tests.service.oip.tritonclient_driver import handle

MODEL = SMALL_CONFIG.name


@pytest.fixture(scope="module")
def v2_server(small_model_dir):
    server = spawn_server(small_model_dir, "--provider", "cpu")
    yield server
    server.process.terminate()
    server.process.wait(30)


# A refusal's status as each of tritonclient's clients reports it.
STATUS = {
    "grpc": {
        "INVALID_ARGUMENT": "StatusCode.INVALID_ARGUMENT",
        "NOT_FOUND": "StatusCode.NOT_FOUND",
    },
    "http": {"INVALID_ARGUMENT": "400", "NOT_FOUND": "404"},
}


class Triton:
    """One of tritonclient's clients, one call at a time."""

    def __init__(self, protocol: str, address: str) -> None:
        self.protocol = protocol
        self.module = importlib.import_module(f"tritonclient.{protocol}")
        self.client = self.module.InferenceServerClient(address)

    def send(self, command: dict) -> dict:
        return handle(self.protocol, self.module, self.client, command)

    def call(self, name: str, *args) -> object:
        answer = self.send({"call": name, "args": list(args)})
        assert "error" not in answer, answer
        return answer["result"]

    def status(self, code: str) -> str:
        return STATUS[self.protocol][code]

    def infer(self, inputs, outputs=(), parameters=None, model=MODEL, shm_bytes=0) -> dict:
        spec = {"model": model, "inputs": inputs, "outputs": list(outputs)}
        if parameters:
            spec["parameters"] = parameters
        return self.send({"infer": spec, "shm_bytes": shm_bytes})


@pytest.fixture(scope="module", params=["grpc", "http"])
def triton(request, v2_server):
    address = v2_server.address if request.param == "grpc" else f"127.0.0.1:{v2_server.http_port}"
    client = Triton(request.param, address)
    yield client
    client.client.close()


STEERING = {"name": "steering", "datatype": "FP32", "shape": [64], "data": [0.5] * 64}


def ids_input(rows: list[list[int]]) -> dict:
    return {
        "name": "input_ids",
        "datatype": "INT64",
        "shape": [len(rows), len(rows[0])],
        "data": [i for row in rows for i in row],
    }


def array(output: dict) -> np.ndarray:
    return np.array(output["data"]).reshape(output["shape"])


def test_health_and_metadata_through_tritonclient(triton, small_runtime):
    assert triton.call("is_server_live") is True
    assert triton.call("is_server_ready") is True
    assert triton.call("is_model_ready", MODEL) is True
    assert triton.call("is_model_ready", "no-such-model") is False
    server = triton.call("get_server_metadata")
    assert server["name"] == "attnserve" and "statistics" in server["extensions"]
    meta = triton.call("get_model_metadata", MODEL)
    assert meta["versions"] == ["1"]  # numeric, as Triton's tools expect
    assert triton.call("is_model_ready", MODEL, small_runtime.version) is True  # the hash too
    inputs = {t["name"]: (t["datatype"], [int(d) for d in t["shape"]]) for t in meta["inputs"]}
    assert inputs["input_ids"] == ("INT64", [-1, -1])
    assert inputs["text"] == ("BYTES", [-1])
    outputs = {t["name"]: (t["datatype"], [int(d) for d in t["shape"]]) for t in meta["outputs"]}
    assert outputs["embeddings"] == ("FP32", [-1, -1, SMALL_CONFIG.d_model])
    assert set(outputs) >= {"pooled", "attention", "attention_indices", "head_entropy"}
    # perf_analyzer asks for every listed output: the readouts are named, never listed
    assert not set(outputs) & set(READOUT_OUTPUTS) and "head_mask" not in inputs
    config = triton.call("get_model_config", MODEL)
    config = config.get("config", config)  # gRPC wraps it in ModelConfigResponse
    assert config["name"] == MODEL and config["platform"] == "onnxruntime_onnx"
    assert [i["name"] for i in config["input"]] == ["input_ids", "input_lengths", "text"]


def test_model_infer_equals_encode(triton, v2_server):
    rows = [[5, 6, 7, 8, 9, 10], [11, 12, 13, 256, 256, 256]]  # the second is 3 long
    lengths = {"name": "input_lengths", "datatype": "INT64", "shape": [2], "data": [6, 3]}
    answer = triton.infer(
        [ids_input(rows), lengths],
        outputs=["embeddings", "pooled", "lengths"],
        parameters={"pooling": "mean"},
    )
    outputs = answer["outputs"]
    with EncoderClient(v2_server.address) as client:
        expected = client.encode([rows[0], rows[1][:3]], pooling="mean")
    embeddings = array(outputs["embeddings"])
    assert embeddings.shape == (2, 6, SMALL_CONFIG.d_model)
    np.testing.assert_allclose(embeddings[0], expected[0].embeddings, atol=1e-6, rtol=0)
    np.testing.assert_allclose(embeddings[1, :3], expected[1].embeddings, atol=1e-6, rtol=0)
    assert not embeddings[1, 3:].any()  # past its length: zeros
    np.testing.assert_allclose(
        array(outputs["pooled"]), np.stack([e.pooled for e in expected]), atol=1e-6, rtol=0
    )
    assert array(outputs["lengths"]).tolist() == [6, 3]


def test_text_and_attention_options_through_tritonclient(triton, v2_server):
    text = {"name": "text", "datatype": "BYTES", "shape": [1], "data": ["attention"]}
    answer = triton.infer(
        [text],
        outputs=["attention", "head_entropy", "token_ids"],
        parameters={"attention_layers": "1", "attention_rows": "-1", "head_reduction": "mean"},
    )
    outputs = answer["outputs"]
    with EncoderClient(v2_server.address) as client:
        (expected,) = client.encode(
            "attention", layers=[1], rows=[-1], head_reduction="mean", head_entropy=True
        )
    assert outputs["attention"]["datatype"] == "FP32"
    np.testing.assert_allclose(array(outputs["attention"])[0], expected.attention, atol=1e-6)
    np.testing.assert_allclose(array(outputs["head_entropy"])[0], expected.head_entropy, atol=1e-6)
    assert array(outputs["token_ids"])[0].tolist() == list(expected.token_ids)


def test_head_mask_hidden_states_predictions_and_lens_through_tritonclient(triton, v2_server):
    """The readouts as V2 tensors equal Encode's, rows of different lengths zero-padded."""
    rows = [[5, 6, 7, 8, 9, 10], [11, 12, 13, 256, 256, 256]]
    lengths = {"name": "input_lengths", "datatype": "INT64", "shape": [2], "data": [6, 3]}
    mask = np.ones((SMALL_CONFIG.n_layers, SMALL_CONFIG.n_heads), np.float32)
    mask[1, 2] = 0.0
    head_mask = {"name": "head_mask", "datatype": "FP32", "shape": list(mask.shape)}
    head_mask["data"] = mask.ravel().tolist()
    answer = triton.infer(
        [ids_input(rows), lengths, head_mask],
        outputs=[
            "hidden_states",
            "logits",
            "next_token_ids",
            "target_probabilities",
            "lens_probabilities",
        ],
        parameters={
            "hidden_layers": "0,2",
            "lens_positions": "-1",
            "lens_norm": "own",
            "top_tokens": 2,
            "target_ids": "5,9",
        },
    )
    outputs = answer["outputs"]
    with EncoderClient(v2_server.address) as client:
        expected = client.encode(
            [rows[0], rows[1][:3]],
            head_mask=mask,
            hidden_states={"layers": [0, 2]},
            predictions={"top_k": 2, "target_ids": [5, 9], "logits": True},
            logit_lens={"positions": [-1], "top_k": 2, "lens_norm": "own"},
        )
    hidden = array(outputs["hidden_states"])
    assert hidden.shape == (2, 2, 6, SMALL_CONFIG.d_model)
    np.testing.assert_allclose(hidden[1, :, :3], expected[1].hidden_states, atol=1e-6)
    assert not hidden[1, :, 3:].any()
    logits = array(outputs["logits"])
    assert logits.shape == (2, 6, SMALL_CONFIG.vocab_size)
    np.testing.assert_allclose(logits[0], expected[0].predictions.logits[0], atol=1e-6)
    ids = array(outputs["next_token_ids"])
    assert outputs["next_token_ids"]["datatype"] == "INT32" and ids.shape == (2, 6, 2)
    np.testing.assert_array_equal(ids[1, :3], expected[1].predictions.top_ids[0])
    assert (ids[1, 3:] == -1).all()  # past its length: -1, not token 0
    targets = array(outputs["target_probabilities"])
    np.testing.assert_allclose(
        targets[0], expected[0].predictions.target_probabilities[0], atol=1e-7
    )
    lens = array(outputs["lens_probabilities"])
    assert lens.shape == (2, SMALL_CONFIG.n_layers + 1, 1, 2)
    np.testing.assert_allclose(lens[1], expected[1].logit_lens.top_probabilities, atol=1e-7)
    # the mask was applied: without it the logits differ
    with EncoderClient(v2_server.address) as client:
        plain = client.encode(rows[0], predictions={"logits": True})
    assert np.abs(plain[0].predictions.logits[0] - logits[0]).max() > 1e-4


def test_attribution_through_tritonclient(triton, v2_server):
    """Direct logit attribution as V2 tensors equals Encode's, rows zero-padded."""
    rows = [[5, 6, 7, 8, 9], [11, 12, 256, 256, 256]]
    lengths = {"name": "input_lengths", "datatype": "INT64", "shape": [2], "data": [5, 2]}
    names = [
        "attribution_heads",
        "attribution_attention_biases",
        "attribution_mlps",
        "attribution_embeddings",
        "attribution_constants",
    ]
    answer = triton.infer(
        [ids_input(rows), lengths],
        outputs=names,
        parameters={"attribution_target_ids": "5,9", "attribution_contrast_ids": "7,7"},
    )
    outputs = answer["outputs"]
    with EncoderClient(v2_server.address) as client:
        expected = client.encode(
            [rows[0], rows[1][:2]], attribution={"target_ids": [5, 9], "contrast_ids": [7, 7]}
        )
    heads = array(outputs["attribution_heads"])
    assert heads.shape == (2, 5, 2, SMALL_CONFIG.n_layers, SMALL_CONFIG.n_heads)
    for name in names:
        got = array(outputs[name])
        for row, encoding in enumerate(expected):
            want = getattr(encoding.attribution, name.removeprefix("attribution_"))
            np.testing.assert_allclose(got[row, : len(want)], want, atol=1e-6)
        assert not got[1, 2:].any()  # past the second row's length: zeros


def test_mean_ablation_through_tritonclient(triton, v2_server):
    """head_mask and head_means as V2 inputs equal Encode's HeadScale entries."""
    L, H, d_k = SMALL_CONFIG.n_layers, SMALL_CONFIG.n_heads, SMALL_CONFIG.head_dim
    mask = np.ones((L, H), np.float32)
    mask[0, 3] = 0.0
    means = np.zeros((L, H, d_k), np.float32)
    means[0, 3] = np.linspace(-1, 1, d_k)
    means[1, 0] = 0.5  # scale 1, moved
    inputs = [ids_input([[5, 6, 7, 8]])]
    for name, values in (("head_mask", mask), ("head_means", means)):
        inputs.append(
            {
                "name": name,
                "datatype": "FP32",
                "shape": list(values.shape),
                "data": values.ravel().tolist(),
            }
        )
    answer = triton.infer(inputs, outputs=["embeddings"])
    with EncoderClient(v2_server.address) as client:
        (expected,) = client.encode(
            [5, 6, 7, 8],
            head_mask={(0, 3): 0.0},
            head_means={(0, 3): means[0, 3], (1, 0): means[1, 0]},
        )
        (plain,) = client.encode([5, 6, 7, 8], head_mask={(0, 3): 0.0})
    embeddings = array(answer["outputs"]["embeddings"])[0]
    np.testing.assert_allclose(embeddings, expected.embeddings, atol=1e-6)
    assert np.abs(embeddings - plain.embeddings).max() > 1e-3


@pytest.mark.parametrize(
    ("inputs", "outputs", "parameters", "field"),
    [
        (
            [{"name": "input_ids", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}],
            [],
            None,
            "inputs[0].datatype",
        ),
        (
            [{"name": "tokens", "datatype": "INT64", "shape": [1, 2], "data": [1, 2]}],
            [],
            None,
            "inputs[0].name",
        ),
        (
            [{"name": "input_ids", "datatype": "INT64", "shape": [2], "data": [1, 2]}],
            [],
            None,
            "inputs[0].shape",
        ),
        ([ids_input([[1, 2]])], ["probabilities"], None, "outputs[0].name"),
        (
            [
                ids_input([[1, 2]]),
                {"name": "head_mask", "datatype": "FP32", "shape": [4, 2], "data": [0] * 8},
            ],
            [],
            None,
            "head_mask has shape [4, 2], this model's is [2, 4]",
        ),
        (
            [
                ids_input([[1, 2]]),
                {"name": "head_means", "datatype": "FP32", "shape": [2, 4, 3], "data": [0] * 24},
            ],
            [],
            None,
            "head_means has shape [2, 4, 3], this model's is [2, 4, 16]",
        ),
        ([ids_input([[1, 2]])], ["target_probabilities"], None, "needs the target_ids"),
        ([ids_input([[1, 2]])], ["logits"], {"lens_layers": "0"}, "lens_layers needs one of"),
        (
            [ids_input([[1, 2]])],
            ["lens_token_ids"],
            {"lens_layers": "3"},
            "parameters.lens_layers: 3 is outside [-3, 3)",
        ),
        (
            [ids_input([[1, 2]])],
            ["lens_token_ids"],
            {"lens_norm": "both"},
            "lens_norm must be one of",
        ),
        (
            [ids_input([[1, 2]])],
            ["attention"],
            {"attention_layers": "0,5"},
            "parameters.attention_layers: 5 is outside [-2, 2)",
        ),
        (
            [ids_input([[1, 2]])],
            ["next_token_ids"],
            {"top_tokens": 5000},
            "parameters.top_tokens: 5000 is outside [1, 259]",
        ),
        ([ids_input([[1, 2]])], ["attribution_mlps"], None, "need the attribution_target_ids"),
        (
            [ids_input([[1, 2]])],
            ["logits"],
            {"attribution_target_ids": "1"},
            "attribution_target_ids needs one of",
        ),
        ([ids_input([[1, 2]])], [], {"temperature": 0.5}, "parameters"),
        ([ids_input([[1, 2]]), STEERING], [], None, "the steering input needs steering_hook"),
        ([ids_input([[1, 2]])], [], {"steering_hook": "x"}, "needs the steering input"),
        (
            [ids_input([[1, 2]]), {**STEERING, "shape": [3], "data": [1.0, 2.0, 3.0]}],
            [],
            {"steering_hook": "blocks.0.hook_resid_pre"},
            "inputs.steering: shape [3]",
        ),
        (
            [ids_input([[1, 2]]), STEERING],
            [],
            {"steering_hook": "blocks.0.attn.hook_pattern"},
            "parameters.steering_hook: blocks.0.attn.hook_pattern is not one of the sites",
        ),
        (
            [ids_input([[1, 2]])],
            ["patching"],
            {"patching_hook": "z"},
            "need patching_source, patching_target_id, patching_contrast_id",
        ),
        ([ids_input([[1, 9999]])], [], None, "vocab"),
        (
            [{"name": "input_lengths", "datatype": "INT64", "shape": [1], "data": [2]}],
            [],
            None,
            "input_ids",
        ),
    ],
)
def test_bad_input_is_invalid_argument_naming_the_field(triton, inputs, outputs, parameters, field):
    before = triton.infer([ids_input([[1, 2, 3]])])["outputs"]["embeddings"]
    answer = triton.infer(inputs, outputs, parameters)
    assert answer["error"]["status"] == triton.status("INVALID_ARGUMENT"), answer
    assert field in answer["error"]["message"]
    assert "options." not in answer["error"]["message"]  # V2 names, not attnserve.v1's
    after = triton.infer([ids_input([[1, 2, 3]])])["outputs"]["embeddings"]
    np.testing.assert_allclose(array(after), array(before), atol=1e-6)  # nothing changed


def test_tritonclients_shared_memory_utilities(triton):
    """tritonclient makes, registers, reads and removes the region; the numbers are the wire's."""
    inputs, parameters = [ids_input([[1, 2, 3, 4]])], {"attention_layers": "0"}
    wire = triton.infer(inputs, ["attention"], parameters)["outputs"]["attention"]
    size = array(wire).size * 4
    shared = triton.infer(inputs, ["attention"], parameters, shm_bytes=size)
    np.testing.assert_array_equal(array(shared["outputs"]["attention"]), array(wire))
    too_small = triton.infer(inputs, ["attention"], parameters, shm_bytes=size - 4)
    assert too_small["error"]["status"] == triton.status("INVALID_ARGUMENT")
    assert "shared_memory_byte_size" in too_small["error"]["message"]


def test_an_unknown_model_is_not_found(triton):
    answer = triton.infer([ids_input([[1, 2]])], model="gpt-5")
    assert answer["error"]["status"] == triton.status("NOT_FOUND")
    assert MODEL in answer["error"]["message"]  # says what is served instead


def test_statistics_count_the_requests(triton):
    before = triton.call("get_inference_statistics", MODEL)["model_stats"][0]
    triton.infer([ids_input([[1, 2, 3], [4, 5, 6]])])
    after = triton.call("get_inference_statistics", MODEL)["model_stats"][0]
    assert int(after["inference_count"]) == int(before.get("inference_count", 0)) + 2
    assert int(after["execution_count"]) == int(before.get("execution_count", 0)) + 1


def test_patching_and_steering_through_tritonclient(triton, v2_server):
    """The patching grid as V2 outputs and a steering vector as a V2 input equal Encode's:
    what the protocol's named tensors carry of interventions (docs/api.md)."""
    corrupted, clean = "Mary gave it", "John gave it"
    text = {"name": "text", "datatype": "BYTES", "shape": [1], "data": [corrupted]}
    asked = {"patching_source": clean, "patching_hook": "resid_pre"}
    asked |= {"patching_target_id": ord("M"), "patching_contrast_id": ord("J")}
    names = ["patching", "patching_clean", "patching_corrupted"]
    answer = triton.infer([text], outputs=names, parameters=asked)
    outputs = answer["outputs"]
    with EncoderClient(v2_server.address) as client:
        want = client.encode(
            corrupted,
            patching={"source": clean, "hook": "resid_pre", "target": "M", "contrast": "J"},
        )[0].patching
        steer = np.linspace(-2, 2, SMALL_CONFIG.d_model, dtype=np.float32)
        hook = "blocks.1.hook_resid_pre"
        steered = client.encode(
            corrupted,
            interventions=[
                {"hook": hook, "op": "add", "values": steer, "scale": 3.0, "positions": [-1]}
            ],
        )[0].embeddings
    np.testing.assert_allclose(array(outputs["patching"])[0], want.values, atol=1e-6)
    assert array(outputs["patching_clean"])[0] == pytest.approx(want.clean, abs=1e-6)
    assert array(outputs["patching_corrupted"])[0] == pytest.approx(want.corrupted, abs=1e-6)
    # the answer says when "recovered" means little (clean and corrupted < 1.0 apart)
    assert want.warning is not None  # this random model's answer barely moves
    assert answer["parameters"]["patching_warning"] == f"row 0: {want.warning}"
    steering = {
        "name": "steering",
        "datatype": "FP32",
        "shape": [SMALL_CONFIG.d_model],
        "data": steer.tolist(),
    }
    params = {"steering_hook": hook, "steering_scale": 3.0, "steering_positions": "-1"}
    got = triton.infer([text, steering], outputs=["embeddings"], parameters=params)["outputs"]
    np.testing.assert_allclose(array(got["embeddings"])[0], steered, atol=1e-6)
    assert triton.call("is_server_ready") is True
