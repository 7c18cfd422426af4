"""Every family attnserve imports (Llama, Mistral, Qwen2 and 3, GPT-NeoX, Gemma 1-3, Phi 1-3,
OLMo 2 and 3, GPT-J, OPT, StableLM, Granite) and every rope scaling: imported, exported and
served number for number with transformers' eager implementation (the reference, built here
from a config).

Every comparison runs at lengths past the sliding windows, on right-padded batches of
mixed lengths, against the last hidden state and the attention probabilities.
"""

import json
import shutil
from dataclasses import replace

import httpx
import numpy as np
import pytest
import torch

from attnserve.client import ClientOptions, EncoderClient, OipClient
from attnserve.export.hf_import import HFImportError, config_from_hf, load_hf
from attnserve.model.artifacts import FUSED_ONNX_FILENAME, TOKENIZER_FILENAME
from attnserve.model.encoder import encoder_from_weights
from attnserve.model.footprint import parameter_count
from attnserve.service.ort.runtime import OrtRuntime, RuntimeOptions
from perf.hf_checkpoints import TEXTS, build_checkpoint, reference_outputs
from tests.conftest import ServerThread, run_cli
from tests.export.families import FAMILY_SHAPES

FAMILIES = sorted(FAMILY_SHAPES)
TOLERANCE = 1e-4  # docs/model.md: fp32, PyTorch or ONNX Runtime against the reference
LENGTHS = (40, 23, 9)  # a right-padded batch; 40 and 23 pass every window (5 to 9)


def heads_of(shape: dict) -> int:
    return shape.get("num_attention_heads") or shape["n_head"]  # GPT-J spells it n_head


def padded_batch(vocab_size: int, seed: int = 0) -> tuple[np.ndarray, tuple[int, ...]]:
    """Random ids of LENGTHS, right-padded with id 0 to the longest."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((len(LENGTHS), max(LENGTHS)), dtype=np.int64)
    for row, length in enumerate(LENGTHS):
        ids[row, :length] = rng.integers(3, vocab_size, size=length)
    return ids, LENGTHS


def assert_close_on_real_positions(emb, att, want_emb, want_att, lengths) -> None:
    """Each row's real positions (right padding is exact, so nothing past them matters)."""
    for row, t in enumerate(lengths):
        assert np.abs(emb[row, :t] - want_emb[row, :t]).max() <= TOLERANCE
        assert np.abs(att[row, ..., :t, :t] - want_att[row, ..., :t, :t]).max() <= TOLERANCE


@pytest.mark.parametrize("family", FAMILIES)
def test_pytorch_import_matches_transformers(families, family):
    directory, reference = families.checkpoint(family)
    model, _ = load_hf(directory, log=lambda _: None)
    ids, lengths = padded_batch(model.config.vocab_size)
    want_emb, want_att = reference_outputs(reference, ids)
    with torch.no_grad():
        emb, att = model(torch.from_numpy(ids))
    assert att.shape[2] == heads_of(FAMILY_SHAPES[family])  # per query head
    assert_close_on_real_positions(emb.numpy(), att.numpy(), want_emb, want_att, lengths)
    # the import's memory check counts the parameters from the config alone
    assert parameter_count(model.config) == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("family", FAMILIES)
def test_onnx_graphs_match_transformers_and_padding_is_exact(families, family):
    _, reference = families.checkpoint(family)
    runtime = OrtRuntime(families.exported(family), RuntimeOptions(provider="cpu"))
    ids, lengths = padded_batch(runtime.config.vocab_size, seed=1)
    want_emb, want_att = reference_outputs(reference, ids)
    emb, att = runtime.run(ids)
    assert_close_on_real_positions(emb, att, want_emb, want_att, lengths)
    embed_only = runtime.embed(ids)
    for row, t in enumerate(lengths):
        assert np.abs(embed_only[row, :t] - want_emb[row, :t]).max() <= TOLERANCE
        alone_emb, alone_att = runtime.run(ids[row : row + 1, :t])
        assert np.abs(alone_emb[0] - emb[row, :t]).max() <= 1e-5
        assert np.abs(alone_att[0] - att[row, ..., :t, :t]).max() <= 1e-5


