"""The running batch on the real decode graph: a prompt run in chunks computes what it run
whole computes, under a change of some of its positions too, and texts that join from chunks
step as they would alone."""

from __future__ import annotations

import numpy as np

from attnserve.model.tokenizer import ByteTokenizer
from attnserve.service.core.interventions import plan_changes
from attnserve.service.core.request import Intervention
from attnserve.service.core.view import ModelView
from tests.conftest import SMALL_CONFIG


def _prompt(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, SMALL_CONFIG.vocab_size, n).astype(np.int64)


def test_a_prompt_run_in_chunks_is_the_prompt_run_whole(small_runtime):
    prompt = _prompt(37, 0)
    # a change of the prompt's positions 3 and 20 (one per position: sliced by chunk)
    values = np.random.default_rng(1).normal(0, 4, SMALL_CONFIG.d_model).astype(np.float32)
    change = Intervention("blocks.1.hook_resid_pre", "add", values, 2.0, positions=(3, 20))
    view = ModelView(SMALL_CONFIG, ByteTokenizer(SMALL_CONFIG))
    changes = plan_changes((change,), (), view, len(prompt), 0)
    assert changes and next(iter(changes.values())).scale.shape[1] == len(prompt)
    whole_batch, chunked_batch = small_runtime.decode_batch(), small_runtime.decode_batch()
    whole = whole_batch.prefill(prompt, changes).advance(len(prompt))
    run = chunked_batch.prefill(prompt, changes)
    chunks = [run.advance(8) for _ in range(5)]  # 8 + 8 + 8 + 8 + 5
    assert all(c is None for c in chunks[:-1]) and chunks[-1] is not None
    np.testing.assert_allclose(chunks[-1], whole, atol=1e-4, rtol=0)
    unchanged = small_runtime.decode_batch().prefill(prompt, {}).advance(len(prompt))
    assert np.abs(unchanged - whole).max() > 1e-2  # the change reached the chunks it is in
    # joined, each batch steps alike
    chunked_batch.join(run, {})
    whole_batch.join(_ran(whole_batch, prompt, changes), {})
    a = whole_batch.step([int(np.argmax(whole))])
    b = chunked_batch.step([int(np.argmax(chunks[-1]))])
    np.testing.assert_allclose(b, a, atol=1e-4, rtol=0)


def _ran(batch, prompt, changes):
    run = batch.prefill(prompt, changes)
    run.advance(len(prompt))
    return run


def test_texts_joined_from_chunks_step_as_each_alone(small_runtime):
    prompts = [_prompt(n, seed) for seed, n in enumerate((5, 70, 23))]
    batch = small_runtime.decode_batch()
    for prompt in prompts:
        run = batch.prefill(prompt, {})
        while run.advance(16) is None:
            pass
        batch.join(run, {})
    tokens = [1, 2, 3]
    together = batch.step(tokens)
    for row, (prompt, token) in enumerate(zip(prompts, tokens, strict=True)):
        alone = small_runtime.decode_batch()
        alone.join(_ran(alone, prompt, {}), {})
        np.testing.assert_allclose(together[row], alone.step([token])[0], atol=1e-4, rtol=0)
