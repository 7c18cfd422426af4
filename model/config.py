"""The model's one source of truth: a torch-free, frozen, JSON-serialisable config.

The same JSON travels inside checkpoints (safetensors metadata) and inside the
exported ONNX file (metadata_props); the service reads it back from there, so
there is never a second copy to drift.

The defaults are this project's own encoder, GPT-2's block shape. The switches
after `bias` reproduce the causal LMs people study (Llama, Mistral, Qwen2,
GPT-NeoX, Gemma 1-3, Phi 1-3, Qwen3, OLMo 2-3, GPT-J, OPT, StableLM, Granite); each
field's comment names who uses which value, and docs/model.md has the table.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

TOKENIZER_KINDS = ("byte", "hf")  # hf: the model directory's tokenizer.json
# The MLP's activations, each with its names in Hugging Face configs (export/hf_switches.py
# reads a checkpoint's hidden_act by them; model/layers.py builds each)
ACTIVATIONS = {
    "gelu": ("gelu",),
    "gelu_tanh": ("gelu_new", "gelu_pytorch_tanh"),  # GPT-2's and Gemma's
    "relu": ("relu",),
    "silu": ("silu", "swish"),
}
NORMS = ("layernorm", "rmsnorm", "rmsnorm_plus_one")
POSITIONS = ("learned", "rotary")
MLPS = ("plain", "gated")
# parallel: attn and mlp read the block's input through norms of their own (GPT-NeoX);
# parallel_one_norm: through one norm they share (GPT-J, Phi, StableLM)
RESIDUALS = ("sequential", "parallel", "parallel_one_norm")
# Where each block's two norms sit: pre (GPT-2, Llama: x + f(norm(x))), sandwich (Gemma 2, 3:
# x + norm'(f(norm(x))), four norms), output (OLMo 2: x + norm(f(x))), post (OPT-350m, the
# 2017 Transformer: norm(x + f(x)), and no final norm).
NORM_PLACEMENTS = ("pre", "sandwich", "output", "post")
# Norms of the queries and keys before the rotation: per head over head_dim, one weight
# shared by the heads (Qwen3, Gemma 3, Phi) or one per head (StableLM); or over the whole
# projection, every head at once (OLMo 2, 3). Of the model's `norm` kind.
QK_NORMS = ("head", "each_head", "projection")
ROPE_KINDS = ("linear", "llama3", "yarn", "dynamic", "longrope")
# The unembedding (residual stream -> next-token logits): the token table itself (GPT-2,
# Gemma, OPT, this project's model), a matrix of its own (Llama, Pythia's embed_out...), or
# none (a checkpoint saved without its LM head; imports made before heads were kept).
UNEMBEDDINGS = ("tied", "separate", "none")
FLOAT_FIELDS = (
    "layer_norm_eps",
    "rope_theta",
    "rotary_fraction",
    "embedding_scale",
    "residual_scale",
    "attention_scale",
    "attention_softcap",
    "sliding_rope_theta",
    "logit_scale",
    "logit_softcap",
)

OPTIONAL_FLOATS = ("attention_scale", "attention_softcap", "sliding_rope_theta", "logit_softcap")


class ConfigError(ValueError):
    """A model config that cannot describe a valid model; the message names the field."""


@dataclass(frozen=True)
class RopeScaling:
    """How a checkpoint stretches its rotary frequencies past its training context
    (transformers' rope_parameters); model/rope.py turns it into the tables.

    linear: every frequency / factor. llama3 (Llama 3.1-3.3): low frequencies / factor,
    high ones kept, a smooth ramp between. yarn: a ramp between interpolated and original
    frequencies over beta_fast..beta_slow rotations, cos and sin times attention_factor.
    dynamic and longrope change with the sequence's length; within original_max_seq_len
    they are the default frequencies and the short factors, and only there are they served.
    """

    kind: str  # one of ROPE_KINDS
    factor: float = 1.0
    original_max_seq_len: int | None = None  # the context the checkpoint was trained at
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    truncate: bool = True  # yarn: the ramp's ends rounded to whole dims
    attention_factor: float = 1.0  # yarn, longrope: cos and sin times this
    short_factor: tuple[float, ...] | None = None  # longrope: each frequency divided by one

    def __post_init__(self) -> None:
        if self.kind not in ROPE_KINDS:
            raise ConfigError(f"rope_scaling.kind must be one of {ROPE_KINDS}, got {self.kind!r}")
        for field in ("factor", "low_freq_factor", "high_freq_factor", "attention_factor"):
            value = getattr(self, field)
            if not isinstance(value, float) or value <= 0:
                raise ConfigError(f"rope_scaling.{field} must be a positive float, got {value!r}")
        needs_original = self.kind in ("llama3", "yarn", "dynamic", "longrope")
        if needs_original and self.original_max_seq_len is None:
            raise ConfigError(f"rope_scaling.original_max_seq_len is needed by {self.kind!r}")
        if self.original_max_seq_len is not None:
            _check_positive_int("rope_scaling.original_max_seq_len", self.original_max_seq_len)
        if self.kind == "llama3" and self.high_freq_factor <= self.low_freq_factor:
            raise ConfigError("rope_scaling.high_freq_factor must exceed low_freq_factor")
        if self.kind == "longrope" and not self.short_factor:
            raise ConfigError("rope_scaling.short_factor is needed by 'longrope'")

    @property
    def length_bound(self) -> bool:
        """True where the frequencies change past original_max_seq_len (dynamic, longrope)."""
        return self.kind in ("dynamic", "longrope")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RopeScaling:
        data = dict(data)
        for field in (
            "factor",
            "low_freq_factor",
            "high_freq_factor",
            "beta_fast",
            "beta_slow",
            "attention_factor",
        ):
            if isinstance(data.get(field), int) and not isinstance(data[field], bool):
                data[field] = float(data[field])
        if data.get("short_factor") is not None:
            data["short_factor"] = tuple(float(f) for f in data["short_factor"])
        return cls(**data)


@dataclass(frozen=True)
class ModelConfig:
    n_layers: int = 4  # number of transformer blocks
    n_heads: int = 8  # query heads per block (the heads attention weights are reported for)
    d_model: int = 256  # width of the residual stream (embedding size)
    d_ff: int = 1024  # hidden width of each block's MLP (4 * d_model in GPT-2)
    max_seq_len: int = 1024  # longest sequence: size of the learned positional table
    vocab_size: int = 259  # token table rows: 256 bytes + <pad>, <bos>, <eos> for "byte"
    tokenizer: str = "byte"  # how text becomes ids: "byte", or "hf" (tokenizer.json beside)
    pad_id: int = 256  # right-padding id; causality makes its value irrelevant to real tokens
    bos_id: int = 257  # prepended to text so the first real token has a context to attend from
    eos_id: int = 258  # appended to text on request (useful for "last" pooling)
    activation: str = "gelu"  # MLP nonlinearity: gelu (erf), gelu_tanh (GPT-2), relu, silu
    layer_norm_eps: float = 1e-5  # epsilon of every norm, LayerNorm or RMSNorm
    bias: bool = True  # biases in Linear layers (GPT-2 has them); the three below override it
    name: str = "attnserve-encoder"  # model name reported by the service
    input_name: str = "input_ids"  # ONNX input: int64 [batch, seq]
    embeddings_name: str = "embeddings"  # ONNX output: float32 [batch, seq, d_model]
    attentions_name: str = "attentions"  # ONNX output: float32 [batch, layers, heads, seq, seq]
    # --- switches of the model families (docs/model.md) ---
    norm: str = "layernorm"  # layernorm | rmsnorm (Llama...) | rmsnorm_plus_one (Gemma: 1 + w)
    positions: str = "learned"  # learned table (GPT-2) | rotary (the rest)
    rope_theta: float = 10000.0  # rotary base
    rotary_fraction: float = 1.0  # share of each head's dims that rotate (Pythia 0.25)
    rotary_interleaved: bool = False  # GPT-J's (x0, x1) pairs; False: half-split (Llama, NeoX)
    n_kv_heads: int | None = None  # key/value heads, dividing n_heads (GQA, MQA); None: n_heads
    d_head: int | None = None  # width of one head if not d_model / n_heads (Gemma)
    mlp: str = "plain"  # plain: act(fc x) | gated: act(gate x) * (up x) (SwiGLU, GeGLU)
    qkv_bias: bool | None = None  # biases on q, k, v (Qwen2: only these); None: as `bias`
    out_bias: bool | None = None  # bias of the attention's output projection; None: as `bias`
    mlp_bias: bool | None = None  # biases of the MLP; None: as `bias`
    residual: str = "sequential"  # sequential | parallel: attn and mlp of one input (NeoX)
    sliding_window: int | None = None  # keys per query, itself included (Mistral); None: all
    sliding_layers: tuple[int, ...] | None = None  # layers with the window; None: every layer
    embedding_scale: float = 1.0  # token embeddings times this (Gemma: sqrt(d_model))
    norm_placement: str = "pre"  # pre | sandwich (Gemma 2, 3) | output (OLMo 2) | post (OPT)
    qk_norm: str | None = None  # head (Qwen3, Gemma 3, Phi) | each_head (StableLM) | projection
    attention_scale: float | None = None  # scores times this; None: 1/sqrt(head_dim) (Gemma 2)
    attention_softcap: float | None = None  # scores -> cap * tanh(scores / cap) (Gemma 2)
    residual_scale: float = 1.0  # each sublayer's output times this before the add (Granite)
    rope_scaling: RopeScaling | None = None  # stretched frequencies (Llama 3.x, YaRN...)
    # Gemma 3, OLMo 3: the sliding layers' own rotary base, never scaled; rope_scaling then
    # applies to the other layers only. None: every layer shares one rotary.
    sliding_rope_theta: float | None = None
    d_embed: int | None = None  # token embedding width if not d_model: projected in and out (OPT)
    unembedding: str = "tied"  # tied: logits from the token table | separate: own matrix | none
    unembedding_bias: bool = False  # a bias on the logits (Phi, GPT-J; separate only)
    logit_scale: float = 1.0  # logits times this (Granite: 1 / logits_scaling)
    logit_softcap: float | None = None  # logits -> cap * tanh(logits / cap) (Gemma 2)

    def __post_init__(self) -> None:
        self._check_types()
        if self.d_head is None and self.d_model % self.n_heads:
            raise ConfigError(
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads}) "
                "unless d_head is set"
            )
        if self.n_heads % self.kv_heads:
            raise ConfigError(
                f"n_kv_heads ({self.kv_heads}) must divide n_heads ({self.n_heads}): "
                "each key/value head serves the same number of query heads"
            )
        if self.tokenizer == "byte" and self.vocab_size < 256:
            raise ConfigError(
                f"vocab_size must be >= 256 for the byte tokenizer, got {self.vocab_size}"
            )
        if self.qk_norm is not None and self.qk_norm not in QK_NORMS:
            raise ConfigError(f"qk_norm must be one of {QK_NORMS} or null, got {self.qk_norm!r}")
        if self.qk_norm == "each_head" and self.norm != "layernorm":
            raise ConfigError("qk_norm 'each_head' (StableLM's LayerNorms) needs norm 'layernorm'")
        self._check_rotary()
        if self.unembedding_bias and self.unembedding != "separate":
            raise ConfigError("unembedding_bias needs unembedding 'separate'")
        if self.sliding_layers is not None:
            if self.sliding_window is None:
                raise ConfigError("sliding_layers needs sliding_window")
            bad = [i for i in self.sliding_layers if not 0 <= i < self.n_layers]
            if bad:
                raise ConfigError(f"sliding_layers {bad} are outside [0, n_layers={self.n_layers})")

    def _check_types(self) -> None:
        """Each field of its type and range, each choice among its values."""
        for field in ("n_layers", "n_heads", "d_model", "d_ff", "max_seq_len", "vocab_size"):
            _check_positive_int(field, getattr(self, field))
        for field in ("n_kv_heads", "d_head", "sliding_window", "d_embed"):
            if getattr(self, field) is not None:
                _check_positive_int(field, getattr(self, field))
        for field in ("pad_id", "bos_id", "eos_id"):
            value = getattr(self, field)
            if not isinstance(value, int) or not 0 <= value < self.vocab_size:
                raise ConfigError(
                    f"{field} must be an integer in [0, vocab_size={self.vocab_size}), "
                    f"got {value!r}"
                )
        for field, choices in (
            ("tokenizer", TOKENIZER_KINDS),
            ("activation", tuple(ACTIVATIONS)),
            ("norm", NORMS),
            ("positions", POSITIONS),
            ("mlp", MLPS),
            ("residual", RESIDUALS),
            ("norm_placement", NORM_PLACEMENTS),
            ("unembedding", UNEMBEDDINGS),
        ):
            if getattr(self, field) not in choices:
                raise ConfigError(f"{field} must be one of {choices}, got {getattr(self, field)!r}")
        for field in FLOAT_FIELDS:
            value = getattr(self, field)
            if value is None and field in OPTIONAL_FLOATS:
                continue
            if not isinstance(value, float) or value <= 0:
                raise ConfigError(f"{field} must be a positive float, got {value!r}")
        for field in (
            "bias",
            "rotary_interleaved",
            "qkv_bias",
            "out_bias",
            "mlp_bias",
            "unembedding_bias",
        ):
            value = getattr(self, field)
            if not isinstance(value, bool) and not (value is None and field.endswith("_bias")):
                raise ConfigError(f"{field} must be true or false, got {value!r}")
        names = (self.input_name, self.embeddings_name, self.attentions_name)
        if len(set(names)) != 3 or not all(isinstance(n, str) and n for n in names):
            raise ConfigError(f"input/output names must be distinct non-empty strings, got {names}")

    def _check_rotary(self) -> None:
        """Rotary positions the graph can reproduce: the scaling's factors, the context."""
        if self.rope_scaling is not None:
            if not isinstance(self.rope_scaling, RopeScaling):
                raise ConfigError("rope_scaling must be a RopeScaling object")
            factors = self.rope_scaling.short_factor
            if factors is not None and len(factors) != self.rotary_dims // 2:
                raise ConfigError(
                    f"rope_scaling.short_factor has {len(factors)} values; the "
                    f"{self.rotary_dims} rotary dims need {self.rotary_dims // 2}"
                )
            original = self.rope_scaling.original_max_seq_len
            if (
                self.rope_scaling.length_bound
                and original is not None
                and original < self.max_seq_len
            ):
                raise ConfigError(
                    f"max_seq_len ({self.max_seq_len}) exceeds the {self.rope_scaling.kind!r} "
                    f"rope's original context (rope_scaling.original_max_seq_len = {original}): "
                    "past it the frequencies change with the sequence's length, which one "
                    f"graph cannot reproduce; serve at most {original} positions"
                )
        if not 0 < self.rotary_fraction <= 1:
            raise ConfigError(f"rotary_fraction must be in (0, 1], got {self.rotary_fraction!r}")
        if self.positions == "rotary" and (self.rotary_dims < 2 or self.rotary_dims % 2):
            raise ConfigError(
                f"rotary_fraction ({self.rotary_fraction}) of head_dim ({self.head_dim}) must "
                f"give an even number of rotated dims, got {self.rotary_dims}"
            )

    @property
    def head_dim(self) -> int:
        """d_k: the width of one head's queries, keys and values."""
        return self.d_head or self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        """How many key/value heads each block has (n_heads without GQA)."""
        return self.n_kv_heads or self.n_heads

    @property
    def kv_head_of(self) -> tuple[int, ...]:
        """The key/value head each query head reads: consecutive query heads share one."""
        group = self.n_heads // self.kv_heads
        return tuple(h // group for h in range(self.n_heads))

    @property
    def rotary_dims(self) -> int:
        """How many of each head's dims rotate (the first ones; the rest pass through)."""
        return int(self.head_dim * self.rotary_fraction)

    @property
    def embedding_dim(self) -> int:
        """The width of the token embeddings and of the returned embeddings (OPT's d_embed)."""
        return self.d_embed or self.d_model

    @property
    def fuses_attention(self) -> bool:
        """Whether the fused attention kernel (ONNX's Attention op) computes this model's
        attention: it has no soft-cap, so Gemma 2's goes the textbook way throughout."""
        return self.attention_softcap is None

    @property
    def attribution_refusal(self) -> str | None:
        """Why a logit cannot be split exactly into what each head and MLP wrote, or None
        where it can: the parts add up where what they write reaches the final norm as a
        sum (norms before the sublayers, or of each sublayer's output, their scales frozen)
        and an unembedding reads it (without a projection out between)."""
        if self.unembedding == "none":
            return "it has no unembedding (its checkpoint had no LM head)"
        if self.norm_placement == "post":
            return (
                "its post norms normalise the residual stream itself after each sublayer, "
                "so the parts would not add up to the logit"
            )
        if self.d_embed is not None:
            return "its projection out of d_model is not part of the attribution graph"
        return None

    def window(self, layer: int) -> int | None:
        """The sliding window of one layer, or None where it attends to every earlier key."""
        if self.sliding_layers is None or layer in self.sliding_layers:
            return self.sliding_window
        return None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        if not isinstance(data, dict):
            raise ConfigError(f"model config must be a JSON object, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown model config field(s): {', '.join(unknown)}")
        data = dict(data)
        # JSON has one number type; accept 1 where a float such as 1e-5 is expected.
        for field in FLOAT_FIELDS:
            if isinstance(data.get(field), int) and not isinstance(data[field], bool):
                data[field] = float(data[field])
        if isinstance(data.get("sliding_layers"), list):  # JSON has no tuples
            data["sliding_layers"] = tuple(data["sliding_layers"])
        if isinstance(data.get("rope_scaling"), dict):
            data["rope_scaling"] = RopeScaling.from_dict(data["rope_scaling"])
        if "unembedding" not in data and data.get("tokenizer") == "hf":
            data["unembedding"] = "none"  # imported before heads were kept: it was dropped
        return cls(**data)

    @classmethod
    def from_json(cls, text: str) -> ModelConfig:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"model config is not valid JSON: {exc}") from exc
        return cls.from_dict(data)


def _check_positive_int(field: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{field} must be a positive integer, got {value!r}")