@pytest.mark.parametrize("family", FAMILIES)
def test_served_encode_http_and_v2_match_transformers(families, family):
    """One server per family: Encode (with in-graph attention options), the JSON mirror,
    V2, and a model info that says which key/value head each query head reads."""
    _, reference = families.checkpoint(family)
    shape = FAMILY_SHAPES[family]
    heads, kv = heads_of(shape), shape.get("num_key_value_heads")
    server = ServerThread(families.exported(family))
    try:
        with EncoderClient(server.address, ClientOptions(timeout_s=60)) as client:
            info = client.model_info()
            assert info["n_heads"] == heads and info["n_kv_heads"] == (kv or heads)
            group = heads // (kv or heads)
            assert info["kv_heads"] == [h // group for h in range(heads)]
            out = client.encode(TEXTS, attention=True)
            for encoding in out.encodings:
                ids = encoding.token_ids[None]
                want_emb, want_att = reference_outputs(reference, ids)
                assert np.abs(encoding.embeddings - want_emb[0]).max() <= TOLERANCE
                assert np.abs(encoding.attention - want_att[0]).max() <= TOLERANCE
            ids = out.encodings[0].token_ids
            _, want_att = reference_outputs(reference, ids[None])
            mean = client.encode([ids], head_reduction="mean", rows=[-1], top_k=3).encodings[0]
            want_mean_last = want_att[0].mean(axis=1)[:, -1]  # (L, T): heads averaged
            top = np.sort(want_mean_last, axis=-1)[:, ::-1][:, :3]
            assert np.abs(mean.attention[:, 0, 0] - top).max() <= TOLERANCE
        with httpx.Client(base_url=server.http_url, timeout=60) as http:
            body = {"inputs": [{"tokenIds": {"ids": ids.tolist()}}], "tensor_format": "list"}
            answer = http.post("/v1/encode", json=body).json()
            got = np.array(answer["results"][0]["embeddings"]["values"])
            want_emb, _ = reference_outputs(reference, ids[None])
            assert np.abs(got - want_emb[0]).max() <= TOLERANCE
        with OipClient(server.address, shared_memory=False) as v2:
            result = v2.infer(input_ids=[ids.tolist()], outputs=["attention"])
            assert np.abs(result["attention"][0] - want_att[0]).max() <= TOLERANCE
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("family", "fields"),
    [  # shapes the other tests do not use: 8:1 GQA, MQA, odd widths, sequential NeoX
        ("llama", dict(hidden_size=40, num_attention_heads=8, num_key_value_heads=1)),
        ("mistral", dict(hidden_size=36, num_attention_heads=3, num_key_value_heads=3)),
        ("qwen2", dict(num_attention_heads=10, num_key_value_heads=2, max_window_layers=2)),
        ("gpt_neox", dict(num_attention_heads=4, rotary_pct=0.5, use_parallel_residual=False)),
        ("gemma", dict(num_attention_heads=5, num_key_value_heads=5, head_dim=6)),
        ("phi3", dict(hidden_size=40, num_attention_heads=5, num_key_value_heads=1)),
    ],
)
def test_other_shapes_match_too(tmp_path, family, fields):
    reference = build_checkpoint(
        family, tmp_path / family, seed=3, **{**FAMILY_SHAPES[family], **fields}
    )
    model, _ = load_hf(tmp_path / family, log=lambda _: None)
    ids, lengths = padded_batch(model.config.vocab_size, seed=2)
    want_emb, want_att = reference_outputs(reference, ids)
    with torch.no_grad():
        emb, att = model(torch.from_numpy(ids))
    assert_close_on_real_positions(emb.numpy(), att.numpy(), want_emb, want_att, lengths)


