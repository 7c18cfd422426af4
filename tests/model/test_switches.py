"""docs/model.md's properties with every family switch on at once, and what each switch means.

The families' exactness against transformers is tested in tests/export/test_hf_families.py;
here the encoder alone: causality with windows, right padding with rotary positions, the
fused kernel against the textbook path, and rotary's defining property for both layouts.
"""

import hashlib

import numpy as np
import pytest
import torch

from attnserve.model.config import ConfigError, ModelConfig, RopeScaling
from attnserve.model.encoder import Encoder, build_encoder
from attnserve.model.footprint import parameter_count
from attnserve.model.hook_points import head_ablation, hooked
from attnserve.model.layers import Rotary, apply_rotary
from attnserve.model.rope import frequencies

WINDOW = 5
# GQA 7:1, head_dim 10 apart from d_model 48 / 7, partial rotary, RMSNorm, SwiGLU, q/k/v
# biases only, a parallel residual, Gemma's embedding scale, a window on layer 1 only.
EVERYTHING = ModelConfig(
    n_layers=2,
    n_heads=7,
    n_kv_heads=1,
    d_model=48,
    d_head=10,
    d_ff=40,
    max_seq_len=64,
    norm="rmsnorm",
    positions="rotary",
    rotary_fraction=0.6,
    mlp="gated",
    activation="silu",
    bias=False,
    qkv_bias=True,
    residual="parallel",
    embedding_scale=48**0.5,
    sliding_window=WINDOW,
    sliding_layers=(1,),
)

