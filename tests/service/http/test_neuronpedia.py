"""Neuronpedia's activation endpoints, called by its published client
(neuronpedia-inference-client, unmodified) with its secret header, against attnserve.v1's
features of the same prompt (tests/service/core/test_features.py holds those to SAELens)
read as Neuronpedia's own server (apps/inference) reads them."""

from __future__ import annotations

import httpx
import neuronpedia_inference_client as neuronpedia
import numpy as np
import pytest
from neuronpedia_inference_client.exceptions import ApiException

from attnserve.client import ClientOptions, EncoderClient
from attnserve.export.sae import add_sae
from tests.conftest import SMALL_CONFIG, ServerThread, linked_copy
from tests.export.test_sae import D_SAE, saelens_sae

SECRET = "neuronpedia-secret"
MODEL = SMALL_CONFIG.name
PROMPT = "The cat sat on the mat."
SOURCES = ["0-res-test", "1-res-test"]  # Neuronpedia's ids: LAYER-SET


@pytest.fixture(scope="module")
def secured(small_model_dir, tmp_path_factory):
    """A server with --auth-token, an SAE on each layer's output named as Neuronpedia names
    them, and Neuronpedia's client configured with the secret."""
    root = tmp_path_factory.mktemp("neuronpedia")
    model_dir = linked_copy(small_model_dir, root / "model")
    for layer, name in enumerate(SOURCES):
        hook = f"blocks.{layer}.hook_resid_post"
        _, source = saelens_sae(root / name, "jumprelu", hook=hook, threshold=2.0)
        add_sae(model_dir, source, name=name, log=lambda _: None)
    server = ServerThread(model_dir, auth_token=SECRET)
    config = neuronpedia.Configuration(
        host=f"{server.http_url}/v1", api_key={"SimpleSecretAuth": SECRET}
    )
    with neuronpedia.ApiClient(config) as api_client:
        yield server, neuronpedia.DefaultApi(api_client)
    server.stop()


