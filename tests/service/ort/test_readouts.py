"""The readouts in ONNX Runtime (residual stream and its parts under a head mask, the logit
lens, direct logit attribution) against the PyTorch model they were exported from, and what
a directory without them says."""

import shutil

import numpy as np
import pytest
import torch

from attnserve.model.artifacts import (
    ATTRIBUTION_PARTS,
    ON_DEMAND,
    ONNX_FILENAME,
    PARTS_NAMES,
    RESIDUAL_STREAM_NAME,
    graph_file,
)
from attnserve.model.hook_points import captured, head_ablation, hooked, stacked
from attnserve.model.readout_sites import readout_sites
from attnserve.service.core.errors import UnsupportedError
from attnserve.service.ort.runtime import OrtRuntime, RuntimeOptions
from tests.conftest import SMALL_CONFIG, head_changes


def masks(batch: int) -> np.ndarray:
    """One head mask per sequence: all kept, a head removed, a layer's heads halved."""
    mask = np.ones((batch, SMALL_CONFIG.n_layers, SMALL_CONFIG.n_heads), dtype=np.float32)
    mask[1, 0, 2] = 0.0
    mask[2, -1, :] = 0.5
    return mask


def test_residual_stream_under_a_head_mask_matches_pytorch(small_runtime, small_model):
    ids = np.random.default_rng(0).integers(0, SMALL_CONFIG.vocab_size, size=(3, 21))
    mask = masks(3)
    sites = readout_sites(SMALL_CONFIG)
    run = small_runtime.readouts.stream(ids, head_changes(mask), sites=sites)
    embeddings, stream = run.embeddings, run.residual
    assert stream.shape == (3, SMALL_CONFIG.n_layers + 1, 21, SMALL_CONFIG.d_model)
    reads = [site for names in sites.values() for site in names]
    changes = head_ablation(torch.from_numpy(mask))
    with torch.inference_mode(), hooked(small_model, changes), captured(small_model, reads) as v:
        want_embeddings, want_attentions = small_model(torch.from_numpy(ids))
        want = {name: value.numpy() for name, value in stacked(v, sites).items()}
    np.testing.assert_allclose(stream, want[RESIDUAL_STREAM_NAME], rtol=0, atol=1e-4)
    np.testing.assert_allclose(run.attentions, want_attentions.numpy(), rtol=0, atol=1e-5)
    np.testing.assert_allclose(embeddings, want_embeddings.numpy(), rtol=0, atol=1e-4)
    assert set(sites) == {RESIDUAL_STREAM_NAME, *PARTS_NAMES, "attn_outputs", "resid_mid"}
    for name in sites:  # (B, L, T, .): the parts, what attention writes, resid_mid
        np.testing.assert_allclose(run.output(name), want[name], rtol=0, atol=1e-4)
    assert np.all(run.heads[1, 0, :, 2 * SMALL_CONFIG.head_dim : 3 * SMALL_CONFIG.head_dim] == 0)
    # each sequence got its own mask: the unmasked one is what the served graphs give
    served, _ = small_runtime.run(ids[:1])
    np.testing.assert_allclose(embeddings[:1], served, rtol=0, atol=1e-5)
    assert np.abs(embeddings[1] - small_runtime.run(ids[1:2])[0][0]).max() > 1e-3


def test_the_lens_matches_pytorch_and_is_the_logits_at_the_last_layer(small_runtime, small_model):
    ids = np.random.default_rng(1).integers(0, SMALL_CONFIG.vocab_size, size=(1, 12))
    stream = small_runtime.readouts.stream(ids, [{}]).residual
    rows = stream[0].reshape(-1, SMALL_CONFIG.d_model)  # every layer and position
    last = np.broadcast_to(stream[0, -1], stream[0].shape).reshape(rows.shape).copy()
    logits = small_runtime.readouts.lens(rows, last, logits=True).logits.reshape(
        SMALL_CONFIG.n_layers + 1, 12, -1
    )
    with torch.inference_mode():
        want = small_model.lens(torch.from_numpy(rows), torch.from_numpy(last)).numpy()
        want_logits = small_model.logits(torch.from_numpy(ids)).numpy()
    np.testing.assert_allclose(logits.reshape(want.shape), want, rtol=0, atol=1e-4)
    np.testing.assert_allclose(logits[-1], want_logits[0], rtol=0, atol=1e-4)


def test_the_lens_reads_off_the_top_k_and_the_targets_probabilities(small_runtime):
    rng = np.random.default_rng(2)
    rows = rng.normal(size=(6, SMALL_CONFIG.d_model)).astype(np.float32)
    last = rng.normal(size=(6, SMALL_CONFIG.d_model)).astype(np.float32)
    targets = rng.integers(0, SMALL_CONFIG.vocab_size, size=(6, 3))
    out = small_runtime.readouts.lens(rows, last, k=4, targets=targets, logits=True)
    logits = out.logits.astype(np.float64)
    probabilities = np.exp(logits - logits.max(-1, keepdims=True))
    probabilities /= probabilities.sum(-1, keepdims=True)
    order = np.argsort(-probabilities, axis=-1)[:, :4]
    assert out.top_ids.shape == (6, 4) and out.top_ids.dtype == np.int64
    np.testing.assert_array_equal(out.top_ids, order)  # random rows: no near-ties
    np.testing.assert_allclose(
        out.top_probabilities, np.take_along_axis(probabilities, order, -1), atol=1e-6
    )
    np.testing.assert_allclose(
        out.target_probabilities, np.take_along_axis(probabilities, targets, -1), atol=1e-6
    )
    # without targets: none asked, none computed
    assert small_runtime.readouts.lens(rows, last).target_probabilities.shape == (6, 0)


