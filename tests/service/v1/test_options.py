"""attnserve.v1's EncodeRequest -> the data plane's inputs and options (service/v1/options.py):
every enum word of the .proto has its word in the core, and every field arrives."""

import numpy as np
import pytest

from attnserve.client import build_request
from attnserve.service.core.errors import InvalidInputError
from attnserve.service.core.readouts import READOUTS
from attnserve.service.core.request import (
    AttentionOptions,
    AttributionOptions,
    HeadReduction,
    HeadScale,
    HiddenStatesOptions,
    Layout,
    LensNorm,
    Pooling,
    PredictionsOptions,
)
from attnserve.service.v1.options import inputs_of, options_of
from attnserve.v1 import encoder_service_pb2 as pb

ENUMS = [
    (pb.Pooling, "pooling", Pooling, lambda o: o.pooling),
    (pb.LensNorm, "logit_lens.lens_norm", LensNorm, lambda o: o.logit_lens.lens_norm),
    (pb.AttentionLayout, "attention.layout", Layout, lambda o: o.attention.layout),
    (pb.HeadReduction, "attention.head_reduction", HeadReduction,
     lambda o: o.attention.head_reduction),
]  # fmt: skip


@pytest.mark.parametrize(("enum", "field", "words", "read"), ENUMS)
def test_every_value_of_a_proto_enum_has_its_word_in_the_core(enum, field, words, read):
    """A value added to the .proto without a word in core/request.py fails here."""
    for name, number in enum.items():
        options = pb.EncodeOptions()
        message, _, leaf = ("options." + field).rpartition(".")
        target = options
        for part in message.split(".")[1:]:
            target = getattr(target, part)
        setattr(target, leaf, number)
        got = read(options_of(options))
        if number:
            assert got == words(name.removeprefix(enum.Name(0).removesuffix("UNSPECIFIED")).lower())
        else:  # UNSPECIFIED: the default
            assert got in (Pooling.NONE, LensNorm.FROZEN, Layout.FULL, None)
    with pytest.raises(InvalidInputError, match=rf"options.{field}: 99 is not one of"):
        bad = pb.EncodeOptions()
        setattr(bad if "." not in field else getattr(bad, field.split(".")[0]),
                field.rsplit(".")[-1], 99)  # fmt: skip
        options_of(bad)


def test_every_field_arrives():
    request = build_request(
        ["a text", [3, 4, 5]],
        pooling="mean",
        truncate=True,
        token_embeddings=False,
        layers=[-1],
        heads=[0],
        attention_dtype="float16",
        head_reduction="max",
        top_k=2,
        hidden_states={"layers": [0], "positions": [-1], "norms": True},
        predictions={"positions": [-1], "top_k": 3, "target_ids": [7], "logits": True},
        logit_lens={"layers": [1], "lens_norm": "own"},
        attribution={"target_ids": [1], "contrast_ids": [2]},
        head_means={(1, 2): [0.5, 0.25]},
    )
    inputs = inputs_of(request)
    assert inputs[0] == "a text" and inputs[1].dtype == np.int64
    assert inputs[1].tolist() == [3, 4, 5]
    options = options_of(request.options)
    assert options.truncate and options.pooling == Pooling.MEAN
    assert not options.token_embeddings
    assert options.attention == AttentionOptions(
        layers=(-1,), heads=(0,), float16=True, head_reduction=HeadReduction.MAX, top_k=2
    )
    assert options.hidden_states == HiddenStatesOptions(layers=(0,), positions=(-1,), norms=True)
    assert options.predictions == PredictionsOptions(
        positions=(-1,), top_k=3, target_ids=(7,), logits=True
    )
    assert options.logit_lens == PredictionsOptions(layers=(1,), lens_norm=LensNorm.OWN)
    assert options.attribution == AttributionOptions(target_ids=(1,), contrast_ids=(2,))
    assert options.head_mask == (HeadScale(1, 2, 1.0, (0.5, 0.25)),)  # a mean added, kept


@pytest.mark.parametrize("kind", READOUTS, ids=lambda kind: kind.option)
def test_every_readout_of_the_table_arrives_as_its_options(kind):
    """A row of core/readouts.py READOUTS is read off attnserve.v1's message of the same
    name (field by field, unless v1/options.py translates it), as the row's options type."""
    options = pb.EncodeOptions()
    getattr(options, kind.option).SetInParent()
    if kind.option == "patching":  # its tokens are a oneof: one must be set
        options.patching.target_id, options.patching.contrast_id = 1, 2
        options.patching.source.text = "a"
    got = getattr(options_of(options), kind.option)
    assert type(got) is kind.options
    if kind.option != "patching":  # an empty message: every option at its default
        assert got == kind.options()
    others = [k.option for k in READOUTS if k is not kind]
    assert all(getattr(options_of(options), other) is None for other in others)