# The second round's switches, three models' worth: Gemma 2 and 3's sandwich norms, soft-cap,
# own scale, q/k norms per head and a local rotary beside YaRN's; OLMo 2's output norms and
# q/k norms over the projection with Llama 3's rope and Granite's multipliers; OPT-350m's
# post-norm with projected embeddings beside GPT-J's one-norm parallel block and StableLM's
# per-head q/k norms (as the window on layer 1 only, for the tests below).
SECOND_ROUND = {
    "sandwich": dict(
        norm="rmsnorm_plus_one",
        norm_placement="sandwich",
        qk_norm="head",
        attention_scale=0.3,
        attention_softcap=0.8,
        logit_softcap=2.0,
        rope_scaling=RopeScaling("yarn", factor=4.0, original_max_seq_len=16),
        sliding_rope_theta=500.0,
    ),
    "output": dict(
        norm="rmsnorm",
        norm_placement="output",
        qk_norm="projection",
        rope_scaling=RopeScaling("llama3", factor=8.0, original_max_seq_len=16),
        embedding_scale=3.0,
        residual_scale=0.5,
        logit_scale=0.25,
    ),
    "post": dict(
        norm="layernorm",
        norm_placement="post",
        residual="parallel_one_norm",
        qk_norm="each_head",
        d_embed=24,
        rotary_interleaved=True,
        unembedding="separate",
        unembedding_bias=True,
    ),
}
BASE = {**EVERYTHING.to_dict(), "residual": "sequential", "sliding_layers": (1,)}
CONFIGS = {"everything": EVERYTHING} | {
    name: ModelConfig(**{**BASE, **switches}) for name, switches in SECOND_ROUND.items()
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def model(request):
    return build_encoder(CONFIGS[request.param], seed=2)


def run(model, ids, need_weights=True):
    with torch.inference_mode():
        return model(torch.as_tensor(ids), need_weights)


def ids(batch, t, seed=0):
    return torch.randint(3, 259, (batch, t), generator=torch.Generator().manual_seed(seed))


def test_rows_sum_to_one_and_the_mask_is_exact_zeros(model):
    emb, att = run(model, ids(2, 30))  # (B, L, H, T, T)
    assert att.shape == (2, 2, 7, 30, 30)
    assert emb.shape == (2, 30, model.config.embedding_dim)
    torch.testing.assert_close(att.sum(-1), torch.ones(2, 2, 7, 30), atol=1e-5, rtol=0)
    future = torch.ones(30, 30, dtype=torch.bool).triu(1)
    outside = torch.ones(30, 30, dtype=torch.bool).tril(-WINDOW)  # j <= i - WINDOW
    assert (att[..., future] == 0).all()
    assert (att[:, 1][..., outside] == 0).all()  # the windowed layer
    assert (att[:, 1][..., ~(future | outside)] > 0).all()
    assert (att[:, 0][..., outside] > 0).all()  # the other layer sees every earlier key


def test_future_tokens_change_nothing_and_right_padding_is_exact(model):
    x = ids(1, 30)
    changed = x.clone()
    changed[:, 12:] = (changed[:, 12:] + 5) % 259
    emb_a, att_a = run(model, x)
    emb_b, att_b = run(model, changed)
    torch.testing.assert_close(emb_a[:, :12], emb_b[:, :12], atol=1e-6, rtol=0)
    torch.testing.assert_close(att_a[..., :12, :], att_b[..., :12, :], atol=1e-6, rtol=0)
    padded = torch.cat([x[:, :17], torch.zeros(1, 13, dtype=torch.int64)], dim=1)
    emb_p, att_p = run(model, padded)
    torch.testing.assert_close(emb_p[:, :17], emb_a[:, :17], atol=1e-5, rtol=0)
    torch.testing.assert_close(att_p[..., :17, :17], att_a[..., :17, :17], atol=1e-5, rtol=0)


def test_the_fused_kernel_gives_the_textbook_embeddings(model):
    """need_weights=False runs PyTorch's fused attention (GQA and window masks included)."""
    x = ids(3, 33, seed=4)
    torch.testing.assert_close(run(model, x, False)[0], run(model, x)[0], atol=1e-5, rtol=0)


def test_the_readouts_agree_with_the_forward_pass(model):
    """logits are the unembedded output; the lens at the last layer is the logits; hidden
    states are the stream with its last normed; a head mask of ones changes nothing."""
    x = ids(2, 20)
    with torch.inference_mode():
        embeddings, attentions = model(x)
        logits = model.logits(x)
        stream, _ = model.residual_stream(x)
        hidden = model.hidden_states(x)
        ones = torch.ones(model.config.n_layers, model.config.n_heads)
        with hooked(model, head_ablation(ones)):
            masked, masked_attentions = model(x)
        lens = model.lens(torch.stack(stream, dim=1), stream[-1][:, None])  # (B, L+1, T, V)
        unembedded = model.unembed(embeddings)
    assert logits.shape == (2, 20, model.config.vocab_size)
    assert torch.allclose(logits, unembedded, atol=1e-5)
    assert torch.allclose(lens[:, -1], logits, atol=1e-4)
    assert len(stream) == model.config.n_layers + 1 and hidden.shape[1] == len(stream)
    assert torch.equal(hidden[:, 0], stream[0])  # (hidden states take the fused kernel)
    assert torch.allclose(hidden[:, -2], stream[-2], atol=1e-5)
    if model.config.d_embed is None:
        assert torch.allclose(hidden[:, -1], embeddings, atol=1e-6)
    assert torch.equal(masked, embeddings) and torch.equal(masked_attentions, attentions)


def test_query_heads_of_one_group_read_the_same_keys():
    """With one KV head, a query head's keys are the group's: swapping the q rows of two
    heads swaps their attention maps exactly."""
    model = build_encoder(EVERYTHING, seed=5)
    layer = model.blocks[0].attn
    d = EVERYTHING.head_dim
    with torch.no_grad():
        x = ids(1, 20, seed=6)
        _, before = run(model, x)
        w = layer.qkv.weight
        w[: 2 * d] = torch.cat([w[d : 2 * d], w[:d]]).clone()  # swap query heads 0 and 1
        b = layer.qkv.bias
        b[: 2 * d] = torch.cat([b[d : 2 * d], b[:d]]).clone()
        _, after = run(model, x)
    torch.testing.assert_close(after[:, 0, 0], before[:, 0, 1], atol=1e-6, rtol=0)
    torch.testing.assert_close(after[:, 0, 1], before[:, 0, 0], atol=1e-6, rtol=0)


@pytest.mark.parametrize("interleaved", [False, True])
def test_rotary_scores_depend_on_relative_position_only(interleaved):
    """RoPE's defining property: <R_m q, R_n k> is a function of m - n, and R keeps norms
    (the unrotated tail of a partial rotation passes untouched)."""
    config = ModelConfig(
        n_heads=1, d_model=16, positions="rotary", rotary_fraction=0.5,
        rotary_interleaved=interleaved, max_seq_len=64,
    )  # fmt: skip
    cos, sin = Rotary(config)(64)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)

    def rotated(x, position):
        return apply_rotary(
            x, cos[position : position + 1], sin[position : position + 1], interleaved
        )

    def score(m, n):
        return float((rotated(q, m) * rotated(k, n)).sum())

    assert score(10, 3) == pytest.approx(score(40, 33), abs=1e-4)
    assert score(10, 3) != pytest.approx(score(10, 4), abs=1e-3)
    assert float(rotated(q, 37).norm()) == pytest.approx(float(q.norm()), rel=1e-5)
    torch.testing.assert_close(rotated(q, 37)[..., 8:], q[..., 8:])


