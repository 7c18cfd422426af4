"""The ONNX Runtime backend: a model directory's graphs in ORT sessions.

It owns the sessions and nothing else (no queueing, no transport, no request
validation: the data plane's plan checks ids once per request). Torch-free.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import logging
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from attnserve.model.artifacts import (
    CONFIG_METADATA_KEY,
    HEAD_MASK_NAME,
    HEAD_MEANS_NAME,
    PARTS_NAMES,
    READOUT_GRAPHS,
    READOUTS_ONNX_FILENAME,
    ModelDirectory,
    change_inputs,
    query_key_sites,
    readout_filename,
)
from attnserve.model.config import ConfigError, ModelConfig
from attnserve.model.sae_config import SAEConfig
from attnserve.service.core.backend import (
    AttentionOutput,
    AttentionSelection,
    Features,
    ReadoutOutput,
    ReadoutSelection,
    WeightsInfo,
)
from attnserve.service.core.errors import (
    InferenceError,
    ModelLoadError,
    ProviderUnavailableError,
)
from attnserve.service.core.memory import give_back_memory
from attnserve.service.core.readouts import CHANGES, DECODE, QUERIES, STREAM
from attnserve.service.ort.blocks import BlockStatistics
from attnserve.service.ort.clamping import clamped
from attnserve.service.ort.decoding import RunningBatch
from attnserve.service.ort.features import SAEGraphs
from attnserve.service.ort.options import RuntimeOptions
from attnserve.service.ort.patching import patch
from attnserve.service.ort.readouts import ReadoutGraphs, change_feeds
from attnserve.service.ort.reducer import AttentionReducer

log = logging.getLogger(__name__)

CUDA_EP = "CUDAExecutionProvider"
CPU_EP = "CPUExecutionProvider"
# No TF32: float32 stays float32 on Ampere and later GPUs (parity within 1e-4, not ~1e-3).
# The arena grows by what is asked, not to the next power of two, so that a mix of sequence
# lengths does not ratchet GPU memory up.
CUDA_OPTIONS = {"use_tf32": "0", "arena_extend_strategy": "kSameAsRequested"}
_ORT_SILENT = 4  # ORT log severity FATAL: hides the expected noise of a CUDA probe in "auto"
_ORT_WARNING = 2  # ORT's default log severity
# Embeddings whose graph would hold more attention scores than this at once come from the
# queries graph on CPU (a 32-head model from 725 tokens on, 16 heads 1,024)
LONG_EMBEDDINGS_BYTES = 64 * 2**20


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
        options = options or RuntimeOptions()
        if not isinstance(model_dir, ModelDirectory):
            model_dir = ModelDirectory(model_dir)
        self.model_dir = model_dir
        if options.precision == "int8":  # MatMulNBits and the fused graph: the CPU provider's
            if options.provider == "cuda":
                raise ProviderUnavailableError(
                    "precision=int8 runs on the CPU provider only (8-bit weights with int8 "
                    "arithmetic); use precision=fp16 on CUDA"
                )
            options = replace(options, provider="cpu")
        self.precision = options.precision
        self.model_path = model_path = model_dir.graph(options.precision, attention=True)
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
        # One session (one copy of the weights) runs the readouts graph where there is one:
        # every head kept, it answers what the graph with attention does, and reading the
        # residual stream then opens no second copy (a 9B int8 model: 10.9 GiB, not 23).
        readouts_graph = model_dir.path / readout_filename(READOUTS_ONNX_FILENAME, self.precision)
        self._one_graph = options.single_session and readouts_graph.is_file()
        self.attention_graph = readouts_graph if self._one_graph else model_path  # what runs
        self.session, self.provider = _create_session(self.attention_graph, options)
        if self.precision == "fp16" and self.provider == "cpu":
            log.warning(
                "precision=fp16 on CPU: no faster than fp32 and less exact (it is for CUDA)"
            )
        self.config = _read_config(self.session, self.attention_graph)
        self.version = weights_version(model_path)
        _check_io(
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

        # Attention options run on the same provider as the model (service/ort/reducer_graph.py).
        self.reducer = AttentionReducer(
            _providers(self.provider),
            session_options(options),
            self.config.n_layers,
            self.config.n_heads,
        )
        # ... and long texts' statistics, by query blocks of the queries graph's outputs
        self.blocks = BlockStatistics(
            _providers(self.provider), session_options(options), self.config
        )
        # the last single text's embeddings, queries and keys: the tiles of its map the
        # explorer asks for next need no second run
        self._last_queries: tuple | None = None

        # The readouts (residual stream, head mask, logit lens), opened when first asked for.
        self.readout_graphs = ReadoutGraphs(
            model_dir,
            self.config,
            self.precision,
            lambda path, so: _open(Path(path), so, _providers(self.provider)),
            lambda: session_options(options),
            # Copies are cheap: as the served graphs. An 8-bit graph always: unpacked,
            # MatMulNBits widens a whole matrix to float32 at every run (the lens: 3.7 GB
            # for gemma-2-9b's unembedding, where its packed copy is 0.9).
            prepack=not options.single_session or self.precision == "int8",
            stream=self.session if self._one_graph else None,
            packed_decode=options.packed_decode,
        )

        # The SAEs the directory holds, served where the readouts graph feeds them.
        owns_saes = sae_graphs is None and STREAM in self.readout_graphs.available
        self.sae_graphs = sae_graphs
        if owns_saes:
            self.sae_graphs = SAEGraphs(
                model_dir,
                self.config,
                lambda path, so: _open(Path(path), so, _providers(self.provider)),
                lambda: session_options(options),
                self.readout_graphs.stream_outputs,
                prepack=self.readout_graphs.prepack,
            )

        self.embeddings_session = self.session
        fast_path = model_dir.graph(options.precision, attention=False)
        if fast_path.is_file() and not options.single_session:
            self.embeddings_session = self._open_beside(fast_path, options, with_attentions=False)
        # Each session holds its own (prepacked) copy of the weights (the decode graph's, when
        # opened, is not counted here: it opens at the first generation).
        weight_bytes = model_dir.weight_bytes(self.precision)
        sessions = 1 + (self.embeddings_session is not self.session)
        served = [self.attention_graph.name, model_dir.graph(self.precision, False).name]
        served += [readout_filename(name, self.precision) for name in READOUT_GRAPHS]
        sae_bytes = self.sae_graphs.weight_bytes if owns_saes and self.sae_graphs else 0
        self.weights_info = WeightsInfo(
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
        session, _ = _create_session(path, replace(options, provider=self.provider))
        if _read_config(session, path) != self.config:
            raise ModelLoadError(f"{path} and {self.model_path} carry different configs")
        _check_io(session, self.config, path, with_attentions)
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
        embeddings, *layers = self._run(self.readout_graphs.session(QUERIES), names, input_ids)
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
            and QUERIES in self.readout_graphs.available
            and squares * t * t * 4 > LONG_EMBEDDINGS_BYTES
        ):
            session = self.readout_graphs.session(QUERIES)
        return self._run(session, [c.embeddings_name], input_ids)[0]

    @property
    def readouts(self) -> frozenset[str]:
        return self.readout_graphs.available

    @property
    def saes(self) -> dict[str, SAEConfig]:
        return self.sae_graphs.configs if self.sae_graphs else {}

    def refresh_saes(self) -> bool:
        return self.sae_graphs.refresh() if self.sae_graphs else False

    def feature_direction(self, sae: str, feature_id: int) -> np.ndarray:
        assert self.sae_graphs is not None  # the plan names only SAEs in `saes`
        return self.sae_graphs.direction(sae, feature_id)

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
            graphs, saes = self.readout_graphs, self.sae_graphs
            changes = list(clamped(graphs, saes, input_ids, lengths, selections))
        run = self.readout_graphs.stream(
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
                out = self.readout_graphs.read_row(run, row, selection)
                if features[row] is not None:
                    out = replace(out, features=features[row])
                if selection.attention is not None and run.attentions is not None:
                    attention = self.reducer(run.attentions[row], n, selection.attention)
                    out = replace(out, attention=attention)
                if selection.patching is not None:  # its own runs, after the batch's
                    ids = input_ids[row, :n]
                    out = replace(out, patching=patch(self.readout_graphs, ids, selection.patching))
                outputs.append(out)
        except InferenceError:
            raise
        except Exception as exc:  # ORT raises its own untyped errors
            raise InferenceError(f"ONNX Runtime failed on the readouts: {exc}") from exc
        return run.embeddings, outputs

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
            head_mask = CHANGES not in self.readout_graphs.available
            feeds |= change_feeds(self.config, head_mask, [{}] * len(input_ids), 1)
        return feeds

    def decode_batch(self) -> RunningBatch:
        return RunningBatch(self.readout_graphs.session(DECODE), self.config)

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
        self.readout_graphs.close()
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


def session_settings(options: RuntimeOptions) -> dict:
    """The server's ORT session settings as plain data: the peers benchmark hands the very same
    ones to the peer servers it compares against."""
    return {
        "intra_op_num_threads": options.intra_op_threads,
        "inter_op_num_threads": 1,
        # Lengths vary per request: a memory pattern planned for one shape is wasted on the next.
        "enable_mem_pattern": False,
        "config_entries": {
            "session.intra_op.allow_spinning": "1" if options.intra_op_spinning else "0",
            "session.force_spinning_stop": "1",  # not after a run
            "session.inter_op.allow_spinning": "0",
        },
    }


def weights_version(graph: Path) -> str:
    """Identifies the served weights: two exports of different models never share it. The
    files a graph keeps its weights in (ONNX external data) are hashed with it."""
    digest = hashlib.sha256(graph.read_bytes())
    proto = onnx.load(str(graph), load_external_data=False)
    locations = {
        entry.value
        for tensor in proto.graph.initializer
        for entry in tensor.external_data
        if entry.key == "location"
    }
    for location in sorted(locations):
        with (graph.parent / location).open("rb") as f:
            while chunk := f.read(1 << 24):
                digest.update(chunk)
    return digest.hexdigest()[:12]


def session_options(options: RuntimeOptions) -> ort.SessionOptions:
    """The server's ORT session settings, as an ORT SessionOptions."""
    settings = session_settings(options)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = settings["intra_op_num_threads"]
    so.inter_op_num_threads = settings["inter_op_num_threads"]
    so.enable_mem_pattern = settings["enable_mem_pattern"]
    for key, value in settings["config_entries"].items():
        so.add_session_config_entry(key, value)
    return so