LLAMA_ROPE = dict(FAMILY_SHAPES["llama"], max_position_embeddings=96)
ORIGINAL = 24  # the rope scalings' original context: the test sequences pass it
VARIANTS = {  # name: (model_type, config fields)
    "llama3": (
        "llama",
        LLAMA_ROPE | {"rope_parameters": {
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": ORIGINAL,
            "rope_theta": 500000.0,
        }},
    ),
    "yarn": (
        "qwen2",
        LLAMA_ROPE | {"rope_parameters": {
            "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL,
            "rope_theta": 10000.0,
        }},
    ),
    "yarn-mscale": (  # DeepSeek's attention factor, other ramp ends
        "llama",
        LLAMA_ROPE | {"rope_parameters": {
            "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL,
            "rope_theta": 10000.0, "mscale": 0.8, "mscale_all_dim": 0.5, "beta_fast": 16,
            "beta_slow": 2,
        }},
    ),
    "linear": (
        "mistral",
        LLAMA_ROPE | {"rope_parameters": {"rope_type": "linear", "factor": 3.0, "rope_theta": 1e4}},
    ),
    "dynamic": (
        "llama",
        LLAMA_ROPE | {"rope_parameters": {"rope_type": "dynamic", "factor": 3.0,
                                          "rope_theta": 1e4}},
    ),
    "longrope": (  # Phi-3's long-context checkpoints, within their original context
        "phi3",
        dict(FAMILY_SHAPES["phi3"], max_position_embeddings=128,
             original_max_position_embeddings=48, rope_parameters={
                 "rope_type": "longrope", "rope_theta": 10000.0,
                 "short_factor": [1.0, 2.5], "long_factor": [2.0, 5.0],
                 "original_max_position_embeddings": 48,
             }),
    ),
    "opt-350m": (  # post-norm, no final norm, narrower embeddings projected in and out
        "opt",
        FAMILY_SHAPES["opt"] | {"word_embed_proj_dim": 32, "do_layer_norm_before": False},
    ),
    "stablelm-parallel": (
        "stablelm",
        FAMILY_SHAPES["stablelm"] | {"use_parallel_residual": True, "qk_layernorm": False},
    ),
    "phi-2": ("phi", dict(FAMILY_SHAPES["phi"], hidden_size=50, num_attention_heads=5,
                          partial_rotary_factor=0.4, qk_layernorm=False)),
    "gemma3": (  # the multimodal checkpoint's language model; the vision tower is not read
        "gemma3",
        dict(
            text_config=dict(FAMILY_SHAPES["gemma3_text"], vocab_size=400),
            vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                               num_attention_heads=2, image_size=28, patch_size=14),
            mm_tokens_per_image=4,
        ),
    ),
}  # fmt: skip


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_rope_scalings_and_variants_match(tmp_path, variant):
    model_type, fields = VARIANTS[variant]
    reference = build_checkpoint(model_type, tmp_path / variant, seed=4, **fields)
    model, _ = load_hf(tmp_path / variant, log=lambda _: None)
    ids, lengths = padded_batch(model.config.vocab_size, seed=5)
    want_emb, want_att = reference_outputs(reference, ids)
    with torch.no_grad():
        emb, att = model(torch.from_numpy(ids))
    assert_close_on_real_positions(emb.numpy(), att.numpy(), want_emb, want_att, lengths)


@pytest.mark.parametrize("variant", ["opt-350m", "longrope"])
def test_variants_export_and_run_in_onnx_runtime(tmp_path, variant):
    """The projected embeddings and the stretched tables through the exported graphs."""
    model_type, fields = VARIANTS[variant]
    reference = build_checkpoint(model_type, tmp_path / variant, seed=4, **fields)
    out = tmp_path / "model"
    result = run_cli("export", "--from-hf", str(tmp_path / variant), "--out", str(out))
    assert result.returncode == 0, result.stderr
    runtime = OrtRuntime(out, RuntimeOptions(provider="cpu"))
    ids, lengths = padded_batch(runtime.config.vocab_size, seed=5)
    want_emb, want_att = reference_outputs(reference, ids)
    emb, att = runtime.run(ids)
    assert_close_on_real_positions(emb, att, want_emb, want_att, lengths)


