"""Names shared by the exporter (which writes a model directory) and the service (which reads it).

Torch-free on purpose: the service imports it.
"""

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from attnserve.model import hooks
from attnserve.model.config import ModelConfig
from attnserve.model.sae_config import SAEConfig

ONNX_FILENAME = "model.onnx"  # embeddings and attention weights of every layer and head
# The same graph with the readouts: a head mask in, the residual stream out beside them
# (a graph of its own: ONNX Runtime computes every output, asked for or not).
READOUTS_ONNX_FILENAME = "model_readouts.onnx"
# Interventions: the readouts graph changes every layer's site of each kind hooks.changeable
# names, x -> x * scale + add * gate, by three float32 inputs per kind, `{kind}_scale`,
# `{kind}_add` and `{kind}_gate`, each [batch or 1, layers, positions or 1, width or 1]
# (per-head sites': [batch or 1, layers, positions or 1, heads or 1, head_dim or 1])
# broadcast against the site's value; ones, zeros and zeros leave it as it is.
CHANGE_PARTS = ("scale", "add", "gate")
# Directories written before 2026-11-28 have two inputs instead, hook_z's scale and add:
HEAD_MASK_NAME = "head_mask"  # float32 [batch, layers, heads]: 1 keeps a head
HEAD_MEANS_NAME = "head_means"  # float32 [batch, layers, heads, head_dim]: added after
RESIDUAL_STREAM_NAME = "residual_stream"  # output, float32 [batch, layers + 1, seq, d_model]
# The logit lens: any layer's residual rows through the final norm (with the last layer's
# scale frozen) and the unembedding; written where the model has an unembedding.
LENS_ONNX_FILENAME = "model_lens.onnx"
LENS_INPUTS = ("residual", "last")  # float32 [rows, d_model] each: x_l and x_L of one position
LOGITS_NAME = "logits"  # output, float32 [rows, vocab]
# ... and what is read off them: k (int64 [1]) and targets (int64 [rows, n], token ids) in;
# the k most probable ids (int64 [rows, k]), their probabilities and the targets' out.
PREDICTION_INPUTS = ("k", "targets")
PREDICTION_OUTPUTS = ("top_ids", "top_probabilities", "target_probabilities")
# What the blocks add to the stream, beside it in the readouts graph: each layer's heads as
# its output projection reads them, [batch, layers, seq, heads * d_head], and its MLP's
# output, [batch, layers, seq, d_model].
PARTS_NAMES = ("head_outputs", "mlp_outputs")
# The other sites SAEs read, beside them: what attention writes (hook_attn_out: after its
# output norm, before Granite's scale), [batch, layers, seq, d_model], and in sequential
# blocks the stream between attention and MLP (hook_resid_mid), likewise.
ATTN_OUTPUTS_NAME, RESID_MID_NAME = "attn_outputs", "resid_mid"


def change_inputs(config: ModelConfig) -> dict[str, tuple[str, str]]:
    """The readouts graph's intervention inputs: each name -> (the kind of site, its part)."""
    return {
        f"{kind}_{part}": (kind, part) for kind in hooks.changeable(config) for part in CHANGE_PARTS
    }


def unchanged(config: ModelConfig) -> dict[str, np.ndarray]:
    """Intervention inputs that change nothing: ones to scale by, zeros to add, of the
    smallest shape each (1, L, 1, 1) (hook_z: (1, L, 1, 1, 1))."""
    feeds = {}
    for name, (kind, part) in change_inputs(config).items():
        per_head = hooks.kind_heads(config, kind) is not None
        shape = (1, config.n_layers, 1, 1, 1) if per_head else (1, config.n_layers, 1, 1)
        feeds[name] = np.full(shape, 1.0 if part == "scale" else 0.0, dtype=np.float32)
    return feeds


