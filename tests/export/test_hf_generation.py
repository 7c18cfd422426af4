"""Generation on the families people steer, served, against transformers' `generate`: the
same greedy tokens, plain and with a steering vector added at one layer's residual stream
on both sides (at the prompt's positions and every generated one)."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import torch

from tests.conftest import ServerThread

FAMILIES = ["llama", "gemma2", "gpt_neox"]
NEW_TOKENS = 32
PROMPT = [1, 5, 17, 33, 8, 90, 12]  # longer than gemma2's window once generation runs


def transformers_greedy(reference, steering: np.ndarray | None, layer: int) -> list[int]:
    """transformers' greedy continuation, with `steering` added to what decoder layer
    `layer` reads (TransformerLens' blocks.{layer}.hook_resid_pre) where given."""
    handles = []
    if steering is not None:
        vector = torch.from_numpy(steering)

        def add(_module, args, kwargs):
            if args:
                return (args[0] + vector, *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": kwargs["hidden_states"] + vector}

        block = reference.base_model.layers[layer]
        handles.append(block.register_forward_pre_hook(add, with_kwargs=True))
    try:
        with torch.no_grad():
            out = reference.generate(
                torch.tensor([PROMPT]),
                max_new_tokens=NEW_TOKENS,
                min_new_tokens=NEW_TOKENS,
                do_sample=False,
            )
    finally:
        for handle in handles:
            handle.remove()
    return out[0, len(PROMPT) :].tolist()


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_tokens_equal_transformers_plain_and_steered(families, family):
    _, reference = families.checkpoint(family)
    width = reference.config.hidden_size
    steering = np.random.default_rng(0).normal(0, 2.0, width).astype(np.float32)
    layer = 1
    plain = transformers_greedy(reference, None, layer)
    steered = transformers_greedy(reference, steering, layer)
    assert steered != plain  # the vector changes the text: the comparison below can fail
    server = ServerThread(families.exported(family))
    try:
        body = {
            "prompt": PROMPT,
            "max_tokens": NEW_TOKENS,
            "temperature": 0,
            "ignore_eos": True,
            "return_token_ids": True,
            "interventions": [
                {"hook": f"blocks.{layer}.hook_resid_pre", "op": "add", "values": steering.tolist()}
            ],
            "compare": True,
        }
        answer = httpx.post(f"{server.http_url}/v1/completions", json=body, timeout=120)
        assert answer.status_code == 200, answer.text
        choices = answer.json()["choices"]
        assert [c["index"] for c in choices] == [0, 1]
        assert choices[0]["token_ids"] == steered
        assert choices[1]["token_ids"] == plain
        assert all(c["finish_reason"] == "length" for c in choices)
    finally:
        server.stop()
