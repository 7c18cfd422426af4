"""Hidden states, predictions, the logit lens and head masks through the real server (gRPC
and JSON), against the PyTorch model the served graphs were exported from."""

import dataclasses
import typing

import httpx
import numpy as np
import pytest
import torch

from attnserve.client import ClientOptions, EncoderClient, build_request
from attnserve.model.artifacts import PARTS_NAMES, RESIDUAL_STREAM_NAME
from attnserve.model.config import ModelConfig
from attnserve.model.hook_points import captured, head_ablation, hooked, stacked
from attnserve.model.readout_sites import readout_sites
from attnserve.model.tokenizer import ByteTokenizer
from attnserve.service.core.backend import ReadoutOutput, ReadoutSelection
from attnserve.service.core.errors import UnsupportedError
from attnserve.service.core.plan import plan_request
from attnserve.service.core.readouts import READOUTS
from attnserve.service.core.request import EncodeOptions
from attnserve.service.core.view import ModelView
from attnserve.service.oip.outputs import OUTPUT_DATATYPES
from attnserve.service.v1.options import inputs_of, options_of
from attnserve.v1 import encoder_service_pb2 as pb
from attnserve.v1.wire import ATTRIBUTION_PARTS
from tests.conftest import SMALL_CONFIG

L, H = SMALL_CONFIG.n_layers, SMALL_CONFIG.n_heads
TEXTS = ["The cat sat on the mat.", "Heads"]


def reference(small_model, ids: list[int], head_mask=None) -> dict[str, np.ndarray]:
    """What PyTorch computes of one sequence: hidden states, logits, the lens grid."""
    x = torch.tensor([ids])
    changes = {} if head_mask is None else head_ablation(torch.from_numpy(head_mask))
    with torch.inference_mode(), hooked(small_model, changes):
        stream, attentions = small_model.residual_stream(x)
        residual = torch.stack(stream, 1)[0]  # (L+1, T, D)
        lens = small_model.lens(residual, residual[-1].expand_as(residual))
        return {
            "hidden": small_model.hidden_states(x)[0].numpy(),
            "logits": small_model.logits(x)[0].numpy(),
            "lens": lens.numpy(),  # (L+1, T, V)
            "embeddings": small_model(x)[0][0].numpy(),
            "attentions": attentions[0].numpy(),
        }


def softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits.astype(np.float64) - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def check_predictions(got, logits: np.ndarray, k: int, targets=()) -> None:
    """The returned top k are the k most probable (their probabilities, sorted) and the
    targets' probabilities are theirs; `logits` (layers, positions, V)."""
    p = softmax(logits)
    want_top = -np.sort(-p, axis=-1)[..., :k]
    np.testing.assert_allclose(got.top_probabilities, want_top, atol=1e-5)
    np.testing.assert_allclose(
        np.take_along_axis(p, got.top_ids.astype(np.int64), -1), want_top, atol=1e-5
    )
    assert got.top_tokens.shape == got.top_ids.shape
    if targets:
        np.testing.assert_allclose(got.target_probabilities, p[..., list(targets)], atol=1e-5)


def test_hidden_states_are_transformers_output_hidden_states(client, small_model):
    out = client.encode(TEXTS, hidden_states={"norms": True})
    for encoding in out:
        want = reference(small_model, encoding.token_ids.tolist())["hidden"]
        assert encoding.hidden_state_layers == list(range(L + 1))
        assert encoding.hidden_state_positions == list(range(len(encoding.token_ids)))
        np.testing.assert_allclose(encoding.hidden_states, want, rtol=0, atol=1e-4)
        np.testing.assert_allclose(
            encoding.hidden_state_norms, np.linalg.norm(want, axis=-1), rtol=1e-5
        )
        # the last state is the final norm's output: the embeddings
        np.testing.assert_allclose(encoding.hidden_states[-1], encoding.embeddings, atol=1e-6)


def test_hidden_states_select_layers_and_positions_or_only_norms(client, small_model):
    encoding = client.encode(
        TEXTS[0], hidden_states={"layers": [2, 0], "positions": [-1, 3], "norms": True}
    )[0]
    want = reference(small_model, encoding.token_ids.tolist())["hidden"]
    T = len(encoding.token_ids)
    assert encoding.hidden_state_positions == [T - 1, 3]
    np.testing.assert_allclose(encoding.hidden_states, want[[2, 0]][:, [T - 1, 3]], atol=1e-4)
    only = client.encode(TEXTS[0], hidden_states={"norms": True, "omit_states": True})[0]
    assert only.hidden_states is None
    np.testing.assert_allclose(only.hidden_state_norms, np.linalg.norm(want, axis=-1), rtol=1e-5)


