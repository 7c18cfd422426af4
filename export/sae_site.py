"""The graph that feeds an SAE whose site a norm computes (model/readout_sites.py normed_site:
ln2.hook_normalized, mlp.hook_in): that norm of the model, with its weights, traced from the
model's own code to saes/NAME/site.onnx and checked against PyTorch. The service runs it on
the readouts' rows of the site the norm reads, then the SAE's graph on what it returns.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from attnserve.export.onnx_export import ONNX_OPSET, quiet_exporter
from attnserve.export.onnx_files import save_checked
from attnserve.export.read_back import ReadBackError, read_encoder
from attnserve.export.sae_sources import SAEError
from attnserve.model.artifacts import SAE_INPUTS, SAE_SITE_ONNX
from attnserve.model.config import ModelConfig
from attnserve.model.norms import NormSite
from attnserve.model.readout_sites import normed_site

# ONNX Runtime's site against PyTorch's, over each position's largest value
SITE_TOLERANCE = 1e-5
CHECK_SCALE, OUTLIER_SCALE = 10.0, 3000.0  # the check's rows: outliers as trained models'


def norm_sites(model_dir: Path, config: ModelConfig, hooks: list[str]) -> dict[str, NormSite]:
    """The norm computing each of `hooks` that the readouts graph does not return, by hook
    (none for the others), read from the directory's float32 weights."""
    normed = {hook: site for hook in hooks if (site := normed_site(config, hook)) is not None}
    if not normed:
        return {}
    try:
        encoder = read_encoder(model_dir)
    except ReadBackError as exc:
        first = next(iter(normed))
        raise SAEError(
            f"hook_name {first!r} is computed by the model's {normed[first].norm}, whose "
            f"weights are read from the float32 export: {exc}"
        ) from None
    return {
        hook: NormSite(encoder.get_submodule(site.norm), site.weighted).eval()
        for hook, site in normed.items()
    }


def write_site(site: NormSite, folder: Path) -> float:
    """Trace `site` to folder/site.onnx and check it against PyTorch on rows with outlier
    dimensions; the largest difference over each position's largest value."""
    quiet_exporter()
    batch, seq = torch.export.Dim("batch", min=1), torch.export.Dim("seq", min=1)
    d = next(site.parameters()).shape[-1]
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        program = torch.onnx.export(
            site,
            (torch.zeros(2, 3, d),),
            dynamo=True,
            dynamic_shapes={"x": {0: batch, 1: seq}},
            input_names=[SAE_INPUTS[0]],
            output_names=["site"],
            opset_version=ONNX_OPSET,
            verbose=False,
        )
    assert program is not None
    path = save_checked(program.model_proto, folder / SAE_SITE_ONNX)
    generator = torch.Generator().manual_seed(0)
    x = CHECK_SCALE * torch.randn(2, 7, d, generator=generator)
    x[..., :: max(1, d // 4)] *= OUTLIER_SCALE / CHECK_SCALE
    with torch.no_grad():
        want = site(x).numpy()
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {SAE_INPUTS[0]: x.numpy()})
    scale = np.abs(want).max(-1, keepdims=True)
    difference = float((np.abs(got - want) / scale).max())
    if difference > SITE_TOLERANCE:
        raise SAEError(f"the site's graph disagrees with PyTorch: {difference:.3g}")
    return difference
