"""Attention by query blocks in the ORT backend: which requests the plan sends there and what
it reserves for them, blocks of any size giving one answer, the queries graph serving long
texts' embeddings, a text's queries and keys kept for its tiles, and a directory without the
queries graph refusing what only it computes."""

from __future__ import annotations

import shutil
from dataclasses import replace

import numpy as np
import pytest

from attnserve.model.artifacts import QUERIES_ONNX_FILENAME
from attnserve.model.tokenizer import ByteTokenizer
from attnserve.service.core.backend import AttentionSelection
from attnserve.service.core.budget import ATTENTION_BLOCK_BYTES, queries_bytes, request_bytes
from attnserve.service.core.errors import UnsupportedError
from attnserve.service.core.plan import LONG_ATTENTION_BYTES, plan_request, response_bytes
from attnserve.service.core.request import AttentionOptions, EncodeOptions, HeadReduction
from attnserve.service.core.view import ModelView
from attnserve.service.ort import runtime as runtime_module
from attnserve.service.ort.blocks import block_rows
from attnserve.service.ort.runtime import OrtRuntime, RuntimeOptions
from tests.conftest import SMALL_CONFIG

EVERY = dict(layers=tuple(range(SMALL_CONFIG.n_layers)), heads=tuple(range(SMALL_CONFIG.n_heads)))


def planned(runtime: OrtRuntime, length: int, **attention):
    options = EncodeOptions(attention=AttentionOptions(**attention))
    ids = np.random.default_rng(length).integers(0, 256, length)
    view = ModelView(runtime.config, ByteTokenizer(runtime.config), runtime.graphs)
    return plan_request([ids], options, view)


def test_the_plan_sends_statistics_and_long_maps_to_blocks(small_runtime):
    c = small_runtime.config
    assert not planned(small_runtime, 50, top_k=3).attention[0].blocked  # a small map
    for asked in (dict(received=True), dict(row_entropy=True), dict(key_end=9)):
        assert planned(small_runtime, 50, **asked).attention[0].blocked
    # the same top_k, where the weights would not fit: in blocks, its reservation the
    # queries and keys and one block instead of the T x T weights
    long = 1 + int((LONG_ATTENTION_BYTES / (2 * c.n_layers * c.n_heads * 4)) ** 0.5)
    small_runtime.config = replace(c, max_seq_len=long)
    try:
        plan = planned(small_runtime, long, top_k=3)
        rollout = planned(small_runtime, long, rollout=True, head_reduction=HeadReduction.MEAN)
    finally:
        small_runtime.config = c
    assert plan.attention[0].blocked and not rollout.attention[0].blocked
    squares = 2 * c.n_layers * c.n_heads * 4 * long**2
    blocked = queries_bytes(c, long) + ATTENTION_BLOCK_BYTES
    assert request_bytes(plan, c) == 2 * response_bytes(plan, c) + blocked
    assert request_bytes(rollout, c) == 2 * response_bytes(rollout, c) + squares
    assert block_rows(32, 8192) * 8 * 4 * 32 * 8192 <= ATTENTION_BLOCK_BYTES
    assert block_rows(32, 10**9) == 1  # one row at least


def test_blocks_of_any_size_give_one_answer(small_runtime):
    ids = np.random.default_rng(0).integers(0, 256, (1, 120))
    selection = AttentionSelection(
        **EVERY, top_k=5, entropy=True, row_entropy=True, received=True, blocked=True
    )
    default = small_runtime.blocks.block_bytes
    answers = []
    try:
        for block_bytes in (default, 8 * 4 * SMALL_CONFIG.n_heads * 120 * 7, 1):  # 1: a row
            small_runtime.blocks.block_bytes = block_bytes
            answers.append(small_runtime.attend(ids, [120], [selection])[1][0])
    finally:
        small_runtime.blocks.block_bytes = default
    _, attention = small_runtime.run(ids)
    first = answers[0]
    assert np.abs(first.received - attention[0].sum(2)).max() <= 1e-5
    for other in answers[1:]:
        for name in ("weights", "received", "row_entropy", "entropy"):  # sums in other orders
            np.testing.assert_allclose(getattr(other, name), getattr(first, name), 1e-6, 1e-6)
        assert (other.indices == first.indices).all()


def test_long_embeddings_come_from_the_queries_graph(small_runtime, monkeypatch):
    ids = np.random.default_rng(1).integers(0, 256, (2, 90))
    want = small_runtime.embed(ids)  # the embeddings graph: short enough
    monkeypatch.setattr(runtime_module, "LONG_EMBEDDINGS_BYTES", 0)
    calls = []
    queries = small_runtime.graph_sessions.session("queries")
    run = queries.run
    monkeypatch.setattr(queries, "run", lambda *a, **k: calls.append(a[0]) or run(*a, **k))
    got = small_runtime.embed(ids)
    assert calls == [[small_runtime.config.embeddings_name]]
    assert np.abs(got - want).max() <= 1e-5


def test_a_texts_queries_and_keys_serve_its_tiles(small_runtime):
    ids = np.random.default_rng(2).integers(0, 256, (1, 80))
    stats = AttentionSelection(**EVERY, top_k=4, received=True, blocked=True)
    small_runtime.attend(ids, [80], [stats])
    kept = small_runtime._last_queries
    tile = AttentionSelection(layers=(1,), heads=(3,), rows=tuple(range(40, 60)),
                              key_range=(10, 50), blocked=True)  # fmt: skip
    _, (out,) = small_runtime.attend(ids, [80], [tile])
    assert small_runtime._last_queries is kept  # no second run of the model
    _, attention = small_runtime.run(ids)
    assert np.abs(out.weights[0, 0] - attention[0, 1, 3, 40:60, 10:50]).max() <= 1e-6
    other = np.random.default_rng(3).integers(0, 256, (1, 80))
    small_runtime.attend(other, [80], [tile])
    assert small_runtime._last_queries is not kept


def test_without_the_queries_graph_statistics_are_refused(small_model_dir, tmp_path):
    model_dir = tmp_path / "model"
    shutil.copytree(small_model_dir, model_dir)
    for name in (QUERIES_ONNX_FILENAME, QUERIES_ONNX_FILENAME.replace(".onnx", "_fp16.onnx")):
        (model_dir / name).unlink()
    runtime = OrtRuntime(model_dir, RuntimeOptions(provider="cpu"))
    with pytest.raises(UnsupportedError, match=r"no queries graph .*re-export"):
        planned(runtime, 20, received=True)
    assert not planned(runtime, 20, top_k=2).attention[0].blocked  # the maps still serve