@pytest.mark.parametrize(
    ("family", "neutral"),
    [  # each switch set back to what it would be without it
        ("gemma2", {"attention_softcap": None}),
        ("gemma2", {"attention_scale": None}),
        ("gemma2", {"norm_placement": "pre"}),
        ("gemma3_text", {"sliding_rope_theta": None}),
        ("gemma3_text", {"rope_scaling": None}),
        ("olmo3", {"rope_scaling": None}),
        ("granite", {"residual_scale": 1.0}),
        ("phi", {"qk_norm": None}),
        ("stablelm", {"qk_norm": None}),
    ],
)
def test_the_tiny_shapes_exercise_each_switch(families, family, neutral):
    """The exactness above is no accident of small numbers: the same weights without the
    switch miss transformers by far more than the tolerance."""
    directory, reference = families.checkpoint(family)
    model, _ = load_hf(directory, log=lambda _: None)
    tensors = dict(model.state_dict())
    if neutral.get("norm_placement") == "pre":  # the sandwich's output norms go unused
        tensors = {k: v for k, v in tensors.items() if "_out." not in k}
    if neutral.get("qk_norm", "kept") is None:
        tensors = {k: v for k, v in tensors.items() if "_norm." not in k}
    changed = encoder_from_weights(replace(model.config, **neutral), tensors)
    ids, lengths = padded_batch(model.config.vocab_size)
    want_emb, want_att = reference_outputs(reference, ids)
    with torch.no_grad():
        emb, att = changed(torch.from_numpy(ids))
    t = lengths[0]
    missed = max(
        np.abs(emb[0, :t].numpy() - want_emb[0, :t]).max(),
        np.abs(att[0, ..., :t, :t].numpy() - want_att[0, ..., :t, :t]).max(),
    )
    assert missed > 100 * TOLERANCE


def test_gemma2_serves_without_the_fused_graph(families):
    """ONNX's fused Attention op has no soft-cap: Gemma 2's graphs compute it op by op."""
    assert not (families.exported("gemma2") / FUSED_ONNX_FILENAME).exists()
    assert (families.exported("gemma3_text") / FUSED_ONNX_FILENAME).exists()


def test_sharded_safetensors_with_their_index(tmp_path):
    reference = build_checkpoint(
        "llama", tmp_path / "sharded", max_shard_size="20KB", **FAMILY_SHAPES["llama"]
    )
    assert len(list((tmp_path / "sharded").glob("model-*-of-*.safetensors"))) > 1
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    model, _ = load_hf(tmp_path / "sharded", log=lambda _: None)
    ids, lengths = padded_batch(model.config.vocab_size)
    want_emb, want_att = reference_outputs(reference, ids)
    with torch.no_grad():
        emb, att = model(torch.from_numpy(ids))
    assert_close_on_real_positions(emb.numpy(), att.numpy(), want_emb, want_att, lengths)


def read_config(directory) -> dict:
    return json.loads((directory / "config.json").read_text())


def test_older_spellings_read_as_transformers_5s(families):
    """Checkpoints written before transformers 5 keep rotary settings at the top level."""
    neox = read_config(families.checkpoint("gpt_neox")[0])
    rope = neox.pop("rope_parameters")
    old_neox = {**neox, "rotary_pct": rope["partial_rotary_factor"], "rotary_emb_base": 2500}
    new_neox = {**neox, "rope_parameters": {**rope, "rope_theta": 2500.0}}
    assert config_from_hf(old_neox, "x") == config_from_hf(new_neox, "x")
    assert config_from_hf(old_neox, "x").rotary_fraction == 0.25
    llama = read_config(families.checkpoint("llama")[0])
    rope = llama.pop("rope_parameters")
    old_llama = {**llama, "rope_theta": rope["rope_theta"], "rope_scaling": None}
    assert config_from_hf(old_llama, "x") == config_from_hf({**llama, "rope_parameters": rope}, "x")


