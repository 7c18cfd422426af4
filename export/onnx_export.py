"""PyTorch -> ONNX with dynamic batch and sequence axes and the config in the metadata."""

from __future__ import annotations

import json
import logging
import warnings
from importlib.metadata import version
from pathlib import Path

import onnx
import torch
from torch import nn

from attnserve.export.head_fold import fold_head_transposes
from attnserve.export.onnx_files import save_checked
from attnserve.model.artifacts import CONFIG_METADATA_KEY, VERSIONS_METADATA_KEY
from attnserve.model.encoder import Encoder

# 23 is the first opset with the fused Attention op the embeddings-only graph uses.
ONNX_OPSET = 23


class EmbeddingsOnly(nn.Module):
    """The encoder with its fused attention path: input_ids -> embeddings."""

    def __init__(self, encoder: Encoder) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.encoder(input_ids, need_weights=False)[0]


def exporter_versions() -> dict[str, str]:
    return {pkg: version(pkg) for pkg in ("attnserve", "torch", "onnx", "onnxscript")}


def export_onnx(model: Encoder, path: str | Path, with_attentions: bool = True) -> Path:
    """Export `model` to `path` as one self-contained ONNX file and check it.

    with_attentions=False exports the embeddings-only graph (EmbeddingsOnly).
    """
    path = Path(path)
    config = model.config
    module: nn.Module = model if with_attentions else EmbeddingsOnly(model)
    outputs = [config.embeddings_name] + ([config.attentions_name] if with_attentions else [])
    # The traced example only has to be valid; both axes are symbolic in the graph.
    example = torch.zeros(2, min(8, config.max_seq_len), dtype=torch.int64)
    dynamic_shapes = (
        {
            0: torch.export.Dim("batch", min=1),
            1: torch.export.Dim("seq", min=1, max=config.max_seq_len),
        },
    )
    # The dynamo exporter logs missing optional torchvision ops at WARNING; irrelevant here.
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch-internal deprecation noise
        program = torch.onnx.export(
            module.eval(),
            (example,),
            dynamo=True,
            dynamic_shapes=dynamic_shapes,
            input_names=[config.input_name],
            output_names=outputs,
            opset_version=ONNX_OPSET,
            optimize=True,
            verbose=False,
        )
    assert program is not None  # torch returns None only for the legacy exporter
    proto = program.model_proto
    if not with_attentions:  # the traced full graph has no Attention op to fold into
        proto = fold_head_transposes(proto, config.n_heads, config.kv_heads)
    onnx.helper.set_model_props(
        proto,
        {
            CONFIG_METADATA_KEY: config.to_json(),
            VERSIONS_METADATA_KEY: json.dumps(exporter_versions(), sort_keys=True),
        },
    )
    proto.doc_string = f"attnserve causal self-attention encoder {config.name}: {outputs}"
    return save_checked(proto, path)
