"""The seam between the batcher and whatever runs the model.

The batcher and the transports see only this protocol and its value types, which import
no engine; `OrtRuntime` (service/ort/runtime.py) implements it with ONNX Runtime sessions, and
the batcher's tests implement it with a few lines of numpy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from attnserve.model.config import ModelConfig
from attnserve.model.sae_config import SAEConfig
from attnserve.service.core.replacement import ReplacementModel


@dataclass(frozen=True)
class AttentionSelection:
    """One input's attention request, validated: indices are in range and absolute."""

    layers: tuple[int, ...]  # ascending when rollout
    heads: tuple[int, ...]
    rows: tuple[int, ...] | None = None  # absolute query positions; None: every row
    reduction: str = "none"  # over heads: "none", "mean", "max" (rollout: never "none")
    rollout: bool = False
    top_k: int = 0  # 0: off
    entropy: bool = False
    weights: bool = True  # False: only the summaries (entropy, top-k indices)
    float16: bool = False
    packed: bool = False  # causal-packed layout (every row, no top_k)
    row_entropy: bool = False  # each row's entropy, per head
    received: bool = False  # each key's attention summed over the rows
    key_range: tuple[int, int] | None = None  # a tile: the weights of keys [start, end)
    # computed by query blocks from the queries and keys (never a layer's T x T scores)
    blocked: bool = False


@dataclass(frozen=True)
class AttentionOutput:
    """What one input's result carries besides embeddings, in wire dtypes."""

    rows: np.ndarray  # (R,) the absolute query positions of the rows axis
    weights: np.ndarray | None  # (L', H', R, T | k) or packed (L', H', T (T + 1) / 2)
    indices: np.ndarray | None  # int32, weights' shape: key positions of the top-k
    entropy: np.ndarray | None  # float32 (L', H')
    row_entropy: np.ndarray | None = None  # float32 (L', H', R)
    received: np.ndarray | None = None  # float32 (L', H' or 1 when reduced, T)


@dataclass(frozen=True)
class HiddenStatesSelection:
    """Residual-stream vectors of one input: states in [0, L] (L: after the final norm)."""

    layers: tuple[int, ...]
    positions: tuple[int, ...]  # absolute
    states: bool = True
    norms: bool = False


@dataclass(frozen=True)
class PredictionsSelection:
    """Next-token distributions of one input: the logit lens of `layers` (L alone: the
    model's own predictions) at `positions`."""

    layers: tuple[int, ...]  # residual-stream states, in [0, L]
    positions: tuple[int, ...]  # absolute
    top_k: int
    targets: tuple[int, ...] = ()
    logits: bool = False
    # each state normalised by its own statistics, not the last state's scale (the lens)
    own_norm: bool = False


@dataclass(frozen=True)
class AttributionSelection:
    """Direct logit attribution of one input: each target's logit (less its contrast's,
    where given) at `positions`, split into what each part of the residual stream wrote."""

    positions: tuple[int, ...]  # absolute
    targets: tuple[int, ...]
    contrasts: tuple[int, ...] = ()  # empty, or one per target


@dataclass(frozen=True)
class FeaturesSelection:
    """Sparse-autoencoder features of one input: each SAE's at `positions`."""

    saes: tuple[str, ...]
    widths: tuple[int, ...]  # each SAE's d_sae
    positions: tuple[int, ...]  # absolute
    top_k: int
    feature_ids: tuple[int, ...] = ()
    dense: bool = False
    error_norm: bool = True  # the reconstruction's error (the decoders read)
    # the readouts graph's outputs the SAEs read (model/readout_sites.py)
    sites: tuple[str, ...] = ()


@dataclass(frozen=True, eq=False)
class SiteChange:
    """One input's change of every layer's site of one kind (model/hooks.py CHANGEABLE):
    x -> x * scale + add, at every position (axis 1 of size 1) or at each of the input's."""

    scale: np.ndarray  # float32 (L, 1 or T, 1); hook_z: (L, 1 or T, H, 1)
    add: np.ndarray  # float32 (L, 1 or T, D); hook_z: (L, 1 or T, H, d_k)


@dataclass(frozen=True, eq=False)
class Clamp:
    """One input's SAE feature clamped at the SAE's site: x + (value - a(x)) * direction at
    `positions`, a(x) the feature's activation of the site as the run made it."""

    sae: str
    feature: int
    value: float
    kind: str  # of model/hooks.py CHANGEABLE: the SAE's site
    layer: int
    positions: tuple[int, ...]  # absolute
    direction: np.ndarray  # float32 (d_in,): the feature's decoder row


@dataclass(frozen=True)
class CaptureSelection:
    """Hook sites' values of one input, after its changes: each site's place among the
    readouts graph's outputs (artifacts.stream_site) and the shape of one position's value."""

    sites: dict[str, tuple[str, int, tuple[int, ...]]]  # hook -> (output, index, shape)
    positions: tuple[int, ...]  # absolute


# Clean and corrupted logit differences closer than this make patching's "recovered" noise
# (the default model's Mary/John pair: 0.22 apart, "recovered" from -0.94 to 3.13).
MIN_PATCHING_GAP = 1.0


