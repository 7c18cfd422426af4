"""Checkpoints: safetensors weights with the model config inside (or beside).

safetensors holds raw tensors and a string->string metadata map, so loading a
checkpoint never unpickles anything. The config JSON goes into the metadata
under CONFIG_KEY; a checkpoint without it may have a `config.json` beside it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from attnserve.model.config import ConfigError, ModelConfig
from attnserve.model.encoder import Encoder

CONFIG_KEY = "attnserve_config"
SIDECAR_CONFIG = "config.json"


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded; the message says which file and tensor."""


# Stored dtypes that load into the float32 model: float16 halves a checkpoint's size and
# keeps ~3 significant digits, plenty for weights the float32 model then computes with.
WIDENED_ON_LOAD = (torch.float16, torch.bfloat16)


def save_checkpoint(model: Encoder, path: str | Path, dtype: torch.dtype | None = None) -> Path:
    """Write the model's weights (converted to `dtype` if given) and config to one
    safetensors file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {
        name: t.detach().to(dtype or t.dtype).contiguous() for name, t in model.state_dict().items()
    }
    save_file(tensors, str(path), metadata={CONFIG_KEY: model.config.to_json()})
    return path


def load_checkpoint(path: str | Path) -> Encoder:
    """An Encoder in eval mode with the checkpoint's weights, every tensor checked."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(
            f"{path} is not a readable safetensors file ({exc}); "
            "only safetensors checkpoints are accepted, pickles are never loaded"
        ) from exc

    config = _read_config(path, metadata)
    model = Encoder(config)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise CheckpointError(f"{path}: missing tensor(s) {', '.join(missing)}")
    unexpected = sorted(set(tensors) - set(expected))
    if unexpected:
        raise CheckpointError(f"{path}: unexpected tensor(s) {', '.join(unexpected)}")
    if mismatch := first_shape_mismatch(expected, tensors):
        raise CheckpointError(f"{path}: {mismatch}")
    for name, want in expected.items():
        if tensors[name].dtype in WIDENED_ON_LOAD and want.dtype == torch.float32:
            tensors[name] = tensors[name].float()
        if tensors[name].dtype != want.dtype:
            raise CheckpointError(
                f"{path}: tensor {name} has dtype {tensors[name].dtype}, need {want.dtype}"
            )
    model.load_state_dict(tensors, strict=True)
    return model.eval()


def first_shape_mismatch(expected: dict[str, Any], tensors: dict[str, Any]) -> str | None:
    """Says which tensor does not have the shape the config needs, if any does not."""
    for name, want in expected.items():
        got = tensors[name]
        if got.shape != want.shape:
            return (
                f"tensor {name} has shape {tuple(got.shape)}, the config needs {tuple(want.shape)}"
            )
    return None


def _read_config(path: Path, metadata: dict[str, str]) -> ModelConfig:
    sidecar = path.parent / SIDECAR_CONFIG
    if CONFIG_KEY in metadata:
        source, text = f"{path} metadata", metadata[CONFIG_KEY]
    elif sidecar.is_file():
        source, text = str(sidecar), sidecar.read_text()
    else:
        raise CheckpointError(
            f"{path} carries no model config: expected metadata key {CONFIG_KEY!r} "
            f"or a {SIDECAR_CONFIG} beside it"
        )
    try:
        return ModelConfig.from_json(text)
    except ConfigError as exc:
        raise CheckpointError(f"bad model config in {source}: {exc}") from exc
