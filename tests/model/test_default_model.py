"""The default model: the committed checkpoint (`attnserve train`) learned real structure.

Its exported graphs come from the session's `default_export`, which runs
`attnserve export` exactly as `make serve` does (no source: this checkpoint).
"""

from __future__ import annotations

import json
import math

import numpy as np

from attnserve.export.cli import DEFAULT_CHECKPOINT
from attnserve.model.config import ModelConfig
from attnserve.service.ort.runtime import OrtRuntime, RuntimeOptions

ENGLISH = (
    "The cat sat on the mat because it was tired. Later that evening, the children "
    "came home from school and asked their mother what was for dinner."
)
# Bits per byte the trained model must beat the corpus's unigram entropy by, on held-out text.
MARGIN_BITS = 2.0


def english_ids() -> np.ndarray:
    return np.array([[ModelConfig().bos_id, *ENGLISH.encode()]], dtype=np.int64)


def previous_token_scores(attentions: np.ndarray) -> np.ndarray:
    """(L, H, T, T) -> [layers, heads]: mean attention from each i >= 1 to i - 1."""
    t = attentions.shape[-1]
    return attentions[:, :, np.arange(1, t), np.arange(t - 1)].mean(axis=-1)


def test_the_checkpoint_ships_with_its_report():
    report = json.loads(
        DEFAULT_CHECKPOINT.with_name(DEFAULT_CHECKPOINT.name + ".report.json").read_text()
    )
    # The default config exactly (fields added since the report was written take defaults).
    assert ModelConfig.from_dict(report["model_config"]) == ModelConfig()
    assert DEFAULT_CHECKPOINT.stat().st_size < 10 * 2**20  # float16: a few MB


def test_validation_loss_is_well_below_the_unigram_entropy():
    import torch

    from attnserve.model.checkpoint import load_checkpoint
    from attnserve.model.train import Corpus, LanguageModel, evaluate

    corpus = Corpus.load(ModelConfig())
    model = LanguageModel(load_checkpoint(DEFAULT_CHECKPOINT))
    with torch.no_grad():
        # Full-length windows: positions the short training windows never saw count too.
        nats = evaluate(model, corpus.validation, seq_len=1024, tokens=16384)
    bits = nats / math.log(2)
    assert bits < corpus.unigram_bits_per_byte() - MARGIN_BITS, (
        bits,
        corpus.unigram_bits_per_byte(),
    )


def test_it_has_a_previous_token_head_and_random_weights_do_not(default_export):
    # The served graph, as `make serve` exports it.
    trained = OrtRuntime(default_export[0], RuntimeOptions(provider="cpu"))
    scores = previous_token_scores(trained.run(english_ids())[1][0])
    assert scores.max() > 0.5, scores.round(2)
    # The same architecture with random weights (seed 0, the old default): no such head.
    import torch

    from attnserve.model.encoder import build_encoder

    with torch.no_grad():
        _, attentions = build_encoder(ModelConfig(), seed=0)(torch.from_numpy(english_ids()))
    control = previous_token_scores(attentions[0].numpy())
    assert control.max() < 0.5, control.round(2)
