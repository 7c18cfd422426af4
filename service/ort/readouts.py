"""What a request reads off a model's readouts graphs (service/ort/graphs.py opens them):
the residual stream and its parts under any changes (model_readouts.onnx), the logit lens
of any residual rows (model_lens.onnx) and direct logit attribution of any positions
(model_attribution.onnx), row by row of a batch."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from attnserve.model.artifacts import (
    ATTRIBUTION_INPUTS,
    ATTRIBUTION_OUTPUTS,
    HEAD_MASK_NAME,
    HEAD_MEANS_NAME,
    LENS_INPUTS,
    LOGITS_NAME,
    PARTS_NAMES,
    PREDICTION_INPUTS,
    PREDICTION_OUTPUTS,
    RESIDUAL_STREAM_NAME,
    unchanged,
)
from attnserve.model.config import ModelConfig
from attnserve.model.hooks import changeable
from attnserve.service.core.backend import (
    Attribution,
    AttributionSelection,
    Predictions,
    PredictionsSelection,
    ReadoutOutput,
    ReadoutSelection,
    SiteChange,
)
from attnserve.service.core.errors import InferenceError
from attnserve.service.core.readouts import ATTRIBUTION, CHANGES, LENS, STREAM
from attnserve.service.core.residual import attribution_chunk_rows, lens_chunk_rows
from attnserve.service.ort.graphs import GraphSessions


@dataclass(frozen=True)
class StreamRun:
    """One run of the readouts graph over a batch (B sequences, right-padded to T)."""

    embeddings: np.ndarray  # float32 (B, T, D)
    residual: np.ndarray  # float32 (B, L+1, T, D): x_0 .. x_L
    attentions: np.ndarray | None  # float32 (B, L, H, T, T), when asked for
    # The graph's other readout_sites outputs asked for, by name: (B, L, T, width) each
    sites: dict[str, np.ndarray]

    def output(self, name: str) -> np.ndarray:
        """The readouts graph's output `name` (the residual stream, or one asked for)."""
        value = self.residual if name == RESIDUAL_STREAM_NAME else self.sites.get(name)
        if value is None:
            raise InferenceError(f"the readouts run did not return {name}")
        return value

    @property
    def heads(self) -> np.ndarray:
        """(B, L, T, H*d_k): each head's output as W_O reads it."""
        return self.output(PARTS_NAMES[0])

    @property
    def mlps(self) -> np.ndarray:
        """(B, L, T, D): each MLP's output."""
        return self.output(PARTS_NAMES[1])


@dataclass(frozen=True)
class LensOutput:
    """The logit lens of some residual rows (N of them): what the model would predict if
    each row were its last layer's."""

    logits: np.ndarray | None  # float32 (N, V), when asked for
    top_ids: np.ndarray  # int64 (N, k), most probable first
    top_probabilities: np.ndarray  # float32 (N, k)
    target_probabilities: np.ndarray  # float32 (N, n): of the target ids asked for


def change_feeds(
    config: ModelConfig,
    head_mask: bool,
    changes: Sequence[Mapping[str, SiteChange]],
    length: int,
) -> dict[str, np.ndarray]:
    """The readouts graph's change inputs for a batch of len(changes) rows padded to
    `length`: each row's changes, nothing changed elsewhere (a kind no row changes costs its
    smallest shape). `head_mask`: a graph written before interventions, which takes hook_z's
    as a head mask and means (the plan refuses other changes there)."""
    batch = len(changes)
    if head_mask:
        mask = np.ones((batch, config.n_layers, config.n_heads), dtype=np.float32)
        means = np.zeros((*mask.shape, config.head_dim), dtype=np.float32)
        for row, change in enumerate(changes):
            if "z" in change:
                mask[row] = change["z"].scale[:, 0, :, 0]
                means[row] = change["z"].add[:, 0]
        return {HEAD_MASK_NAME: mask, HEAD_MEANS_NAME: means}
    feeds = unchanged(config)
    for kind in changeable(config):
        rows = [(row, change[kind]) for row, change in enumerate(changes) if kind in change]
        if not rows:
            continue
        positions = length if any(c.scale.shape[1] > 1 for _, c in rows) else 1
        scale = np.ones((batch, config.n_layers, positions, *rows[0][1].scale.shape[2:]), "f4")
        add = np.zeros((batch, config.n_layers, positions, *rows[0][1].add.shape[2:]), "f4")
        for row, site in rows:
            n = site.scale.shape[1]  # 1: every position; else the row's own (padded after)
            scale[row, :, : n if n > 1 else None] = site.scale
            add[row, :, : n if n > 1 else None] = site.add
        feeds[f"{kind}_scale"], feeds[f"{kind}_add"] = scale, add
        feeds[f"{kind}_gate"] = np.ones_like(feeds[f"{kind}_gate"])
    return feeds


