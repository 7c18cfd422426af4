"""circuit-tracer's transcoder sets into a model directory (`attnserve sae add` of a
directory with config.yaml): each layer's transcoder as an SAE of its own (export/sae.py),
and the set's replacement model's backward beside the model's graphs (export/backward.py).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import torch

from attnserve.export.backward import write_backward
from attnserve.export.sae import check_against, served_model, write_sae
from attnserve.export.sae_site import norm_sites
from attnserve.export.sae_sources import SAEError, read_transcoder_set, transcoder_set_scan
from attnserve.model.artifacts import WEIGHTS_INDEX_FILENAME, backward_files
from attnserve.model.sae_config import SAEConfig


def add_transcoder_set(
    model_dir: str | Path,
    source: str | Path,
    name: str | None = None,
    log: Callable[[str], None] = print,
    precision: str = "fp32",
) -> list[Path]:
    """circuit-tracer's transcoder set at `source` (export/sae_sources.py), each layer's
    transcoder checked against the model in `model_dir`, then written as
    model_dir/saes/LAYER-NAME (Neuronpedia's names of a set's members); nothing is left
    written if a check fails."""
    model_dir, source = Path(model_dir), Path(source)
    layers = read_transcoder_set(source)
    model, returned = served_model(model_dir)
    for _, config, _ in layers:
        check_against(config, model, returned)
    sites = norm_sites(model_dir, model, [config.hook_name for _, config, _ in layers])
    name = name or source.name
    members = [
        (f"{layer}-{name}", config, weights.get("W_skip")) for layer, config, weights in layers
    ]
    written: list[Path] = []
    try:
        for (member, config, _), (_, _, weights) in zip(members, layers, strict=True):
            site = sites.get(config.hook_name)
            written.append(
                write_sae(model_dir, source, config, weights, member, log, precision, site)
            )
        if (model_dir / WEIGHTS_INDEX_FILENAME).is_file():
            scan = transcoder_set_scan(source) or name
            _backward_of(model_dir, name, members, scan, log, written)
        else:
            log(f"no attribution graphs with {name}: {model_dir} holds no float32 weights")
    except BaseException:
        for path in written:
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
        raise
    return written


def _backward_of(
    model_dir: Path,
    name: str,
    members: list[tuple[str, SAEConfig, torch.Tensor | None]],
    scan: str,
    log: Callable[[str], None],
    written: list[Path],
) -> None:
    """A set's backward graph (export/backward.py), its files added to `written` first (so
    that a failure removes what was begun)."""
    files = [model_dir / f for f in backward_files(name)]
    if any(f.exists() for f in files):
        raise SAEError(f"{files[0]} exists: choose another --name")
    written += files
    try:
        write_backward(model_dir, name, members, scan, log)
    except ValueError as e:  # a set no replacement model is made of, with the reason
        raise SAEError(f"{name}: {e}") from e
    log(f"wrote {files[0]}: the replacement model's backward with {name}")