def test_rms_norm_forms():
    """Llama's RMSNorm scales by w; Gemma's by 1 + w (so a zero weight is the identity scale)."""
    x = torch.randn(2, 5, 48)
    for norm, weight in (("rmsnorm", 1.0), ("rmsnorm_plus_one", 0.0)):
        model = build_encoder(ModelConfig(n_heads=4, d_model=48, norm=norm))
        rms = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
        assert (model.ln_f.weight == weight).all()
        torch.testing.assert_close(model.ln_f(x), rms, atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"n_kv_heads": 3}, "n_kv_heads (3) must divide n_heads (8)"),
        ({"positions": "alibi"}, "positions must be one of"),
        ({"norm": "batchnorm"}, "norm must be one of"),
        ({"positions": "rotary", "rotary_fraction": 0.1}, "even number of rotated dims, got 3"),
        ({"rotary_fraction": 1.5}, "rotary_fraction must be in (0, 1]"),
        ({"sliding_layers": [0]}, "sliding_layers needs sliding_window"),
        ({"sliding_window": 4, "sliding_layers": [4]}, "sliding_layers [4] are outside"),
        ({"sliding_window": 0}, "sliding_window must be a positive integer"),
        ({"qkv_bias": "yes"}, "qkv_bias must be true or false"),
        ({"d_model": 250}, "must be divisible by n_heads (8) unless d_head is set"),
        ({"norm_placement": "middle"}, "norm_placement must be one of"),
        ({"qk_norm": "token"}, "qk_norm must be one of"),
        ({"qk_norm": "each_head", "norm": "rmsnorm"}, "'each_head' (StableLM's LayerNorms)"),
        ({"attention_softcap": 0.0}, "attention_softcap must be a positive float"),
        ({"d_embed": 0}, "d_embed must be a positive integer"),
        ({"unembedding": "lm_head"}, "unembedding must be one of ('tied', 'separate', 'none')"),
        ({"unembedding_bias": True}, "unembedding_bias needs unembedding 'separate'"),
        ({"logit_softcap": 0.0}, "logit_softcap must be a positive float"),
        (
            {"positions": "rotary", "rope_scaling": {"kind": "ntk"}},
            "rope_scaling.kind must be one of",
        ),
        (
            {"positions": "rotary", "rope_scaling": {"kind": "llama3", "factor": 8}},
            "rope_scaling.original_max_seq_len is needed by 'llama3'",
        ),
        (
            {
                "positions": "rotary",
                "rope_scaling": {
                    "kind": "longrope",
                    "original_max_seq_len": 64,
                    "short_factor": [1.0, 2.0],
                },
            },
            "rope_scaling.short_factor has 2 values; the 32 rotary dims need 16",
        ),
        (
            {
                "positions": "rotary",
                "rope_scaling": {"kind": "dynamic", "factor": 2, "original_max_seq_len": 512},
            },
            "max_seq_len (1024) exceeds the 'dynamic' rope's original context "
            "(rope_scaling.original_max_seq_len = 512)",
        ),
    ],
)
def test_switch_values_are_checked_naming_the_field(overrides, named):
    with pytest.raises(ConfigError) as excinfo:
        ModelConfig.from_dict({**ModelConfig().to_dict(), **overrides})
    assert named in str(excinfo.value)