def test_predictions_are_the_models_next_token_distribution(client, small_model):
    targets = (5, 101)
    out = client.encode(TEXTS, predictions={"top_k": 3, "target_ids": targets, "logits": True})
    for encoding in out:
        logits = reference(small_model, encoding.token_ids.tolist())["logits"][None]
        got = encoding.predictions
        assert got.layers == [L] and got.positions == list(range(len(encoding.token_ids)))
        np.testing.assert_allclose(got.logits, logits, rtol=0, atol=1e-4)
        check_predictions(got, logits, 3, targets)
    assert out[0].logit_lens is None and out[0].hidden_states is None


def test_the_logit_lens_is_each_layers_residual_read_as_the_last(client, small_model):
    encoding = client.encode(
        TEXTS[0], logit_lens={"positions": [-1, 0], "target_ids": [7]}, return_tokens=True
    )[0]
    T = len(encoding.token_ids)
    lens = reference(small_model, encoding.token_ids.tolist())["lens"]
    got = encoding.logit_lens
    assert got.layers == list(range(L + 1)) and got.positions == [T - 1, 0]
    assert got.top_ids.shape == (L + 1, 2, 5)  # top_k 0 means 5
    check_predictions(got, lens[:, [T - 1, 0]], 5, (7,))
    assert got.logits is None
    tokens = ByteTokenizer(SMALL_CONFIG).token_strings(got.top_ids.ravel().tolist())
    assert got.top_tokens.ravel().tolist() == tokens


def test_a_head_mask_changes_everything_the_request_returns(client, small_model):
    mask = np.ones((L, H), np.float32)
    mask[0, 1] = 0.0  # removed
    mask[1, 3] = 0.5  # halved
    out = client.encode(
        TEXTS,
        head_mask=mask,
        attention=True,
        predictions={"positions": [-1], "logits": True},
        hidden_states={"layers": [1]},
    )
    plain = client.encode(TEXTS, attention=True)
    for encoding, unmasked in zip(out, plain, strict=True):
        want = reference(small_model, encoding.token_ids.tolist(), mask)
        np.testing.assert_allclose(encoding.embeddings, want["embeddings"], atol=1e-4)
        np.testing.assert_allclose(encoding.attention, want["attentions"], atol=1e-5)
        np.testing.assert_allclose(encoding.hidden_states, want["hidden"][[1]], atol=1e-4)
        np.testing.assert_allclose(encoding.predictions.logits[0], want["logits"][[-1]], atol=1e-4)
        assert np.abs(encoding.embeddings - unmasked.embeddings).max() > 1e-3
        # layer 0's attention comes before any removed head's output reaches a score
        np.testing.assert_allclose(encoding.attention[0], unmasked.attention[0], atol=1e-6)


def attribution_reference(small_model, ids: list[int], targets, head_mask=None):
    """PyTorch's Encoder.attribution at every position of one sequence, from the parts
    read at its hook points."""
    changes = {} if head_mask is None else head_ablation(torch.from_numpy(head_mask))
    sites = readout_sites(SMALL_CONFIG)
    reads = [site for names in sites.values() for site in names]
    with torch.inference_mode(), hooked(small_model, changes), captured(small_model, reads) as v:
        small_model(torch.tensor([ids]), need_weights=False)
        readouts = stacked(v, sites)
        stream = readouts[RESIDUAL_STREAM_NAME][0]  # (L+1, T, D)
        heads, mlps = (readouts[name][0].transpose(0, 1) for name in PARTS_NAMES)  # (T, L, .)
        rows = torch.tensor([list(targets)] * len(ids))
        return [
            p.numpy() for p in small_model.attribution(heads, mlps, stream[0], stream[-1], rows)
        ]


def test_attribution_parts_add_up_to_the_logits(client, small_model):
    targets = (5, 101, 7)
    encoding = client.encode(
        TEXTS[0],
        attribution={"target_ids": targets, "positions": [-1, 2]},
        predictions={"positions": [-1, 2], "logits": True},
    )[0]
    T = len(encoding.token_ids)
    got = encoding.attribution
    assert got.positions == [T - 1, 2] and got.target_ids == list(targets)
    assert got.heads.shape == (2, 3, L, H) and got.mlps.shape == (2, 3, L)
    logits = encoding.predictions.logits[0][:, targets]  # (positions, targets)
    np.testing.assert_allclose(got.total, logits, rtol=0, atol=1e-4)
    want = attribution_reference(small_model, encoding.token_ids.tolist(), targets)
    for name, part in zip(ATTRIBUTION_PARTS, want, strict=True):
        np.testing.assert_allclose(getattr(got, name), part[[T - 1, 2]], rtol=0, atol=1e-5)


