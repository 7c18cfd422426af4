"""A generation request, checked and planned once: its prompt's ids, how tokens are chosen
and when the text ends, and its interventions as changes of the prompt's positions and of
every position generated after (the readouts graph's changes, core/interventions.py); and
what the text holds in the memory budget at its longest."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from attnserve.model.config import ModelConfig
from attnserve.service.core.backend import SiteChange
from attnserve.service.core.errors import InvalidInputError
from attnserve.service.core.interventions import changes_bytes, plan_changes
from attnserve.service.core.plan import tokenized
from attnserve.service.core.request import EncodeOptions, GenerateOptions, Input
from attnserve.service.core.view import ModelView
from attnserve.service.generate.sampling import MAX_LOGPROBS, Sampling

MAX_STOP = 4  # stop strings per request, as OpenAI allows
DEFAULT_MAX_TOKENS = 16  # OpenAI's, where the request sets none (and the context has room)
MAX_TEMPERATURE = 100.0


@dataclass(frozen=True, eq=False)
class GenerationPlan:
    """One text to continue, validated."""

    prompt: np.ndarray  # int64 (T,)
    max_tokens: int  # at most this many, and no further than the model's context
    sampling: Sampling = field(default_factory=Sampling)
    stop: tuple[str, ...] = ()  # the text ends before the first of these it makes
    stop_ids: frozenset[int] = frozenset()  # ... or at one of these tokens (EOS's included)
    prompt_changes: Mapping[str, SiteChange] = field(default_factory=dict)
    step_changes: Mapping[str, SiteChange] = field(default_factory=dict)  # at each new token


def generation_bytes(plan: GenerationPlan, config: ModelConfig) -> int:
    """What a text holds at its longest: each layer's keys and values of every position,
    twice (a step's past and the step's output beside it), and its changes."""
    positions = min(len(plan.prompt) + plan.max_tokens, config.max_seq_len) + 1
    per_position = 2 * config.n_layers * config.kv_heads * config.head_dim * 4
    return 2 * positions * per_position + changes_bytes(plan.prompt_changes)


def plan_generation(item: Input, options: GenerateOptions, view: ModelView) -> GenerationPlan:
    """The checked plan of one text's generation; InvalidInputError names the field."""
    config = view.config
    prompt, _ = tokenized("prompt", item, EncodeOptions(), config, view.tokenizer)
    if len(prompt) >= config.max_seq_len:
        raise InvalidInputError(
            f"prompt: {len(prompt)} tokens leave no room to generate in the model's context "
            f"(max_seq_len={config.max_seq_len})"
        )
    # the prompt's last token needs no position of its own: its successor is the first made
    room = config.max_seq_len - len(prompt) + 1
    max_tokens = min(DEFAULT_MAX_TOKENS, room) if options.max_tokens is None else options.max_tokens
    if max_tokens < 1:
        raise InvalidInputError(f"max_tokens: {max_tokens} is not >= 1")
    if max_tokens > room:
        raise InvalidInputError(
            f"max_tokens: {max_tokens} is more than the {room} tokens the model's context "
            f"(max_seq_len={config.max_seq_len}) leaves after the prompt's {len(prompt)}"
        )
    if not (0.0 <= options.temperature <= MAX_TEMPERATURE):  # NaN fails too
        raise InvalidInputError(
            f"temperature: {options.temperature} is outside [0, {MAX_TEMPERATURE:g}]"
        )
    if not (0.0 < options.top_p <= 1.0):
        raise InvalidInputError(f"top_p: {options.top_p} is outside (0, 1]")
    if options.logprobs is not None and not 0 <= options.logprobs <= MAX_LOGPROBS:
        raise InvalidInputError(f"logprobs: {options.logprobs} is outside [0, {MAX_LOGPROBS}]")
    if options.seed is not None and options.seed < 0:
        raise InvalidInputError(f"seed: {options.seed} is not >= 0")
    if len(options.stop) > MAX_STOP or not all(options.stop):
        raise InvalidInputError(f"stop: at most {MAX_STOP} strings, none empty")
    for i, token in enumerate(options.stop_token_ids):
        if not 0 <= token < config.vocab_size:
            raise InvalidInputError(
                f"stop_token_ids[{i}]: {token} is outside the vocabulary [0, {config.vocab_size})"
            )
    stop_ids = set(options.stop_token_ids)
    if not options.ignore_eos:
        stop_ids.add(config.eos_id)
    for i, entry in enumerate(options.interventions):
        if entry.op == "clamp":
            raise InvalidInputError(
                f"interventions[{i}].op: clamp is not served in generation (it reads the "
                "feature at every step); steer with op add and the feature instead"
            )
        if not math.isfinite(entry.scale if entry.scale is not None else 0.0):
            raise InvalidInputError(f"interventions[{i}].scale: {entry.scale} is not finite")
    # at each generated position: the changes of every position (one row of values)
    everywhere = tuple(
        i
        for i in options.interventions
        if not i.positions and (i.values is None or i.values.ndim == 1)
    )
    return GenerationPlan(
        prompt=prompt,
        max_tokens=max_tokens,
        sampling=Sampling(options.temperature, options.top_p, options.seed, options.logprobs),
        stop=options.stop,
        stop_ids=frozenset(stop_ids),
        prompt_changes=plan_changes(options.interventions, (), view, len(prompt), 0),
        step_changes=plan_changes(everywhere, (), view, 1, 0),
    )
