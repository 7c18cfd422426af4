"""The sparse autoencoders of a model directory (MODEL_DIR/saes/NAME/sae.onnx, written by
`attnserve sae add`) in ONNX Runtime, and the features a request reads with them off the
readouts graph's run: each SAE's graph fed the hook site it reads, at the positions asked.

Their sessions open with the model (what a directory holds is what it serves), on its
provider and with the readouts' prepacking policy, once: the model's instances share them
(ONNX Runtime's sessions run concurrently), so an SAE costs its weights once.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import numpy as np
import onnxruntime as ort

from attnserve.model.artifacts import (
    SAE_INPUTS,
    SAE_ONNX,
    SAE_OUTPUTS,
    SAES_DIRNAME,
    ModelDirectory,
)
from attnserve.model.config import ModelConfig
from attnserve.service.core.backend import Features, FeaturesSelection
from attnserve.service.core.errors import InferenceError, ModelLoadError, UnsupportedError
from attnserve.service.core.features import site_of
from attnserve.service.ort.readouts import StreamRun

_ACTIVATIONS = SAE_OUTPUTS[-1]  # every feature's activation, copied out only when asked
_ERROR = SAE_OUTPUTS[3]  # the reconstruction error's norm: the decoder read only for it


class SAEGraphs:
    """The SAEs a model directory holds, each in its own session."""

    def __init__(
        self,
        model_dir: ModelDirectory,
        config: ModelConfig,
        open_session: Callable[[str, ort.SessionOptions], ort.InferenceSession],
        options: Callable[[], ort.SessionOptions],
        returned: Collection[str],
        prepack: bool = False,
    ) -> None:
        """`returned`: the readouts graph's outputs (an SAE on a site it lacks is refused)."""
        self.configs = model_dir.saes()
        self._sessions: dict[str, ort.InferenceSession] = {}
        self._sites: dict[str, tuple[str, int]] = {}
        self.weight_bytes = model_dir.sae_bytes()  # what their sessions hold
        for name, sae in self.configs.items():
            folder = model_dir.path / SAES_DIRNAME / name
            try:
                self._sites[name] = site_of(sae, config)
            except UnsupportedError as exc:
                raise ModelLoadError(f"{folder}: {exc}") from None
            if self._sites[name][0] not in returned:
                raise ModelLoadError(
                    f"{folder}: the SAE reads {sae.hook_name}, which this directory's "
                    f"readouts graph does not return (written before attnserve returned "
                    f"{self._sites[name][0]}): export the model again"
                )
            so = options()
            if not prepack:
                so.add_session_config_entry("session.disable_prepacking", "1")
            session = open_session(str(folder / SAE_ONNX), so)
            missing = set(SAE_OUTPUTS) - {o.name for o in session.get_outputs()}
            if missing:
                raise ModelLoadError(f"{folder / SAE_ONNX} has no {sorted(missing)} outputs")
            self._sessions[name] = session
        # SAEs added before their decoder could be left unread (no with_error_norm input)
        self._decoder_always = {
            name
            for name, session in self._sessions.items()
            if SAE_INPUTS[2] not in {i.name for i in session.get_inputs()}
        }

    def read(self, run: StreamRun, row: int, selection: FeaturesSelection) -> Features:
        """Row `row`'s features of a readouts run: each SAE of `selection` on its site at
        the selection's positions, stacked on a first axis over the SAEs."""
        names = [name for name in SAE_OUTPUTS[:-1] if selection.error_norm or name != _ERROR]
        if selection.dense or selection.feature_ids:
            names.append(_ACTIVATIONS)
        positions, ids = list(selection.positions), list(selection.feature_ids)
        k = np.array([selection.top_k], dtype=np.int64)
        decode = np.array(selection.error_norm)
        per_sae = []
        for sae in selection.saes:
            output, index = self._sites[sae]
            x = run.output(output)[row, index, positions][None]  # (1, P, d_in)
            feeds = dict(zip(SAE_INPUTS, (x, k, decode), strict=True))
            if sae in self._decoder_always:
                del feeds[SAE_INPUTS[2]]
            try:
                outputs = self._sessions[sae].run(names, feeds)
            except Exception as exc:  # ORT raises its own untyped errors
                raise InferenceError(f"ONNX Runtime failed on SAE {sae!r}: {exc}") from exc
            got = {name: value[0] for name, value in zip(names, outputs, strict=True)}
            if ids:  # of SAEs of any widths; dense ones are of one width (the plan's rule)
                got["chosen"] = got[_ACTIVATIONS][:, ids]
            per_sae.append(got)

        def stacked(name: str) -> np.ndarray:
            return np.stack([got[name] for got in per_sae])

        return Features(
            top_ids=stacked("top_ids"),
            top_activations=stacked("top_activations"),
            l0=stacked("l0"),
            error_norm=stacked(_ERROR) if selection.error_norm else None,
            feature_activations=stacked("chosen") if ids else None,
            activations=stacked(_ACTIVATIONS) if selection.dense else None,
        )