def test_attribution_of_a_contrast_and_under_a_head_mask(client, small_model):
    both = client.encode(TEXTS[1], attribution={"target_ids": [5, 9]})[0].attribution
    contrast = client.encode(TEXTS[1], attribution={"target_ids": [5], "contrast_ids": [9]})[
        0
    ].attribution
    assert contrast.contrast_ids == [9]
    np.testing.assert_allclose(contrast.heads[:, 0], both.heads[:, 0] - both.heads[:, 1], atol=1e-6)
    np.testing.assert_allclose(contrast.total[:, 0], both.total[:, 0] - both.total[:, 1], atol=1e-5)
    masked = client.encode(
        TEXTS[1],
        attribution={"target_ids": [5], "positions": [-1]},
        predictions={"positions": [-1], "logits": True},
        head_mask={(0, 1): 0.0},
    )[0]
    a = masked.attribution
    assert np.all(a.heads[:, :, 0, 1] == 0)  # a removed head writes nothing
    assert np.abs(a.heads[:, :, 0, 0]).max() > 0
    np.testing.assert_allclose(a.total, masked.predictions.logits[0][:, [5]], atol=1e-4)


def test_mean_ablation_replaces_a_heads_output_by_the_mean_given(client, small_model):
    """Scale 0 and a mean: the head's output is that vector, in everything returned."""
    d_k = SMALL_CONFIG.head_dim
    mean = np.random.default_rng(5).normal(size=d_k).astype(np.float32)
    out = client.encode(
        TEXTS,
        head_mask={(0, 2): 0.0},
        head_means={(0, 2): mean, (1, 1): -mean},  # (1, 1): scale 1, moved by -mean
        predictions={"positions": [-1], "logits": True},
        attribution={"target_ids": [5], "positions": [-1]},
    )
    mask = torch.ones(L, H)
    mask[0, 2] = 0.0
    means = torch.zeros(L, H, d_k)
    means[0, 2], means[1, 1] = torch.from_numpy(mean), -torch.from_numpy(mean)
    for encoding in out:
        ids = torch.tensor([encoding.token_ids.tolist()])
        with torch.inference_mode(), hooked(small_model, head_ablation(mask, means)):
            embeddings = small_model(ids, need_weights=False)[0][0]
            logits = small_model.unembed(embeddings[-1:])
        np.testing.assert_allclose(encoding.embeddings, embeddings.numpy(), atol=1e-4)
        np.testing.assert_allclose(encoding.predictions.logits[0], logits.numpy(), atol=1e-4)
        np.testing.assert_allclose(encoding.attribution.total, logits[:, [5]].numpy(), atol=1e-4)
    plain = client.encode(TEXTS[0], head_mask={(0, 2): 0.0})[0]
    assert np.abs(plain.embeddings - out[0].embeddings).max() > 1e-3  # the mean matters


def test_a_mask_of_ones_changes_nothing(client):
    masked = client.encode(TEXTS, head_mask=np.ones((L, H), np.float32), attention=True)
    kept = client.encode(TEXTS, head_mask={(0, 0): 1.0}, attention=True)
    plain = client.encode(TEXTS, attention=True)
    for a, b, c in zip(masked, kept, plain, strict=True):
        np.testing.assert_allclose(b.embeddings, c.embeddings, atol=1e-5)
        np.testing.assert_allclose(b.attention, c.attention, atol=1e-6)
        np.testing.assert_array_equal(a.embeddings, c.embeddings)  # no entry: the plain path


def test_readouts_in_json_as_lists(server, client):
    body = {
        "inputs": [{"text": TEXTS[1]}],
        "options": {
            "logitLens": {"positions": [-1], "topK": 2},
            "hiddenStates": {"layers": [0], "positions": [0]},
            "headMask": [{"layer": 1, "head": 0}],
            "attribution": {"targetIds": [5], "positions": [-1]},
        },
        "tensor_format": "list",
    }
    got = httpx.post(f"{server.http_url}/v1/encode", json=body, timeout=60).json()["results"][0]
    want = client.encode(
        TEXTS[1],
        logit_lens={"positions": [-1], "top_k": 2},
        hidden_states={"layers": [0], "positions": [0]},
        head_mask={(1, 0): 0.0},
        attribution={"target_ids": [5], "positions": [-1]},
    )[0]
    lens = got["logitLens"]
    assert lens["topIds"]["shape"] == [L + 1, 1, 2] and lens["topIds"]["dtype"] == "int32"
    assert lens["topIds"]["values"] == want.logit_lens.top_ids.tolist()
    assert lens["topTokens"] == want.logit_lens.top_tokens.ravel().tolist()
    np.testing.assert_allclose(
        lens["topProbabilities"]["values"], want.logit_lens.top_probabilities, atol=1e-7
    )
    np.testing.assert_allclose(got["hiddenStates"]["values"], want.hidden_states, atol=1e-7)
    heads = got["attribution"]["heads"]
    assert heads["shape"] == [1, 1, L, H] and got["attribution"]["targetIds"] == ["5"]
    np.testing.assert_allclose(heads["values"], want.attribution.heads, atol=1e-7)


