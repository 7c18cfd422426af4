"""Interventions (add, set, scale any site) and captures through the real server (gRPC and
JSON), against the PyTorch model with the same changes made by hand at its hook points."""

import base64
import re

import grpc
import httpx
import numpy as np
import pytest
import torch

from attnserve.model.hook_points import captured, hooked
from attnserve.service.core import patching
from tests.conftest import SMALL_CONFIG

L, H, D, d_k = SMALL_CONFIG.n_layers, SMALL_CONFIG.n_heads, SMALL_CONFIG.d_model, 16
TEXT = "The cat sat on the mat."
rng = np.random.default_rng(7)
STEER = (rng.standard_normal(D) * 3).astype(np.float32)


def run(model, ids, hooks, reads=()):
    """PyTorch's embeddings, logits and the values of `reads` under `hooks`."""
    with torch.inference_mode(), hooked(model, hooks), captured(model, list(reads)) as values:
        embeddings, _ = model(torch.tensor([ids]))
        logits = model.unembed(embeddings)
    return embeddings[0].numpy(), logits[0].numpy(), {k: v[0].numpy() for k, v in values.items()}


def test_add_set_and_scale_equal_the_same_changes_in_pytorch(client, small_model):
    ids = client.encode(TEXT)[0].token_ids.tolist()
    T = len(ids)
    rows = rng.standard_normal((2, d_k)).astype(np.float32)
    interventions = [
        {"hook": "blocks.0.hook_resid_pre", "op": "add", "values": STEER, "scale": 2.0},
        {"hook": "blocks.0.hook_mlp_out", "op": "scale", "scale": 0.5, "positions": [1, 3]},
        {"hook": "blocks.1.attn.hook_z", "op": "set", "values": rows, "heads": [2],
         "positions": [0, -1]},
        {"hook": "blocks.1.hook_attn_out", "op": "scale", "scale": 0.0},
        {"hook": "blocks.1.hook_resid_post", "op": "add", "values": STEER, "positions": [-2]},
    ]  # fmt: skip

    def mlp_out(x):
        x = x.clone()
        x[:, [1, 3]] *= 0.5
        return x

    def z(x):
        x = x.clone()
        x[:, [0, T - 1], 2] = torch.from_numpy(rows)
        return x

    def resid_post(x):
        x = x.clone()
        x[:, T - 2] += torch.from_numpy(STEER)
        return x

    hooks = {
        "blocks.0.hook_resid_pre": lambda x: x + 2.0 * torch.from_numpy(STEER),
        "blocks.0.hook_mlp_out": mlp_out,
        "blocks.1.attn.hook_z": z,
        "blocks.1.hook_attn_out": lambda x: x * 0.0,
        "blocks.1.hook_resid_post": resid_post,
    }
    captures = ["blocks.1.hook_resid_pre", "blocks.1.attn.hook_z", "blocks.0.hook_mlp_out"]
    embeddings, logits, values = run(small_model, ids, hooks, captures)
    got = client.encode(
        ids,
        interventions=interventions,
        capture=captures,
        hidden_states=True,
        predictions={"logits": True},
    )[0]
    np.testing.assert_allclose(got.embeddings, embeddings, atol=1e-4, rtol=0)
    np.testing.assert_allclose(got.predictions.logits[0], logits, atol=1e-3, rtol=0)
    assert got.activation_positions == list(range(T))
    assert sorted(got.activations) == sorted(captures)
    for hook in captures:
        np.testing.assert_allclose(got.activations[hook], values[hook], atol=1e-4, rtol=0)
    unchanged = client.encode(ids)[0].embeddings
    assert np.abs(unchanged - embeddings).max() > 1e-2  # the changes did change the run


def test_a_capture_patched_into_another_run_is_activation_patching(client, small_model):
    clean, corrupted = (
        "When Mary and John went, John gave it to",
        "When Mary and John went, Mary gave it to",
    )
    site, position = "blocks.1.hook_resid_pre", 5
    ids = [e.token_ids.tolist() for e in client.encode([clean, corrupted])]
    assert len(ids[0]) == len(ids[1])
    got_clean = client.encode(ids[0], capture={"hooks": [site], "positions": [position]})[0]
    value = got_clean.activations[site]  # (1, D)
    patched = client.encode(
        ids[1],
        interventions=[{"hook": site, "op": "set", "values": value, "positions": [position]}],
    )[0]
    _, _, clean_values = run(small_model, ids[0], {}, [site])
    np.testing.assert_allclose(value[0], clean_values[site][position], atol=1e-4, rtol=0)

    def patch(x):
        x = x.clone()
        x[:, position] = torch.from_numpy(clean_values[site][position])
        return x

    want, _, _ = run(small_model, ids[1], {site: patch})
    np.testing.assert_allclose(patched.embeddings, want, atol=1e-4, rtol=0)