@pytest.mark.parametrize(
    ("family", "change", "message"),
    [
        (
            "llama",
            {"rope_parameters": {"rope_type": "proportional", "factor": 2.0}},
            "rope_parameters: rope type 'proportional' is not implemented",
        ),
        (
            "llama",
            {"rope_parameters": {"rope_type": "llama3", "factor": 8.0}},
            "rope_parameters lacks 'original_max_position_embeddings', which rope type 'llama3'",
        ),
        (
            "gemma3_text",
            {
                "rope_parameters": {
                    "full_attention": {"rope_type": "default", "rope_theta": 1e6},
                    "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4},
                }
            },
            "rope_parameters.sliding_attention: the sliding layers' rotary is only implemented",
        ),
        ("gemma", {"final_logit_softcapping": 30.0}, "final_logit_softcapping=30.0"),
        ("gemma2", {"use_bidirectional_attention": True}, "(Gemma embedders) is not causal"),
        ("mistral", {"num_local_experts": 8}, "num_local_experts=8 is not supported (mixtures"),
        ("qwen2", {"layer_types": ["chunked_attention"] * 3}, "layer_types ['chunked_attention']"),
        ("llama", {"hidden_act": "tanh"}, "hidden_act='tanh' is not supported"),
        ("llama", {"model_type": "falcon"}, "model_type is 'falcon'; supported: gemma, gemma2"),
        ("llama", {"model_type": "mixtral"}, "'mixtral' is not supported: a mixture of experts"),
        ("llama", {"model_type": "gpt_oss"}, "attention sinks (rows that sum to less than 1)"),
        ("llama", {"model_type": "qwen3_next"}, "linear-attention layers (gated DeltaNet)"),
        ("opt", {"layer_norm_elementwise_affine": False}, "layer_norm_elementwise_affine=False"),
        ("mistral", {"num_key_value_heads": 4}, "n_kv_heads (4) must divide n_heads (6)"),
    ],
)
def test_what_cannot_be_reproduced_is_refused_before_any_work(
    families, tmp_path, family, change, message
):
    """The directory holds only config.json: the refusal comes from the config alone."""
    config = {**read_config(families.checkpoint(family)[0]), **change}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(HFImportError) as excinfo:
        load_hf(tmp_path, log=lambda _: None)
    assert message in str(excinfo.value)
    result = run_cli("export", "--from-hf", str(tmp_path), "--out", str(tmp_path / "m"))
    assert result.returncode == 2 and message in result.stderr
    assert not (tmp_path / "m").exists()


def test_a_length_bound_rope_is_served_within_its_original_context(tmp_path):
    """LongRoPE switches to its long factors past the original context, which one graph
    cannot: an import serves at most that many positions, and asking more is refused."""
    model_type, fields = VARIANTS["longrope"]
    build_checkpoint(model_type, tmp_path / "longrope", **fields)
    config = config_from_hf(read_config(tmp_path / "longrope"), "x")
    assert config.max_seq_len == 48 and config.rope_scaling.short_factor == (1.0, 2.5)
    out = tmp_path / "m"
    result = run_cli(
        "export", "--from-hf", str(tmp_path / "longrope"), "--out", str(out), "--max-seq-len", "64"
    )
    assert result.returncode == 2
    assert "max_seq_len (64) exceeds the 'longrope' rope's original context" in result.stderr
    assert "rope_scaling.original_max_seq_len = 48" in result.stderr and not out.exists()


def test_special_ids_from_generation_and_tokenizer_configs(families, tmp_path):
    directory = tmp_path / "copy"
    shutil.copytree(families.checkpoint("qwen2")[0], directory)
    config = read_config(directory)
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        config.pop(key, None)
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 1]}))
    (directory / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": {"content": "<s>"}, "pad_token": "<pad>"})
    )
    model, _ = load_hf(directory, log=lambda _: None)
    assert (model.config.bos_id, model.config.eos_id, model.config.pad_id) == (1, 2, 0)


def test_a_hub_id_through_a_laid_out_offline_cache(families, tmp_path):
    """huggingface_hub's cache layout (refs/main -> snapshots/<commit>/), HF_HUB_OFFLINE=1:
    the hub id resolves to the cached snapshot and nothing is fetched."""
    source, _ = families.checkpoint("phi3")
    repo = tmp_path / "cache" / "models--acme--tiny-phi3"
    commit = "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(source, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "cache")}
    out = tmp_path / "model"
    result = run_cli("export", "--from-hf", "acme/tiny-phi3", "--out", str(out), env=env)
    assert result.returncode == 0, result.stderr
    assert json.loads((out / "export_report.json").read_text())["parity"]
    assert (out / TOKENIZER_FILENAME).read_bytes() == (source / TOKENIZER_FILENAME).read_bytes()
    result = run_cli("export", "--from-hf", "acme/absent", "--out", str(tmp_path / "x"), env=env)
    assert result.returncode == 2
    assert "cannot fetch acme/absent from the hub or its cache" in result.stderr


def test_max_seq_len_caps_what_an_import_serves(families, tmp_path):
    directory, _ = families.checkpoint("gemma")
    model, _ = load_hf(directory, max_seq_len=24, log=lambda _: None)
    assert model.config.max_seq_len == 24 and model.rotary.cos.shape[0] == 24
    result = run_cli("export", "--seed", "1", "--max-seq-len", "8", "--out", str(tmp_path / "m"))
    assert result.returncode == 2 and "--max-seq-len takes a positive integer" in result.stderr