def test_an_answer_too_large_for_a_message_names_the_readouts(small_model_dir, small_runtime):
    from tests.conftest import ServerThread

    # Every position's logits at 300 tokens: 300 x 259 x 4 B = 311 kB.
    small = ServerThread(small_model_dir, small_runtime, max_message_bytes=200_000)
    try:
        with EncoderClient(small.address, ClientOptions(max_message_bytes=200_000)) as c:
            with pytest.raises(Exception) as excinfo:
                c.encode([[1] * 300], predictions={"logits": True}, token_embeddings=False)
            assert "more than the 200,000-byte message limit" in excinfo.value.details()
            assert "no logits" in excinfo.value.details()
            out = c.encode([[1] * 300], predictions={"positions": [-1], "logits": True})
            assert out[0].predictions.logits.shape == (1, 1, SMALL_CONFIG.vocab_size)
    finally:
        small.stop()


def plan(request, config: ModelConfig, readable: set[str]):
    return plan_request(
        inputs_of(request),
        options_of(request.options),
        ModelView(config, ByteTokenizer(config), frozenset(readable)),
    )


def test_a_model_without_readout_graphs_refuses_them_by_name():
    request = build_request("abc", logit_lens=True)
    config = ModelConfig(n_layers=1, n_heads=1, d_model=8, d_ff=8, max_seq_len=16)
    with pytest.raises(UnsupportedError, match=r"options.logit_lens: .*\(re-export it"):
        plan(request, config, {"readouts"})
    request = build_request("abc", head_mask={(0, 0): 0.0})
    with pytest.raises(UnsupportedError, match=r"options.head_mask: "):
        plan(request, config, set())
    assert plan(request, config, {"readouts"}).readouts


def test_attribution_is_refused_where_the_parts_would_not_add_up():
    readable = {"readouts", "lens", "attribution"}
    request = build_request("abc", attribution={"target_ids": [1]})
    shape = dict(n_layers=1, n_heads=1, d_model=8, d_ff=8, max_seq_len=16)
    post = ModelConfig(**shape, norm_placement="post")
    with pytest.raises(UnsupportedError, match=r"options.attribution: .*its post norms"):
        plan(request, post, readable)
    for placement in ("sandwich", "output"):  # their scales frozen, the parts add up
        assert plan(request, ModelConfig(**shape, norm_placement=placement), readable).readouts
    config = ModelConfig(n_layers=1, n_heads=1, d_model=8, d_ff=8, max_seq_len=16)
    with pytest.raises(UnsupportedError, match=r"options.attribution: .*\(re-export it"):
        plan(request, config, {"readouts", "lens"})
    assert plan(request, config, readable).readouts


def test_layers_count_from_the_end_as_positions_do(client):
    """-1 is the last state (hidden states, the lens) and the last layer (attention)."""
    last = client.encode(
        TEXTS[0], hidden_states={"layers": [-1, 0]}, logit_lens={"layers": [-1]}, layers=[-1]
    )[0]
    named = client.encode(
        TEXTS[0], hidden_states={"layers": [L, 0]}, logit_lens={"layers": [L]}, layers=[L - 1]
    )[0]
    assert last.hidden_state_layers == [L, 0] and last.layers == [L - 1]
    np.testing.assert_array_equal(last.hidden_states, named.hidden_states)
    np.testing.assert_array_equal(last.attention, named.attention)
    np.testing.assert_array_equal(last.logit_lens.top_ids, named.logit_lens.top_ids)


def test_every_readout_is_a_row_every_layer_names():
    """The readout table against the types it names: each row's option is a field of
    EncodeOptions (core's and attnserve.v1's) of its options' type, its selection a field of
    ReadoutSelection and ReadoutOutput, its V2 outputs typed; and every selection a request
    can make is some row's (besides the changes and attention, planned before them)."""
    hints = typing.get_type_hints(EncodeOptions)
    selections = {f.name for f in dataclasses.fields(ReadoutSelection)}
    outputs = {f.name for f in dataclasses.fields(ReadoutOutput)}
    for kind in READOUTS:
        assert typing.get_args(hints[kind.option]) == (kind.options, type(None)), kind.option
        assert kind.option in pb.EncodeOptions.DESCRIPTOR.fields_by_name, kind.option
        assert kind.selection in selections, kind.option
        assert kind.selection in outputs or kind.option == "capture", kind.option
        assert set(kind.v2) <= set(OUTPUT_DATATYPES), kind.option
    rows = {kind.selection for kind in READOUTS}
    assert selections - rows == {"changes", "clamps", "attention"}
    assert len(rows) == len(READOUTS)
