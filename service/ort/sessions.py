"""The session factory: ONNX Runtime sessions opened as the server opens them (its settings,
the provider and the fallback from CUDA to CPU), each graph checked to be one this version
wrote (its config, its inputs and outputs), and the weights' hash that names a version."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import logging
from pathlib import Path

import onnx
import onnxruntime as ort

from attnserve.model.artifacts import (
    CONFIG_METADATA_KEY,
    HEAD_MASK_NAME,
    HEAD_MEANS_NAME,
    change_inputs,
)
from attnserve.model.config import ConfigError, ModelConfig
from attnserve.service.core.errors import ModelLoadError, ProviderUnavailableError
from attnserve.service.ort.options import RuntimeOptions

log = logging.getLogger(__name__)

CUDA_EP = "CUDAExecutionProvider"
CPU_EP = "CPUExecutionProvider"
# No TF32: float32 stays float32 on Ampere and later GPUs (parity within 1e-4, not ~1e-3).
# The arena grows by what is asked, not to the next power of two, so that a mix of sequence
# lengths does not ratchet GPU memory up.
CUDA_OPTIONS = {"use_tf32": "0", "arena_extend_strategy": "kSameAsRequested"}
_ORT_SILENT = 4  # ORT log severity FATAL: hides the expected noise of a CUDA probe in "auto"
_ORT_WARNING = 2  # ORT's default log severity


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


def create_session(path: Path, options: RuntimeOptions) -> tuple[ort.InferenceSession, str]:
    """Open the session on the requested provider; returns it and the provider really used."""
    so = session_options(options)
    if options.provider == "cpu":
        return open_session(path, so, [CPU_EP]), "cpu"

    # ORT lists CUDA as available even without a GPU and silently falls back to
    # CPU when it cannot start, so we try it and look at what the session got.
    probe_output = io.StringIO()
    with contextlib.redirect_stdout(probe_output), contextlib.suppress(Exception):
        ort.preload_dlls()  # CUDA/cuDNN libraries from the nvidia-* wheels, if present
    quiet = options.provider == "auto"
    if quiet:
        ort.set_default_logger_severity(_ORT_SILENT)
    try:
        session = open_session(path, so, [(CUDA_EP, CUDA_OPTIONS), CPU_EP])
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


def providers(provider: str) -> list:
    """The execution providers of a session beside the model's, on the provider it got."""
    return [(CUDA_EP, CUDA_OPTIONS), CPU_EP] if provider == "cuda" else [CPU_EP]


def open_session(path: Path, so: ort.SessionOptions, providers: list) -> ort.InferenceSession:
    try:
        return ort.InferenceSession(str(path), so, providers=providers)
    except Exception as exc:  # InvalidProtobuf, Fail, NoSuchFile...: all mean "not loadable"
        raise ModelLoadError(f"{path} is not a loadable ONNX model: {exc}") from exc


def read_config(session: ort.InferenceSession, path: Path) -> ModelConfig:
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


def check_io(
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