# Direct logit attribution: those parts at some positions, x_0 and x_L there, and target
# ids [rows, n] -> what each part adds to each target's logit (Encoder.attribution);
# written where the parts add up to the logit (ModelConfig.attribution_refusal).
ATTRIBUTION_ONNX_FILENAME = "model_attribution.onnx"
ATTRIBUTION_INPUTS = (*PARTS_NAMES, "first", "last", "targets")
# The parts a logit is split into, in the order Encoder.attribution returns them: the one
# list of their names (attnserve.v1's LogitAttribution, the backend's Attribution and the
# V2 outputs, attribution_<part>, use these; tests/service/test_names.py holds them to it).
ATTRIBUTION_PARTS = ("heads", "attention_biases", "mlps", "embeddings", "constants")
# The attribution graph's output of each part, float32 [rows, n, layers, heads],
# [rows, n, layers] twice, [rows, n] twice (the names directories were written with)
ATTRIBUTION_OUTPUTS = dict(
    zip(
        ATTRIBUTION_PARTS,
        (
            "head_attribution",
            "bias_attribution",
            "mlp_attribution",
            "embedding_attribution",
            "constant_attribution",
        ),
        strict=True,
    )
)
# Embeddings only, through ONNX's fused Attention op: faster where no weights are wanted.
EMBEDDINGS_ONNX_FILENAME = "model_embeddings.onnx"
# The full graph's outputs through the fused Attention op (export/fused.py): faster on CPU;
# ORT's CUDA kernel cannot return the attention probabilities yet, so only CPU uses it.
FUSED_ONNX_FILENAME = "model_fused.onnx"
# Sparse autoencoders beside the model (`attnserve sae add`): MODEL_DIR/saes/NAME/ holds
# one's graph, its weights (sae.data; sae_int8.data for an SAE added in 8 bits) and
# sae.json ({"config": SAEConfig, "source", "precision", "fidelity"}).
# The graph: x float32 [batch, seq, d_in] (a hook site's values) and top_k int64 [1] in;
# the top_k features' ids (int64, -1 past the active ones) and activations, L0 (int64) and
# the reconstruction error's norm [batch, seq], and every activation [batch, seq, d_sae] out.
SAES_DIRNAME = "saes"
SAE_ONNX, SAE_WEIGHTS, SAE_JSON = "sae.onnx", "sae.data", "sae.json"
# An SAE on a site a norm computes (normed_site): that norm's graph, x (B, T, D) the site
# the norm reads in, `site` (B, T, D) out, its weights inside (a norm's: D or 2D floats).
SAE_SITE_ONNX = "site.onnx"
# x float32 (B, T, d_in), top_k int64 [1], with_error_norm bool []: false leaves the
# decoder unread (error_norm zeros); SAEs added before 2026-11-28 lack it (always read)
SAE_INPUTS = ("x", "top_k", "with_error_norm")
# a transcoder's graph's fourth input: its output site's values (B, T, d_out), which its
# reconstruction error is measured against
TRANSCODER_TARGET = "target"
SAE_OUTPUTS = ("top_ids", "top_activations", "l0", "error_norm", "activations")
# A transcoder set's replacement model (`attnserve sae add` of circuit-tracer's set):
# backward_{set}.onnx beside the model's graphs (export/backward.py: its inputs and outputs),
# pointing into weights.data for the model's tensors and into backward_{set}.data for the
# set's own (the skips); backward_{set}.json: {"members": the SAE names by layer, "scan",
# "input_site": the site each reads, "{layer}" unfilled, "skip", "fidelity"}.
BACKWARD_PREFIX = "backward_"
# the rows' gradients, in layer order, at every hook_mlp_out (N, L, T, D) and at hook_embed
# (N, T, D); the prompt's transcoder inputs (L, T, d_in), MLP outputs (L, T, D), last
# logits (V,), token embeddings (T, D) and what the skips write (L, T, D)
BACKWARD_OUTPUTS = (
    "mlp_grads",
    "embed_grads",
    "transcoder_inputs",
    "mlp_outputs",
    "logits",
    "embeddings",
    "skip_outputs",
)


def backward_inputs(n_layers: int) -> tuple[str, ...]:
    """A backward graph's inputs: input_ids int64 (1, T); then the rows layer by layer,
    grads_{l} float32 (N_l, D) and positions_{l} int64 (N_l,) for l in 0..L, each row's
    direction and place (layer L: the model's output after the final norm)."""
    layers = range(n_layers + 1)
    return ("input_ids", *(f"{kind}_{i}" for kind in ("grads", "positions") for i in layers))


def backward_files(set_name: str) -> tuple[str, str, str]:
    """A transcoder set's backward graph, its own tensors and its description."""
    stem = f"{BACKWARD_PREFIX}{set_name}"
    return f"{stem}.onnx", f"{stem}.data", f"{stem}.json"


