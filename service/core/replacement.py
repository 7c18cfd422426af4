"""The seam between attribution graphs (service/circuits) and whatever runs the model: a
transcoder set's replacement model, as the backend serves it, and what one prompt's run
gives it. Imports no engine; service/ort/replacement.py implements it."""

from __future__ import annotations

from typing import NamedTuple, Protocol

import numpy as np


class FrozenPrompt(NamedTuple):
    """What a prompt's run gives a transcoder set's replacement model (its patterns and
    norm scales stay inside the backward graph)."""

    inputs: np.ndarray  # float32 (L, T, d_in): what each layer's transcoder reads
    outputs: np.ndarray  # float32 (L, T, D): what each MLP writes (hook_mlp_out)
    skips: np.ndarray  # float32 (L, T, D): what each transcoder's skip writes (or zeros)
    logits: np.ndarray  # float32 (V,): the next-token logits after the last position
    embeddings: np.ndarray  # float32 (T, D): the tokens' embeddings (hook_embed)


class ReplacementModel(Protocol):
    """A transcoder set's local replacement model of the served one (one transcoder per
    layer, each writing its layer's MLP output): what attribution graphs are computed on
    (service/circuits). Its matrices are float32 memory maps of the set's files."""

    @property
    def members(self) -> tuple[str, ...]:
        """Each layer's transcoder, as `saes` names it."""

    @property
    def scan(self) -> str:
        """The set's identifier, its config.yaml's `scan` (a graph's metadata names it)."""

    def freeze(self, input_ids: np.ndarray) -> FrozenPrompt:
        """A prompt, int64 (T,), run once."""

    def rows(
        self, input_ids: np.ndarray, grads: np.ndarray, layers: np.ndarray, positions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The frozen model's backward for N rows: grads float32 (N, D) put at (layers[n],
        positions[n]) of the transcoders' input site (layer L: the model's output after its
        final norm) -> their gradients at every hook_mlp_out (N, L, T, D) and at hook_embed
        (N, T, D)."""

    def activations(self, layer: int, x: np.ndarray) -> np.ndarray:
        """Layer `layer`'s transcoder's features (T, S) at its input x (T, d_in)."""

    def encoder(self, layer: int) -> np.ndarray:
        """W_enc (d_in, S): a feature's column is what reads it."""

    def decoder(self, layer: int) -> np.ndarray:
        """W_dec (S, D): a feature's row is what a unit of it writes."""

    def decoder_bias(self, layer: int) -> np.ndarray:
        """b_dec (D,)."""

    def unembedding(self) -> np.ndarray:
        """(V, D) the rows the logits are read with (times `logit_scale`)."""
