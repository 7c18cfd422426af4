"""Sparse-autoencoder features through the real server (attnserve.v1 over gRPC and JSON, the
Open Inference Protocol by tritonclient): SAELens' own
`SAE.encode` of the hook sites the PyTorch model computes, the options that select them,
and requests refused by the field they get wrong."""

from __future__ import annotations

import json

import grpc
import httpx
import numpy as np
import pytest
import torch

from attnserve.client import ClientOptions, EncoderClient
from attnserve.export.sae import add_sae
from attnserve.model.hook_points import captured, head_ablation, hooked
from tests.conftest import SMALL_CONFIG, ServerThread, linked_copy, make_repository, run_cli
from tests.export.test_sae import D_SAE, saelens_sae
from tests.service.oip.test_oip import Triton, array, ids_input

L, D, NAME = SMALL_CONFIG.n_layers, SMALL_CONFIG.d_model, SMALL_CONFIG.name
TEXT = "The cat sat on the mat."
# name -> (architecture, the site it reads): the residual stream, a head's and an MLP's output
SAES = {
    "resid": ("jumprelu", f"blocks.{L - 1}.hook_resid_post"),
    "z": ("standard", "blocks.0.attn.hook_z"),
    "mlp": ("topk", f"blocks.{L - 1}.hook_mlp_out"),
}


@pytest.fixture(scope="module")
def sae_server(small_model_dir, tmp_path_factory):
    """A server on the small model with the SAEs of SAES beside it, and SAELens' own."""
    root = tmp_path_factory.mktemp("features")
    model_dir = linked_copy(small_model_dir, root / "model")
    saes = {}
    for name, (architecture, hook) in SAES.items():
        sae, source = saelens_sae(root / name, architecture, hook=hook, threshold=2.0)
        add_sae(model_dir, source, name=name, log=lambda _: None)
        saes[name] = sae
    server = ServerThread(model_dir)
    yield server, saes
    server.stop()


@pytest.fixture
def features_client(sae_server):
    with EncoderClient(sae_server[0].address, ClientOptions(timeout_s=60)) as c:
        yield c


def saelens_encode(small_model, sae, hook: str, ids, head_mask=None) -> np.ndarray:
    """SAELens' activations (T, d_sae) of the site PyTorch computes for `ids`."""
    changes = {} if head_mask is None else head_ablation(torch.from_numpy(head_mask))
    with torch.inference_mode(), hooked(small_model, changes), captured(small_model, [hook]) as v:
        small_model(torch.tensor([list(ids)]))
        x = v[hook].flatten(2)  # (1, T, d_in): hook_z's heads side by side
        return sae.encode(x)[0].numpy()


def test_features_equal_saelens_on_each_site(sae_server, features_client, small_model):
    _, saes = sae_server
    out = features_client.encode(TEXT, features={"saes": list(SAES), "top_k": 8, "dense": True})
    got = out[0].features
    t = len(out[0].token_ids)
    assert got.saes == list(SAES) and got.positions == list(range(t))
    assert got.top_ids.shape == (3, t, 8) and got.activations.shape == (3, t, D_SAE)
    for i, (name, (_, hook)) in enumerate(SAES.items()):
        want = saelens_encode(small_model, saes[name], hook, out[0].token_ids)
        largest = np.abs(want).max(-1, keepdims=True)
        assert (np.abs(got.activations[i] - want) <= 1e-4 * np.maximum(largest, 1e-6)).all()
        np.testing.assert_array_equal(got.l0[i], (want > 0).sum(-1))
        order = np.argsort(-want, axis=-1, kind="stable")[:, :8]
        active = np.take_along_axis(want, order, -1) > 0
        np.testing.assert_array_equal(got.top_ids[i], np.where(active, order, -1))
        assert got.l0[i].min() > 0 and got.l0[i].max() < D_SAE  # features on and off


def test_positions_feature_ids_and_the_first_token_left_out(features_client):
    everything = features_client.encode(TEXT, features={"saes": ["resid"], "dense": True})
    dense = everything[0].features.activations[0]  # (T, S)
    out = features_client.encode(
        TEXT,
        features={
            "saes": ["resid", "z"],
            "positions": [0, -1, 2],
            "skip_first_token": True,
            "feature_ids": [3, 0, 95],
            "top_k": 4,
        },
    )
    got = out[0].features
    t = len(out[0].token_ids)
    assert got.positions == [t - 1, 2] and got.feature_ids == [3, 0, 95]
    assert got.top_ids.shape == (2, 2, 4) and got.activations is None
    np.testing.assert_allclose(
        got.feature_activations[0], dense[[t - 1, 2]][:, [3, 0, 95]], rtol=0, atol=1e-5
    )
    # the default top_k is 10, and without feature_ids none are returned
    plain = features_client.encode(TEXT, features={"saes": ["mlp"]})[0].features
    assert plain.top_ids.shape[-1] == 10 and plain.feature_activations is None


