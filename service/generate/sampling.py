"""Choosing the next token from a row of logits: greedy, or sampled at a temperature from
the nucleus (top_p), with the log-probabilities OpenAI's `logprobs` report. numpy only."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_LOGPROBS = 10  # alternatives per token, as OpenAI's completions allow (top_logprobs <= 20
# in chat; vLLM's default cap is 20): beyond, the answer grows for nothing a reader uses


@dataclass(frozen=True)
class Sampling:
    """How one text's tokens are chosen, and what is reported of each."""

    temperature: float = 1.0  # 0: greedy (the most probable token, ties to the lowest id)
    top_p: float = 1.0  # the smallest set of most probable tokens holding this mass
    seed: int | None = None  # the same seed and request give the same text
    logprobs: int | None = None  # None: none; else the chosen token's and this many others'


@dataclass(frozen=True)
class Choice:
    """A chosen token, and its log-probability and the most probable alternatives' where
    asked (of the model's distribution, before temperature and top_p, as vLLM reports)."""

    token_id: int
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] = ()  # (id, logprob), most probable first


def choose(logits: np.ndarray, sampling: Sampling, rng: np.random.Generator) -> Choice:
    """The next token from logits (V,) float32."""
    logits = logits.astype(np.float64)
    if sampling.temperature == 0.0:
        token = int(np.argmax(logits))
    else:
        token = _sample(logits / sampling.temperature, sampling.top_p, rng)
    if sampling.logprobs is None:
        return Choice(token)
    logprobs = logits - _logsumexp(logits)
    top: tuple[tuple[int, float], ...] = ()
    if sampling.logprobs:
        k = min(sampling.logprobs, len(logprobs))
        ids = np.argpartition(-logprobs, k - 1)[:k]
        ids = ids[np.argsort(-logprobs[ids], kind="stable")]
        top = tuple((int(i), float(logprobs[i])) for i in ids)
    return Choice(token, float(logprobs[token]), top)


def _sample(scaled: np.ndarray, top_p: float, rng: np.random.Generator) -> int:
    probabilities = np.exp(scaled - _logsumexp(scaled))
    order = np.argsort(-probabilities, kind="stable")
    if top_p < 1.0:  # the nucleus: the most probable tokens until their mass reaches top_p
        mass = np.cumsum(probabilities[order])
        order = order[: int(np.searchsorted(mass, top_p)) + 1]
    kept = probabilities[order]
    return int(order[rng.choice(len(order), p=kept / kept.sum())])


def _logsumexp(x: np.ndarray) -> float:
    top = float(x.max())
    return top + float(np.log(np.exp(x - top).sum()))