def dense(server: ServerThread, sources: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """attnserve.v1's activations of every feature (saes, T, S) of the prompt with a BOS in
    front, as Neuronpedia reads it, and its ids."""
    options = ClientOptions(timeout_s=60, token=SECRET)
    with EncoderClient(server.address, options) as client:
        out = client.encode(PROMPT, features={"saes": sources, "dense": True})[0]
    assert out.token_ids[0] == SMALL_CONFIG.bos_id  # the byte tokenizer's BOS, already there
    return out.features.activations, out.token_ids


def test_topk_by_token(secured):
    server, api = secured
    request = neuronpedia.ActivationTopkByTokenPostRequest(
        prompt=PROMPT, model=MODEL, source="1-res-test", top_k=3, ignore_bos=True
    )
    answer = api.activation_topk_by_token_post(request)
    acts, ids = dense(server, ["1-res-test"])
    assert [r.token_position for r in answer.results] == list(range(1, len(ids)))
    assert answer.tokens == [r.token for r in answer.results] and answer.tokens[1] == "h"
    assert not any(r.is_special for r in answer.results)
    for result in answer.results:
        row = acts[0, result.token_position]
        want = [i for i in np.argsort(-row, kind="stable")[:3] if row[i] > 0]
        assert [f.feature_index for f in result.top_features] == want
        np.testing.assert_allclose(
            [f.activation_value for f in result.top_features], row[want], rtol=1e-6
        )
    with_bos = api.activation_topk_by_token_post(
        neuronpedia.ActivationTopkByTokenPostRequest(
            prompt=PROMPT, model=MODEL, source="1-res-test", ignore_bos=False
        )
    )
    assert with_bos.results[0].is_special and with_bos.results[0].token_position == 0
    active = (acts[0] > 0).sum(-1)  # (T,): the default top_k is 5
    assert [len(r.top_features) for r in with_bos.results] == np.minimum(active, 5).tolist()


def test_single(secured):
    server, api = secured
    acts, _ = dense(server, ["0-res-test"])
    index = int(np.argmax(acts[0, 1:].max(0)))  # a feature that fires
    request = neuronpedia.ActivationSinglePostRequest(
        prompt=PROMPT, model=MODEL, source="0-res-test", index=str(index)
    )
    answer = api.activation_single_post(request)
    values = acts[0, 1:, index]  # the BOS position left out
    np.testing.assert_allclose(answer.activation.values, values, rtol=1e-6)
    assert answer.activation.max_value_index == int(values.argmax())
    assert answer.activation.max_value == pytest.approx(float(values.max()), rel=1e-6)
    assert len(answer.tokens) == len(values) and answer.tokens_is_special == [False] * len(values)


def test_all_ranks_the_sets_features_as_neuronpedia_does(secured):
    server, api = secured
    acts, _ = dense(server, SOURCES)  # (2, T, S)
    for sort_by in ([], [2, 4]):
        request = neuronpedia.ActivationAllPostRequest(
            prompt=PROMPT,
            model=MODEL,
            source_set="res-test",
            selected_sources=[],
            sort_by_token_indexes=sort_by,
            ignore_bos=True,
            num_results=7,
        )
        answer = api.activation_all_post(request)
        rows = []  # Neuronpedia's ranking over both sources, BOS zeroed
        for s, source in enumerate(SOURCES):
            a = acts[s].T.copy()
            a[:, 0] = 0
            key = a[:, sort_by].sum(1) if sort_by else a.max(1)
            rows += [(-key[i], s, source, i, a[i]) for i in range(D_SAE)]
        rows.sort(key=lambda row: (row[0], row[1]))
        got = [(f.source, f.index) for f in answer.activations]
        assert got == [(source, i) for _, _, source, i, _ in rows[:7]]
        for feature, (_, _, _, _, values) in zip(answer.activations, rows, strict=False):
            np.testing.assert_allclose(feature.values, values, rtol=1e-6, atol=1e-7)
            assert feature.max_value_index == int(values.argmax())
        assert len(answer.tokens) == acts.shape[1]


def test_refusals_name_the_field_in_neuronpedias_error_shape(secured):
    server, api = secured
    with pytest.raises(ApiException) as excinfo:
        api.activation_topk_by_token_post(
            neuronpedia.ActivationTopkByTokenPostRequest(
                prompt=PROMPT, model=MODEL, source="9-nope", ignore_bos=False
            )
        )
    assert excinfo.value.status == 400
    assert "source: '9-nope' is not an SAE of" in excinfo.value.body
    url = f"{server.http_url}/v1/activation/single"
    body = {"prompt": PROMPT, "model": MODEL, "source": "0-res-test", "index": str(D_SAE)}
    headers = {"X-SECRET-KEY": SECRET}
    bad_index = httpx.post(url, json=body, headers=headers, timeout=60)
    assert bad_index.status_code == 400
    assert bad_index.json() == {
        "error": f"index: '{D_SAE}' is not a feature of 0-res-test (0 to {D_SAE - 1})"
    }
    unset = httpx.post(url, json=body | {"index": None}, headers=headers, timeout=60)
    assert unset.status_code == 400 and "a custom vector and hook are not served" in unset.text
    no_set = httpx.post(
        f"{server.http_url}/v1/activation/all",
        json={
            "prompt": PROMPT,
            "model": MODEL,
            "source_set": "mlp",
            "selected_sources": [],
            "sort_by_token_indexes": [],
            "ignore_bos": False,
        },
        headers=headers,
        timeout=60,
    )
    assert no_set.status_code == 400 and "its sets: res-test" in no_set.json()["error"]
    wrong = httpx.post(url, json=body, headers={"X-SECRET-KEY": "wrong"}, timeout=60)
    assert wrong.status_code == 401 and "X-SECRET-KEY" in wrong.json()["error"]
    unknown_model = httpx.post(
        url, json=body | {"model": "gpt2-small"}, headers=headers, timeout=60
    )
    assert unknown_model.status_code == 404 and "gpt2-small" in unknown_model.json()["error"]


def test_the_default_model_serves_its_sae_to_neuronpedias_client(default_export):
    """Out of the box: `make serve`'s directory holds the default SAE (2-res), and
    Neuronpedia's client reads its features, each token's strongest as attnserve.v1 gives."""
    server = ServerThread(default_export[0])
    config = neuronpedia.Configuration(host=f"{server.http_url}/v1")
    try:
        with neuronpedia.ApiClient(config) as api_client:
            api = neuronpedia.DefaultApi(api_client)
            answer = api.activation_topk_by_token_post(
                neuronpedia.ActivationTopkByTokenPostRequest(
                    prompt=PROMPT,
                    model="attnserve-encoder",
                    source="2-res",
                    top_k=3,
                    ignore_bos=True,
                )
            )
        with EncoderClient(server.address, ClientOptions(timeout_s=60)) as client:
            features = client.encode(PROMPT, features={"saes": ["2-res"], "top_k": 3})[0].features
        for result in answer.results:
            want = features.top_ids[0, result.token_position].tolist()
            assert [f.feature_index for f in result.top_features] == want
        assert len(answer.results) == len(PROMPT)  # every token after the BOS, each 3 features
    finally:
        server.stop()
