"""A model directory's encoder built again from its float32 weights file, for graphs added
after the export (a transcoder set's backward: export/backward.py): the parameters are
memory-mapped views of the file (export/weights.py read_tensors), nothing is copied."""

from __future__ import annotations

from pathlib import Path

import onnx
import torch

from attnserve.export.weights import read_tensors
from attnserve.model.artifacts import (
    CONFIG_METADATA_KEY,
    WEIGHTS_INDEX_FILENAME,
    ModelDirectory,
)
from attnserve.model.config import ModelConfig
from attnserve.model.encoder import Encoder, encoder_from_weights


class ReadBackError(ValueError):
    """The directory cannot build its encoder again (and why)."""


def read_config(model_dir: str | Path) -> ModelConfig:
    """The config a model directory's graphs were exported from (their metadata)."""
    directory = ModelDirectory(model_dir)
    if not directory.precisions:
        raise ReadBackError(f"{model_dir} is not a model directory: no model graph")
    graph = onnx.load(str(directory.graph(directory.precisions[0], True)), load_external_data=False)
    metadata = {p.key: p.value for p in graph.metadata_props}
    return ModelConfig.from_json(metadata[CONFIG_METADATA_KEY])


def read_encoder(model_dir: str | Path) -> Encoder:
    """The encoder of a directory with float32 weights and their index, in eval mode."""
    index = Path(model_dir) / WEIGHTS_INDEX_FILENAME
    if not index.is_file():
        raise ReadBackError(
            f"{model_dir} has no {WEIGHTS_INDEX_FILENAME}: it holds no float32 weights "
            "(an int8-only export) or was exported before 2026-12-02; export it again in "
            "float32 (attnserve export ... --precision fp32)"
        )
    config = read_config(model_dir)
    tensors = read_tensors(index)
    with torch.device("meta"):  # the names only
        names = list(Encoder(config).state_dict())
    missing = [name for name in names if name not in tensors]
    if missing:
        raise ReadBackError(f"{index} lacks {len(missing)} parameters, {missing[0]} first")
    return encoder_from_weights(config, {name: tensors[name] for name in names})