def test_skip_error_norm_returns_the_same_features_without_it(features_client):
    features = {"saes": list(SAES), "dense": True, "top_k": 5}
    full = features_client.encode(TEXT, features=features)[0].features
    skipped = features_client.encode(TEXT, features=features | {"skip_error_norm": True})
    got = skipped[0].features
    assert full.error_norm is not None and full.error_norm.shape == full.l0.shape
    assert got.error_norm is None
    for name in ("top_ids", "top_activations", "l0", "activations"):
        np.testing.assert_array_equal(getattr(got, name), getattr(full, name))


def test_dense_features_too_large_for_a_message_name_the_features_options(sae_server):
    # every feature of two SAEs at 120 positions: 2 x 120 x 96 x 4 B = 92 kB
    small = ServerThread(sae_server[0].settings.model, max_message_bytes=50_000)
    try:
        with EncoderClient(small.address, ClientOptions(max_message_bytes=50_000)) as c:
            features = {"saes": ["resid", "mlp"], "dense": True}
            with pytest.raises(grpc.RpcError) as excinfo:
                c.encode([[1] * 120], features=features, token_embeddings=False)
            assert excinfo.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "more than the 50,000-byte message limit" in excinfo.value.details()
            assert "fewer options.features.saes" in excinfo.value.details()
            out = c.encode([[1] * 120], features={"saes": ["resid"]}, token_embeddings=False)
            assert out[0].features.top_ids.shape == (1, 120, 10)
    finally:
        small.stop()


def test_features_are_read_under_the_head_mask(sae_server, features_client, small_model):
    _, saes = sae_server
    mask = np.ones((L, SMALL_CONFIG.n_heads), dtype=np.float32)
    mask[0, 1] = 0.0
    out = features_client.encode(TEXT, features={"saes": ["resid"], "dense": True}, head_mask=mask)
    want = saelens_encode(small_model, saes["resid"], SAES["resid"][1], out[0].token_ids, mask)
    got = out[0].features.activations[0]
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
    unmasked = features_client.encode(TEXT, features={"saes": ["resid"], "dense": True})
    assert np.abs(unmasked[0].features.activations[0] - got).max() > 1e-3


def test_model_info_lists_the_saes(features_client):
    info = features_client.model_info()
    assert [s["name"] for s in info["saes"]] == sorted(SAES)
    by_name = {s["name"]: s for s in info["saes"]}
    assert by_name["z"] == {
        "name": "z",
        "hook_name": "blocks.0.attn.hook_z",
        "architecture": "standard",
        "d_in": SMALL_CONFIG.n_heads * SMALL_CONFIG.head_dim,
        "d_sae": D_SAE,
    }


def test_features_in_json_are_the_grpc_numbers(sae_server, features_client):
    server, _ = sae_server
    body = {
        "inputs": [{"text": TEXT}],
        "options": {"features": {"saes": ["resid"], "topK": 5, "featureIds": [1, 2]}},
        "tensor_format": "list",
    }
    response = httpx.post(f"{server.http_url}/v1/encode", json=body, timeout=60)
    assert response.status_code == 200, response.text
    got = response.json()["results"][0]["features"]
    want = features_client.encode(
        TEXT, features={"saes": ["resid"], "top_k": 5, "feature_ids": [1, 2]}
    )
    f = want[0].features
    assert got["topIds"]["values"] == f.top_ids.tolist()
    assert got["l0"]["values"] == f.l0.tolist()
    np.testing.assert_allclose(got["errorNorm"]["values"], f.error_norm, rtol=1e-6)
    np.testing.assert_allclose(got["featureActivations"]["values"], f.feature_activations)