def test_queries_keys_and_values_change_per_head(client, small_model):
    """hook_q, hook_k and hook_v (before rotation): a head's slice set, scaled or moved."""
    ids = client.encode(TEXT)[0].token_ids.tolist()
    query = rng.standard_normal(d_k).astype(np.float32)
    keys = rng.standard_normal((2, H * d_k)).astype(np.float32)
    interventions = [
        {"hook": "blocks.0.attn.hook_q", "op": "set", "values": query, "heads": [1]},
        {"hook": "blocks.1.attn.hook_k", "op": "add", "values": keys, "positions": [0, 2]},
        {"hook": "blocks.1.attn.hook_v", "op": "scale", "scale": -1.0, "heads": [0, 3]},
    ]

    def q(x):
        x = x.clone()
        x[:, :, 1] = torch.from_numpy(query)
        return x

    def k(x):
        x = x.clone()
        x[:, [0, 2]] += torch.from_numpy(keys).view(2, H, d_k)
        return x

    def v(x):
        x = x.clone()
        x[:, :, [0, 3]] *= -1.0
        return x

    hooks = {"blocks.0.attn.hook_q": q, "blocks.1.attn.hook_k": k, "blocks.1.attn.hook_v": v}
    want, _, _ = run(small_model, ids, hooks)
    got = client.encode(ids, interventions=interventions)[0].embeddings
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


def test_rows_of_one_batch_keep_their_own_changes(client, small_model):
    """Two inputs of different lengths, batched: each row's changes apply to it alone."""
    texts = [TEXT, "Heads up"]
    ids = [e.token_ids.tolist() for e in client.encode(texts)]
    interventions = [
        {"hook": "blocks.1.hook_resid_mid", "op": "add", "values": STEER, "positions": [-1]}
    ]
    got = client.encode(texts, interventions=interventions)
    for sequence, encoding in zip(ids, got, strict=True):
        T = len(sequence)

        def last(x, T=T):
            x = x.clone()
            x[:, T - 1] += torch.from_numpy(STEER)
            return x

        want, _, _ = run(small_model, sequence, {"blocks.1.hook_resid_mid": last})
        np.testing.assert_allclose(encoding.embeddings, want, atol=1e-4, rtol=0)


def test_head_mask_and_interventions_compose_in_order(client, small_model):
    ids = client.encode(TEXT)[0].token_ids.tolist()
    head_mean = rng.standard_normal(d_k).astype(np.float32)
    got = client.encode(
        ids,
        head_mask={(0, 1): 0.0},
        head_means={(0, 1): head_mean},
        interventions=[{"hook": "blocks.0.attn.hook_z", "op": "scale", "scale": 2.0}],
    )[0]

    def z(x):
        x = x.clone()
        x[:, :, 1] = torch.from_numpy(head_mean)
        return x * 2.0

    want, _, _ = run(small_model, ids, {"blocks.0.attn.hook_z": z})
    np.testing.assert_allclose(got.embeddings, want, atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    ("intervention", "message"),
    [
        ({"hook": "blocks.9.hook_resid_pre", "op": "add", "values": STEER},
         r"options.interventions\[0\].hook: 'blocks.9.hook_resid_pre' is not a hook site"),
        ({"hook": "blocks.0.attn.hook_pattern", "op": "scale", "scale": 0.0},
         r"options.interventions\[0\].hook: blocks.0.attn.hook_pattern is not one of the sites"),
        ({"hook": "blocks.0.hook_resid_pre", "op": "add", "values": STEER[:5]},
         r"options.interventions\[0\].values: shape \[5\]; .* its width is d_model = 64"),
        ({"hook": "blocks.0.hook_resid_pre", "op": "add", "values": STEER, "positions": [99]},
         r"options.interventions\[0\].positions: 99 is outside \[-\d+, \d+\)"),
        ({"hook": "blocks.0.hook_resid_pre", "op": "scale"},
         r"options.interventions\[0\].scale: op scale multiplies by it; set it"),
        ({"hook": "blocks.0.hook_resid_pre", "op": "scale", "scale": 2.0, "heads": [0]},
         r"options.interventions\[0\].heads: only the attention.s sites have heads"),
        ({"hook": "blocks.0.attn.hook_z", "op": "set", "values": STEER[:16], "heads": [4]},
         r"options.interventions\[0\].heads: 4 is outside \[0, 4\)"),
        ({"hook": "blocks.0.hook_resid_pre", "op": "set", "values": np.ones((3, 64))},
         r"options.interventions\[0\].values: 3 rows for \d+ positions"),
        ({"hook": "blocks.0.hook_resid_pre", "op": "add", "values": [np.nan] * 64},
         r"options.interventions\[0\].values: not every value is a finite number"),
    ],
)  # fmt: skip
def test_bad_interventions_are_invalid_argument_naming_the_field(client, intervention, message):
    with pytest.raises(grpc.RpcError) as excinfo:
        client.encode(TEXT, interventions=[intervention])
    assert excinfo.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert re.search(message, excinfo.value.details()), excinfo.value.details()
    assert client.encode(TEXT)[0].embeddings is not None  # the server keeps serving