def _create_session(path: Path, options: RuntimeOptions) -> tuple[ort.InferenceSession, str]:
    """Open the session on the requested provider; returns it and the provider really used."""
    so = session_options(options)
    if options.provider == "cpu":
        return _open(path, so, [CPU_EP]), "cpu"

    # ORT lists CUDA as available even without a GPU and silently falls back to
    # CPU when it cannot start, so we try it and look at what the session got.
    probe_output = io.StringIO()
    with contextlib.redirect_stdout(probe_output), contextlib.suppress(Exception):
        ort.preload_dlls()  # CUDA/cuDNN libraries from the nvidia-* wheels, if present
    quiet = options.provider == "auto"
    if quiet:
        ort.set_default_logger_severity(_ORT_SILENT)
    try:
        session = _open(path, so, [(CUDA_EP, CUDA_OPTIONS), CPU_EP])
    finally:
        if quiet:
            ort.set_default_logger_severity(_ORT_WARNING)
    if session.get_providers()[0] == CUDA_EP:
        return session, "cuda"

    probe_lines = probe_output.getvalue().strip().splitlines()
    reason = probe_lines[0] if probe_lines else "see ONNX Runtime's log"
    if options.provider == "cuda":
        raise ProviderUnavailableError(
            "provider=cuda was requested but ONNX Runtime's CUDA execution provider could not "
            f"start ({reason}); install the CUDA 13 / cuDNN 9 libraries or use provider=cpu"
        )
    _note_cpu_fallback(reason)
    return session, "cpu"


