"""Attention statistics by query blocks (issue 72) against transformers' eager attention: on
every family the importer takes (sliding windows, soft-caps, GQA per query head, partial
and scaled rotaries), in blocks of a few rows, and at 2,048 tokens through a real server on
every API."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from attnserve.client import ClientOptions, EncoderClient
from attnserve.service.core.backend import AttentionSelection
from attnserve.service.ort.runtime import OrtRuntime, RuntimeOptions
from perf.hf_checkpoints import build_checkpoint, reference_outputs
from tests.conftest import ServerThread, run_cli
from tests.export.families import FAMILY_SHAPES
from tests.export.test_hf_families import padded_batch

FAMILIES = sorted(FAMILY_SHAPES)
K = 8


def expected(att: np.ndarray, rows: np.ndarray, reduction: str = "none") -> dict:
    """What the statistics of `rows` are, from one text's full weights (L, H, T, T)."""
    picked = att[:, :, rows]  # (L, H, R, T)
    entropy = -(picked * np.log(np.where(picked > 0, picked, 1.0))).sum(-1)  # (L, H, R)
    reduced = {"none": picked, "mean": picked.mean(1, keepdims=True)}.get(reduction)
    if reduced is None:
        reduced = picked.max(1, keepdims=True)
    values = -np.sort(-reduced, axis=-1)[..., :K]
    return {"values": values, "received": reduced.sum(2), "entropy": entropy, "rows": reduced}


def assert_statistics(out, want: dict, weights: np.ndarray) -> None:
    """Top-k values within 1e-5 (and each index pointing at its value), received within
    1e-4 of its own size, entropy within 1e-4: the issue's targets."""
    seen = out.indices >= 0
    assert np.abs(out.weights - want["values"]).max() <= 1e-5
    at = np.take_along_axis(weights, np.maximum(out.indices, 0), axis=-1)
    assert np.abs(np.where(seen, at, 0.0) - out.weights).max() <= 1e-5
    assert (out.weights[~seen] == 0).all()
    relative = np.abs(out.received - want["received"]) / np.maximum(want["received"], 1.0)
    assert relative.max() <= 1e-4
    assert np.abs(out.row_entropy - want["entropy"]).max() <= 1e-4
    assert np.abs(out.entropy - want["entropy"].mean(-1)).max() <= 1e-4


@pytest.mark.parametrize("family", FAMILIES)
def test_statistics_by_blocks_equal_transformers_eager(families, family):
    _, reference = families.checkpoint(family)
    runtime = OrtRuntime(families.exported(family), RuntimeOptions(provider="cpu"))
    c = runtime.config
    # blocks of 3 or 4 rows: the rows of a text cross many blocks, windows and all
    runtime.blocks.block_bytes = 8 * 4 * c.n_heads * 40 * 3
    ids, lengths = padded_batch(c.vocab_size, seed=3)
    _, att = reference_outputs(reference, ids)
    every = dict(layers=tuple(range(c.n_layers)), heads=tuple(range(c.n_heads)), blocked=True)
    asked = dict(top_k=K, entropy=True, row_entropy=True, received=True)
    selections = [AttentionSelection(**every, **asked) for _ in lengths]
    _, outputs = runtime.attend(ids, list(lengths), selections)
    for row, (t, out) in enumerate(zip(lengths, outputs, strict=True)):
        text = att[row, ..., :t, :t]
        want = expected(text, np.arange(t))
        assert_statistics(out, want, want["rows"])
    # head means and maxima of chosen rows, and a tile of one head, of the first text
    t, text = lengths[0], att[0, ..., : lengths[0], : lengths[0]]
    rows = np.array([t - 1, 0, 17, 30])
    for reduction in ("mean", "max"):
        selection = AttentionSelection(
            **every, **asked, rows=tuple(rows.tolist()), reduction=reduction
        )
        _, (out,) = runtime.attend(ids[:1, :t], [t], [selection])
        want = expected(text, rows, reduction)
        assert_statistics(out, want, want["rows"])
    tile = AttentionSelection(
        layers=(c.n_layers - 1,), heads=(1,), rows=tuple(range(5, 31)), key_range=(3, 29),
        blocked=True,
    )  # fmt: skip
    _, (out,) = runtime.attend(ids[:1, :t], [t], [tile])
    assert np.abs(out.weights[0, 0] - text[-1, 1, 5:31, 3:29]).max() <= 1e-5