# The metric's real gradient (model/gradient.py), for attribution patching and saliency:
# gradient_{T}.onnx per length T (`attnserve gradient MODEL_DIR`: export/gradient.py), a
# prompt padded on the right to it (the model is causal: nothing at or before the metric's
# position sees the padding), pointing into weights.data, its own tensors in gradient_{T}.data.
GRADIENT_PREFIX = "gradient_"
# input_ids int64 (1, T); position, target and contrast int64 (1,): the metric is
# logit(target) - logit(contrast) after `position`
GRADIENT_INPUTS = ("input_ids", "position", "target", "contrast")


def gradient_outputs(config: ModelConfig) -> list[str]:
    """The metric (1,), its gradient at every site of each changeable kind (L, T, width),
    `{kind}_grad`, and at hook_embed (T, D), and the token embeddings there (T, D)."""
    return ["metric", *(f"{kind}_grad" for kind in hooks.changeable(config)), "embed_grad", "embed"]


def gradient_files(length: int) -> tuple[str, str]:
    """The gradient graph of inputs `length` long, and its own tensors."""
    return f"{GRADIENT_PREFIX}{length}.onnx", f"{GRADIENT_PREFIX}{length}.data"


# The first two graphs with float16 weights and arithmetic inside, float32 inputs and outputs:
# for the CUDA execution provider (precision="fp16").
FP16_ONNX_FILENAME = "model_fp16.onnx"
EMBEDDINGS_FP16_ONNX_FILENAME = "model_embeddings_fp16.onnx"
# The fused full graph and the embeddings graph with 8-bit matrix weights (MatMulNBits), for
# the CPU provider: for models that do not fit in float32 (precision="int8").
INT8_ONNX_FILENAME = "model_int8.onnx"
EMBEDDINGS_INT8_ONNX_FILENAME = "model_embeddings_int8.onnx"
PRECISIONS = ("fp32", "fp16", "int8")
# Every graph of one precision points into that precision's one weights file (ONNX external
# data): a model costs its weights once on disk. Directories written before keep their
# weights inside each graph (or in `<graph>.data`), and load as they are.
WEIGHTS_FILENAMES = {
    "fp32": "weights.data",
    "fp16": "weights_fp16.data",
    "int8": "weights_int8.data",
}
# The float32 weights file's index (export/weights.py write_index): every parameter of the
# encoder by name, a linear weight as `W.T`; directories written before 2026-12-02 lack it.
WEIGHTS_INDEX_FILENAME = "weights.json"
TOKENIZER_FILENAME = "tokenizer.json"  # a Hugging Face `tokenizers` file, for tokenizer="hf"
# An imported checkpoint's chat template: {"template": Jinja, "bos_token", "eos_token"}
CHAT_TEMPLATE_FILENAME = "chat_template.json"
REPORT_FILENAME = "export_report.json"  # what export measured (parity, sizes, versions)
CONFIG_METADATA_KEY = "attnserve.config"  # ONNX metadata_props: the ModelConfig JSON
VERSIONS_METADATA_KEY = "attnserve.versions"  # ONNX metadata_props: exporter versions JSON
# Generation: one step with a KV cache (Encoder.decode), under the interventions' changes
# (change_inputs: the same inputs as the readouts graph's). In: input_ids int64 [batch, seq]
# (the new tokens), past_mask int64 [batch, past] (1: a key of the text, 0: padding) and
# each layer's past keys and values, float32 [batch, kv_heads, past, head_dim]; past >= 1
# (a prompt's past is one padding key: ONNX Runtime reduces no empty axis). Out: the
# logits after each text's last token, float32 [batch, vocab], and each layer's keys and
# values of the past + seq positions. Written where the model has an unembedding.
DECODE_ONNX_FILENAME = "model_decode.onnx"
DECODE_INPUTS = ("input_ids", "past_mask")
# Long texts: the embeddings and what each layer's scores are made of, its queries and keys
# after their norms and rotation (hook_rot_q, hook_rot_k), `attention_queries.{layer}` float32
# [batch, seq, heads, head_dim] and `attention_keys.{layer}` [batch, seq, kv_heads, head_dim]
# (an output per layer: stacked, they would be held twice at the graph's end); its attention is ONNX
# Runtime's GroupQueryAttention, which never holds a layer's T x T scores on CPU
# (export/group_query.py). The attention statistics are computed from these by query blocks.
QUERIES_ONNX_FILENAME = "model_queries.onnx"
QUERIES_NAME, KEYS_NAME = "attention_queries", "attention_keys"


