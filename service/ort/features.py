"""The sparse autoencoders of a model directory (MODEL_DIR/saes/NAME/sae.onnx, written by
`attnserve sae add`) in ONNX Runtime, and the features a request reads with them off the
readouts graph's run: each SAE's graph fed the hook site it reads, at the positions asked.

Their sessions open with the model (what a directory holds is what it serves), on its
provider and with the readouts' prepacking policy, once: the model's instances share them
(ONNX Runtime's sessions run concurrently), so an SAE costs its weights once. An SAE added
to the directory while it is served (`attnserve sae add` writes its folder whole, then
renames it into place) opens at the next `refresh`; the tables a run reads are replaced by
larger ones, never changed, so a run that began before sees what it planned with. A removed
SAE leaves the list at once and its session at the next start.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper
import onnxruntime as ort

from attnserve.model.artifacts import (
    SAE_INPUTS,
    SAE_JSON,
    SAE_ONNX,
    SAE_OUTPUTS,
    SAE_SITE_ONNX,
    SAES_DIRNAME,
    TRANSCODER_TARGET,
    ModelDirectory,
)
from attnserve.model.config import ModelConfig
from attnserve.model.readout_sites import normed_site
from attnserve.model.sae_config import SAEConfig
from attnserve.service.core.backend import Features, FeaturesSelection
from attnserve.service.core.errors import InferenceError, ModelLoadError, UnsupportedError
from attnserve.service.core.features import site_of
from attnserve.service.ort.readouts import StreamRun

log = logging.getLogger(__name__)

_ACTIVATIONS = SAE_OUTPUTS[-1]  # every feature's activation, copied out only when asked
_ERROR = SAE_OUTPUTS[3]  # the reconstruction error's norm: the decoder read only for it
_DECODER = "W_dec"  # the decoder's initializer (model/sae.py's parameter), (d_sae, d_in)


class SAEGraphs:
    """The SAEs a model directory holds, each in its own session."""

    def __init__(
        self,
        model_dir: ModelDirectory,
        config: ModelConfig,
        open_session: Callable[[str, ort.SessionOptions], ort.InferenceSession],
        options: Callable[[], ort.SessionOptions],
        returned: Callable[[], Collection[str]],
        prepack: bool = False,
    ) -> None:
        """`returned()`: the readouts graph's outputs (an SAE on a site it lacks is refused),
        asked only of a directory that holds SAEs."""
        self._model_dir, self._config = model_dir, config
        self._open_session, self._options, self._returned = open_session, options, returned
        self._prepack = prepack
        self._folder = model_dir.path / SAES_DIRNAME
        self._weights: dict[str, np.ndarray] = {}  # "NAME/TENSOR": mapped when asked
        self._sessions: dict[str, ort.InferenceSession] = {}
        self._sites: dict[str, tuple[str, int]] = {}
        self._targets: dict[str, tuple[str, int]] = {}  # transcoders' output sites
        self._norms: dict[str, ort.InferenceSession] = {}  # site.onnx, where a norm computes it
        self._seen: dict[str, int] = {}  # each SAE folder's sae.json time, as last opened
        self.configs: dict[str, SAEConfig] = {}
        self.decoder_on_demand: frozenset[str] = frozenset()
        self.weight_bytes = 0
        self._open(model_dir.saes(), strict=True)

    def refresh(self) -> bool:
        """Open the SAEs added to the directory since (and forget the removed ones); whether
        its SAEs changed. One that cannot be served is left out, saying why in the log."""
        if self._listing() == self._seen:
            return False
        self._open(self._model_dir.saes(), strict=False)
        return True

    def _listing(self) -> dict[str, int]:
        """What tells a change of the SAEs: each folder's sae.json's time, by name."""
        if not self._folder.is_dir():
            return {}
        return {p.parent.name: p.stat().st_mtime_ns for p in self._folder.glob(f"*/{SAE_JSON}")}

    def _open(self, configs: dict[str, SAEConfig], strict: bool) -> None:
        """Open the sessions of `configs` not open yet (or rewritten since); `strict`:
        ModelLoadError where one cannot be (at start), else it is logged and left out."""
        listing, opened = self._listing(), self._seen
        self._seen = listing
        sessions, sites, targets = dict(self._sessions), dict(self._sites), dict(self._targets)
        norms = dict(self._norms)
        outputs = self._returned() if configs else frozenset()
        for name, sae in configs.items():
            if name in sessions and opened.get(name) == listing.get(name):
                continue
            self._weights = {k: w for k, w in self._weights.items() if not k.startswith(f"{name}/")}
            targets.pop(name, None)
            norms.pop(name, None)
            try:
                sites[name], sessions[name] = self._session(name, sae, outputs)
                if sae.transcoder:
                    targets[name] = self._site(name, sae, outputs, output=True)
                if normed_site(self._config, sae.hook_name) is not None:
                    norms[name] = self._open_graph(self._folder / name / SAE_SITE_ONNX)
            except ModelLoadError as exc:
                if strict:
                    raise
                log.error("SAE %s not served: %s", name, exc)
        # larger tables, then the list: a run sees no name it cannot run
        self._sites, self._targets, self._norms = sites, targets, norms
        self._sessions = sessions
        self.decoder_on_demand = frozenset(
            name
            for name, session in sessions.items()
            if SAE_INPUTS[2] in {i.name for i in session.get_inputs()}
        )
        self.configs = {name: sae for name, sae in configs.items() if name in sessions}
        self.weight_bytes = self._model_dir.sae_bytes()  # what their sessions hold
        if not strict:
            log.info("SAEs now served: %s", ", ".join(sorted(self.configs)) or "none")

    def _session(
        self, name: str, sae: SAEConfig, outputs: Collection[str]
    ) -> tuple[tuple[str, int], ort.InferenceSession]:
        folder = self._folder / name
        site = self._site(name, sae, outputs)
        session = self._open_graph(folder / SAE_ONNX)
        missing = set(SAE_OUTPUTS) - {o.name for o in session.get_outputs()}
        if missing:
            raise ModelLoadError(f"{folder / SAE_ONNX} has no {sorted(missing)} outputs")
        return site, session

    def _open_graph(self, path: Path) -> ort.InferenceSession:
        so = self._options()
        if not self._prepack:
            so.add_session_config_entry("session.disable_prepacking", "1")
        try:
            return self._open_session(str(path), so)
        except Exception as exc:  # ORT raises its own untyped errors
            raise ModelLoadError(f"{path}: {exc}") from exc

    def _site(
        self, name: str, sae: SAEConfig, outputs: Collection[str], output: bool = False
    ) -> tuple[str, int]:
        """Where the readouts graph returns the site SAE `name` reads (`output`: writes)."""
        folder, hook = self._folder / name, sae.output_hook if output else sae.hook_name
        verb = "writes" if output else "reads"
        try:
            site = site_of(sae, self._config, output)
        except UnsupportedError as exc:
            raise ModelLoadError(f"{folder}: {exc}") from None
        if site[0] not in outputs:
            raise ModelLoadError(
                f"{folder}: the SAE {verb} {hook}, which this directory's readouts graph does "
                f"not return (written before attnserve returned {site[0]}): export the model "
                "again"
            )
        return site

    def direction(self, name: str, feature_id: int) -> np.ndarray:
        """Feature `feature_id`'s decoder row (d_in,) of SAE `name`: what a unit of its
        activation adds to the site. UnsupportedError for an SAE added in 8 bits (its rows
        are packed)."""
        try:
            return np.array(self.weight(name, _DECODER)[feature_id], dtype=np.float32)
        except UnsupportedError:
            raise UnsupportedError(
                f"SAE {name!r} was added in 8 bits: its decoder rows are packed, so its "
                "features are not steered by name; add it in float32 or send the row as values"
            ) from None

    def weight(self, name: str, tensor: str) -> np.ndarray:
        """SAE `name`'s float32 parameter `tensor` (model/sae.py's names: W_enc (d_in, S),
        W_dec (S, d_out), b_dec), memory-mapped where the file holds it apart."""
        key = f"{name}/{tensor}"
        if key not in self._weights:
            folder = self._folder / name
            graph = onnx.load(str(folder / SAE_ONNX), load_external_data=False).graph
            found = next((t for t in graph.initializer if t.name == tensor), None)
            if found is None or found.data_type != onnx.TensorProto.FLOAT:
                raise UnsupportedError(f"SAE {name!r} holds no float32 {tensor}")
            if found.data_location == onnx.TensorProto.EXTERNAL:
                info = {entry.key: entry.value for entry in found.external_data}
                self._weights[key] = np.memmap(
                    folder / info["location"],
                    dtype="<f4",
                    mode="r",
                    offset=int(info.get("offset", 0)),
                    shape=tuple(found.dims),
                )
            else:
                self._weights[key] = onnx.numpy_helper.to_array(found)
        return self._weights[key]

    def activations(self, name: str, x: np.ndarray) -> np.ndarray:
        """Every feature's activation (P, d_sae) of SAE `name` at the site's rows x (P, d_in)."""
        return self._run(name, x[None], top_k=1, error_norm=False, activations=True)[_ACTIVATIONS]

    def read(
        self, run: StreamRun, selections: Sequence[FeaturesSelection | None]
    ) -> list[Features | None]:
        """Each row's features of a readouts run (None where its selection is): each SAE on
        its site at the selection's positions, stacked on a first axis over the SAEs. An
        SAE runs once for the whole batch, on every asking row's positions side by side
        (its graph reads each position alone)."""
        asked = {row: s for row, s in enumerate(selections) if s is not None}
        got: dict[tuple[int, str], dict[str, np.ndarray]] = {}
        for sae in dict.fromkeys(name for s in asked.values() for name in s.saes):
            rows = [row for row, s in asked.items() if sae in s.saes]
            error_norm = any(asked[row].error_norm for row in rows)
            x = _rows(run, self._sites[sae], rows, asked)  # (1, positions of every row, d_in)
            if sae in self._norms:  # x is the stream the norm computing its site reads
                x = self._normed(sae, x)
            target = None  # a transcoder's error is against its output site
            if sae in self._targets and error_norm:
                target = _rows(run, self._targets[sae], rows, asked)
            values = self._run(
                sae,
                x,
                top_k=max(asked[row].top_k for row in rows),
                error_norm=error_norm,
                activations=any(asked[row].dense or asked[row].feature_ids for row in rows),
                target=target,
            )
            start = 0
            for row in rows:
                end = start + len(asked[row].positions)
                got[row, sae] = {name: value[start:end] for name, value in values.items()}
                start = end
        return [
            None if s is None else _features(s, [got[row, sae] for sae in s.saes])
            for row, s in enumerate(selections)
        ]

    def _normed(self, sae: str, x: np.ndarray) -> np.ndarray:
        """SAE `sae`'s site (1, P, d_in) from the stream x its norm reads (site.onnx)."""
        try:
            return self._norms[sae].run(None, {SAE_INPUTS[0]: x})[0]
        except Exception as exc:  # ORT raises its own untyped errors
            raise InferenceError(f"ONNX Runtime failed on SAE {sae!r}'s site: {exc}") from exc

    def _run(
        self,
        sae: str,
        x: np.ndarray,
        top_k: int,
        error_norm: bool,
        activations: bool,
        target: np.ndarray | None = None,
    ) -> dict[str, np.ndarray]:
        """SAE `sae`'s graph on x (1, P, d_in) (a transcoder's error against `target`
        (1, P, d_out)): its outputs by name, (P, ...) each."""
        names = [name for name in SAE_OUTPUTS[:-1] if error_norm or name != _ERROR]
        names += [_ACTIVATIONS] if activations else []
        k = np.array([top_k], dtype=np.int64)
        feeds = dict(zip(SAE_INPUTS, (x, k, np.array(error_norm)), strict=True))
        if sae not in self.decoder_on_demand:
            del feeds[SAE_INPUTS[2]]
        if sae in self._targets:  # a transcoder's output site: unread without the error
            width = self.configs[sae].width_out
            feeds[TRANSCODER_TARGET] = (
                np.zeros((1, x.shape[1], width), np.float32) if target is None else target
            )
        try:
            outputs = self._sessions[sae].run(names, feeds)
        except Exception as exc:  # ORT raises its own untyped errors
            raise InferenceError(f"ONNX Runtime failed on SAE {sae!r}: {exc}") from exc
        return {name: value[0] for name, value in zip(names, outputs, strict=True)}