@functools.cache
def _note_cpu_fallback(reason: str) -> None:
    """Once a process: provider auto found no GPU to start, which on a CPU machine is how
    it should be (an INFO line that says which ONNX Runtime is installed, not a warning)."""
    installed = "onnxruntime-gpu (the gpu or cuda extra)"
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        installed = "onnxruntime (the cpu extra), which has no CUDA provider"
    log.info(
        "provider auto: running on CPU; CUDA did not start (%s); installed: %s", reason, installed
    )


def _providers(provider: str) -> list:
    """The execution providers of a session beside the model's, on the provider it got."""
    return [(CUDA_EP, CUDA_OPTIONS), CPU_EP] if provider == "cuda" else [CPU_EP]


def _open(path: Path, so: ort.SessionOptions, providers: list) -> ort.InferenceSession:
    try:
        return ort.InferenceSession(str(path), so, providers=providers)
    except Exception as exc:  # InvalidProtobuf, Fail, NoSuchFile...: all mean "not loadable"
        raise ModelLoadError(f"{path} is not a loadable ONNX model: {exc}") from exc


def _read_config(session: ort.InferenceSession, path: Path) -> ModelConfig:
    metadata = session.get_modelmeta().custom_metadata_map
    if CONFIG_METADATA_KEY not in metadata:
        raise ModelLoadError(
            f"{path} has no {CONFIG_METADATA_KEY!r} metadata: it was not written by "
            "`attnserve export`"
        )
    try:
        return ModelConfig.from_json(metadata[CONFIG_METADATA_KEY])
    except ConfigError as exc:
        raise ModelLoadError(f"{path} carries an invalid model config: {exc}") from exc