@pytest.mark.parametrize(
    "features, message",
    [
        ({"saes": []}, f"options.features.saes: name at least one; {NAME} serves mlp, resid, z"),
        ({"saes": ["resid", "nope"]}, f"options.features.saes[1]: 'nope' is not an SAE of {NAME}"),
        ({"saes": ["z", "z"]}, "options.features.saes: ['z', 'z'] names an SAE twice"),
        ({"saes": ["z"], "top_k": D_SAE + 1}, f"options.features.top_k: {D_SAE + 1} is outside"),
        ({"saes": ["z"], "feature_ids": [D_SAE]}, f"feature_ids: {D_SAE} is outside [0, d_sae="),
        ({"saes": ["z"], "positions": [99]}, "options.features.positions: 99 is outside"),
    ],
)
def test_bad_features_are_refused_by_field(features_client, features, message):
    with pytest.raises(grpc.RpcError) as excinfo:
        features_client.encode(TEXT, features=features)
    assert excinfo.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in excinfo.value.details()
    assert features_client.encode(TEXT, features={"saes": ["z"]})[0].features is not None


def test_leaving_out_the_only_token_is_refused(features_client):
    with pytest.raises(grpc.RpcError) as excinfo:
        features_client.encode([5], features={"saes": ["z"], "skip_first_token": True})
    assert "skip_first_token leaves no position of inputs[0]" in excinfo.value.details()


SAE_OUTPUTS_V2 = (
    "sae_top_ids",
    "sae_top_activations",
    "sae_l0",
    "sae_error_norm",
    "sae_feature_activations",
    "sae_activations",
)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_features_through_tritonclient_equal_encodes(sae_server, features_client, protocol):
    """The Open Inference Protocol's sae parameters and outputs, by tritonclient unmodified:
    Encode's numbers, ragged rows padded (-1 for ids)."""
    server, _ = sae_server
    address = server.address if protocol == "grpc" else server.http_url.removeprefix("http://")
    triton = Triton(protocol, address)
    rows = [[3, 17, 40, 2, 9], [8, 1, 5]]
    inputs = [ids_input([rows[0], rows[1] + [0, 0]])]
    inputs.append({"name": "input_lengths", "datatype": "INT64", "shape": [2], "data": [5, 3]})
    parameters = {"sae": "mlp", "sae_top_k": 4, "sae_feature_ids": "2,7"}
    answer = triton.infer(inputs, SAE_OUTPUTS_V2, parameters, model=NAME)
    assert answer["outputs"]["sae_top_ids"]["datatype"] == "INT64"
    outputs = {name: array(output) for name, output in answer["outputs"].items()}
    want = features_client.encode(
        rows, features={"saes": ["mlp"], "top_k": 4, "feature_ids": [2, 7], "dense": True}
    )
    for row, encoding in enumerate(want):
        f, t = encoding.features, len(rows[row])
        for name in SAE_OUTPUTS_V2:
            expected = getattr(f, name.removeprefix("sae_"))[0]
            np.testing.assert_allclose(outputs[name][row, :t], expected, rtol=0, atol=1e-6)
    assert (outputs["sae_top_ids"][1, 3:] == -1).all() and (outputs["sae_l0"][1, 3:] == 0).all()
    for parameters, message in (
        ({"sae_top_k": 4}, "the sae outputs need the sae parameter"),
        ({"sae": "mlp", "sae_top_k": D_SAE + 1}, f"sae_top_k: {D_SAE + 1} is outside [1, {D_SAE}]"),
        ({"sae": "nope"}, "parameters.sae[0]: 'nope' is not an SAE of"),
    ):
        refused = triton.infer(inputs, ["sae_l0"], parameters, model=NAME)
        assert refused["error"]["status"] == triton.status("INVALID_ARGUMENT")
        assert message in refused["error"]["message"]
    triton.client.close()


def test_encode_on_the_command_line_lists_each_tokens_features(sae_server, features_client):
    server, _ = sae_server
    args = ("encode", "--target", server.address, "--text", TEXT, "--sae", "resid")
    summary = run_cli(*args, "--top-features", "3", "--skip-first-token")
    assert summary.returncode == 0, summary.stderr
    want = features_client.encode(
        TEXT, features={"saes": ["resid"], "top_k": 3, "skip_first_token": True}, return_tokens=True
    )[0]
    lines = summary.stdout.splitlines()
    start = lines.index("    features of resid (id activation, strongest first):")
    rows = lines[start + 1 : start + 1 + len(want.features.positions)]
    last = rows[-1]  # the last token: its text, L0 and its three strongest features
    t = len(want.token_ids)
    assert last.startswith(f"      {t - 1:>4} {want.tokens[-1]!r}: L0 {want.features.l0[0, -1]},")
    ids, activations = want.features.top_ids[0, -1], want.features.top_activations[0, -1]
    assert last.endswith(", ".join(f"#{i} {a:.3f}" for i, a in zip(ids, activations, strict=True)))
    assert not rows[0].startswith("         0")  # the first token left out
    as_json = json.loads(run_cli(*args, "--json").stdout)["results"][0]["features"]
    assert as_json["saes"] == ["resid"] and len(as_json["top_ids"][0][0]) == 5
    unknown = run_cli("encode", "--target", server.address, "--text", TEXT, "--sae", "nope")
    assert unknown.returncode == 1 and "'nope' is not an SAE of" in unknown.stderr


