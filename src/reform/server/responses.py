"""``POST /v1/responses``: OpenAI's Responses API for questions over vector stores, as the official client's
``client.responses.create(model=..., input=..., tools=[{"type": "file_search", "vector_store_ids": [...]}])``
sends it. The answer comes from the library of those vector stores (``libraries.LibraryQuestion``): a
``file_search_call`` item (its results with ``include=["file_search_call.results"]``), then the message
with a ``file_citation`` annotation per document the answer was recomputed from; ``reform`` carries the
evidence (document, page, section) and each stage's time, as in chat completions. Without a ``file_search``
tool the question is answered by the model alone. Streaming is refused (400): a chat completion with
``vector_store_ids`` streams the same answer."""

from __future__ import annotations

import secrets
import time

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from .admission import Waiting, still_wanted
from .edge import asked
from .libraries import LibraryQuestion
from .openai_schema import ApiError
from .scheduler import Cancelled

router = APIRouter()
IGNORED = ("store", "metadata", "user", "parallel_tool_calls", "tool_choice", "truncation", "reasoning",
           "service_tier", "safety_identifier", "prompt_cache_key", "text", "background", "previous_response_id")


class ResponseRequest(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)     # JSON types as sent: "5" is no int, true no 1
    model: str
    input: str | list[dict]
    instructions: str | None = None
    tools: list[dict] = Field(default_factory=list)
    include: list[str] | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    stream: bool = False

    def question(self) -> tuple[list[tuple[str, str]], str]:
        """``(earlier turns, question)``: the input's last user message is the question."""
        if isinstance(self.input, str):
            turns, last = [], ("user", self.input)
        else:
            items = [(m.get("role"), content_text(m.get("content"))) for m in self.input if m.get("type", "message") == "message"]
            if not items:
                raise ApiError(400, "input holds no message", param="input")
            turns, last = items[:-1], items[-1]
        if last[0] != "user" or not last[1].strip():
            raise ApiError(400, "the last input message must be the user's question, in text", param="input")
        return [(r, t) for r, t in turns if t.strip()], last[1]

    def vector_store_ids(self) -> list[str] | None:
        ids = None
        for tool in self.tools:
            if tool.get("type") != "file_search":
                raise ApiError(400, f"tool '{tool.get('type')}' is not supported here; file_search is",
                               param="tools")
            ids = (ids or []) + list(tool.get("vector_store_ids") or [])
        if ids == []:
            raise ApiError(400, "file_search needs vector_store_ids", param="tools")
        return ids

    def refuse_unsupported(self) -> None:
        if self.stream:
            raise ApiError(400, "streaming is not supported by /v1/responses here; stream a chat completion with "
                                "extra_body={'vector_store_ids': [...]} instead", param="stream")
        unknown = sorted(k for k in (self.model_extra or {}) if k not in IGNORED)
        if unknown:
            raise ApiError(400, f"unknown or unsupported field(s): {', '.join(unknown)}", param=unknown[0])

    def sampling(self) -> dict:
        return {"temperature": 0.0 if self.temperature is None else self.temperature,
                "top_p": 1.0 if self.top_p is None else self.top_p, "seed": None, "stop": ()}


def content_text(content) -> str:
    """A Responses input message's text: a string, or its ``input_text``/``output_text`` parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    parts = []
    for part in content:
        if part.get("type") not in ("input_text", "output_text", "text"):
            raise ApiError(400, f"input content of type '{part.get('type')}' is not supported; send text",
                           param="input")
        parts.append(part.get("text") or "")
    return "".join(parts)


def output(answer, question: str, shelf: dict | None, include: list[str]) -> list[dict]:
    """The response's output items: the file search and the message with its file citations."""
    items = []
    cited = []
    if shelf is not None:
        stages = answer.stats.get("library", {})
        cited = [(n, shelf[n].title or n) for n in reversed(stages.get("gathered_from", []))]
        by_title = {title: name for name, title in cited}
        results = [{"file_id": by_title.get(p.document, ""), "filename": p.document, "score": p.score, "text": p.text,
                    "attributes": {"page": p.page, "section": p.section, "unit": p.unit}} for p in answer.evidence]
        items.append({"type": "file_search_call", "id": "fs_" + secrets.token_hex(12), "status": "completed",
                      "queries": [question], "results": results if "file_search_call.results" in include else None})
    annotations = [{"type": "file_citation", "index": len(answer.text), "file_id": n, "filename": title}
                   for n, title in cited]
    items.append({"type": "message", "id": "msg_" + secrets.token_hex(12), "status": "completed", "role": "assistant",
                  "content": [{"type": "output_text", "text": answer.text, "annotations": annotations,
                               "logprobs": []}]})
    return items


@router.post("/v1/responses")
async def create_response(request: Request):
    service, tenant, req, deadline = await asked(request, ResponseRequest)
    settings = service.settings
    turns, question = req.question()
    if req.instructions:
        turns = [("system", req.instructions)] + turns
    question = await service.fit_history(turns, question)
    vs_ids = req.vector_store_ids()
    stores = service.vector_stores
    shelf = None if vs_ids is None else await run_in_threadpool(stores.shelf, tenant, vs_ids)
    job_of = LibraryQuestion(service, stores.asker(tenant), shelf, question, stream=False,
                            max_new_tokens=req.max_output_tokens, sampling=req.sampling(), tenant=tenant)
    try:
        job = await service.enqueue(job_of.put, lambda: still_wanted(request, deadline, settings.request_timeout),
                                    tenant)
        answer, _ = await Waiting(job, request, deadline, settings.request_timeout).result()
    except Cancelled:
        return {}
    created = int(time.time())
    incomplete = answer.finish_reason == "length"
    return {"id": "resp_" + secrets.token_hex(12), "object": "response", "created_at": created,
            "completed_at": created, "status": "incomplete" if incomplete else "completed", "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "instructions": req.instructions, "model": service.model_id,
            "output": output(answer, question, shelf, req.include or []), "parallel_tool_calls": False,
            "tool_choice": "auto", "tools": req.tools, "temperature": req.temperature, "top_p": req.top_p,
            "max_output_tokens": req.max_output_tokens, "metadata": {},
            "usage": {"input_tokens": answer.input_tokens, "output_tokens": len(answer.tokens),
                      "total_tokens": answer.input_tokens + len(answer.tokens),
                      "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}},
            "reform": {"stats": answer.stats, "evidence": [p.to_json() for p in answer.evidence],
                       **({"evidence_note": answer.evidence_note} if answer.evidence_note else {})}}
