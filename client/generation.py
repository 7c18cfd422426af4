"""attnserve.v1's Generate from Python: the request built from keywords, each streamed message
as a GeneratedToken.

    with EncoderClient("localhost:50051") as client:
        for token in client.generate("The cat", max_tokens=20, temperature=0):
            print(token.text, end="", flush=True)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from attnserve.client.request import Input, intervention_message
from attnserve.v1 import encoder_service_pb2 as pb

FINISH_REASONS = {pb.FINISH_REASON_STOP: "stop", pb.FINISH_REASON_LENGTH: "length"}


@dataclass(frozen=True)
class GeneratedToken:
    """One token of a text, as the server made it."""

    choice: int  # 0, or with compare 1 for the plain text's
    token_id: int
    text: str  # what it adds to the text (empty while a character or stop string forms)
    logprob: float | None
    top_logprobs: tuple[tuple[int, float], ...]  # (id, logprob), most probable first
    finish_reason: str | None  # "stop" or "length" on a text's last token
    prompt_tokens: int  # the prompt's length, on each choice's first token (else 0)


def build_generate_request(
    prompt: Input,
    *,
    model: str = "",
    max_tokens: int = 16,
    temperature: float | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    stop: Sequence[str] = (),
    stop_token_ids: Sequence[int] = (),
    ignore_eos: bool = False,
    logprobs: int | None = None,
    interventions: Sequence[Mapping] = (),
    compare: bool = False,
) -> pb.GenerateRequest:
    """A GenerateRequest: the prompt a text or its token ids; interventions as
    build_request's (dicts of hook, op, values, scale, positions, heads, feature)."""
    request = pb.GenerateRequest(model=model)
    if isinstance(prompt, str):
        request.prompt.text = prompt
    else:
        request.prompt.token_ids.ids.extend(int(i) for i in prompt)
    options = request.options
    options.max_tokens = max_tokens
    options.stop.extend(stop)
    options.stop_token_ids.extend(stop_token_ids)
    options.ignore_eos = ignore_eos
    options.compare = compare
    for name, value in (
        ("temperature", temperature),
        ("top_p", top_p),
        ("seed", seed),
        ("logprobs", logprobs),
    ):
        if value is not None:
            setattr(options, name, value)
    options.interventions.extend(intervention_message(entry) for entry in interventions)
    return request


def parse_token(message: pb.GenerateResponse) -> GeneratedToken:
    return GeneratedToken(
        choice=message.choice,
        token_id=message.token_id,
        text=message.text,
        logprob=message.logprob if message.HasField("logprob") else None,
        top_logprobs=tuple((t.token_id, t.logprob) for t in message.top_logprobs),
        finish_reason=FINISH_REASONS.get(message.finish_reason),
        prompt_tokens=message.prompt_tokens,
    )
