"""The OpenAI chat-completions request as this server reads it: which fields it honours, which it refuses
(with a 400 that names them), and how a conversation splits into a context and a question.

The last message must be the user's question; every earlier message (system prompt, a pasted document,
earlier turns) is context. A chat client re-sends the whole conversation every turn, so the context
grows by the previous question and answer each time; to encode a document once, the server looks for
the longest stored prefix of the earlier messages and lets the few turns after it ride along with the
question (``split_conversation``).
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# Fields of the OpenAI schema that change the answer and that this server cannot honour.
UNSUPPORTED = {
    "tools": "tool calls", "tool_choice": "tool calls", "functions": "function calls",
    "function_call": "function calls", "logprobs": "log-probabilities", "top_logprobs": "log-probabilities",
    "logit_bias": "logit bias", "audio": "audio output", "modalities": "audio output", "prediction": "predicted outputs",
    "web_search_options": "web search",
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
    model_config = ConfigDict(extra="ignore", strict=True)     # JSON types as sent: "5" is no int, true no 1
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict] | None = None

    def parts(self) -> list[str | bytes]:
        """The message's content in order: text parts as text, ``image_url`` parts (data URLs) as the
        image's bytes; other part types are refused."""
        if self.content is None:
            return []
        if isinstance(self.content, str):
            return [self.content]
        parts = []
        for part in self.content:
            if part.get("type") == "image_url":
                parts.append(image_bytes(part.get("image_url")))
            elif part.get("type") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif part.get("type") == "file":
                parts.append(file_part(part.get("file")))
            else:
                raise ApiError(400, f"message content of type '{part.get('type')}' is not supported; send text, "
                                    "file parts (documents) or image_url parts (to a vision-language model)",
                               param="messages")
        return parts

    def text(self) -> str:
        """The message's text parts, joined."""
        return "".join(p for p in self.parts() if isinstance(p, str))

    def has_images(self) -> bool:
        return isinstance(self.content, list) and any(p.get("type") == "image_url" for p in self.content)

    def files(self) -> list["FilePart"]:
        return [p for p in self.parts() if isinstance(p, FilePart)]


@dataclass(frozen=True)
class FilePart:
    """An OpenAI ``file`` content part: the document's bytes (``file_data``) or a ``file_id`` of /v1/files."""

    data: bytes | None
    file_id: str | None
    filename: str


MEDIA_SUFFIX = {"application/pdf": ".pdf", "text/html": ".html", "application/epub+zip": ".epub", "text/markdown": ".md",
                "application/vnd.openxmlformats-officedocument.wordprocessingml.document": ".docx", "text/plain": ".txt"}


def file_part(file) -> FilePart:
    """The document of a ``{"type": "file", "file": {...}}`` part: ``file_data`` as a base64 data URL
    (``data:application/pdf;base64,...``) or plain base64, with ``filename``; or ``file_id``."""
    if not isinstance(file, dict):
        raise ApiError(400, "a file part needs a 'file' object with file_data (and filename) or file_id",
                       param="messages")
    if isinstance(file.get("file_id"), str) and file["file_id"]:
        return FilePart(None, file["file_id"], file.get("filename") or file["file_id"])
    data = file.get("file_data")
    if not isinstance(data, str) or not data:
        raise ApiError(400, "a file part needs file.file_data (a base64 data URL) or file.file_id", param="messages")
    media = ""
    if data.startswith("data:"):
        header, _, data = data.partition(",")
        if not header.endswith(";base64"):
            raise ApiError(400, "file_data must be base64-encoded (data:application/pdf;base64,...)", param="messages")
        media = header[len("data:"):-len(";base64")]
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(400, "file_data is not valid base64", param="messages") from None
    filename = file.get("filename") if isinstance(file.get("filename"), str) and file.get("filename") else \
        "document" + MEDIA_SUFFIX.get(media, "")
    return FilePart(raw, None, filename)


