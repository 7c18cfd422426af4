"""OpenAI's API as this server takes it: the request bodies of /v1/completions,
/v1/chat/completions and /v1/embeddings (pydantic, as OpenAI's SDK sends them, with vLLM's
`stop_token_ids`, `ignore_eos`, `return_token_ids` and `truncate_prompt_tokens` and
attnserve's `interventions` and `compare`). Translated to the core's types in
service/openai/translate.py; answered by service/openai/answers.py."""

from __future__ import annotations

import difflib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from attnserve.service.core.errors import InvalidInputError


class OpenAIBody(BaseModel):
    """A part of an OpenAI API body: a value of the wrong type is refused, not coerced ("5"
    is not a number, "yes" not a boolean), and so is a field it does not have."""

    model_config = ConfigDict(extra="forbid", strict=True)


class RequestBody(OpenAIBody):
    """A whole request body: its unknown parameters refused by name, with the known one
    each may have meant (OpenAI's API refuses them too, where ignoring `max_token` would
    answer 16 sampled tokens and a 200)."""

    @model_validator(mode="before")
    @classmethod
    def _known_parameters(cls, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = [key for key in data if key not in cls.model_fields]
            if unknown:
                raise InvalidInputError("; ".join(cls._unknown(key) for key in unknown))
        return data

    @classmethod
    def _unknown(cls, key: str) -> str:
        meant = difflib.get_close_matches(key, cls.model_fields, n=1)
        hint = f"; did you mean {meant[0]}?" if meant else ""
        return f"{key}: not a parameter of this endpoint{hint}"


class FeatureBody(OpenAIBody):
    sae: str = Field(description="an SAE the model serves (GET /v1/model-info's saes)")
    feature_id: int


class InterventionBody(OpenAIBody):
    """attnserve's change of a hook site, as attnserve.v1's Intervention in JSON: `values` a
    list of floats (one vector, or one per position)."""

    hook: str = Field("", description="TransformerLens' name: blocks.3.hook_resid_pre")
    op: Literal["add", "set", "scale"] = "add"
    values: list[float] | list[list[float]] | None = None
    scale: float | None = Field(None, description="add, set: times the values; scale: the factor")
    positions: list[int] = Field(
        default_factory=list, description="prompt positions; none: every position, generated too"
    )
    heads: list[int] = Field(default_factory=list, description="hook_z, q, k, v: heads changed")
    feature: FeatureBody | None = Field(None, description="steer along an SAE feature's decoder")


class StreamOptions(OpenAIBody):
    include_usage: bool = False


class SamplingBody(RequestBody):
    """What OpenAI's completions and chat completions share (the parameters this server
    honours; `n`, the penalties and `logit_bias` only at their defaults)."""

    model: str | None = Field(None, description="the served model's name (GET /v1/models)")
    max_tokens: int | None = Field(None, description="at most this many (default 16)")
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # vLLM's
    truncate_prompt_tokens: int | None = Field(
        None, description="keep only the prompt's last k tokens (its BOS kept)"
    )
    stop_token_ids: list[int] = Field(default_factory=list)
    ignore_eos: bool = False
    return_token_ids: bool = False
    # attnserve's
    interventions: list[InterventionBody] = Field(default_factory=list)
    compare: bool = Field(
        False, description="each prompt's completion with and without the interventions"
    )

    def unsupported(self) -> dict[str, bool]:
        """Each parameter served only at its default, and whether it was changed."""
        return {
            "n": self.n != 1,
            "presence_penalty": self.presence_penalty != 0.0,
            "frequency_penalty": self.frequency_penalty != 0.0,
            "logit_bias": bool(self.logit_bias),
        }


class CompletionRequest(SamplingBody):
    """OpenAI's completion request (`echo`, `best_of` and `suffix` at their defaults only)."""

    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = None
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None

    def unsupported(self) -> dict[str, bool]:
        return super().unsupported() | {
            "echo": self.echo,
            "best_of": self.best_of not in (None, 1),
            "suffix": self.suffix is not None,
        }


class ContentPart(OpenAIBody):
    type: Literal["text"]  # this server's models read text only
    text: str


class ChatMessage(OpenAIBody):
    """One message of the conversation, as OpenAI's chat API takes it; the chat template
    reads every field (tool calls and results included)."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None  # None only for an assistant's tool calls
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class ChatRequest(SamplingBody):
    """OpenAI's chat completion request: the conversation rendered by the model's chat
    template."""

    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = Field(
        None, description="the functions the template shows the model, as OpenAI's API lists them"
    )
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="vLLM's: more variables for the chat template"
    )


class EmbeddingsRequest(RequestBody):
    """OpenAI's embeddings request, as its official SDK sends it, and vLLM's
    `truncate_prompt_tokens`."""

    input: str | list[str] | list[int] | list[list[int]] = Field(
        description="a text, a list of texts, a token array or a list of token arrays"
    )
    model: str | None = Field(None, description="the served model's name (GET /v1/models)")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, description="if given, the model's embedding width")
    user: str | None = None
    truncate_prompt_tokens: int | None = Field(
        None, description="keep only each input's last k tokens (its BOS kept)"
    )