def test_attribution_in_chunks_matches_pytorch(small_runtime, small_model, monkeypatch):
    """Every position of a sequence, three at a time: the chunks join in order."""
    import attnserve.service.ort.readouts as readouts

    monkeypatch.setattr(readouts, "attribution_chunk_rows", lambda config, ids: 3)
    ids = np.random.default_rng(3).integers(0, SMALL_CONFIG.vocab_size, size=(1, 10))
    run = small_runtime.readouts.stream(ids, [{}], attentions=False, sites=PARTS_NAMES)
    assert run.attentions is None
    inputs = [np.ascontiguousarray(run.heads[0].swapaxes(0, 1))]
    inputs += [np.ascontiguousarray(run.mlps[0].swapaxes(0, 1))]
    inputs += [run.residual[0, 0], run.residual[0, -1]]
    targets = np.random.default_rng(4).integers(0, SMALL_CONFIG.vocab_size, size=(10, 2))
    got = small_runtime.readouts.attribution(*inputs, targets)
    with torch.inference_mode():
        want = small_model.attribution(*(torch.from_numpy(x) for x in (*inputs, targets)))
    assert list(got) == list(ATTRIBUTION_PARTS)  # by name, in Encoder.attribution's order
    for part, wanted in zip(got.values(), want, strict=True):
        np.testing.assert_allclose(part, wanted.numpy(), rtol=0, atol=1e-5)


def prepacking(runtime: OrtRuntime) -> list[bool]:
    """Whether each opened readouts session prepacks (copies) the weights."""
    found = []
    for session in runtime.graph_sessions._sessions.values():
        try:
            entry = session.get_session_options().get_session_config_entry(
                "session.disable_prepacking"
            )
        except RuntimeError:  # never set: ONNX Runtime's default, prepacking
            entry = "0"
        found.append(entry != "1")
    return found


def test_readout_sessions_copy_the_weights_only_where_copies_are_cheap(small_model_dir):
    """As the served graphs: prepacked beside two sessions; in one session (a model whose
    second copy would not fit) the stream is that session's, the served one's copy, and
    the lens reads the mapped weights file instead."""
    row = np.ones((1, SMALL_CONFIG.d_model), np.float32)
    ids = np.ones((1, 3), np.int64)
    for single_session in (False, True):
        runtime = OrtRuntime(small_model_dir, RuntimeOptions(single_session=single_session))
        runtime.readouts.lens(row, row)
        runtime.readouts.stream(ids, [{}], attentions=False)
        sessions = runtime.graph_sessions._sessions
        assert (sessions["readouts"] is runtime.session) == single_session
        assert prepacking(runtime) == ([True, False] if single_session else [True, True])


def test_a_directory_without_readouts_says_to_re_export(small_model_dir, tmp_path):
    readable = {"readouts", "changes", "lens", "attribution", "decode", "queries"}
    # each precision has them all
    assert OrtRuntime(small_model_dir, RuntimeOptions(precision="fp16")).graphs == readable
    model_dir = tmp_path / "model"
    shutil.copytree(small_model_dir, model_dir)
    for precision in ("fp32", "fp16"):
        for kind in ON_DEMAND:  # the decode graph with them: written after
            (model_dir / graph_file(kind, precision)).unlink()
    runtime = OrtRuntime(model_dir, RuntimeOptions(provider="cpu"))
    with pytest.raises(UnsupportedError, match=r"no present.0.key .*re-export"):
        runtime.decode_batch()
    with pytest.raises(UnsupportedError, match=r"no logits .*re-export"):
        runtime.readouts.lens(np.zeros((1, 64), np.float32), np.ones((1, 64), np.float32))
    with pytest.raises(UnsupportedError, match=r"no residual_stream .*re-export"):
        runtime.readouts.stream(np.zeros((1, 3), np.int64), [{}])
    fp16 = OrtRuntime(model_dir, RuntimeOptions(provider="cpu", precision="fp16"))
    assert runtime.graphs == fp16.graphs == frozenset()  # what the planner refuses
    with pytest.raises(UnsupportedError, match="no residual_stream to read in fp16"):
        fp16.readouts.stream(np.zeros((1, 3), np.int64), [{}])
    assert (model_dir / ONNX_FILENAME).is_file()  # what it has still serves
    assert runtime.run(np.zeros((1, 3), np.int64))[0].shape == (1, 3, 64)