@dataclass(frozen=True, eq=False)
class PatchingSelection:
    """Activation patching of one input: for each layer and position (each layer and head
    for hook_z, at every position), its run with that place's value of `kind` taken from
    the source's run, read as logit(target) - logit(contrast) at the last position."""

    kind: str  # of model/hooks.py CHANGEABLE
    source: np.ndarray  # int64 (T,): the clean input
    target: int
    contrast: int
    # attribution patching instead: the grid's linear estimate by the gradient graph of
    # this length (model/artifacts.py gradient_files); 0: activation patching
    gradient_length: int = 0


@dataclass(frozen=True)
class Patching:
    """What a PatchingSelection makes."""

    values: np.ndarray  # float32 (L, T), hook_z: (L, H)
    clean: float  # the difference in the source's own run
    corrupted: float  # ... and in the input's
    # attribution patching's by-product: input-times-gradient saliency of the difference,
    # float32 (T,), each token's embedding times its gradient, summed over d_model
    saliency: np.ndarray | None = None

    @property
    def warning(self) -> str | None:
        """Why the grid's share of the clean difference ("recovered") means little, if it
        does: the clean and corrupted differences closer than MIN_PATCHING_GAP, where a
        share of their gap is mostly the runs' own noise."""
        gap = abs(self.clean - self.corrupted)
        if gap >= MIN_PATCHING_GAP:
            return None
        return (
            f"the clean and corrupted logit differences ({self.clean:.3f}, {self.corrupted:.3f}) "
            f"are {gap:.3f} apart, less than {MIN_PATCHING_GAP:.1f}: what a patched place brings "
            "back of that gap is mostly noise; choose texts on which the answer moves more"
        )


@dataclass(frozen=True, eq=False)
class ReadoutSelection:
    """One input's request of what only the readouts graphs have: changes of its sites and
    SAE clamps, the residual stream, hook sites captured, predictions and the lens,
    attribution, SAE features, activation patching. Everything it asks is computed under
    the changes."""

    # by kind of site (model/hooks.py CHANGEABLE); the head mask is a change of hook_z
    changes: Mapping[str, SiteChange] = field(default_factory=dict)
    clamps: tuple[Clamp, ...] = ()  # after the changes, each site in the forward's order
    capture: CaptureSelection | None = None
    patching: PatchingSelection | None = None
    attention: AttentionSelection | None = None
    hidden_states: HiddenStatesSelection | None = None
    predictions: PredictionsSelection | None = None
    lens: PredictionsSelection | None = None
    attribution: AttributionSelection | None = None
    features: FeaturesSelection | None = None


@dataclass(frozen=True)
class Predictions:
    """What one PredictionsSelection makes, each (layers, positions, ...)."""

    top_ids: np.ndarray  # int32 (.., k), most probable first
    top_probabilities: np.ndarray  # float32 (.., k)
    target_probabilities: np.ndarray | None  # float32 (.., n); None without targets
    logits: np.ndarray | None  # float32 (.., V); None unless asked


@dataclass(frozen=True)
class Attribution:
    """What one AttributionSelection makes, each float32 (positions, targets, ...): the
    parts add up to each target's logit before any soft-cap (less its contrast's)."""

    heads: np.ndarray  # (.., L, H): each head through the output projection
    attention_biases: np.ndarray  # (.., L): each output projection's bias
    mlps: np.ndarray  # (.., L)
    embeddings: np.ndarray  # (..): the token and position embeddings, x_0
    constants: np.ndarray  # (..): the final norm's and the unembedding's biases


@dataclass(frozen=True)
class Features:
    """What one FeaturesSelection makes, each with a first axis over its SAEs, then the
    positions."""

    top_ids: np.ndarray  # int64 (saes, positions, k), strongest first; -1 past the active
    top_activations: np.ndarray  # float32 (saes, positions, k); 0 past the active
    l0: np.ndarray  # int64 (saes, positions): how many features are active
    error_norm: np.ndarray | None  # float32 (saes, positions): |x - the reconstruction|
    feature_activations: np.ndarray | None  # float32 (saes, positions, n) of feature_ids
    activations: np.ndarray | None  # float32 (saes, positions, d_sae) when dense


@dataclass(frozen=True)
class ReadoutOutput:
    """What one input's ReadoutSelection makes besides embeddings."""

    attention: AttentionOutput | None = None
    hidden_states: np.ndarray | None = None  # float32 (layers, positions, D)
    hidden_state_norms: np.ndarray | None = None  # float32 (layers, positions)
    predictions: Predictions | None = None
    lens: Predictions | None = None
    attribution: Attribution | None = None
    features: Features | None = None
    activations: dict[str, np.ndarray] | None = None  # hook -> float32 (positions, ...)
    patching: Patching | None = None