def test_a_head_dim_set_apart_need_not_divide_d_model():
    config = ModelConfig(d_model=250, d_head=32)
    assert config.head_dim == 32 and build_encoder(config).blocks[0].attn.proj.in_features == 256


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_switches_survive_json(name):
    config = CONFIGS[name]
    assert ModelConfig.from_json(config.to_json()) == config


def test_an_import_from_before_heads_were_kept_has_none():
    """Imported (hf) directories written before the unembedding was kept had it dropped;
    the project's own model (byte) was always tied."""
    old = ModelConfig(tokenizer="hf").to_dict()
    del old["unembedding"]
    assert ModelConfig.from_dict(old).unembedding == "none"
    own = ModelConfig().to_dict()
    del own["unembedding"]
    assert ModelConfig.from_dict(own).unembedding == "tied"


def test_what_json_gives_back_is_typed():
    again = ModelConfig.from_json(CONFIGS["sandwich"].to_json())
    assert isinstance(again.rope_scaling, RopeScaling) and again.rope_scaling.kind == "yarn"
    again = ModelConfig.from_json(EVERYTHING.to_json())
    assert again == EVERYTHING and again.sliding_layers == (1,)
    assert again.kv_head_of == (0,) * 7 and again.window(0) is None and again.window(1) == WINDOW


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_footprint_counts_what_the_encoder_holds(name):
    """model/footprint.py's torch-free count, which the import's memory check relies on."""
    with torch.device("meta"):
        model = Encoder(CONFIGS[name])
    assert parameter_count(CONFIGS[name]) == sum(p.numel() for p in model.parameters())


ROPE_PROBE = """
import hashlib, json
from attnserve.model.config import ModelConfig
from attnserve.model.layers import Rotary
config = ModelConfig(positions="rotary", max_seq_len=4096, n_heads=2, d_model=256)
r = Rotary(config)
print(json.dumps([hashlib.sha256(t.numpy().tobytes()).hexdigest() for t in (r.cos, r.sin)]))
"""


def test_rotary_tables_are_the_correctly_rounded_values_in_every_process():
    """The tables are cos and sin of transformers' float32 angles, rounded once from float64,
    and a fresh process builds the same ones. torch's float32 cos on two threads is now and
    then 1.5e-4 off in a process (research/rope-tables), and the export traces some graphs
    in a child process: a checkpoint's parity gate then said one thing in one run of eight."""
    from tests.conftest import run_probe

    config = ModelConfig(positions="rotary", max_seq_len=4096, n_heads=2, d_model=256)
    rotary = Rotary(config)
    inv_freq, _ = frequencies(config.rotary_dims, config.rope_theta, None)
    angles = torch.arange(config.max_seq_len, dtype=torch.float)[:, None] * inv_freq[None]
    exact = torch.cat((angles, angles), dim=-1).double()
    assert torch.equal(rotary.cos, torch.from_numpy(np.cos(exact.numpy()).astype(np.float32)))
    assert torch.equal(rotary.sin, torch.from_numpy(np.sin(exact.numpy()).astype(np.float32)))
    mine = [hashlib.sha256(t.numpy().tobytes()).hexdigest() for t in (rotary.cos, rotary.sin)]
    assert all(run_probe(ROPE_PROBE) == mine for _ in range(3))