def _rows(
    run: StreamRun,
    place: tuple[str, int],
    rows: list[int],
    asked: dict[int, FeaturesSelection],
) -> np.ndarray:
    """One site's values (1, P, width) at every asking row's positions, side by side."""
    output, index = place
    site = run.output(output)  # (B, sites, T, width)
    return np.concatenate([site[row, index, list(asked[row].positions)] for row in rows])[None]


def _features(selection: FeaturesSelection, per_sae: list[dict[str, np.ndarray]]) -> Features:
    """One row's Features from each of its SAEs' outputs at its positions (their top k of
    the batch's largest k, cut to its own)."""

    def stacked(name: str, cut: slice | list[int] = slice(None)) -> np.ndarray:
        return np.stack([got[name][:, cut] if name != _ERROR else got[name] for got in per_sae])

    k, ids = slice(selection.top_k), list(selection.feature_ids)
    return Features(
        top_ids=stacked("top_ids", k),
        top_activations=stacked("top_activations", k),
        l0=np.stack([got["l0"] for got in per_sae]),
        error_norm=stacked(_ERROR) if selection.error_norm else None,
        # of SAEs of any widths; dense ones are of one width (the plan's rule)
        feature_activations=stacked(_ACTIVATIONS, ids) if ids else None,
        activations=stacked(_ACTIVATIONS) if selection.dense else None,
    )
