"""What the imported encoder reads off its residual stream, against transformers'
AutoModelForCausalLM (built here from a config): next-token logits with each family's
unembedding (tied or not, its bias, Gemma 2's soft-cap, Granite's scaling), the hidden
states of every layer, the logit lens, and heads removed by a head mask.
"""

import numpy as np
import pytest
import torch

from attnserve.export.hf_import import load_hf
from attnserve.export.model_dir import plan_graphs
from attnserve.model.artifacts import PARTS_NAMES
from attnserve.model.config import NORM_PLACEMENTS, ModelConfig
from attnserve.model.hook_points import head_ablation, hooked
from attnserve.service.ort.runtime import OrtRuntime, RuntimeOptions
from perf.hf_checkpoints import build_checkpoint
from tests.export.families import FAMILY_SHAPES
from tests.export.test_hf_families import padded_batch

FAMILIES = sorted(FAMILY_SHAPES)
LOGITS_TOLERANCE = 1e-3  # issue 52: within 1e-3 of AutoModelForCausalLM
HIDDEN_TOLERANCE = 1e-4


def transformers_readouts(reference, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """AutoModelForCausalLM's logits (B, T, V) and hidden states (B, L+1, T, D)."""
    with torch.no_grad():
        out = reference(torch.as_tensor(ids), output_hidden_states=True)
    return out.logits.numpy(), torch.stack(out.hidden_states, dim=1).numpy()


def assert_rows_close(got: np.ndarray, want: np.ndarray, lengths, axis: int, limit: float):
    """Each row's real positions along `axis` (right padding is exact past them)."""
    for row, t in enumerate(lengths):
        real = np.take(got[row], range(t), axis=axis - 1)
        wanted = np.take(want[row], range(t), axis=axis - 1)
        assert np.abs(real - wanted).max() <= limit


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_and_hidden_states_match_transformers(families, family):
    directory, reference = families.checkpoint(family)
    model, _ = load_hf(directory, log=lambda _: None)
    ids, lengths = padded_batch(model.config.vocab_size, seed=2)
    want_logits, want_hidden = transformers_readouts(reference, ids)
    with torch.no_grad():
        logits = model.logits(torch.from_numpy(ids)).numpy()
        hidden = model.hidden_states(torch.from_numpy(ids)).numpy()
    assert logits.shape == want_logits.shape
    assert_rows_close(logits, want_logits, lengths, axis=1, limit=LOGITS_TOLERANCE)
    if family != "opt":  # OPT-350m's last is after its projection out; this shape has none
        assert hidden.shape == want_hidden.shape
    assert_rows_close(hidden, want_hidden, lengths, axis=2, limit=HIDDEN_TOLERANCE)


def test_unembedding_follows_the_checkpoint(families):
    """Tied where the checkpoint ties it (no second matrix), its own matrix otherwise, with
    the family's bias; a checkpoint without its LM head imports without logits."""
    tied, _ = load_hf(families.checkpoint("llama")[0], log=lambda _: None)
    assert tied.config.unembedding == "tied" and not hasattr(tied, "lm_head")
    untied, _ = load_hf(families.checkpoint("mistral")[0], log=lambda _: None)
    assert untied.config.unembedding == "separate" and untied.lm_head.bias is None
    phi, _ = load_hf(families.checkpoint("phi")[0], log=lambda _: None)
    assert phi.config.unembedding_bias and phi.lm_head.bias is not None


def test_a_checkpoint_without_its_head_imports_without_logits(families, tmp_path):
    _, reference = families.checkpoint("mistral")
    reference.model.save_pretrained(tmp_path)  # the bare MistralModel: no lm_head.weight
    (tmp_path / "tokenizer.json").write_bytes(
        (families.checkpoint("mistral")[0] / "tokenizer.json").read_bytes()
    )
    lines: list[str] = []
    model, _ = load_hf(tmp_path, log=lines.append)
    assert model.config.unembedding == "none"
    assert any("no LM head" in line for line in lines)
    with pytest.raises(ValueError, match="has no unembedding"):
        model.logits(torch.ones(1, 3, dtype=torch.long))


# head_mask on the layouts that differ: GQA (Llama), parallel blocks with two norms
# (GPT-NeoX) and one (Phi), sandwich norms (Gemma 2), GPT-2's Conv1D
MASKED = ("llama", "gpt_neox", "phi", "gemma2", "gpt2")
OUTPUT_PROJECTIONS = {  # the module whose input is the heads' concatenated outputs
    "gpt2": "attn.c_proj",
    "llama": "self_attn.o_proj",
    "gpt_neox": "attention.dense",
    "phi": "self_attn.dense",
    "gemma2": "self_attn.o_proj",
}


def blocks(reference) -> list:
    """transformers' decoder layers, under either name (GPT-2's `h`)."""
    base = reference.base_model
    return list(base.layers if hasattr(base, "layers") else base.h)


def zero_heads(reference, family: str, mask: torch.Tensor) -> list:
    """Hooks on transformers' model scaling each head's slice of the output projection's
    input by mask[layer, head] (what issue 52 defines head_mask to be)."""
    handles = []
    for i, layer in enumerate(blocks(reference)):
        module = layer.get_submodule(OUTPUT_PROJECTIONS[family])

        def scale(_module, args, row=mask[i]):
            (x,) = args  # (B, T, H * d_k), the heads side by side
            return (x * row.repeat_interleave(x.shape[-1] // row.numel()),)

        handles.append(module.register_forward_pre_hook(scale))
    return handles


@pytest.mark.parametrize("family", MASKED)
def test_head_mask_equals_scaling_the_output_projections_input(families, family):
    directory, reference = families.checkpoint(family)
    model, _ = load_hf(directory, log=lambda _: None)
    config = model.config
    mask = torch.ones(config.n_layers, config.n_heads)
    mask[0, 1] = 0.0
    mask[-1, 0] = 0.0
    mask[-1, -1] = 0.5  # a float scales the head
    ids, lengths = padded_batch(config.vocab_size, seed=3)
    handles = zero_heads(reference, family, mask)
    try:
        want_logits, want_hidden = transformers_readouts(reference, ids)
    finally:
        for handle in handles:
            handle.remove()
    unmasked, _ = transformers_readouts(reference, ids)
    assert np.abs(unmasked - want_logits).max() > 100 * LOGITS_TOLERANCE  # the mask matters
    with torch.no_grad():
        with hooked(model, head_ablation(mask)):
            logits = model.logits(torch.from_numpy(ids)).numpy()
            hidden = model.hidden_states(torch.from_numpy(ids)).numpy()
            _, attentions = model(torch.from_numpy(ids))
        _, plain_attentions = model(torch.from_numpy(ids))
    assert_rows_close(logits, want_logits, lengths, axis=1, limit=LOGITS_TOLERANCE)
    assert_rows_close(hidden, want_hidden, lengths, axis=2, limit=HIDDEN_TOLERANCE)
    # the first layer's pattern is its input's: unchanged; later ones read a changed stream
    assert torch.equal(attentions[:, 0], plain_attentions[:, 0])
    assert not torch.allclose(attentions[:, -1], plain_attentions[:, -1])


@pytest.mark.parametrize("family", ["llama", "gpt_neox"])
def test_mean_ablation_equals_replacing_the_output_projections_input(families, family):
    """A head's slice of the output projection's input replaced by a vector (GQA, parallel
    blocks): head_mask 0 and head_means that vector."""
    directory, reference = families.checkpoint(family)
    model, _ = load_hf(directory, log=lambda _: None)
    config = model.config
    d_k = config.head_dim
    mean = torch.from_numpy(np.random.default_rng(8).normal(size=d_k).astype(np.float32))
    layer, head = config.n_layers - 1, config.n_heads - 1
    module = blocks(reference)[layer].get_submodule(OUTPUT_PROJECTIONS[family])

    def replace(_module, args):
        (x,) = args  # (B, T, H * d_k)
        x = x.clone()
        x[..., head * d_k : (head + 1) * d_k] = mean
        return (x,)

    ids, lengths = padded_batch(config.vocab_size, seed=9)
    handle = module.register_forward_pre_hook(replace)
    try:
        want_logits, _ = transformers_readouts(reference, ids)
    finally:
        handle.remove()
    mask = torch.ones(config.n_layers, config.n_heads)
    mask[layer, head] = 0.0
    means = torch.zeros(config.n_layers, config.n_heads, d_k)
    means[layer, head] = mean
    with torch.no_grad(), hooked(model, head_ablation(mask, means)):
        logits = model.logits(torch.from_numpy(ids)).numpy()
    assert_rows_close(logits, want_logits, lengths, axis=1, limit=LOGITS_TOLERANCE)
    plain, _ = transformers_readouts(reference, ids)
    assert np.abs(plain - want_logits).max() > 100 * LOGITS_TOLERANCE  # the mean matters


def numpy_lens(model, ids: np.ndarray) -> np.ndarray:
    """The logit lens written out in numpy from the model's weights: each layer's residual,
    centred (LayerNorm), divided by the last residual's norm scale, times the final norm's
    weight plus its bias, times the unembedding, scaled and soft-capped (B, L+1, T, V)."""
    config = model.config
    with torch.no_grad():
        stream, _ = model.residual_stream(torch.from_numpy(ids), need_weights=False)

    def array(t: torch.Tensor) -> np.ndarray:
        return t.detach().double().numpy()

    x = array(torch.stack(stream, dim=1))  # (B, L+1, T, D)
    last = x[:, -1:]
    norm = model.ln_f
    if config.norm == "layernorm":
        scale = np.sqrt(last.var(-1, keepdims=True) + norm.eps)
        normed = (x - x.mean(-1, keepdims=True)) / scale * array(norm.weight) + array(norm.bias)
    else:
        scale = np.sqrt((last**2).mean(-1, keepdims=True) + norm.eps)
        normed = x / scale * ((config.norm == "rmsnorm_plus_one") + array(norm.weight))
    table = model.tok_emb.weight if config.unembedding == "tied" else model.lm_head.weight
    logits = normed @ array(table).T
    if config.unembedding_bias:
        logits = logits + array(model.lm_head.bias)
    logits = logits * config.logit_scale
    if config.logit_softcap is not None:
        logits = np.tanh(logits / config.logit_softcap) * config.logit_softcap
    return logits


@pytest.mark.parametrize("family", ["gpt_neox", "gemma2", "granite", "phi"])
def test_logit_lens_equals_a_numpy_reference(families, family):
    """LayerNorm (NeoX), Gemma's 1 + w RMSNorm with the soft-cap, Granite's scaling and
    Phi's bias; at the last layer the lens is the model's own logits."""
    model, _ = load_hf(families.checkpoint(family)[0], log=lambda _: None)
    ids, _ = padded_batch(model.config.vocab_size, seed=4)
    with torch.no_grad():
        stream, _ = model.residual_stream(torch.from_numpy(ids), need_weights=False)
        lens = model.lens(torch.stack(stream, dim=1), stream[-1][:, None]).numpy()
        logits = model.logits(torch.from_numpy(ids)).numpy()
    assert np.abs(lens - numpy_lens(model, ids)).max() <= 1e-4
    assert np.abs(lens[:, -1] - logits).max() <= 1e-4
    assert np.abs(lens[:, 0] - logits).max() > 1e-2  # the first layer reads differently


def test_gemma2_soft_caps_its_logits(tmp_path):
    """A small final cap, so that the cap decides the logits (30 barely touches them)."""
    shape = dict(FAMILY_SHAPES["gemma2"], final_logit_softcapping=0.5)
    reference = build_checkpoint("gemma2", tmp_path, **shape)
    model, _ = load_hf(tmp_path, log=lambda _: None)
    assert model.config.logit_softcap == 0.5
    ids, lengths = padded_batch(model.config.vocab_size, seed=5)
    want_logits, _ = transformers_readouts(reference, ids)
    assert np.abs(want_logits).max() <= 0.5
    with torch.no_grad():
        logits = model.logits(torch.from_numpy(ids)).numpy()
    assert_rows_close(logits, want_logits, lengths, axis=1, limit=LOGITS_TOLERANCE)


@pytest.mark.parametrize("family", FAMILIES)
def test_exported_readouts_match_transformers(families, family):
    """The exported graphs in ONNX Runtime: the residual stream (hidden states with the
    final norm's output last) and the lens of the last layer (the logits)."""
    _, reference = families.checkpoint(family)
    runtime = OrtRuntime(families.exported(family), RuntimeOptions(provider="cpu"))
    config = runtime.config
    ids, lengths = padded_batch(config.vocab_size, seed=6)
    want_logits, want_hidden = transformers_readouts(reference, ids)
    run = runtime.readouts.stream(ids, [{}] * len(ids))
    stream = run.residual
    hidden = np.concatenate([stream[:, :-1], run.embeddings[:, None]], axis=1)
    assert_rows_close(hidden, want_hidden, lengths, axis=2, limit=HIDDEN_TOLERANCE)
    last = stream[:, -1].reshape(-1, config.d_model)  # every position's x_L
    logits = runtime.readouts.lens(last, last, logits=True).logits.reshape(*ids.shape, -1)
    assert_rows_close(logits, want_logits, lengths, axis=1, limit=LOGITS_TOLERANCE)


# Direct logit attribution on the layouts whose parts differ: GQA with a tied unembedding
# (Llama), parallel blocks with LayerNorm (GPT-NeoX), one norm with biases everywhere
# (Phi), Granite's residual and logit scales, GPT-2's learned positions and Conv1D.
ATTRIBUTED = {  # family -> its blocks' output projection, as in OUTPUT_PROJECTIONS
    "gpt2": "attn.c_proj",
    "llama": "self_attn.o_proj",
    "gpt_neox": "attention.dense",
    "phi": "self_attn.dense",
    "granite": "self_attn.o_proj",
    "gemma2": "self_attn.o_proj",
    "gemma3_text": "self_attn.o_proj",
    "olmo2": "self_attn.o_proj",
}
# family -> its blocks' norms of what attention and the MLP write (sandwich, output norms)
OUTPUT_NORMS = {
    family: ("post_attention_layernorm", "post_feedforward_layernorm")
    for family in ("gemma2", "gemma3_text", "olmo2")
}


def rms_gain(norm) -> tuple[float, torch.Tensor]:
    """A transformers RMSNorm's (eps, gain): Gemma's store the weight less one."""
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    weight = norm.weight.double()
    return eps, weight + 1 if type(norm).__name__.startswith("Gemma") else weight


@torch.no_grad()
def transformers_attribution(reference, family: str, ids: np.ndarray, targets: list[int]):
    """TransformerLens' direct logit attribution written out on transformers' model: hooks
    take each output projection's input (the heads side by side) and output and each MLP's
    output (after their own norms, where a family has them: each head's share of the
    attention's norm is its part over the norm's scale at their sum); x_L is x_0 plus what
    they wrote, the final norm's scale at x_L is frozen, and each part is read along the
    targets' unembedding rows. Returns (heads (T, n, L, H), biases (T, n, L), MLPs
    (T, n, L), embeddings (T, n), constant (T, n)) and the logits before any soft-cap,
    float64."""
    config = reference.config
    layers = blocks(reference)
    captured: dict[tuple[str, int], torch.Tensor] = {}

    def keep(key):
        def hook(_module, args, output):
            captured[key, 0] = args[0][0].double()  # (T, .) the input
            captured[key, 1] = (output[0] if isinstance(output, tuple) else output)[0].double()

        return hook

    handles = []
    attention_norm, mlp_norm = OUTPUT_NORMS.get(family, (None, "mlp"))
    for i, layer in enumerate(layers):
        handles.append(layer.get_submodule(ATTRIBUTED[family]).register_forward_hook(keep(i)))
        handles.append(layer.get_submodule(mlp_norm).register_forward_hook(keep(("mlp", i))))
        if attention_norm is not None:
            norm = layer.get_submodule(attention_norm)
            handles.append(norm.register_forward_hook(keep(("attention", i))))
    try:
        out = reference(torch.as_tensor(ids), output_hidden_states=True)
    finally:
        for handle in handles:
            handle.remove()
    residual_scale = getattr(config, "residual_multiplier", 1.0)
    logit_scale = 1.0 / getattr(config, "logits_scaling", 1.0)
    x0 = out.hidden_states[0][0].double()  # (T, D)
    attention = [captured[("attention", i) if attention_norm else i, 1] for i in range(len(layers))]
    written = [attention[i] + captured[("mlp", i), 1] for i in range(len(layers))]
    last = x0 + residual_scale * sum(written)  # x_L
    base = reference.base_model
    norm = next(
        getattr(base, n)
        for n in ("norm", "final_layer_norm", "final_layernorm", "ln_f")
        if hasattr(base, n)
    )
    head = reference.get_output_embeddings()
    u = head.weight.double()[targets]  # (n, D)
    if isinstance(norm, torch.nn.LayerNorm):
        scale = torch.sqrt(last.var(-1, unbiased=False, keepdim=True) + norm.eps)  # (T, 1)
        w = u * norm.weight.double() / scale[:, :, None]  # (T, n, D)
        w = w - w.mean(-1, keepdim=True)
        constant = (u @ norm.bias.double()).expand(len(last), -1)
    else:
        eps, gain = rms_gain(norm)
        scale = torch.sqrt(last.pow(2).mean(-1, keepdim=True) + eps)
        w = u * gain / scale[:, :, None]
        constant = torch.zeros(len(last), len(targets), dtype=torch.float64)
    if head.bias is not None:
        constant = constant + head.bias.double()[targets]
    w, constant = w * logit_scale, constant * logit_scale
    H = config.num_attention_heads
    heads, biases, mlps = [], [], []
    for i, layer in enumerate(layers):
        projection = layer.get_submodule(ATTRIBUTED[family])
        z = captured[i, 0].unflatten(-1, (H, -1))  # (T, H, d)
        weight = projection.weight.double()  # (D, H*d); GPT-2's Conv1D keeps (H*d, D)
        weight = (weight.t() if family == "gpt2" else weight).unflatten(-1, (H, -1))  # (D, H, d)
        by_head = torch.einsum("thd,ehd->the", z, weight)  # (T, H, D)
        bias = torch.zeros(len(z), len(x0[0]), dtype=torch.float64)  # (T, D)
        if projection.bias is not None:
            bias = bias + projection.bias.double()
        if attention_norm:  # the norm of what attention writes, at the heads' sum
            eps, gain = rms_gain(layer.get_submodule(attention_norm))
            whole = captured[i, 1]  # (T, D): the projection's output
            frozen = torch.sqrt(whole.pow(2).mean(-1, keepdim=True) + eps)  # (T, 1)
            by_head, bias = by_head / frozen[:, None] * gain, bias / frozen * gain
        heads.append(torch.einsum("tne,the->tnh", w, by_head))
        biases.append(torch.einsum("tne,te->tn", w, bias))
        mlps.append((w * captured[("mlp", i), 1][:, None]).sum(-1))
    return (
        torch.stack(heads, 2).numpy() * residual_scale,
        torch.stack(biases, 2).numpy() * residual_scale,
        torch.stack(mlps, 2).numpy() * residual_scale,
        (w * x0[:, None]).sum(-1).numpy(),
        constant.numpy(),
    ), uncapped(out.logits[0].double(), config).numpy()


def uncapped(logits: torch.Tensor, config) -> torch.Tensor:
    """Logits before Gemma 2's final soft-cap (cap * tanh(logit / cap)), undone."""
    cap = getattr(config, "final_logit_softcapping", None)
    return logits if cap is None else cap * torch.atanh(logits / cap)


@pytest.mark.parametrize("family", sorted(ATTRIBUTED))
def test_exported_attribution_equals_transformers_decomposed(families, family):
    """The exported readouts and attribution graphs in ONNX Runtime against the same
    decomposition written on transformers' model; the parts add up to its logits."""
    _, reference = families.checkpoint(family)
    runtime = OrtRuntime(families.exported(family), RuntimeOptions(provider="cpu"))
    config = runtime.config
    ids, lengths = padded_batch(config.vocab_size, seed=7)
    ids = ids[:1, : lengths[0]]
    targets = [3, config.vocab_size - 1, 11]
    want, logits = transformers_attribution(reference, family, ids, targets)
    graphs = runtime.readouts
    run = graphs.stream(ids, [{}], attentions=False, sites=PARTS_NAMES)
    inputs = [run.heads[0].swapaxes(0, 1), run.mlps[0].swapaxes(0, 1)]
    inputs += [run.residual[0, 0], run.residual[0, -1]]
    got = list(
        graphs.attribution(
            *(np.ascontiguousarray(x) for x in inputs), np.tile(targets, (len(inputs[2]), 1))
        ).values()
    )
    for part, wanted in zip(got, want, strict=True):
        assert part.shape == wanted.shape
        assert np.abs(part - wanted).max() <= HIDDEN_TOLERANCE
    total = got[0].sum((2, 3)) + got[1].sum(2) + got[2].sum(2) + got[3] + got[4]
    assert np.abs(total - logits[:, targets]).max() <= HIDDEN_TOLERANCE  # 3e-7 to 7e-7 seen
    assert np.abs(got[0]).max() > 10 * HIDDEN_TOLERANCE  # the heads do write along them


def test_attribution_is_not_exported_where_the_parts_do_not_add_up():
    """Post norms normalise the residual stream itself: no attribution graph; output and
    sandwich norms (their scales frozen) have one."""
    for placement in NORM_PLACEMENTS:
        config = ModelConfig(norm_placement=placement)
        kinds = {graph.kind for graph in plan_graphs(config, ("fp32",))}
        assert ("attribution" in kinds) == (placement != "post"), placement
        assert "lens" in kinds
    refusal = ModelConfig(norm_placement="post").attribution_refusal
    assert refusal is not None and "post norms" in refusal