def test_an_sae_added_to_a_served_model_is_served_after_its_reload(
    tmp_path, small_model_dir, other_model_dir
):
    """`attnserve sae add` into a repository's version folder, then the repository's load
    (Triton's extension, by tritonclient): the reload picks the SAE up."""
    import tritonclient.grpc as triton_grpc

    root = make_repository(tmp_path / "repo", small_model_dir, other_model_dir)
    server = ServerThread(None, model_repository=root, default_model="a")
    try:
        with EncoderClient(server.address, ClientOptions(timeout_s=60)) as client:
            with pytest.raises(grpc.RpcError) as excinfo:
                client.encode(TEXT, features={"saes": ["resid"]})
            assert "it serves none (add one with `attnserve sae add`)" in excinfo.value.details()
            _, source = saelens_sae(tmp_path, "jumprelu", hook=SAES["resid"][1], threshold=2.0)
            add_sae(root / "a" / "1", source, name="resid", log=lambda _: None)
            triton_grpc.InferenceServerClient(server.address).load_model("a")
            out = client.encode(TEXT, features={"saes": ["resid"]})
            assert out[0].features.saes == ["resid"] and out[0].features.l0.max() > 0
            assert [s["name"] for s in client.model_info(model="a")["saes"]] == ["resid"]
    finally:
        server.stop()


def test_an_sae_added_to_a_served_directory_is_served_without_a_restart(tmp_path, small_model_dir):
    """`attnserve sae add` into the directory a --model server serves, under load: the server
    notices it and serves its features, and no request fails meanwhile. The repository's
    calls on such a server are refused by name (400; they were a 500)."""
    import threading
    import time

    model_dir = linked_copy(small_model_dir, tmp_path / "model")
    server = ServerThread(model_dir)
    failures: list[BaseException] = []
    stop = threading.Event()

    def load() -> None:
        with EncoderClient(server.address, ClientOptions(timeout_s=60, retries=0)) as c:
            while not stop.is_set():
                try:
                    c.encode(TEXT, hidden_states={"layers": [0]})
                except grpc.RpcError as exc:
                    failures.append(exc)

    threads = [threading.Thread(target=load) for _ in range(3)]
    try:
        for t in threads:
            t.start()
        with EncoderClient(server.address, ClientOptions(timeout_s=60)) as client:
            _, source = saelens_sae(tmp_path, "jumprelu", hook=SAES["resid"][1], threshold=2.0)
            add_sae(model_dir, source, name="resid", log=lambda _: None)
            deadline = time.monotonic() + 60  # the server looks every SAE_WATCH_S seconds
            while not client.model_info()["saes"]:
                assert time.monotonic() < deadline, "the SAE was never served"
                time.sleep(0.1)
            out = client.encode(TEXT, features={"saes": ["resid"]})
            assert out[0].features.saes == ["resid"] and out[0].features.l0.max() > 0
        answer = httpx.post(f"{server.http_url}/v2/repository/models/{NAME}/load", timeout=60)
        assert answer.status_code == 400
        assert "--model-repository" in answer.json()["error"]
    finally:
        stop.set()
        for t in threads:
            t.join(60)
        server.stop()
    assert failures == []


