"""What a request asks of a model, whatever its wire: the inputs and the options, as plain
values. Every transport translates into these (attnserve.v1's messages in service/v1/, the
Open Inference Protocol's tensors and parameters in service/oip/, OpenAI's lists in
service/http/openai.py); the plan (core/plan.py) checks them against the model.

The options are named as attnserve.v1's EncodeOptions names its fields, so that an error
names the field ("options.attention.layers: 7 is outside [-2, 2)") in the words of the
API's reference; the Open Inference Protocol renames them to its parameters
(service/oip/parameters.py). Index lists left empty mean all of them; negative indices
count from the end.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import numpy as np

Input = str | np.ndarray  # a text, or its token ids (1-D, int64)


class Pooling(StrEnum):
    NONE = "none"
    MEAN = "mean"
    LAST = "last"  # in a causal model only the last token has seen the whole input


class HeadReduction(StrEnum):
    NONE = "none"
    MEAN = "mean"
    MAX = "max"


class Layout(StrEnum):
    FULL = "full"
    CAUSAL_PACKED = "causal_packed"  # the lower triangle, row by row


class LensNorm(StrEnum):
    FROZEN = "frozen"  # every state scaled by the last state's final-norm statistics
    OWN = "own"  # each state normalised by its own


@dataclass(frozen=True)
class AttentionOptions:
    layers: tuple[int, ...] = ()
    heads: tuple[int, ...] = ()
    query_positions: tuple[int, ...] = ()  # the rows; none: every row
    float16: bool = False
    layout: Layout = Layout.FULL
    head_reduction: HeadReduction | None = None  # None: mean with rollout, else none
    rollout: bool = False
    top_k: int = 0  # 0: every key
    head_entropy: bool = False
    omit_weights: bool = False
    row_entropy: bool = False
    received: bool = False
    key_start: int = 0  # a tile of keys [key_start, key_end); key_end 0: through T
    key_end: int = 0


@dataclass(frozen=True)
class HiddenStatesOptions:
    layers: tuple[int, ...] = ()  # states 0..L
    positions: tuple[int, ...] = ()
    omit_states: bool = False
    norms: bool = False


@dataclass(frozen=True)
class PredictionsOptions:
    """The model's next-token predictions, or the logit lens of earlier states."""

    layers: tuple[int, ...] = ()  # states 0..L (the lens only)
    positions: tuple[int, ...] = ()
    top_k: int = 0  # 0: the default
    target_ids: tuple[int, ...] = ()
    logits: bool = False
    lens_norm: LensNorm = LensNorm.FROZEN


@dataclass(frozen=True)
class AttributionOptions:
    positions: tuple[int, ...] = ()
    target_ids: tuple[int, ...] = ()
    contrast_ids: tuple[int, ...] = ()  # none, or one per target


@dataclass(frozen=True)
class FeaturesOptions:
    """Sparse-autoencoder features of the hook sites the named SAEs read."""

    saes: tuple[str, ...] = ()  # as `attnserve sae list` names them
    positions: tuple[int, ...] = ()
    top_k: int = 0  # 0: the default
    feature_ids: tuple[int, ...] = ()  # whose activations to return at every position
    dense: bool = False  # every feature's activation
    skip_first_token: bool = False  # leave position 0 out (its activations are outliers)
    skip_error_norm: bool = False  # no reconstruction error: the decoders stay unread


@dataclass(frozen=True)
class HeadScale:
    """One head's output times `scale`, plus `mean` (head_dim floats) where given."""

    layer: int
    head: int
    scale: float = 0.0
    mean: tuple[float, ...] = ()


@dataclass(frozen=True)
class Intervention:
    """A change of one hook site's value for one request (core/interventions.py)."""

    hook: str  # as TransformerLens names it: blocks.3.hook_resid_pre
    op: str  # "add" (x + scale * values), "set" (scale * values), "scale" (x * scale)
    values: np.ndarray | None = None  # float32 (width,) or one row per position
    scale: float | None = None  # add and set: times the values (None: 1); scale: the factor
    positions: tuple[int, ...] = ()  # none: every position
    heads: tuple[int, ...] = ()  # hook_z only: the heads changed (none: every head)
    feature: tuple[str, int] | None = None  # (SAE, feature id): its decoder row as values


@dataclass(frozen=True)
class CaptureOptions:
    """Hook sites' values to return, after the request's own changes."""

    hooks: tuple[str, ...] = ()
    positions: tuple[int, ...] = ()  # none: every position


class PatchingMethod(StrEnum):
    ACTIVATION = "activation"  # a run per place, with the source's value there
    # its linear estimate: at each place (source - input) times the gradient of the
    # difference at the input's run, from one run and one backward (model/gradient.py)
    ATTRIBUTION = "attribution"


@dataclass(frozen=True)
class PatchingOptions:
    """Activation patching: the input run once per layer and position (or head) with the
    source's value of one kind of site there (core/interventions.py); or attribution
    patching, its linear estimate."""

    source: Input  # the clean input, as long as each input
    hook: str  # the kind of site: resid_pre, attn_out, mlp_out, ... or z
    target: int | str  # a token's id, or its text (one token)
    contrast: int | str
    method: PatchingMethod | str = PatchingMethod.ACTIVATION


@dataclass(frozen=True)
class EncodeOptions:
    truncate: bool = False  # cut inputs past max_seq_len instead of refusing them
    pooling: Pooling = Pooling.NONE
    token_embeddings: bool = True
    return_tokens: bool = False
    attention: AttentionOptions | None = None
    hidden_states: HiddenStatesOptions | None = None
    predictions: PredictionsOptions | None = None
    logit_lens: PredictionsOptions | None = None
    attribution: AttributionOptions | None = None
    head_mask: tuple[HeadScale, ...] = ()
    features: FeaturesOptions | None = None
    interventions: tuple[Intervention, ...] = ()
    capture: CaptureOptions | None = None
    patching: PatchingOptions | None = None


@dataclass(frozen=True)
class GenerateOptions:
    """What a client asks of one generation (OpenAI's completion parameters, vLLM's
    `ignore_eos`, attnserve's interventions); checked by service/generate/plan.py."""

    max_tokens: int | None = None  # None: 16 (OpenAI's), or the context's room if less
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    # changes of the run: those with positions change the prompt's, the others every
    # position, the prompt's and each generated one's
    interventions: tuple[Intervention, ...] = ()