def _check_io(
    session: ort.InferenceSession,
    config: ModelConfig,
    path: Path,
    with_attentions: bool,
    head_inputs: bool = False,
) -> None:
    """The graph's inputs and outputs must be the ones its config promises (`head_inputs`:
    the readouts graph's changes too)."""
    inputs = {i.name: i for i in session.get_inputs()}
    outputs = {o.name: o for o in session.get_outputs()}
    expected = {
        config.input_name: (inputs, "tensor(int64)", 2),
        config.embeddings_name: (outputs, "tensor(float)", 3),
    }
    fixed_dims = {config.embeddings_name: {2: config.embedding_dim}}
    if with_attentions:
        expected[config.attentions_name] = (outputs, "tensor(float)", 5)
        fixed_dims[config.attentions_name] = {1: config.n_layers, 2: config.n_heads}
    for name, (group, dtype, rank) in expected.items():
        arg = group.get(name)
        if arg is None:
            raise ModelLoadError(
                f"{path} has no {name!r} {'input' if group is inputs else 'output'}; "
                f"it has inputs {sorted(inputs)} and outputs {sorted(outputs)}"
            )
        if arg.type != dtype or len(arg.shape) != rank:
            raise ModelLoadError(
                f"{path}: {name!r} is {arg.type} of rank {len(arg.shape)}, "
                f"expected {dtype} of rank {rank}"
            )
    for name, dims in fixed_dims.items():
        shape = outputs[name].shape
        for axis, size in dims.items():
            if shape[axis] != size:
                raise ModelLoadError(
                    f"{path}: output {name!r} has shape {shape}, its config needs "
                    f"{size} on axis {axis}"
                )
    wanted = {config.input_name}
    if head_inputs:  # the readouts graph's changes, or (exported before them) its head mask
        legacy = {HEAD_MASK_NAME, HEAD_MEANS_NAME}
        wanted |= legacy if legacy <= set(inputs) else set(change_inputs(config))
    if set(inputs) != wanted:
        raise ModelLoadError(f"{path} must have the inputs {sorted(wanted)}, has {sorted(inputs)}")
