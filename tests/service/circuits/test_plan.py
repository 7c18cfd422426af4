"""A graph request's plan (service/circuits/plan.py): the prompt's ids as circuit-tracer
attributes them (a special token first, put there unless one is), every knob in its range
or an error naming it and its limit, the transcoder set among the directory's, and the
rows of one backward pass held to BACKWARD_BYTES."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from attnserve.model.config import ModelConfig
from attnserve.model.tokenizer import ByteTokenizer
from attnserve.service.circuits.graph import GraphOptions
from attnserve.service.circuits.plan import BACKWARD_BYTES, plan_graph
from attnserve.service.core.errors import InvalidInputError
from attnserve.service.core.view import ModelView

CONFIG = ModelConfig(n_layers=3, n_heads=2, d_model=8, d_ff=16, max_seq_len=12)
VIEW = ModelView(CONFIG, ByteTokenizer(CONFIG))
SETS = ("plt",)
DEFAULTS = GraphOptions()


def plan(item, options: GraphOptions = DEFAULTS, sets=SETS, transcoders="plt"):
    return plan_graph(item, transcoders, options, VIEW, sets)


def test_a_text_gets_the_bos_token_first_and_no_other_special():
    got = plan("hi")
    assert got.input_ids.tolist() == [CONFIG.bos_id, ord("h"), ord("i")]
    assert got.input_ids.dtype == np.int64


@pytest.mark.parametrize("first", [CONFIG.bos_id, CONFIG.eos_id, CONFIG.pad_id])
def test_ids_that_start_with_a_special_token_are_kept(first):
    assert plan(np.array([first, 5, 6])).input_ids.tolist() == [first, 5, 6]


def test_ids_without_one_get_the_bos_token():
    assert plan(np.array([5, 6])).input_ids.tolist() == [CONFIG.bos_id, 5, 6]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"max_n_logits": 0}, "max_n_logits: must be between 1 and 259, not 0"),
        ({"max_n_logits": 1000}, "max_n_logits: must be between 1 and 259, not 1000"),
        ({"batch_size": 0}, "batch_size: must be at least 1, not 0"),
        ({"max_feature_nodes": 0}, "max_feature_nodes: must be at least 1, not 0"),
        ({"update_interval": -1}, "update_interval: must be at least 1, not -1"),
        ({"desired_logit_prob": 1.5}, "desired_logit_prob: must be between 0 and 1, not 1.5"),
        ({"node_threshold": -0.1}, "node_threshold: must be between 0 and 1, not -0.1"),
        ({"edge_threshold": 2.0}, "edge_threshold: must be between 0 and 1, not 2.0"),
    ],
)
def test_a_knob_out_of_its_range_is_named_with_its_limit(change, message):
    with pytest.raises(InvalidInputError) as raised:
        plan("hi", replace(DEFAULTS, **change))
    assert str(raised.value) == message
    assert raised.value.field == next(iter(change))


def test_the_prompt_is_checked_against_the_model():
    with pytest.raises(InvalidInputError, match=r"^prompt.token_ids: token id 400 is outside"):
        plan(np.array([1, 400]))
    with pytest.raises(InvalidInputError, match=r"^prompt: the prompt is empty"):
        plan("")
    # 11 characters and the bos token: 12, the context; one more is refused, counted so
    assert len(plan("a" * 11).input_ids) == CONFIG.max_seq_len
    with pytest.raises(InvalidInputError, match="has 13 tokens with the first special one"):
        plan("a" * 12)


def test_the_transcoder_set_must_be_one_the_directory_holds():
    with pytest.raises(InvalidInputError, match=r"^transcoders: no transcoder set 'x' \(this "
                       r"model has plt\)"):  # fmt: skip
        plan("hi", transcoders="x")
    with pytest.raises(InvalidInputError, match="this model has none: add a circuit-tracer"):
        plan("hi", sets=())


def test_a_backward_pass_holds_the_rows_that_fit_its_bytes():
    got = plan("a" * 11)
    per_row = 4 * (CONFIG.n_layers + 1) * 12 * CONFIG.d_model  # every MLP output and tokens
    assert got.max_rows == BACKWARD_BYTES // per_row
    assert got.max_rows * per_row <= BACKWARD_BYTES < (got.max_rows + 1) * per_row
