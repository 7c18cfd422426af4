import json
import pickle

import pytest
import torch
from safetensors.torch import save_file

from attnserve.model.checkpoint import CONFIG_KEY, CheckpointError, load_checkpoint, save_checkpoint
from tests.conftest import SMALL_CONFIG


def tensors_of(model):
    return {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}


def test_round_trip_keeps_config_and_outputs(small_model, tmp_path):
    path = save_checkpoint(small_model, tmp_path / "ckpt.safetensors")
    loaded = load_checkpoint(path)
    assert loaded.config == SMALL_CONFIG
    ids = torch.randint(0, 256, (2, 9))
    with torch.inference_mode():
        for a, b in zip(small_model(ids), loaded(ids), strict=True):
            assert torch.equal(a, b)


def test_config_beside_the_weights_is_used_when_metadata_has_none(small_model, tmp_path):
    save_file(tensors_of(small_model), str(tmp_path / "weights.safetensors"))
    (tmp_path / "config.json").write_text(SMALL_CONFIG.to_json())
    assert load_checkpoint(tmp_path / "weights.safetensors").config == SMALL_CONFIG


def test_no_config_anywhere(small_model, tmp_path):
    save_file(tensors_of(small_model), str(tmp_path / "weights.safetensors"))
    with pytest.raises(CheckpointError, match="carries no model config"):
        load_checkpoint(tmp_path / "weights.safetensors")


def write(tmp_path, tensors, config_json):
    path = tmp_path / "bad.safetensors"
    save_file(tensors, str(path), metadata={CONFIG_KEY: config_json})
    return path


def test_missing_tensor_is_named(small_model, tmp_path):
    tensors = tensors_of(small_model)
    del tensors["blocks.1.mlp.fc.weight"]
    with pytest.raises(CheckpointError, match=r"missing tensor\(s\) blocks\.1\.mlp\.fc\.weight"):
        load_checkpoint(write(tmp_path, tensors, SMALL_CONFIG.to_json()))


def test_unexpected_tensor_is_named(small_model, tmp_path):
    tensors = {**tensors_of(small_model), "lm_head.weight": torch.zeros(2, 2)}
    with pytest.raises(CheckpointError, match=r"unexpected tensor\(s\) lm_head\.weight"):
        load_checkpoint(write(tmp_path, tensors, SMALL_CONFIG.to_json()))


def test_shape_mismatch_names_tensor_and_shapes(small_model, tmp_path):
    tensors = tensors_of(small_model)
    tensors["pos_emb.weight"] = torch.zeros(100, 64)
    with pytest.raises(CheckpointError) as excinfo:
        load_checkpoint(write(tmp_path, tensors, SMALL_CONFIG.to_json()))
    assert "pos_emb.weight has shape (100, 64), the config needs (300, 64)" in str(excinfo.value)


def test_dtype_mismatch_is_named(small_model, tmp_path):
    tensors = tensors_of(small_model)
    tensors["ln_f.weight"] = tensors["ln_f.weight"].to(torch.int32)
    with pytest.raises(CheckpointError, match=r"ln_f\.weight has dtype torch\.int32"):
        load_checkpoint(write(tmp_path, tensors, SMALL_CONFIG.to_json()))


def test_float16_checkpoints_load_widened_to_float32(small_model, tmp_path):
    path = save_checkpoint(small_model, tmp_path / "half.safetensors", dtype=torch.float16)
    loaded = load_checkpoint(path)
    for name, tensor in loaded.state_dict().items():
        assert tensor.dtype == torch.float32
        assert torch.equal(tensor, small_model.state_dict()[name].half().float()), name


def test_invalid_config_inside_is_reported(small_model, tmp_path):
    bad = json.dumps({**SMALL_CONFIG.to_dict(), "n_heads": 5})
    with pytest.raises(CheckpointError, match=r"bad model config .*d_model \(64\).*n_heads \(5\)"):
        load_checkpoint(write(tmp_path, tensors_of(small_model), bad))


class _Exploit:
    """Unpickling this would create a file: proof that a loader unpickled."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_pickles_are_refused_and_never_unpickled(tmp_path):
    marker = tmp_path / "unpickled"
    path = tmp_path / "model.bin"
    path.write_bytes(pickle.dumps(_Exploit(marker)))
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        load_checkpoint(path)
    assert not marker.exists()


def test_missing_file(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nope.safetensors")