def image_bytes(image_url) -> bytes:
    """The bytes of an OpenAI ``image_url`` part: a ``data:image/...;base64,`` URL (the server fetches
    nothing from the network, so web URLs are refused)."""
    url = image_url.get("url") if isinstance(image_url, dict) else image_url
    if not isinstance(url, str) or not url.startswith("data:"):
        raise ApiError(400, "image_url must be a data URL (data:image/png;base64,...); this server does not fetch "
                            "images from the network", param="messages")
    header, _, payload = url.partition(",")
    if not header.endswith(";base64"):
        raise ApiError(400, "image_url's data URL must be base64-encoded (data:image/png;base64,...)", param="messages")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(400, "image_url's data URL is not valid base64", param="messages") from None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)     # JSON types as sent: "5" is no int, true no 1
    include_usage: bool = False


class ChatRequest(BaseModel):
    """``POST /v1/chat/completions``. ``context_id`` (the OpenAI client's ``extra_body``) names a context
    uploaded to ``/v1/contexts``; then every message but the last may be left out. ``vector_store_ids``
    (``extra_body`` too) asks the files of those vector stores instead."""

    model_config = ConfigDict(extra="allow", strict=True)     # JSON types as sent: "5" is no int, true no 1
    model: str
    messages: list[Message] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = None
    # vLLM's and llama.cpp's sampling fields, and OpenAI's penalties (``engine.sampling.Sampling`` checks ranges)
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    n: int | None = Field(None, ge=1)
    response_format: dict | None = None
    context_id: str | None = None
    vector_store_ids: list[str] | None = None      # ask these vector stores' files (``extra_body``)
    file_ids: list[str] | None = None              # with vector_store_ids: only these of their files

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
        given = {name: getattr(self, name) for name in ("top_k", "min_p", "repetition_penalty", "frequency_penalty",
                                                        "presence_penalty") if getattr(self, name) is not None}
        if given.get("top_k") == -1:         # vLLM's "all tokens"
            given["top_k"] = 0
        return {"temperature": 0.0 if self.temperature is None else self.temperature,
                "top_p": 1.0 if self.top_p is None else self.top_p, "seed": self.seed, "stop": tuple(stop), **given}

    def max_new_tokens(self) -> int | None:
        """The answer length this request sets (``max_completion_tokens`` first), or None."""
        return self.max_completion_tokens or self.max_tokens


@dataclass
class Conversation:
    """The earlier messages' texts (the context candidates) and the question."""

    earlier: list[tuple[str, str]]      # (role, text)
    question: str
    # with images anywhere: the whole context as text and image parts in order (every earlier message,
    # then the question's own images), encoded as it is (``Pipeline.encode``); None for text alone
    parts: list[str | bytes] | None = None
    files: list[FilePart] | None = None     # documents sent as file parts, in order (the context, with ``earlier``)

    @classmethod
    def of(cls, messages: list[Message]) -> "Conversation":
        if messages[-1].role != "user":
            raise ApiError(400, "the last message must be the user's question", param="messages")
        question = messages[-1].text()
        if not question.strip():
            raise ApiError(400, "the last user message (the question) is empty", param="messages")
        earlier = [(m.role, m.text()) for m in messages[:-1]]
        parts = None
        files = [f for m in messages for f in m.files()]
        if files and any(m.has_images() for m in messages):
            raise ApiError(400, "files and images in one conversation are not supported: send the document's "
                                "text or the images", param="messages")
        if any(m.has_images() for m in messages):
            parts = []
            for m in messages[:-1]:
                content = [p for p in m.parts() if not isinstance(p, str) or p.strip()]
                if content:
                    parts += ([SEPARATOR] if parts else []) + content
            images = [p for p in messages[-1].parts() if isinstance(p, bytes)]
            parts += ([SEPARATOR] if parts and images else []) + images
        return cls([(r, t) for r, t in earlier if t.strip()], question, parts, files or None)


SEPARATOR = "\n\n"    # between messages in a context (``context_text``)


def context_text(messages: list[tuple[str, str]]) -> str:
    """The context encoded for some earlier messages: their texts, blank-line separated (one message: its
    text exactly, so a document pasted in chat and the same text uploaded to /v1/contexts share an id)."""
    return SEPARATOR.join(text for _, text in messages)


def history_question(turns: list[tuple[str, str]], question: str) -> str:
    """The question with the turns after the stored context in front of it."""
    if not turns:
        return question
    lines = [f"{role}: {text}" for role, text in turns]
    return "Earlier in this conversation:\n" + "\n".join(lines) + "\n\nQuestion: " + question
