"""attnserve.v1's Generate over one model's data plane: the request as the data plane's
choices, each token as a GenerateResponse."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

from attnserve.service.core.dataplane import DataPlane
from attnserve.service.core.errors import InvalidInputError
from attnserve.service.core.request import GenerateOptions, Input
from attnserve.service.v1.options import input_of, intervention_of
from attnserve.v1 import encoder_service_pb2 as pb

FINISH_REASONS = {None: pb.FINISH_REASON_UNSPECIFIED, "stop": pb.FINISH_REASON_STOP}
FINISH_REASONS["length"] = pb.FINISH_REASON_LENGTH


async def generate(
    plane: DataPlane, request: pb.GenerateRequest, timeout: float | None
) -> AsyncIterator[pb.GenerateResponse]:
    """The request's tokens as they are made; `timeout` bounds the wait for admission."""
    choices = choices_of(request)
    async with plane.generating(choices, timeout) as (lengths, tokens):
        first = [True] * len(choices)
        async for index, token in tokens:
            message = pb.GenerateResponse(
                choice=index,
                token_id=token.token_id,
                text=token.text,
                logprob=token.logprob,
                top_logprobs=[pb.TokenLogprob(token_id=i, logprob=lp) for i, lp in token.top],
                finish_reason=FINISH_REASONS[token.finish_reason],
                prompt_tokens=lengths[index] if first[index] else 0,
            )
            first[index] = False
            yield message


def choices_of(request: pb.GenerateRequest) -> list[tuple[Input, GenerateOptions]]:
    """The prompt and its options; with compare, the plain text's choice after."""
    given = request.options
    options = GenerateOptions(
        max_tokens=given.max_tokens or None,
        temperature=given.temperature if given.HasField("temperature") else 1.0,
        top_p=given.top_p if given.HasField("top_p") else 1.0,
        seed=given.seed if given.HasField("seed") else None,
        stop=tuple(given.stop),
        stop_token_ids=tuple(given.stop_token_ids),
        ignore_eos=given.ignore_eos,
        logprobs=given.logprobs if given.HasField("logprobs") else None,
        interventions=tuple(
            intervention_of(f"options.interventions[{i}]", entry)
            for i, entry in enumerate(given.interventions)
        ),
    )
    prompt = input_of("prompt", request.prompt)
    if not given.compare:
        return [(prompt, options)]
    if not options.interventions:
        raise InvalidInputError("options.compare: name interventions to compare the text with")
    return [(prompt, options), (prompt, replace(options, interventions=()))]
