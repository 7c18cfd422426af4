"""The readouts graphs of a model directory in ONNX Runtime, and what a request reads off
them: the residual stream and its parts under any changes (model_readouts.onnx), the logit
lens of any residual rows (model_lens.onnx) and direct logit attribution of any positions
(model_attribution.onnx), each in the precision served (model_lens_int8.onnx: its matrices
in 8 bits, as model_int8.onnx's).

Their sessions open when first asked for, but for a model served by one session: that
session runs the readouts graph itself (service/ort/runtime.py), so reading the residual
stream adds no second copy of the weights. Where the model's memory layout allows copies of
the weights (service/models.py `session_layout`: not one session) they prepack them, as the
served graphs do: unpacked, every matrix product repacks its weights at every run (the lens
repacks the whole unembedding), which made a logit lens of 8 tokens cost 2.5x their
embeddings. In one session they read the weights where the file is mapped instead, adding
no copy (research/weights-in-memory); but for 8-bit graphs, which MatMulNBits would widen
to float32 whole at every run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
import onnxruntime as ort

from attnserve.model.artifacts import (
    ATTRIBUTION_INPUTS,
    ATTRIBUTION_ONNX_FILENAME,
    ATTRIBUTION_OUTPUTS,
    DECODE_ONNX_FILENAME,
    HEAD_MASK_NAME,
    HEAD_MEANS_NAME,
    LENS_INPUTS,
    LENS_ONNX_FILENAME,
    LOGITS_NAME,
    PARTS_NAMES,
    PREDICTION_INPUTS,
    PREDICTION_OUTPUTS,
    QUERIES_NAME,
    QUERIES_ONNX_FILENAME,
    READOUTS_ONNX_FILENAME,
    RESIDUAL_STREAM_NAME,
    ModelDirectory,
    readout_filename,
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
from attnserve.service.core.errors import InferenceError, UnsupportedError
from attnserve.service.core.readouts import (
    ATTRIBUTION,
    CHANGES,
    DECODE,
    LENS,
    QUERIES,
    STREAM,
    attribution_chunk_rows,
    lens_chunk_rows,
)


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


# kind -> (the graph's file, the output only it has)
_GRAPHS = {
    STREAM: (READOUTS_ONNX_FILENAME, RESIDUAL_STREAM_NAME),
    LENS: (LENS_ONNX_FILENAME, LOGITS_NAME),
    ATTRIBUTION: (ATTRIBUTION_ONNX_FILENAME, ATTRIBUTION_OUTPUTS["heads"]),
    DECODE: (DECODE_ONNX_FILENAME, "present.0.key"),
    QUERIES: (QUERIES_ONNX_FILENAME, f"{QUERIES_NAME}.0"),
}


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


class ReadoutGraphs:
    """The sessions of one served model's extra graphs (model/artifacts.py READOUT_GRAPHS:
    readouts, lens, attribution, decode, queries), each opened on first use."""

    def __init__(
        self,
        model_dir: ModelDirectory,
        config: ModelConfig,
        precision: str,
        open_session: Callable[[str, ort.SessionOptions], ort.InferenceSession],
        options: Callable[[], ort.SessionOptions],
        prepack: bool = False,
        stream: ort.InferenceSession | None = None,
        packed_decode: bool | None = None,
    ) -> None:
        """`open_session(path, options)` opens a graph on the model's provider; `options()`
        makes the server's session options; `prepack`: let the sessions copy the weights;
        `stream`: the readouts graph's session, open already (kept by `close`);
        `packed_decode`: whether the decode graph's does (None: as `prepack` says)."""
        self.model_dir = model_dir
        self.config = config
        self.precision = precision
        self._open_session = open_session
        self._options = options
        self.prepack = prepack
        self.packed_decode = prepack if packed_decode is None else packed_decode
        self._kept = {STREAM: stream} if stream is not None else {}
        self._sessions: dict[str, ort.InferenceSession] = dict(self._kept)
        self._lock = threading.Lock()
        available = {
            kind
            for kind, (filename, _) in _GRAPHS.items()
            if (model_dir.path / readout_filename(filename, precision)).is_file()
        }
        if STREAM in available and HEAD_MASK_NAME not in self._stream_graph("inputs"):
            available.add(CHANGES)  # exported with interventions, not a head mask alone
        self.available = frozenset(available)

    def stream_outputs(self) -> frozenset[str]:
        """The readouts graph's outputs."""
        return self._stream_graph("outputs")

    def _stream_graph(self, side: str) -> frozenset[str]:
        """The readouts graph's input or output names: its open session's, or read from its
        file (its weights stay on disk)."""
        if STREAM in self._sessions:
            session = self._sessions[STREAM]
            args = session.get_inputs() if side == "inputs" else session.get_outputs()
            return frozenset(arg.name for arg in args)
        path = self.model_dir.path / readout_filename(READOUTS_ONNX_FILENAME, self.precision)
        graph = onnx.load(str(path), load_external_data=False).graph
        return frozenset(value.name for value in getattr(graph, side.removesuffix("s")))

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
        session = self.session(STREAM)
        sites = [name for name in sites if name != RESIDUAL_STREAM_NAME]
        names = [c.embeddings_name, RESIDUAL_STREAM_NAME]
        names += [c.attentions_name] if attentions else []
        names += sites
        feeds = {c.input_name: input_ids}
        if isinstance(changes, Mapping):
            feeds |= unchanged(c) | dict(changes)
        else:
            head_mask = CHANGES not in self.available
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
        values = self._run_rows(LENS, names, rows, step, {PREDICTION_INPUTS[0]: k_input})
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
        values = self._run_rows(ATTRIBUTION, list(ATTRIBUTION_OUTPUTS.values()), rows, step)
        return dict(zip(ATTRIBUTION_OUTPUTS, values, strict=True))

    def _run_rows(
        self,
        kind: str,
        names: Sequence[str],
        rows: dict[str, np.ndarray],
        step: int,
        shared: dict[str, np.ndarray] | None = None,
    ) -> list[np.ndarray]:
        """Run the graph of `kind` over the `rows` inputs (as many rows each) `step` rows
        at a time, the `shared` inputs (the lens' k) in every chunk, and join the outputs."""
        session = self.session(kind)
        count = len(next(iter(rows.values())))
        runs = []
        for start in range(0, max(count, 1), step):
            feeds = {name: x[start : start + step] for name, x in rows.items()} | (shared or {})
            try:
                runs.append(session.run(list(names), feeds))
            except Exception as exc:  # ORT raises its own untyped errors
                raise InferenceError(f"ONNX Runtime failed on the {kind} graph: {exc}") from exc
        return [
            column[0] if len(column) == 1 else np.concatenate(column)
            for column in zip(*runs, strict=True)
        ]

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

    def session(self, kind: str) -> ort.InferenceSession:
        """The session of one readouts graph, opened on first use; UnsupportedError where
        the directory has none (written before readouts, or a model without a head)."""
        source, output = _GRAPHS[kind]
        filename = readout_filename(source, self.precision)
        with self._lock:
            if kind in self._sessions:
                return self._sessions[kind]
            path = self.model_dir.path / filename
            if kind not in self.available:
                raise UnsupportedError(
                    f"{self.config.name} has no {output} to read in {self.precision} "
                    f"({filename}): readouts come from the graphs of a directory exported "
                    "by this version (re-export it with `attnserve export`)"
                )
            so = self._options()
            if not (self.packed_decode if kind == DECODE else self.prepack):
                so.add_session_config_entry("session.disable_prepacking", "1")
            if kind == QUERIES:  # long texts' tensors, few and large: the arena's
                so.enable_cpu_mem_arena = False  # power-of-two growth would hold up to twice
            session = self._open_session(str(path), so)
            if output not in {o.name for o in session.get_outputs()}:
                raise UnsupportedError(
                    f"{path} has no {output!r} output: it was exported before readouts "
                    "(re-export it with `attnserve export`)"
                )
            self._sessions[kind] = session
            return session

    def close(self) -> None:
        """Drop the sessions (their arenas go with them); reopened when next asked for. The
        one session of a model is kept."""
        with self._lock:
            self._sessions = dict(self._kept)
