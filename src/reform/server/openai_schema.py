"""The OpenAI chat-completions request as this server reads it: which fields it honours, which it refuses
(with a 400 that names them), and how a conversation splits into a context and a question.

The last message must be the user's question; every earlier message (system prompt, a pasted document,
earlier turns) is context. A chat client re-sends the whole conversation every turn, so the context
grows by the previous question and answer each time; to encode a document once, the server looks for
the longest stored prefix of the earlier messages and lets the few turns after it ride along with the
question (``split_conversation``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# Fields of the OpenAI schema that change the answer and that this server cannot honour.
UNSUPPORTED = {
    "tools": "tool calls", "tool_choice": "tool calls", "functions": "function calls",
    "function_call": "function calls", "logprobs": "log-probabilities", "top_logprobs": "log-probabilities",
    "logit_bias": "logit bias", "audio": "audio output", "modalities": "audio output", "prediction": "predicted outputs",
    "frequency_penalty": "frequency penalties", "presence_penalty": "presence penalties", "web_search_options": "web search",
}
# Fields accepted and ignored because they do not change the answer.
IGNORED = {"user", "metadata", "store", "service_tier", "parallel_tool_calls", "reasoning_effort", "safety_identifier",
           "prompt_cache_key", "verbosity"}


class ApiError(Exception):
    """An error answered in the OpenAI error shape with its HTTP status."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict] | None = None

    def text(self) -> str:
        """The message's text; content parts other than text are refused."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ApiError(400, f"message content of type '{part.get('type')}' is not supported; send text",
                               param="messages")
            parts.append(part["text"])
        return "".join(parts)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class ChatRequest(BaseModel):
    """``POST /v1/chat/completions``. ``context_id`` (the OpenAI client's ``extra_body``) names a context
    uploaded to ``/v1/contexts``; then every message but the last may be left out."""

    model_config = ConfigDict(extra="allow")
    model: str
    messages: list[Message] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    n: int | None = Field(None, ge=1)
    response_format: dict | None = None
    context_id: str | None = None

    @field_validator("stop")
    @classmethod
    def _stop(cls, v):
        stops = [v] if isinstance(v, str) else list(v or [])
        if len(stops) > 4 or not all(stops):
            raise ValueError("stop takes up to 4 non-empty strings")
        return v

    def refuse_unsupported(self) -> None:
        """400 naming any field that would change the answer and is not honoured."""
        extra: dict[str, Any] = dict(self.model_extra or {})
        if self.n not in (None, 1):
            raise ApiError(400, "n > 1 is not supported: ask once per answer", param="n")
        if self.response_format not in (None, {"type": "text"}):
            raise ApiError(400, "response_format other than text is not supported", param="response_format")
        for name, what in UNSUPPORTED.items():
            value = extra.get(name)
            if value not in (None, False, 0, [], {}):
                raise ApiError(400, f"{what} are not supported by this server ('{name}' given)", param=name)
        unknown = sorted(k for k in extra if k not in UNSUPPORTED and k not in IGNORED)
        if unknown:
            raise ApiError(400, f"unknown field(s): {', '.join(unknown)}", param=unknown[0])

    def sampling(self) -> dict:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return {"temperature": 0.0 if self.temperature is None else self.temperature,
                "top_p": 1.0 if self.top_p is None else self.top_p, "seed": self.seed, "stop": tuple(stop)}

    def max_new_tokens(self) -> int | None:
        """The answer length this request sets (``max_completion_tokens`` first), or None."""
        return self.max_completion_tokens or self.max_tokens


@dataclass
class Conversation:
    """The earlier messages' texts (the context candidates) and the question."""

    earlier: list[tuple[str, str]]      # (role, text)
    question: str

    @classmethod
    def of(cls, messages: list[Message]) -> "Conversation":
        if messages[-1].role != "user":
            raise ApiError(400, "the last message must be the user's question", param="messages")
        question = messages[-1].text()
        if not question.strip():
            raise ApiError(400, "the last user message (the question) is empty", param="messages")
        earlier = [(m.role, m.text()) for m in messages[:-1]]
        return cls([(r, t) for r, t in earlier if t.strip()], question)


def context_text(messages: list[tuple[str, str]]) -> str:
    """The context encoded for some earlier messages: their texts, blank-line separated (one message: its
    text exactly, so a document pasted in chat and the same text uploaded to /v1/contexts share an id)."""
    return "\n\n".join(text for _, text in messages)


def history_question(turns: list[tuple[str, str]], question: str) -> str:
    """The question with the turns after the stored context in front of it."""
    if not turns:
        return question
    lines = [f"{role}: {text}" for role, text in turns]
    return "Earlier in this conversation:\n" + "\n".join(lines) + "\n\nQuestion: " + question
