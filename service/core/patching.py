"""A request's activation patching, planned: the kind of site patched, the source as long as
the input, the two answer tokens, and the work bounded; or attribution patching, by the
gradient graph the input fits (service/ort/patching.py runs both)."""

from __future__ import annotations

from attnserve.model.config import ModelConfig
from attnserve.model.hooks import kind_heads
from attnserve.service.core.backend import PatchingSelection
from attnserve.service.core.errors import InvalidInputError
from attnserve.service.core.interventions import returned
from attnserve.service.core.request import PatchingMethod, PatchingOptions
from attnserve.service.core.residual import lens_work_bytes
from attnserve.service.core.view import InputContext

# The most tokens one patching grid runs (runs x input length): GPT-2 small's 12 x 20 grid is
# 4,800; this bound keeps one request from holding a model's worker for hours.
MAX_PATCHED_TOKENS = 2**18
# Activation patching's runs go through the readouts graph this many bytes of work at a time.
PATCHING_CHUNK_BYTES = 256 * 1024 * 1024


def plan_patching(patching: PatchingOptions, at: InputContext) -> PatchingSelection:
    """Activation patching of the input against the options' source (its ids, checked)."""
    field, config, source, length = "options.patching", at.config, at.source, at.length
    assert source is not None  # tokenized and checked by the plan
    index = at.index
    kinds = returned(config)
    if patching.hook not in kinds:
        raise InvalidInputError(
            f"{field}.hook: {patching.hook!r} is not one of {list(kinds)} (the sites' kinds: "
            "each layer and position is patched, or with z each layer and head)"
        )
    if len(source) != length:
        raise InvalidInputError(
            f"{field}.source: {len(source)} tokens, inputs[{index}] has {length}: a patched "
            "run takes a place of the source's run, so they must be as long"
        )
    methods = [str(method) for method in PatchingMethod]
    if patching.method not in methods:
        raise InvalidInputError(f"{field}.method: {patching.method!r} is not one of {methods}")
    gradient_length = 0
    if patching.method == PatchingMethod.ATTRIBUTION:
        gradient_length = _gradient_length(f"{field}.method", at)
    places = config.n_layers * (kind_heads(config, patching.hook) or length)
    if not gradient_length and places * length > MAX_PATCHED_TOKENS:
        raise InvalidInputError(
            f"{field}: {places:,} patched runs of inputs[{index}]'s {length} tokens are "
            f"{places * length:,} tokens to run, more than {MAX_PATCHED_TOKENS:,}; patch a "
            "shorter input (or hook z: a run per head, not per position)"
        )
    tokens = []
    for name in ("target", "contrast"):
        token = getattr(patching, name)
        if isinstance(token, str):  # resolved by the plan, which has the tokenizer
            raise InvalidInputError(f"{field}.{name}: {token!r} is not a token id")
        if not 0 <= token < config.vocab_size:
            raise InvalidInputError(
                f"{field}.{name}_id: {token} is outside the vocabulary [0, {config.vocab_size})"
            )
        tokens.append(token)
    target, contrast = tokens
    return PatchingSelection(patching.hook, source, target, contrast, gradient_length)


def _gradient_length(field: str, at: InputContext) -> int:
    """The shortest gradient graph an input of at.length tokens fits (padded to it)."""
    lengths = at.view.gradient_lengths
    fits = [length for length in lengths if length >= at.length]
    if not fits:
        held = f"up to {max(lengths)} tokens" if lengths else "none"
        raise InvalidInputError(
            f"{field}: attribution patching of inputs[{at.index}]'s {at.length} tokens needs "
            f"a gradient graph of at least that length; this model's: {held} (`attnserve "
            f"gradient MODEL_DIR --lengths {at.length}` writes one)"
        )
    return min(fits)


def patching_bytes(selection: PatchingSelection, config: ModelConfig) -> int:
    """The grid: a value per layer and position (or head)."""
    return config.n_layers * max(len(selection.source), config.n_heads) * 4


def patching_work_bytes(selection: PatchingSelection, config: ModelConfig, length: int) -> int:
    """Its runs' chunk (attribution patching: its backward's), and the lens's of their rows."""
    runs = PATCHING_CHUNK_BYTES
    if selection.gradient_length:
        runs = gradient_work_bytes(config, selection.gradient_length)
    return runs + lens_work_bytes(selection, config, length)


def gradient_work_bytes(config: ModelConfig, length: int) -> int:
    """What a gradient graph of `length` holds at its peak: the forward's values its
    backward reads (each layer's scores, softmax and mask, (H, T, T) each, and a dozen of
    the stream's or the MLP's width per position) and as many gradients again."""
    L, H, T = config.n_layers, config.n_heads, length
    width = max(config.d_model, config.d_ff, config.n_heads * config.head_dim)
    return 2 * 4 * L * (3 * H * T * T + 12 * T * width)


def patching_chunk_rows(config: ModelConfig, length: int) -> int:
    """How many patched runs of `length` tokens go through the readouts graph at a time:
    each computes its attention weights (L, H, T, T) and holds its residual stream and a few
    more of its width (L + 1, T, D)."""
    L, H, D = config.n_layers, config.n_heads, max(config.d_model, config.n_heads * config.head_dim)
    per_row = 4 * (L * H * length * length + 6 * (L + 1) * length * D)
    return max(1, PATCHING_CHUNK_BYTES // per_row)
