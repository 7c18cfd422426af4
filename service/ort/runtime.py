"""The ONNX Runtime backend: a model directory's graphs in ORT sessions.

It owns the sessions and nothing else (no queueing, no transport, no request
validation: the data plane's plan checks ids once per request). Torch-free.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnxruntime as ort

from attnserve.model.artifacts import (
    ON_DEMAND,
    PARTS_NAMES,
    ModelDirectory,
    graph_file,
    query_key_sites,
)
from attnserve.model.sae_config import SAEConfig
from attnserve.service.core.backend import (
    AttentionOutput,
    AttentionSelection,
    Features,
    Patching,
    PatchingSelection,
    ReadoutOutput,
    ReadoutSelection,
    WeightsInfo,
)
from attnserve.service.core.errors import (
    InferenceError,
    ModelLoadError,
    ProviderUnavailableError,
    UnsupportedError,
)
from attnserve.service.core.memory import give_back_memory
from attnserve.service.core.readouts import CHANGES, DECODE, QUERIES, STREAM
from attnserve.service.ort.blocks import BlockStatistics
from attnserve.service.ort.clamping import clamped
from attnserve.service.ort.decoding import RunningBatch
from attnserve.service.ort.features import SAEGraphs
from attnserve.service.ort.gradient import GradientGraphs
from attnserve.service.ort.graphs import GraphSessions
from attnserve.service.ort.options import RuntimeOptions
from attnserve.service.ort.patching import attribution_patch, patch
from attnserve.service.ort.readouts import Readouts, change_feeds
from attnserve.service.ort.reducer import AttentionReducer
from attnserve.service.ort.replacement import OrtReplacement
from attnserve.service.ort.sessions import (
    check_io,
    create_session,
    open_session,
    providers,
    read_config,
    session_options,
    weights_version,
)

log = logging.getLogger(__name__)

# Embeddings whose graph would hold more attention scores than this at once come from the
# queries graph on CPU (a 32-head model from 725 tokens on, 16 heads 1,024)
LONG_EMBEDDINGS_BYTES = 64 * 2**20


def _checked_options(model_dir: ModelDirectory, options: RuntimeOptions) -> RuntimeOptions:
    """`options` as `model_dir` can be served with (int8 on the CPU provider), or why not."""
    if options.precision == "int8":  # MatMulNBits and the fused graph: the CPU provider's
        if options.provider == "cuda":
            raise ProviderUnavailableError(
                "precision=int8 runs on the CPU provider only (8-bit weights with int8 "
                "arithmetic); use precision=fp16 on CUDA"
            )
        options = replace(options, provider="cpu")
    model_path = model_dir.graph(options.precision, attention=True)
    if not model_dir.precisions:
        raise ModelLoadError(
            f"no {model_path.name} in {model_dir.path}: write a model directory with "
            "`attnserve export --out DIR`"
        )
    if not model_path.is_file():
        raise ModelLoadError(
            f"{model_dir.path} holds no {options.precision} graphs (precisions held: "
            f"{', '.join(model_dir.precisions)}); write them with "
            f"`attnserve export --precision {options.precision} --out DIR`"
        )
    return options


class OrtRuntime:
    """A model directory in ONNX Runtime sessions; implements service.backend.Backend.

    `session` runs the full graph (embeddings and attentions): on CPU in float32 the
    fused one when the directory has it (the same outputs, faster), else the traced
    one. `embeddings_session` runs the embeddings-only graph when the directory has
    one (it is faster), else the full graph too. `config` is read back from the ONNX
    metadata, the single source of truth.
    """

    def __init__(
        self,
        model_dir: ModelDirectory | str | Path,
        options: RuntimeOptions | None = None,
        sae_graphs: SAEGraphs | None = None,
    ) -> None:
        """`sae_graphs`: the SAEs' sessions of another instance of this model, shared (else
        this one opens them)."""
        if not isinstance(model_dir, ModelDirectory):
            model_dir = ModelDirectory(model_dir)
        self.model_dir = model_dir
        options = _checked_options(model_dir, options or RuntimeOptions())
        self.precision = options.precision
        self._open_model(options)
        # Attention options run on the same provider as the model (service/ort/reducer_graph.py).
        c = self.config
        self.reducer = AttentionReducer(
            providers(self.provider), session_options(options), c.n_layers, c.n_heads
        )
        # ... and long texts' statistics, by query blocks of the queries graph's outputs
        self.blocks = BlockStatistics(
            providers(self.provider), session_options(options), self.config
        )
        # the last single text's embeddings, queries and keys: the tiles of its map the
        # explorer asks for next need no second run
        self._last_queries: tuple | None = None
        self._open_graphs(options, sae_graphs)
        self._session_options = lambda: session_options(options)
        self._replacements: dict[str, OrtReplacement] = {}  # opened when first asked for

    def _open_model(self, options: RuntimeOptions) -> None:
        """The session that answers Encode's attention (and its config, read back from the
        graph it runs): the readouts graph where one session serves both, the fused graph
        where it is faster, else the model's."""
        model_dir = self.model_dir
        self.model_path = model_path = model_dir.graph(options.precision, attention=True)
        # One session (one copy of the weights) runs the readouts graph where there is one:
        # every head kept, it answers what the graph with attention does, and reading the
        # residual stream then opens no second copy (a 9B int8 model: 10.9 GiB, not 23).
        readouts_graph = model_dir.path / graph_file("readouts", self.precision)
        self._one_graph = options.single_session and readouts_graph.is_file()
        self.attention_graph = readouts_graph if self._one_graph else model_path  # what runs
        self.session, self.provider = create_session(self.attention_graph, options)
        if self.precision == "fp16" and self.provider == "cpu":
            log.warning(
                "precision=fp16 on CPU: no faster than fp32 and less exact (it is for CUDA)"
            )
        self.config = read_config(self.session, self.attention_graph)
        self.version = weights_version(model_path)
        check_io(
            self.session,
            self.config,
            self.attention_graph,
            with_attentions=True,
            head_inputs=self._one_graph,
        )
        fused = options.fused_attention and model_dir.fused_graph.is_file() and not self._one_graph
        if fused and self.provider == "cpu" and self.precision == "fp32":
            # ORT's CUDA Attention kernel cannot return probabilities yet: CPU only.
            self.attention_graph = model_dir.fused_graph
            del self.session  # its copy of the weights goes before the next one is made
            self.session = self._open_beside(model_dir.fused_graph, options, with_attentions=True)

    def _open_graphs(self, options: RuntimeOptions, sae_graphs: SAEGraphs | None) -> None:
        """The other graphs: opened when first asked for (readouts, lens, attribution,
        decode, queries), the SAEs' (shared where `sae_graphs` is given), and the
        embeddings-only graph where the directory has one."""
        self.graph_sessions = GraphSessions(
            self.model_dir,
            self.config,
            self.precision,
            self._open_session,
            lambda: session_options(options),
            # Copies are cheap: as the served graphs. An 8-bit graph always: unpacked,
            # MatMulNBits widens a whole matrix to float32 at every run (the lens: 3.7 GB
            # for gemma-2-9b's unembedding, where its packed copy is 0.9).
            prepack=not options.single_session or self.precision == "int8",
            stream=self.session if self._one_graph else None,
            packed_decode=options.packed_decode,
        )
        self.readouts = Readouts(self.graph_sessions)
        self.gradients = GradientGraphs(
            self.model_dir, self.config, self._open_session, lambda: session_options(options)
        )
        # The SAEs the directory holds, served where the readouts graph feeds them.
        owns_saes = sae_graphs is None and STREAM in self.graph_sessions.available
        self.sae_graphs = self._open_saes(options) if owns_saes else sae_graphs
        self.embeddings_session = self.session
        fast_path = self.model_dir.graph(options.precision, attention=False)
        if fast_path.is_file() and not options.single_session:
            self.embeddings_session = self._open_beside(fast_path, options, with_attentions=False)
        self.weights_info = self._weights_info(owns_saes)

    def _open_session(self, path: str | Path, so: ort.SessionOptions) -> ort.InferenceSession:
        return open_session(Path(path), so, providers(self.provider))

    def _open_saes(self, options: RuntimeOptions) -> SAEGraphs:
        """The SAEs of the directory, fed by the readouts graph's outputs."""
        return SAEGraphs(
            self.model_dir,
            self.config,
            self._open_session,
            lambda: session_options(options),
            lambda: self.graph_sessions.names(STREAM, "outputs"),
            prepack=self.graph_sessions.prepack,
        )

    def _weights_info(self, owns_saes: bool) -> WeightsInfo:
        """What the weights cost and how exact the served graphs are. Each session holds its
        own (prepacked) copy of the weights (the decode graph's, when opened, is not counted
        here: it opens at the first generation)."""
        model_dir = self.model_dir
        weight_bytes = model_dir.weight_bytes(self.precision)
        sessions = 1 + (self.embeddings_session is not self.session)
        served = [self.attention_graph.name, model_dir.graph(self.precision, False).name]
        served += [graph_file(kind, self.precision) for kind in ON_DEMAND]
        sae_bytes = self.sae_graphs.weight_bytes if owns_saes and self.sae_graphs else 0
        return WeightsInfo(
            weight_bytes,
            sessions * weight_bytes + sae_bytes,
            **model_dir.fidelity(self.attention_graph.name),
            output_fidelity=model_dir.output_fidelity(served),
            fidelity_scope=model_dir.fidelity_scope,
        )

    def _open_beside(
        self, path: Path, options: RuntimeOptions, with_attentions: bool
    ) -> ort.InferenceSession:
        """Another graph of the directory, on the provider the first one settled on."""
        session, _ = create_session(path, replace(options, provider=self.provider))
        if read_config(session, path) != self.config:
            raise ModelLoadError(f"{path} and {self.model_path} carry different configs")
        check_io(session, self.config, path, with_attentions)
        return session

    def run(self, input_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """input_ids int64 (B, T) -> embeddings (B, T, D), attentions (B, L, H, T, T)."""
        c = self.config
        embeddings, attentions = self._run(
            self.session, [c.embeddings_name, c.attentions_name], input_ids
        )
        return embeddings, attentions

    def attend(
        self,
        input_ids: np.ndarray,
        lengths: list[int],
        selections: list[AttentionSelection],
    ) -> tuple[np.ndarray, list[AttentionOutput]]:
        """input_ids int64 (B, T), right-padded -> embeddings (B, T, D) and, per row, what its
        selection asks of the row's first `lengths[row]` positions."""
        outputs: list[AttentionOutput | None] = [None] * len(selections)
        blocked = [row for row, selection in enumerate(selections) if selection.blocked]
        rest = [row for row, selection in enumerate(selections) if not selection.blocked]
        try:
            if blocked:
                embeddings, queries, keys = self._queries_and_keys(input_ids)
                for row in blocked:
                    selection, n = selections[row], lengths[row]
                    row_queries, row_keys = [q[row] for q in queries], [k[row] for k in keys]
                    outputs[row] = self.blocks(row_queries, row_keys, n, selection)
            if rest:
                embeddings, attentions = self.run(input_ids)
                for row in rest:
                    outputs[row] = self.reducer(attentions[row], lengths[row], selections[row])
        except InferenceError:
            raise
        except Exception as exc:  # ORT raises its own untyped errors
            raise InferenceError(f"ONNX Runtime failed on the attention options: {exc}") from exc
        return embeddings, outputs  # type: ignore[return-value]

    def _queries_and_keys(self, input_ids: np.ndarray) -> tuple:
        """The queries graph's embeddings and each layer's queries and keys of `input_ids`
        ((B, T, H or H_kv, dh) each); a single text's are kept until the next, for the tiles of
        its map the explorer asks for next."""
        key = input_ids.tobytes() if len(input_ids) == 1 else b""
        last = self._last_queries
        if key and last is not None and last[0] == key:
            return last[1:]
        self._last_queries = None  # its memory goes before the next run's is taken
        c = self.config
        names = [c.embeddings_name, *query_key_sites(c)]
        embeddings, *layers = self._run(self.graph_sessions.session(QUERIES), names, input_ids)
        values = (embeddings, layers[::2], layers[1::2])
        if key:
            self._last_queries = (key, *values)
        return values

    def embed(self, input_ids: np.ndarray) -> np.ndarray:
        """input_ids int64 (B, T) -> embeddings (B, T, D), on the fastest graph there is; a
        long text's on CPU through the queries graph, whose attention holds no T x T scores
        (the embeddings graph's Attention kernel holds a layer's, the one graph every
        layer's)."""
        session = self.embeddings_session
        c, t = self.config, input_ids.shape[1]
        # the full graph (or the one graph) holds every layer's scores, the embeddings one a layer's
        squares = c.n_heads * (c.n_layers if session is self.session else 1)
        if (
            self.provider == "cpu"
            and QUERIES in self.graph_sessions.available
            and squares * t * t * 4 > LONG_EMBEDDINGS_BYTES
        ):
            session = self.graph_sessions.session(QUERIES)
        return self._run(session, [c.embeddings_name], input_ids)[0]

    @property
    def graphs(self) -> frozenset[str]:
        return self.graph_sessions.available

    @property
    def saes(self) -> dict[str, SAEConfig]:
        return self.sae_graphs.configs if self.sae_graphs else {}

    def refresh_saes(self) -> bool:
        return self.sae_graphs.refresh() if self.sae_graphs else False

    def feature_direction(self, sae: str, feature_id: int) -> np.ndarray:
        assert self.sae_graphs is not None  # the plan names only SAEs in `saes`
        return self.sae_graphs.direction(sae, feature_id)

    @property
    def gradient_lengths(self) -> tuple[int, ...]:
        return self.gradients.lengths if STREAM in self.graph_sessions.available else ()

    @property
    def transcoder_sets(self) -> list[str]:
        return self.model_dir.transcoder_sets()

    def replacement(self, transcoders: str) -> OrtReplacement:
        if transcoders not in self._replacements:
            if self.sae_graphs is None:
                raise UnsupportedError(
                    f"{self.model_dir.path} serves no SAEs: no replacement model with "
                    f"transcoders {transcoders!r}"
                )
            self._replacements[transcoders] = OrtReplacement(
                self.model_dir,
                self.config,
                transcoders,
                self.sae_graphs,
                self._open_session,
                self._session_options,
                # a second packed copy of every matrix only where the readouts graphs have
                # one (a gemma-2-2b-shaped model's was 7.5 GiB beside its 10.2)
                prepack=self.graph_sessions.prepack,
            )
        return self._replacements[transcoders]

    def read(
        self,
        input_ids: np.ndarray,
        lengths: list[int],
        selections: list[ReadoutSelection],
    ) -> tuple[np.ndarray, list[ReadoutOutput]]:
        """input_ids int64 (B, T), right-padded -> embeddings (B, T, D) under each row's
        changes (its clamps made additions first) and, per row, what its selection asks of
        its first `lengths[row]` positions (attention through the same reducer as
        `attend`; a patching grid by runs of its own)."""
        changes = [selection.changes for selection in selections]
        if any(selection.clamps for selection in selections):  # a run per clamped site first
            graphs, saes = self.readouts, self.sae_graphs
            changes = list(clamped(graphs, saes, input_ids, lengths, selections))
        run = self.readouts.stream(
            input_ids,
            changes,
            attentions=any(selection.attention is not None for selection in selections),
            sites=sorted({site for selection in selections for site in _sites(selection)}),
        )
        outputs = []
        try:
            features: list[Features | None] = [None] * len(selections)
            if self.sae_graphs is not None:  # each SAE once for the whole batch
                features = self.sae_graphs.read(run, [s.features for s in selections])
            for row, (n, selection) in enumerate(zip(lengths, selections, strict=True)):
                out = self.readouts.read_row(run, row, selection)
                if features[row] is not None:
                    out = replace(out, features=features[row])
                if selection.attention is not None and run.attentions is not None:
                    attention = self.reducer(run.attentions[row], n, selection.attention)
                    out = replace(out, attention=attention)
                if selection.patching is not None:  # its own runs, after the batch's
                    out = replace(out, patching=self._patch(input_ids[row, :n], selection.patching))
                outputs.append(out)
        except InferenceError:
            raise
        except Exception as exc:  # ORT raises its own untyped errors
            raise InferenceError(f"ONNX Runtime failed on the readouts: {exc}") from exc
        return run.embeddings, outputs

    def _patch(self, ids: np.ndarray, selection: PatchingSelection) -> Patching:
        if selection.gradient_length:
            return attribution_patch(self.readouts, self.gradients, ids, selection)
        return patch(self.readouts, ids, selection)

    def _run(
        self, session: ort.InferenceSession, outputs: list[str], input_ids: np.ndarray
    ) -> list[np.ndarray]:
        try:
            return session.run(outputs, self._feeds(session, input_ids))
        except Exception as exc:  # ORT raises its own untyped errors
            raise InferenceError(
                f"ONNX Runtime failed on input_ids of shape {input_ids.shape}: {exc}"
            ) from exc

    def _feeds(self, session: ort.InferenceSession, input_ids: np.ndarray) -> dict:
        """What `session` is fed for `input_ids`: the readouts graph, nothing changed too."""
        feeds = {self.config.input_name: input_ids}
        if self._one_graph and session is self.session:
            head_mask = CHANGES not in self.graph_sessions.available
            feeds |= change_feeds(self.config, head_mask, [{}] * len(input_ids), 1)
        return feeds

    def decode_batch(self) -> RunningBatch:
        return RunningBatch(self.graph_sessions.session(DECODE), self.config)

    def release_memory(self) -> None:
        """Hand the arenas' free chunks and the C heap's free pages back to the OS: one
        1-token run per session that asks ORT to shrink its arenas when it ends (after a
        burst of long requests the CPU arena otherwise keeps their peak, GiBs)."""
        shrink = ort.RunOptions()
        arenas = "cpu:0;gpu:0" if self.provider == "cuda" else "cpu:0"
        shrink.add_run_config_entry("memory.enable_memory_arena_shrinkage", arenas)
        ids = np.full((1, 1), self.config.bos_id, dtype=np.int64)
        for session in {id(s): s for s in (self.session, self.embeddings_session)}.values():
            session.run(None, self._feeds(session, ids), shrink)
        self.reducer.close_sessions()  # their arenas go with them; reopened when next asked
        self.blocks.close_sessions()
        self._last_queries = None
        self.graph_sessions.close()
        give_back_memory()

    def warmup(self, seq_lens: tuple[int, ...] = (1, 16, 128)) -> None:
        """Run each length once per graph so first requests skip allocation and setup."""
        for seq_len in sorted({min(t, self.config.max_seq_len) for t in seq_lens}):
            ids = np.full((1, seq_len), self.config.bos_id, dtype=np.int64)
            self.run(ids)
            self.embed(ids)


def _sites(selection: ReadoutSelection) -> tuple[str, ...]:
    """The readouts graph's outputs `selection` needs besides the residual stream."""
    features = selection.features.sites if selection.features is not None else ()
    captured = (
        [output for output, _, _ in selection.capture.sites.values()] if selection.capture else []
    )
    return (*(PARTS_NAMES if selection.attribution is not None else ()), *features, *captured)
