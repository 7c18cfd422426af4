"""GPT-2-family checkpoints: imported, exported and served number for number with transformers."""

import json
import shutil

import numpy as np
import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, GPT2Model, GPT2TokenizerFast

from attnserve.client import ClientOptions, EncoderClient
from attnserve.export.hf_import import HFImportError, load_hf
from attnserve.model.artifacts import TOKENIZER_FILENAME
from attnserve.service.ort.runtime import OrtRuntime, RuntimeOptions
from tests.conftest import HF_TEXTS, ServerThread, run_cli


@pytest.fixture(scope="module")
def reference(hf_dir):
    return GPT2Model.from_pretrained(hf_dir, attn_implementation="eager").eval()


def transformers_outputs(reference, ids: np.ndarray):
    with torch.no_grad():
        out = reference(torch.from_numpy(ids), output_attentions=True)
    return out.last_hidden_state.numpy(), torch.stack(out.attentions, dim=1).numpy()


SHAPES = [(1, 1), (1, 17), (3, 64), (2, 160)]


@pytest.mark.parametrize(("batch", "seq_len"), SHAPES)
def test_pytorch_import_matches_transformers(hf_dir, reference, batch, seq_len):
    model, _ = load_hf(hf_dir)
    assert model.config.activation == "gelu_tanh" and model.config.tokenizer == "hf"
    ids = np.random.default_rng(seq_len).integers(
        0, reference.config.vocab_size, size=(batch, seq_len)
    )
    want_emb, want_att = transformers_outputs(reference, ids)
    with torch.no_grad():
        emb, att = model(torch.from_numpy(ids))
    assert np.abs(emb.numpy() - want_emb).max() <= 1e-4
    assert np.abs(att.numpy() - want_att).max() <= 1e-4


@pytest.mark.parametrize(("batch", "seq_len"), SHAPES)
def test_onnx_export_matches_transformers(hf_model_dir, reference, batch, seq_len):
    runtime = OrtRuntime(hf_model_dir, RuntimeOptions(provider="cpu"))
    ids = np.random.default_rng(seq_len).integers(
        0, reference.config.vocab_size, size=(batch, seq_len)
    )
    want_emb, want_att = transformers_outputs(reference, ids)
    emb, att = runtime.run(ids)
    assert np.abs(emb - want_emb).max() <= 1e-4
    assert np.abs(att - want_att).max() <= 1e-4
    assert np.abs(runtime.embed(ids) - want_emb).max() <= 1e-4


def test_tokenizer_ids_equal_gpt2_tokenizer_fast(hf_dir, hf_model_dir):
    from attnserve.model.config import ModelConfig
    from attnserve.model.tokenizer import get_tokenizer

    fast = GPT2TokenizerFast(tokenizer_file=str(hf_dir / TOKENIZER_FILENAME))
    config = OrtRuntime(hf_model_dir, RuntimeOptions(provider="cpu")).config
    ours = get_tokenizer(ModelConfig.from_json(config.to_json()), hf_model_dir)
    texts = [*HF_TEXTS, "unseen words: zyxwvut", "", " ", "\n\n", "ÀÉÎÕÜ ß ø", "👩‍👩‍👧 family"]
    for text in texts:
        assert ours.encode(text) == fast(text)["input_ids"], text
    assert (hf_model_dir / TOKENIZER_FILENAME).read_bytes() == (
        hf_dir / TOKENIZER_FILENAME
    ).read_bytes()


def test_served_encode_matches_transformers(hf_model_dir, hf_dir, reference):
    fast = GPT2TokenizerFast(tokenizer_file=str(hf_dir / TOKENIZER_FILENAME))
    server = ServerThread(hf_model_dir)
    try:
        with EncoderClient(server.address, ClientOptions(timeout_s=60)) as client:
            info = client.model_info()
            assert info["tokenizer"] == "hf" and info["n_layers"] == 2
            out = client.encode(HF_TEXTS, attention=True, return_tokens=True)
            for text, encoding in zip(HF_TEXTS, out, strict=True):
                ids = fast(text)["input_ids"]
                assert encoding.token_ids.tolist() == ids
                want_emb, want_att = transformers_outputs(reference, np.array([ids]))
                assert np.abs(encoding.embeddings - want_emb[0]).max() <= 1e-4
                assert np.abs(encoding.attention - want_att[0]).max() <= 1e-4
                assert "".join(encoding.tokens).replace("\u2423", " ") == text
    finally:
        server.stop()