def test_bad_captures_are_invalid_argument_naming_the_field(client):
    cases = [
        ({"hooks": []}, r"options.capture.hooks: name at least one"),
        ({"hooks": ["blocks.0.attn.hook_q"]}, r"options.capture.hooks\[0\]: blocks.0.attn.hook_q"),
        ({"hooks": ["x", "x"]}, r"options.capture.hooks\[0\]: 'x' is not a hook site"),
        ({"hooks": ["blocks.0.hook_resid_post"], "positions": [50]},
         r"options.capture.positions: 50 is outside"),
    ]  # fmt: skip
    for capture, message in cases:
        with pytest.raises(grpc.RpcError) as excinfo:
            client.encode(TEXT, capture=capture)
        assert excinfo.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert re.search(message, excinfo.value.details()), excinfo.value.details()
    changed = [{"hook": "blocks.1.hook_resid_pre", "op": "add", "values": STEER}]
    with pytest.raises(grpc.RpcError, match=r"blocks.0.hook_resid_post is read where"):
        client.encode(TEXT, interventions=changed, capture=["blocks.0.hook_resid_post"])


def test_interventions_and_captures_in_json(server, client, small_model):
    ids = client.encode(TEXT)[0].token_ids.tolist()
    values = {
        "shape": [D],
        "dtype": "DTYPE_FLOAT32",
        "data": base64.b64encode(STEER.astype("<f4").tobytes()).decode(),
    }
    body = {
        "inputs": [{"tokenIds": {"ids": ids}}],
        "options": {
            "interventions": [
                {"hook": "blocks.1.hook_resid_pre", "op": "INTERVENTION_OP_ADD", "values": values}
            ],
            "capture": {"hooks": ["blocks.1.hook_mlp_out"], "positions": [-1]},
        },
        "tensor_format": "list",
    }
    got = httpx.post(f"{server.http_url}/v1/encode", json=body, timeout=60).json()["results"][0]
    hooks = {"blocks.1.hook_resid_pre": lambda x: x + torch.from_numpy(STEER)}
    embeddings, _, want = run(small_model, ids, hooks, ["blocks.1.hook_mlp_out"])
    np.testing.assert_allclose(got["embeddings"]["values"], embeddings, atol=1e-4)
    captured_values = got["activations"]["blocks.1.hook_mlp_out"]
    assert captured_values["shape"] == [1, D]
    np.testing.assert_allclose(
        captured_values["values"], want["blocks.1.hook_mlp_out"][-1:], atol=1e-4
    )
    assert got["activationPositions"] == [len(ids) - 1]


def test_bad_patching_is_invalid_argument_naming_the_field(client, monkeypatch):
    ids = client.encode(TEXT)[0].token_ids.tolist()
    cases = [
        (
            {"source": "short", "hook": "resid_pre"},
            r"options.patching.source: \d+ tokens, inputs\[0\] has",
        ),
        ({"source": TEXT, "hook": "hook_q"}, r"options.patching.hook: 'hook_q' is not one of"),
        (
            {"source": TEXT, "hook": "z", "target": 10**6},
            r"options.patching.target_id: 1000000 is outside",
        ),
        (
            {"source": TEXT, "hook": "z", "target": "ab"},
            r"options.patching.target: 'ab' is 2 tokens",
        ),
        (  # a directory without `attnserve gradient`'s graphs
            {"source": TEXT, "hook": "z", "method": "attribution"},
            r"options.patching.method: attribution patching of inputs\[0\]'s \d+ tokens needs "
            r"a gradient graph of at least that length; this model's: none",
        ),
    ]
    for asked, message in cases:
        fields = {"target": "d", "contrast": "c"} | asked
        with pytest.raises(grpc.RpcError) as excinfo:
            client.encode(ids, patching=fields)
        assert excinfo.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert re.search(message, excinfo.value.details()), excinfo.value.details()
    monkeypatch.setattr(patching, "MAX_PATCHED_TOKENS", 10_000)  # the server's: in process
    long = list(range(1, 101))  # 2 layers x 100 positions of 100 tokens: 20,000
    asked = {"source": long, "target": 1, "contrast": 2}
    with pytest.raises(grpc.RpcError, match=r"200 patched runs .* 20,000 tokens .* than 10,000"):
        client.encode(long, patching=asked | {"hook": "resid_pre"})
    assert client.encode(long, patching=asked | {"hook": "z"})[0].patching.values.shape == (2, 4)
    head_mask = {(0, 1): 0.0}
    with pytest.raises(grpc.RpcError, match=r"options.patching: patches the inputs as they are"):
        client.encode(
            ids,
            head_mask=head_mask,
            patching={"source": ids, "hook": "z", "target": 1, "contrast": 2},
        )