class Readouts:
    """The readouts of one served model, run on its graphs' sessions."""

    def __init__(self, graphs: GraphSessions) -> None:
        self.graphs = graphs
        self.config = graphs.config

    def stream(
        self,
        input_ids: np.ndarray,
        changes: Sequence[Mapping[str, SiteChange]] | Mapping[str, np.ndarray],
        attentions: bool = True,
        sites: Collection[str] = (),
    ) -> StreamRun:
        """input_ids int64 (B, T), right-padded, and each row's changes (or the graph's
        change inputs themselves, artifacts.change_inputs: patching's) -> the readouts
        graph's run: the attentions only with `attentions`, of its other outputs
        (readout_sites) the `sites` named (what is not asked for is not copied out of ONNX
        Runtime)."""
        c = self.config
        session = self.graphs.session(STREAM)
        sites = [name for name in sites if name != RESIDUAL_STREAM_NAME]
        names = [c.embeddings_name, RESIDUAL_STREAM_NAME]
        names += [c.attentions_name] if attentions else []
        names += sites
        feeds = {c.input_name: input_ids}
        if isinstance(changes, Mapping):
            feeds |= unchanged(c) | dict(changes)
        else:
            head_mask = CHANGES not in self.graphs.available
            feeds |= change_feeds(c, head_mask, changes, input_ids.shape[1])
        try:
            values = dict(zip(names, session.run(names, feeds), strict=True))
        except Exception as exc:  # ORT raises its own untyped errors
            raise InferenceError(f"ONNX Runtime failed on the readouts: {exc}") from exc
        return StreamRun(
            values[c.embeddings_name],
            values[RESIDUAL_STREAM_NAME],
            values.get(c.attentions_name),
            {name: values[name] for name in sites},
        )

    def lens(
        self,
        residual: np.ndarray,
        last: np.ndarray,
        k: int = 1,
        targets: np.ndarray | None = None,
        logits: bool = False,
    ) -> LensOutput:
        """Residual rows (N, D) of any layers and the last layer's at the same positions
        (N, D) -> the logit lens: the k most probable ids and their probabilities, those
        of `targets` (N, n) ids, and with `logits` the logits (N, V) (with residual = last,
        the model's own). Large N runs in chunks of bounded memory."""
        if targets is None:
            targets = np.zeros((len(residual), 0), dtype=np.int64)
        names = [LOGITS_NAME, *PREDICTION_OUTPUTS] if logits else list(PREDICTION_OUTPUTS)
        k_input = np.array([k], dtype=np.int64)
        rows = dict(
            zip((*LENS_INPUTS, PREDICTION_INPUTS[1]), (residual, last, targets), strict=True)
        )
        step = lens_chunk_rows(self.config.vocab_size)
        values = self.graphs.run_rows(LENS, names, rows, step, {PREDICTION_INPUTS[0]: k_input})
        return LensOutput(*values) if logits else LensOutput(None, *values)

    def attribution(
        self,
        heads: np.ndarray,
        mlps: np.ndarray,
        first: np.ndarray,
        last: np.ndarray,
        targets: np.ndarray,
    ) -> dict[str, np.ndarray]:
        """Direct logit attribution at N positions (model/encoder.py Encoder.attribution):
        heads (N, L, H*d_k), mlps (N, L, D), x_0 and x_L (N, D), targets (N, n) -> each
        part by its name (ATTRIBUTION_PARTS): heads (N, n, L, H), attention biases, MLPs
        (N, n, L), the embeddings and the constants (N, n). Large N runs in chunks of
        bounded memory."""
        step = attribution_chunk_rows(self.config, targets.shape[1])
        inputs = (heads, mlps, first, last, targets)
        rows = dict(zip(ATTRIBUTION_INPUTS, inputs, strict=True))
        values = self.graphs.run_rows(ATTRIBUTION, list(ATTRIBUTION_OUTPUTS.values()), rows, step)
        return dict(zip(ATTRIBUTION_OUTPUTS, values, strict=True))

    def read_row(self, run: StreamRun, row: int, selection: ReadoutSelection) -> ReadoutOutput:
        """One sequence's readouts (attention aside) from row `row` of a readouts run."""
        embeddings, stream = run.embeddings[row], run.residual[row]
        states = norms = None
        hidden = selection.hidden_states
        if hidden is not None:
            # State L is the final norm's output, which the embeddings are (the planner
            # refuses it where a projection follows).
            vectors = np.stack(
                [
                    (embeddings if layer == self.config.n_layers else stream[layer])[
                        list(hidden.positions)
                    ]
                    for layer in hidden.layers
                ]
            )  # (layers, positions, D)
            norms = np.linalg.norm(vectors, axis=-1) if hidden.norms else None
            states = vectors if hidden.states else None
        capture = selection.capture
        activations = None
        if capture is not None:
            positions = list(capture.positions)
            activations = {
                hook: run.output(output)[row, index, positions].reshape(len(positions), *shape)
                for hook, (output, index, shape) in capture.sites.items()
            }
        return ReadoutOutput(
            activations=activations,
            hidden_states=states,
            hidden_state_norms=norms,
            predictions=self._predictions(stream, selection.predictions),
            lens=self._predictions(stream, selection.lens),
            attribution=self._attribution(run, row, selection.attribution),
        )

    def _attribution(
        self, run: StreamRun, row: int, selection: AttributionSelection | None
    ) -> Attribution | None:
        if selection is None:
            return None
        positions = list(selection.positions)
        ids = np.asarray([*selection.targets, *selection.contrasts], dtype=np.int64)
        heads, mlps = (
            np.ascontiguousarray(parts[row][:, positions].swapaxes(0, 1))  # (N, L, .)
            for parts in (run.heads, run.mlps)
        )
        stream = run.residual[row]
        first, last = stream[0, positions], stream[-1, positions]  # (N, D)
        parts = self.attribution(heads, mlps, first, last, np.tile(ids, (len(positions), 1)))
        n = len(selection.targets)
        if selection.contrasts:  # logit(target) - logit(contrast): each part's difference
            parts = {name: part[:, :n] - part[:, n:] for name, part in parts.items()}
        return Attribution(**parts)

    def _predictions(
        self, stream: np.ndarray, selection: PredictionsSelection | None
    ) -> Predictions | None:
        if selection is None:
            return None
        layers, positions = list(selection.layers), list(selection.positions)
        grid = (len(layers), len(positions))
        residual = stream[layers][:, positions].reshape(-1, stream.shape[-1])  # (N, D)
        if selection.own_norm:  # each state read as if it were the last: its own scale
            last = residual
        else:  # the last state's scale at each position, frozen for every layer
            last = np.repeat(stream[-1, positions][None], len(layers), 0).reshape(residual.shape)
        targets = np.tile(np.asarray(selection.targets, dtype=np.int64), (len(residual), 1))
        out = self.lens(residual, last, selection.top_k, targets, selection.logits)
        return Predictions(
            top_ids=out.top_ids.astype(np.int32).reshape(*grid, -1),
            top_probabilities=out.top_probabilities.reshape(*grid, -1),
            target_probabilities=out.target_probabilities.reshape(*grid, -1)
            if selection.targets
            else None,
            logits=None if out.logits is None else out.logits.reshape(*grid, -1),
        )