def copy_of(hf_dir, tmp_path):
    target = tmp_path / "copy"
    shutil.copytree(hf_dir, target)
    return target


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx=True"),
        ({"reorder_and_upcast_attn": True}, "reorder_and_upcast_attn=True"),
        ({"activation_function": "tanh"}, "activation_function='tanh' is not supported"),
        ({"model_type": "bert"}, "model_type is 'bert'"),
        ({"n_head": 5}, "d_model (64) must be divisible by n_heads (5)"),
    ],
)
def test_unsupported_configs_are_named(hf_dir, tmp_path, change, message):
    directory = copy_of(hf_dir, tmp_path)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(HFImportError) as excinfo:
        load_hf(directory)
    assert message in str(excinfo.value)


def test_missing_and_mismatched_tensors(hf_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    directory = copy_of(hf_dir, tmp_path)
    tensors = load_file(str(directory / "model.safetensors"))
    broken = {k: v for k, v in tensors.items() if k != "h.1.mlp.c_fc.weight"}
    save_file(broken, str(directory / "model.safetensors"))
    with pytest.raises(HFImportError, match=r"missing tensor h\.1\.mlp\.c_fc\.weight"):
        load_hf(directory)
    save_file({**tensors, "wpe.weight": torch.zeros(10, 64)}, str(directory / "model.safetensors"))
    with pytest.raises(HFImportError, match=r"pos_emb\.weight has shape \(10, 64\)"):
        load_hf(directory)
    save_file(
        {**tensors, "h.0.attn.q_proj.weight": torch.zeros(1)}, str(directory / "model.safetensors")
    )
    with pytest.raises(HFImportError, match=r"unexpected tensor\(s\) h\.0\.attn\.q_proj\.weight"):
        load_hf(directory)
    (directory / "model.safetensors").unlink()
    with pytest.raises(
        HFImportError,
        match=r"neither model\.safetensors, model\.safetensors\.index\.json nor pytorch_model\.bin",
    ):
        load_hf(directory)


def test_lm_head_checkpoint_as_pytorch_bin(hf_dir, reference, tmp_path):
    """GPT2LMHeadModel layout ("transformer." prefix, tied lm_head) saved as a .bin,
    read with weights_only=True."""
    config = GPT2Config.from_pretrained(hf_dir)
    lm = GPT2LMHeadModel(config)
    lm.transformer.load_state_dict(reference.state_dict())
    # The legacy layout: config.json beside a torch.save'd state dict.
    config.save_pretrained(tmp_path / "lm")
    torch.save(lm.state_dict(), tmp_path / "lm" / "pytorch_model.bin")
    model, _ = load_hf(tmp_path / "lm")
    ids = np.arange(1, 30)[None]
    with torch.no_grad():
        emb, _ = model(torch.from_numpy(ids))
    want_emb, _ = transformers_outputs(reference, ids)
    assert np.abs(emb.numpy() - want_emb).max() <= 1e-4


def test_cli_refuses_a_directory_without_tokenizer(hf_dir, tmp_path):
    """Before any tensor is read: without weights either, the tokenizer is what is named."""
    directory = copy_of(hf_dir, tmp_path)
    (directory / TOKENIZER_FILENAME).unlink()
    (directory / "model.safetensors").unlink()
    result = run_cli("export", "--from-hf", str(directory), "--out", str(tmp_path / "m"))
    assert result.returncode == 2
    assert "has no tokenizer.json" in result.stderr