def query_key_sites(config: ModelConfig) -> dict[str, str]:
    """The queries graph's outputs beside the embeddings, layer by layer, each its hook site:
    `attention_queries.{layer}` hook_rot_q, `attention_keys.{layer}` hook_rot_k."""
    sites = {}
    for layer in range(config.n_layers):
        sites[f"{QUERIES_NAME}.{layer}"] = hooks.ROT_Q.format(layer=layer)
        sites[f"{KEYS_NAME}.{layer}"] = hooks.ROT_K.format(layer=layer)
    return sites


def cache_names(config: ModelConfig, prefix: str) -> list[str]:
    """The decode graph's past (prefix "past_key_values") or present ("present") keys and
    values, layer by layer: `{prefix}.{layer}.key`, `{prefix}.{layer}.value` (the names
    transformers' and onnxruntime-genai's exports use)."""
    return [
        f"{prefix}.{layer}.{part}" for layer in range(config.n_layers) for part in ("key", "value")
    ]


@dataclass(frozen=True)
class GraphKind:
    """One kind of graph a model directory may hold: a row of GRAPHS, the one table the
    exporter plans what it writes from (export/model_dir.py) and the service opens graphs
    by (service/ort/graphs.py)."""

    kind: str
    filename: str  # its float32 file; another precision's adds `_{precision}` (graph_file)
    holds: str  # what it computes
    # "traced" from the model, or the kind whose float32 graph it is made from (the full
    # graph's trace keeps the readouts before it loses them; the fused from the embeddings)
    made_from: str
    precisions: tuple[str, ...] = PRECISIONS
    # where a precision's graph is converted from another kind's float32 graph (int8's full
    # graph: from the fused one, where there is one)
    sources: tuple[tuple[str, str], ...] = ()
    logits: bool = False  # its outputs are logits, dot products over d_model: 10x the room
    on_demand: bool = False  # opened when first asked for (else when the model loads)
    marker: str = ""  # an output only it has: a directory written before it lacks it
    # whether a directory exported from a config holds it (None: every one)
    needs: Callable[[ModelConfig], bool] | None = None


def _has_head(config: ModelConfig) -> bool:
    return config.unembedding != "none"


GRAPHS: dict[str, GraphKind] = {
    row.kind: row
    for row in (
        GraphKind("full", ONNX_FILENAME, "embeddings and attentions", "traced",
                  sources=(("int8", "fused"),)),
        GraphKind("embeddings", EMBEDDINGS_ONNX_FILENAME, "embeddings only", "traced"),
        GraphKind("queries", QUERIES_ONNX_FILENAME, "embeddings, rotated queries and keys",
                  "traced", on_demand=True, marker=f"{QUERIES_NAME}.0"),
        GraphKind("lens", LENS_ONNX_FILENAME, "the logit lens of residual rows", "traced",
                  logits=True, on_demand=True, marker=LOGITS_NAME, needs=_has_head),
        GraphKind("attribution", ATTRIBUTION_ONNX_FILENAME, "direct logit attribution",
                  "traced", logits=True, on_demand=True,
                  marker=ATTRIBUTION_OUTPUTS["heads"],
                  needs=lambda c: _has_head(c) and c.attribution_refusal is None),
        GraphKind("decode", DECODE_ONNX_FILENAME, "one generation step with a KV cache",
                  "traced", logits=True, on_demand=True, marker="present.0.key",
                  # a prompt and one token to generate after it
                  needs=lambda c: _has_head(c) and c.max_seq_len >= 2),
        GraphKind("readouts", READOUTS_ONNX_FILENAME, "the full graph under changes, with "
                  "the residual stream and its parts", "full", on_demand=True,
                  marker=RESIDUAL_STREAM_NAME),
        GraphKind("fused", FUSED_ONNX_FILENAME, "the full graph through the fused Attention "
                  "op (CPU)", "embeddings", precisions=("fp32",),
                  needs=lambda c: c.fuses_attention),
    )
}  # fmt: skip
ON_DEMAND = tuple(row.kind for row in GRAPHS.values() if row.on_demand)


def graph_file(kind: str, precision: str = "fp32") -> str:
    """The file of a graph kind in a precision: model_lens.onnx in fp32, model_lens_int8.onnx
    in int8 (its matrices in 8 bits, made from the float32 one)."""
    if precision not in GRAPHS[kind].precisions:
        raise ValueError(f"{kind} graphs come in {GRAPHS[kind].precisions}, not {precision!r}")
    filename = GRAPHS[kind].filename
    return filename if precision == "fp32" else filename.replace(".onnx", f"_{precision}.onnx")