def test_steering_by_a_feature_adds_its_decoder_row(sae_server, features_client, small_model):
    """A feature names its direction: SAELens' W_dec row times the strength, added at the
    SAE's own site (hook_z's row spans every head), as PyTorch makes it by hand."""
    _, saes = sae_server
    ids = features_client.encode(TEXT)[0].token_ids.tolist()
    for name in ("resid", "z"):
        hook = SAES[name][1]
        row = saes[name].W_dec[7].detach()
        steer = [{"op": "add", "feature": {"sae": name, "feature_id": 7}, "scale": 3.0}]
        got = features_client.encode(ids, interventions=steer)[0].embeddings
        as_values = [{"hook": hook, "op": "add", "values": row.numpy(), "scale": 3.0}]
        np.testing.assert_array_equal(
            got, features_client.encode(ids, interventions=as_values)[0].embeddings
        )
        with (
            torch.inference_mode(),
            hooked(small_model, {hook: lambda x, r=row: x + 3.0 * r.view_as(x[0, 0])}),
        ):
            want = small_model(torch.tensor([ids]))[0][0].numpy()
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    bad = {
        "unknown": ({"sae": "nope", "feature_id": 1}, r"feature.sae: 'nope' is not an SAE"),
        "past": ({"sae": "resid", "feature_id": D_SAE}, rf"feature_id: {D_SAE} is outside"),
    }
    for feature, message in bad.values():
        with pytest.raises(grpc.RpcError, match=message) as excinfo:
            features_client.encode(ids, interventions=[{"op": "add", "feature": feature}])
        assert excinfo.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError, match=r"hook: blocks.0.hook_resid_pre, but SAE 'resid'"):
        features_client.encode(
            ids,
            interventions=[
                {
                    "hook": "blocks.0.hook_resid_pre",
                    "op": "add",
                    "feature": {"sae": "resid", "feature_id": 1},
                }
            ],
        )


def test_clamping_features_keeps_each_sites_reconstruction_error(
    sae_server, features_client, small_model
):
    """Op clamp sets a feature's activation, the rest of the site kept: x + (value - a(x)) *
    W_dec[feature], a(x) SAELens' encode of the site as the run made it; two sites, the
    later one reading what the earlier clamp changed, as PyTorch's hooks make them."""
    _, saes = sae_server
    ids = features_client.encode(TEXT)[0].token_ids.tolist()
    T = len(ids)

    def clamp(name: str, feature: int, value: float, positions):
        sae = saes[name]

        def hook(x):
            flat = x.flatten(2)  # hook_z's heads side by side, as the SAE reads them
            activation = sae.encode(flat)[..., feature]  # (1, T)
            delta = (value - activation)[..., None] * sae.W_dec[feature].detach()
            keep = torch.zeros(T, 1)
            keep[positions] = 1.0
            return (flat + delta * keep).view_as(x)

        return hook

    hooks = {
        SAES["z"][1]: clamp("z", 3, 4.0, [T - 1]),
        SAES["resid"][1]: clamp("resid", 11, 2.5, list(range(T))),
    }
    with torch.inference_mode(), hooked(small_model, hooks):
        want = small_model(torch.tensor([ids]))[0][0].numpy()
    clamps = [
        {"op": "clamp", "feature": {"sae": "resid", "feature_id": 11}, "scale": 2.5},
        {"op": "clamp", "feature": {"sae": "z", "feature_id": 3}, "scale": 4.0, "positions": [-1]},
    ]
    got = features_client.encode(ids, interventions=clamps)[0].embeddings
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    assert np.abs(got - features_client.encode(ids)[0].embeddings).max() > 1e-3
    with pytest.raises(grpc.RpcError, match=r"interventions\[0\].feature: op clamp sets"):
        features_client.encode(
            ids, interventions=[{"op": "clamp", "hook": SAES["resid"][1], "scale": 1.0}]
        )
    with pytest.raises(grpc.RpcError, match=r"interventions\[0\].scale: op clamp sets the feature"):
        features_client.encode(
            ids, interventions=[{"op": "clamp", "feature": {"sae": "resid", "feature_id": 1}}]
        )


def test_generation_steered_by_a_feature_on_the_command_line(sae_server, features_client):
    """`attnserve generate --steer SAE/ID:STRENGTH --compare`: the feature's decoder row
    added at its SAE's site at every position, the prompt's and each generated one's, as
    the row itself sent as values; the plain text beside it."""
    server, saes = sae_server
    options = dict(max_tokens=12, temperature=0, ignore_eos=True)
    row = saes["resid"].W_dec[7].detach().numpy()
    as_values = [{"hook": SAES["resid"][1], "op": "add", "values": row, "scale": 20.0}]

    def text(**more) -> str:
        return "".join(t.text for t in features_client.generate(TEXT, **options, **more))

    steered, plain = text(interventions=as_values), text()
    assert steered != plain
    result = run_cli(
        "generate", "--target", server.address, "--text", TEXT, "--max-tokens", "12",
        "--ignore-eos", "--steer", "resid/7:20", "--compare",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"steered:\n{steered}\n\nplain:\n{plain}\n"
    several = run_cli("generate", "--target", server.address, "--text", TEXT, "--steer", "7:1")
    assert several.returncode == 2 and "name the SAE as SAE/ID" in several.stderr