@dataclass(frozen=True)
class WeightsInfo:
    """What GetModelInfo says of a model's weights (the server fills it from the backend)."""

    disk_bytes: int = 0  # the served precision's weights on disk
    resident_bytes: int = 0  # what the model's sessions hold of them in memory
    # against PyTorch float32, measured by the export's parity check (export_report.json)
    attention_max_abs_diff: float = 0.0
    embedding_cosine_min: float = 1.0
    # per output of the served graphs (readouts too), the largest difference measured
    output_fidelity: dict[str, float] = field(default_factory=dict)
    fidelity_scope: str = ""  # "the whole model", or the first layers it was measured on


class PromptRun(Protocol):
    """A prompt being run through the decode graph chunk by chunk, before it joins the
    batch (its keys and values grow with each chunk)."""

    def advance(self, tokens: int) -> np.ndarray | None:
        """Run the prompt's next `tokens` positions (fewer at its end) -> its next-token
        logits float32 (V,) once the whole prompt has run, else None."""


class DecodeBatch(Protocol):
    """The texts a model is generating, as one batch whose rows join and leave (one thread
    uses it: the engine's worker)."""

    @property
    def rows(self) -> int:
        """How many texts the batch holds; row i is the i-th joined of those still in it."""

    @property
    def cache_bytes(self) -> int:
        """What the rows' keys and values hold now."""

    def prefill(self, prompt: np.ndarray, changes: Mapping[str, SiteChange]) -> PromptRun:
        """A prompt, int64 (T,), to run under its changes (of the prompt's positions)."""

    def join(self, run: PromptRun, step_changes: Mapping[str, SiteChange]) -> None:
        """Add a prompt that has run as the last row; `step_changes` change its later
        positions."""

    def step(self, tokens: Sequence[int]) -> np.ndarray:
        """Each row's next token -> each row's next-token logits float32 (rows, V)."""

    def remove(self, row: int) -> None:
        """Take a row out (its text ended or its client went away)."""


class Backend(Protocol):
    """Runs batches of right-padded token ids. Inputs are already validated (the data
    plane's plan checks every id and length once, per request), so a backend never refuses
    an id."""

    @property
    def config(self) -> ModelConfig:
        """The served model's config (the one source of truth: read back from the model)."""

    @property
    def version(self) -> str:
        """Identifies the served weights; two different models never share it."""

    @property
    def provider(self) -> str:
        """Where the model runs: "cpu" or "cuda"."""

    @property
    def precision(self) -> str:
        """ "fp32", "fp16" or "int8" (what is computed inside; inputs and outputs stay
        float32)."""

    @property
    def graphs(self) -> frozenset[str]:
        """The graphs beside the served ones the precision has (model/artifacts.py GRAPHS'
        kinds; core/readouts.py names them): what `read` can compute, "readouts" (hidden
        states, head masks), "changes" (any site changed: interventions), "lens"
        (predictions, the logit lens) and "attribution"; "decode" (generation,
        `decode_batch`) and "queries" (long texts' attention statistics by query blocks).
        Empty where the directory has none of them."""

    @property
    def saes(self) -> Mapping[str, SAEConfig]:
        """The sparse autoencoders `read` serves features of, by name."""

    @property
    def gradient_lengths(self) -> Sequence[int]:
        """The prompt lengths `read` has a gradient graph of (attribution patching takes
        inputs up to the longest), shortest first."""

    def refresh_saes(self) -> bool:
        """Serve the SAEs added to (or removed from) the model directory since; whether they
        changed. A run already begun keeps what it planned with."""

    def feature_direction(self, sae: str, feature_id: int) -> np.ndarray:
        """The decoder row (d_in,) of feature `feature_id` of SAE `sae` (one of `saes`):
        what steering by the feature adds per unit of strength."""

    def attend(
        self, input_ids: np.ndarray, lengths: list[int], selections: list[AttentionSelection]
    ) -> tuple[np.ndarray, list[AttentionOutput]]:
        """int64 (B, T), right-padded -> embeddings float32 (B, T, D) and, per row, the
        attention its selection asks for (the full T x T weights stay inside)."""

    def read(
        self, input_ids: np.ndarray, lengths: list[int], selections: list[ReadoutSelection]
    ) -> tuple[np.ndarray, list[ReadoutOutput]]:
        """As attend, on the readouts graph: embeddings float32 (B, T, D) under each row's
        changes and, per row, what its selection asks for."""

    def embed(self, input_ids: np.ndarray) -> np.ndarray:
        """int64 (B, T) -> embeddings float32 (B, T, D), on the fastest path there is."""

    @property
    def transcoder_sets(self) -> Sequence[str]:
        """The transcoder sets `replacement` serves, as the directory holds them now."""

    def replacement(self, transcoders: str) -> ReplacementModel:
        """The replacement model of the transcoder set `transcoders` (`attnserve sae add` of
        a circuit-tracer set); UnsupportedError where the directory has no backward graph
        of that name."""

    def decode_batch(self) -> DecodeBatch:
        """An empty batch to generate texts in (UnsupportedError where the directory has no
        decode graph: written before generation, or a model without an unembedding)."""

    def release_memory(self) -> None:
        """Give memory freed since the last batch back to the OS (called when idle)."""

    def warmup(self) -> None:
        """Run a few shapes once so that first requests skip allocation and setup."""