def graph_kinds(config: ModelConfig) -> list[str]:
    """The kinds of graph a directory exported from `config` holds, in the table's order."""
    return [row.kind for row in GRAPHS.values() if row.needs is None or row.needs(config)]


def graph_source(kind: str, precision: str) -> str:
    """The kind whose float32 graph a precision's graph of `kind` is converted from."""
    return dict(GRAPHS[kind].sources).get(precision, kind)


class ModelDirectory:
    """A model directory as the service reads it: which file holds which graph. The exporter
    writes it with the same file name constants (export/model_dir.py)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def graph(self, precision: str, attention: bool) -> Path:
        """The full graph (attention=True) or the embeddings-only graph of a precision."""
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        return self.path / graph_file("full" if attention else "embeddings", precision)

    @property
    def precisions(self) -> tuple[str, ...]:
        """The precisions whose full graph the directory holds."""
        return tuple(p for p in PRECISIONS if self.graph(p, attention=True).is_file())

    def weight_bytes(self, precision: str) -> int:
        """The bytes of a precision's weights: its weights file, or (directories written
        before there was one) its full graph with any external data beside it."""
        shared = self.path / WEIGHTS_FILENAMES[precision]
        if shared.is_file():
            return shared.stat().st_size
        graph = self.graph(precision, attention=True)
        beside = graph.with_name(graph.name + ".data")
        return sum(f.stat().st_size for f in (graph, beside) if f.is_file())

    def fidelity(self, graph: str) -> dict[str, float]:
        """What the export measured of a graph against PyTorch float32 (export_report.json):
        attention_max_abs_diff and embedding_cosine_min, or nothing where not recorded."""
        return self._report().get("fidelity", {}).get(graph, {})

    def output_fidelity(self, graphs: Iterable[str]) -> dict[str, float]:
        """Per output of `graphs`, the largest difference from PyTorch float32 the export
        measured (what its parity gate judged: export_report.json's output_fidelity)."""
        recorded = self._report().get("output_fidelity", {})
        worst: dict[str, float] = {}
        for graph in graphs:
            for output, value in recorded.get(graph, {}).items():
                worst[output] = max(worst.get(output, 0.0), value)
        return worst

    @property
    def fidelity_scope(self) -> str:
        """What the export measured fidelity on: the whole model, or its first layers."""
        return self._report().get("parity_scope", "")

    def _report(self) -> dict[str, Any]:
        report = self.path / REPORT_FILENAME
        return json.loads(report.read_text()) if report.is_file() else {}

    def sae_bytes(self) -> int:
        """The bytes of every SAE's weights the directory holds (what serving them costs)."""
        root = self.path / SAES_DIRNAME
        return sum(f.stat().st_size for f in root.glob("*/*.data")) if root.is_dir() else 0

    def transcoder_sets(self) -> list[str]:
        """The transcoder sets with a replacement model's backward graph, by name."""
        return sorted(
            p.name.removeprefix(BACKWARD_PREFIX).removesuffix(".json")
            for p in self.path.glob(f"{BACKWARD_PREFIX}*.json")
            if p.with_suffix(".onnx").is_file()
        )

    def gradient_lengths(self) -> list[int]:
        """The lengths the directory holds a gradient graph of, shortest first."""
        stems = (
            p.stem.removeprefix(GRADIENT_PREFIX) for p in self.path.glob(f"{GRADIENT_PREFIX}*.onnx")
        )
        return sorted(int(stem) for stem in stems if stem.isdigit())

    def saes(self) -> dict[str, SAEConfig]:
        """The sparse autoencoders the directory holds, by name."""
        root = self.path / SAES_DIRNAME
        found = sorted(root.glob(f"*/{SAE_JSON}")) if root.is_dir() else []
        return {
            p.parent.name: SAEConfig.from_dict(json.loads(p.read_text())["config"]) for p in found
        }

    @property
    def fused_graph(self) -> Path:
        """The full graph through the fused Attention op (float32; for the CPU provider)."""
        return self.path / graph_file("fused")

    @property
    def tokenizer_file(self) -> Path:
        return self.path / TOKENIZER_FILENAME

    @property
    def chat_template_file(self) -> Path:
        return self.path / CHAT_TEMPLATE_FILENAME

    def __repr__(self) -> str:
        return f"ModelDirectory({str(self.path)!r})"
