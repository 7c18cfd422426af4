"""The models a server serves: each model directory built into a data plane (its ONNX
Runtime sessions, instances, engine and tokenizer) under the memory the machine has, and
the repository that loads, reloads and unloads them. service/server.py composes them with
the transports."""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import replace
from pathlib import Path

from attnserve.model.artifacts import ModelDirectory
from attnserve.model.footprint import SERVE_BASE_BYTES, GiB, available_memory
from attnserve.model.tokenizer import get_tokenizer
from attnserve.service.core.backend import Backend
from attnserve.service.core.budget import ByteBudget
from attnserve.service.core.dataplane import DataPlane
from attnserve.service.core.engine import Engine
from attnserve.service.core.errors import ModelLoadError
from attnserve.service.core.metrics import Metrics
from attnserve.service.core.repository import ModelRepository
from attnserve.service.generate.chat import load_chat_template
from attnserve.service.ort.features import SAEGraphs
from attnserve.service.ort.options import RuntimeOptions
from attnserve.service.ort.runtime import OrtRuntime
from attnserve.service.settings import Settings

log = logging.getLogger(__name__)
# Copies of a model's weights beyond the first (session_layout) are made only while
# together they take at most this share of the memory left beside that first copy.
EXTRA_COPIES_SHARE = 1 / 16


async def load_models(settings: Settings, backend: Backend | None = None) -> ModelRepository:
    """The models of `settings` (with --model, `backend` if given), built, not yet warm: what
    a server serves, whatever its front ends (this module's, or Ray Serve's)."""
    metrics = Metrics()
    budget = ByteBudget(settings.max_inflight_bytes)  # one for the process, every model in it
    metrics.inflight_bytes.set_function(lambda: budget.used)
    metrics.budget_waiting.set_function(lambda: budget.waiting)
    given = [backend] if backend is not None else []

    async def load(name: str | None, version: str, directory: Path) -> DataPlane:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            None, build_model, settings, metrics, budget, name, version, directory, given
        )

    repository = ModelRepository(
        load,
        metrics,
        root=settings.model_repository,
        single=settings.model,
        default=settings.default_model,
        grace_seconds=settings.grace_seconds,
    )
    await repository.start()
    return repository


def build_model(
    settings: Settings,
    metrics: Metrics,
    budget: ByteBudget,
    name: str | None,
    version: str,
    directory: Path,
    given: list[Backend],
) -> DataPlane:
    """One model version with its own backend, instances and engine, not yet started (on a
    worker thread: loading sessions blocks). `given`: a backend to use once instead of
    loading one (tests share one)."""
    model_dir = ModelDirectory(directory)
    instances: list[OrtRuntime] = []
    weights = None
    if given:
        backend = given.pop()
        weights = backend.weights_info if isinstance(backend, OrtRuntime) else None
    else:
        options, count = session_layout(model_dir, settings)
        backend = OrtRuntime(model_dir, options)
        instances = model_instances(
            model_dir, settings, backend.provider, count, backend.sae_graphs
        )
        resident = sum(r.weights_info.resident_bytes for r in (backend, *instances))
        weights = replace(backend.weights_info, resident_bytes=resident)
    name = name or backend.config.name
    tokenizer = get_tokenizer(backend.config, model_dir)
    model_metrics = metrics.for_model(name, version)
    engine = Engine(backend, settings.batcher_options, model_metrics, instances=instances)
    return DataPlane(
        name,
        version,
        backend,
        engine,
        tokenizer,
        model_metrics,
        budget,
        settings.max_message_bytes,
        settings.release_memory,
        settings.release_after_idle_s,
        weights,
        load_chat_template(directory),
    )


def session_layout(model_dir: ModelDirectory, settings: Settings) -> tuple[RuntimeOptions, int]:
    """How many copies of the weights a model may hold: (runtime options, instance count;
    0 for the default). Each ONNX Runtime session prepacks its own copy, and a model runs two
    graphs (embeddings only, and with attention) per instance. Extra copies are worth it only
    while they are cheap: beyond EXTRA_COPIES_SHARE of the memory, the model keeps one
    session, whose graph (the readouts graph, where the directory has one) also answers
    embeddings and the readouts (for large models it costs them nothing: docs/BENCHMARKS.md
    "Real sizes"); so does every int8 model unless instances are asked for. Such a model's
    decode graph (generation) packs a copy of its own where that takes at most half of the
    memory left (`packed_decode`), else reads the one copy's file. A model whose one copy
    does not fit is refused."""
    weights, saes = model_dir.weight_bytes(settings.precision), model_dir.sae_bytes()
    # the SAEs' sessions are shared by every copy: they take their room once
    available = (settings.memory_limit or available_memory()) - saes
    if weights + SERVE_BASE_BYTES > available:
        raise ModelLoadError(
            f"{model_dir.path} needs about {(weights + saes + SERVE_BASE_BYTES) / GiB:.1f} GiB "
            f"to serve ({weights / GiB:.1f} GiB of {settings.precision} weights, "
            f"{saes / GiB:.1f} GiB of SAEs) and {(available + saes) / GiB:.1f} GiB is available"
        )
    options, cores = settings.runtime_options, len(os.sched_getaffinity(0))
    # Generation's decode graph gets a packed copy of its own where it takes at most half of
    # what is left: texts are written together at the speed of packed matrices.
    packed_decode = 2 * weights <= available - weights - SERVE_BASE_BYTES
    if settings.precision == "int8" and not settings.instances:
        # int8 is for models that do not fit in float32: one copy, whatever is free now
        # (near the share's line a second one came and went with the page cache).
        log.info("%s: int8, one session (%d MB of weights)", model_dir, weights >> 20)
        return replace(options, single_session=True, packed_decode=packed_decode), 1
    extra_allowed = (available - weights - SERVE_BASE_BYTES) * EXTRA_COPIES_SHARE
    copies = 2 * (1 + (settings.instances or cores))
    if settings.instances or weights * (copies - 1) <= extra_allowed:
        return options, settings.instances
    if weights <= extra_allowed:
        log.info("%s: no instances (their weights would take %d MB)", model_dir, weights >> 20)
        return options, 1
    log.info(
        "%s: one session (a second copy of its weights: %d MB)%s",
        model_dir,
        weights >> 20,
        "; generation packs its own" if packed_decode else "",
    )
    return replace(options, single_session=True, packed_decode=packed_decode), 1


def model_instances(
    model_dir: ModelDirectory,
    settings: Settings,
    provider: str,
    count: int = 0,
    sae_graphs: SAEGraphs | None = None,
) -> list[OrtRuntime]:
    """The narrow copies of the model that run batches side by side under load (Triton's
    instance groups): `count`, or by default one per core, a thread each, on CPU; none on
    one GPU. They share `sae_graphs` (the first backend's SAEs)."""
    cores = len(os.sched_getaffinity(0))
    count = count or (cores if provider == "cpu" else 1)
    if count < 2:
        return []
    threads = max(1, (settings.threads or cores) // count)
    options = replace(settings.runtime_options, provider=provider, intra_op_threads=threads)
    return [OrtRuntime(model_dir, options, sae_graphs) for _ in range(count)]