@pytest.fixture(scope="module")
def long_llama(tmp_path_factory):
    """A tiny Llama of 2,048 positions with Llama 3's scaled rotary and 4:1 GQA, exported by
    the CLI, and its transformers reference."""
    root = tmp_path_factory.mktemp("long")
    reference = build_checkpoint(
        "llama",
        root / "hf",
        seed=7,
        perturb=0.05,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        rope_parameters={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 256,
            "rope_theta": 500000.0,
        },
    )  # fmt: skip
    out = root / "model"
    result = run_cli("export", "--from-hf", str(root / "hf"), "--out", str(out))
    assert result.returncode == 0, result.stderr
    return out, reference


def test_2048_tokens_on_every_api_equal_transformers_eager(long_llama):
    directory, reference = long_llama
    ids = np.random.default_rng(11).integers(3, reference.config.vocab_size, size=(1, 2048))
    _, att = reference_outputs(reference, ids)
    want = expected(att[0], np.arange(2048))
    server = ServerThread(directory)
    try:
        with EncoderClient(server.address, ClientOptions(timeout_s=300)) as client:
            (got,) = client.encode(
                [ids[0].tolist()], top_k=K, head_entropy=True, row_entropy=True, received=True
            )
        assert got.attention.shape == (2, 8, 2048, K)
        out = AttentionOutputView(got.attention, got.indices, got.head_entropy,
                                  got.attention_row_entropy, got.attention_received)  # fmt: skip
        assert_statistics(out, want, want["rows"])

        # the Open Inference Protocol's outputs, as named in the issue
        body = {
            "inputs": [{"name": "input_ids", "shape": [1, 2048], "datatype": "INT64",
                        "data": ids[0].tolist()}],
            "outputs": [{"name": "attention_received"}, {"name": "attention_row_entropy"}],
            "parameters": {"attention_layers": "1"},
        }  # fmt: skip
        name = httpx.get(f"{server.http_url}/v1/models").json()["data"][0]["id"]
        answer = httpx.post(f"{server.http_url}/v2/models/{name}/infer", json=body, timeout=300)
        assert answer.status_code == 200, answer.text
        tensors = {o["name"]: o for o in answer.json()["outputs"]}
        received = tensors["attention_received"]
        assert received["shape"] == [1, 1, 8, 2048]
        got_received = np.array(received["data"]).reshape(8, 2048)
        assert np.abs(got_received - want["received"][1]).max() <= 1e-4 * 2048
        entropy = np.array(tensors["attention_row_entropy"]["data"]).reshape(8, 2048)
        assert np.abs(entropy - want["entropy"][1]).max() <= 1e-4

        # a tile of the map, on HTTP's JSON Encode
        body = {
            "inputs": [{"token_ids": {"ids": ids[0].tolist()}}],
            "options": {"skip_token_embeddings": True, "attention": {
                "layers": [0], "heads": [5], "query_positions": list(range(1000, 1064)),
                "key_start": 900, "key_end": 1100}},
            "tensor_format": "list",
        }  # fmt: skip
        answer = httpx.post(f"{server.http_url}/v1/encode", json=body, timeout=300)
        assert answer.status_code == 200, answer.text
        tile = np.array(answer.json()["results"][0]["attention"]["values"])
        assert tile.shape == (1, 1, 64, 200)
        assert np.abs(tile[0, 0] - att[0, 0, 5, 1000:1064, 900:1100]).max() <= 1e-5

        # a tile outside the text is refused, naming the fields and the limit
        body["options"]["attention"]["key_end"] = 4000
        answer = httpx.post(f"{server.http_url}/v1/encode", json=body, timeout=60)
        assert answer.status_code == 400
        assert "key_start/key_end" in answer.text and "<= 2048" in answer.text
    finally:
        server.stop()


class AttentionOutputView:
    """An Encoding's statistics under AttentionOutput's names, for assert_statistics."""

    def __init__(self, weights, indices, entropy, row_entropy, received) -> None:
        self.weights, self.indices, self.entropy = weights, indices, entropy
        self.row_entropy, self.received = row_entropy, received
