import json

import pytest

from attnserve.model.config import ACTIVATIONS, ConfigError, ModelConfig


def test_default_config_matches_the_design():
    config = ModelConfig()
    assert (config.n_layers, config.n_heads, config.d_model, config.d_ff) == (4, 8, 256, 1024)
    assert config.max_seq_len == 1024
    assert config.tokenizer == "byte"
    assert config.head_dim == 32


def test_json_round_trip_is_lossless():
    config = ModelConfig(n_layers=3, n_heads=2, d_model=64, activation="gelu_tanh", name="x")
    again = ModelConfig.from_json(config.to_json())
    assert again == config
    assert json.loads(config.to_json())["n_layers"] == 3


def test_integer_epsilon_from_json_is_accepted_as_float():
    data = {**ModelConfig().to_dict(), "layer_norm_eps": 1}
    assert ModelConfig.from_dict(data).layer_norm_eps == 1.0


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"d_model": 250}, "d_model (250) must be divisible by n_heads (8)"),
        ({"n_layers": 0}, "n_layers must be a positive integer"),
        ({"max_seq_len": "1024"}, "max_seq_len must be a positive integer"),
        ({"pad_id": 259}, "pad_id must be an integer in [0, vocab_size=259)"),
        ({"vocab_size": 100}, "pad_id"),
        ({"tokenizer": "wordpiece"}, "tokenizer must be one of"),
        ({"activation": "tanh"}, "activation must be one of"),
        ({"layer_norm_eps": -1.0}, "layer_norm_eps must be a positive float"),
        ({"embeddings_name": "input_ids"}, "input/output names must be distinct"),
    ],
)
def test_invalid_configs_name_the_field(overrides, named):
    with pytest.raises(ConfigError) as excinfo:
        ModelConfig.from_dict({**ModelConfig().to_dict(), **overrides})
    assert named in str(excinfo.value)


def test_unknown_fields_and_bad_json_are_rejected():
    with pytest.raises(ConfigError, match=r"unknown model config field.*n_embd"):
        ModelConfig.from_dict({"n_embd": 768})
    with pytest.raises(ConfigError, match="not valid JSON"):
        ModelConfig.from_json("{not json")
    with pytest.raises(ConfigError, match="must be a JSON object"):
        ModelConfig.from_json("[1, 2]")


def test_every_activation_is_built_and_computes_what_its_hugging_face_names_do():
    """model/config.py's ACTIVATIONS is the one table: the model builds each, and each
    computes what transformers computes under every name the table gives it."""
    import torch
    from transformers.activations import ACT2FN

    from attnserve.model.layers import ACTIVATION_MODULES

    assert set(ACTIVATION_MODULES) == set(ACTIVATIONS)
    x = torch.linspace(-6, 6, 101)
    for ours, names in ACTIVATIONS.items():
        for name in names:
            torch.testing.assert_close(ACTIVATION_MODULES[ours]()(x), ACT2FN[name](x))
