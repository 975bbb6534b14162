"""``/v1/vector_stores``: OpenAI's vector store endpoints over a tenant's libraries (``libraries.py``), as the
official client's ``client.vector_stores`` calls them: create, list, retrieve, update and delete a store;
add (``files.create``, ``file_batches.create``), list, retrieve and remove its files. A file is encoded once
by a queued job; its status reads ``in_progress`` until then (the client's ``create_and_poll`` polls it).
A batch (``file_batches.create``, ``create(file_ids=...)``) answers at once and is added in the background."""

from __future__ import annotations

import asyncio
import secrets
import time

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from .admission import Waiting, still_wanted
from .edge import json_body, service_of, tenant_of
from .openai_schema import ApiError

router = APIRouter()


class StoreBody(BaseModel):
    """``vector_stores.create`` and ``update``: what they send (``chunking_strategy``, ``expires_after`` and
    ``description`` are accepted and not used: a document is encoded whole)."""

    model_config = ConfigDict(extra="ignore", strict=True)     # JSON types as sent: "5" is no int, true no 1
    name: str | None = Field(None, max_length=256)
    metadata: dict[str, str] | None = None
    file_ids: list[str] | None = Field(None, max_length=500)


class FileBody(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)     # JSON types as sent: "5" is no int, true no 1
    file_id: str


class SearchBody(BaseModel):
    """``vector_stores.search``: the query and how many results; attribute filters and query rewriting are
    refused (the library keeps no attributes and rewrites nothing), ``ranking_options`` is not used."""

    model_config = ConfigDict(extra="ignore", strict=True)
    query: str | list[str]
    max_num_results: int = Field(10, ge=1, le=50)
    filters: dict | None = None
    rewrite_query: bool = False
    ranking_options: dict | None = None


class BatchBody(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)     # JSON types as sent: "5" is no int, true no 1
    file_ids: list[str] = Field(min_length=1, max_length=500)


def stores(request: Request):
    return service_of(request).vector_stores


def page(data: list[dict], request: Request) -> dict:
    """OpenAI's list shape, every item in one page (``limit`` honoured, ``after`` too)."""
    after, limit = request.query_params.get("after"), request.query_params.get("limit")
    if after is not None:
        ids = [d["id"] for d in data]
        data = data[ids.index(after) + 1:] if after in ids else []
    more = False
    if limit is not None and limit.isdigit() and int(limit) < len(data):
        data, more = data[:int(limit)], True
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": more}


def wanted_by(request: Request):
    """``(still_wanted of request, its deadline)``, the deadline counted from now."""
    timeout = service_of(request).settings.request_timeout
    deadline = asyncio.get_running_loop().time() + timeout
    return (lambda: still_wanted(request, deadline, timeout)), deadline


@router.post("/v1/vector_stores")
async def create_store(request: Request):
    body = await json_body(request, StoreBody)
    made = await run_in_threadpool(stores(request).create, tenant_of(request), body.name, body.metadata)
    if body.file_ids:
        await stores(request).add_later(tenant_of(request), made["id"], body.file_ids)
        made = await run_in_threadpool(stores(request).describe, tenant_of(request), made["id"])
    return made


@router.get("/v1/vector_stores")
async def list_stores(request: Request):
    return page(await run_in_threadpool(stores(request).all, tenant_of(request)), request)


@router.get("/v1/vector_stores/{vs_id}")
async def get_store(vs_id: str, request: Request):
    return await run_in_threadpool(stores(request).describe, tenant_of(request), vs_id)


@router.post("/v1/vector_stores/{vs_id}")
async def update_store(vs_id: str, request: Request):
    body = await json_body(request, StoreBody)
    return await run_in_threadpool(stores(request).update, tenant_of(request), vs_id, body.name, body.metadata)


@router.delete("/v1/vector_stores/{vs_id}")
async def delete_store(vs_id: str, request: Request):
    return await run_in_threadpool(stores(request).delete, tenant_of(request), vs_id)


@router.post("/v1/vector_stores/{vs_id}/files")
async def add_file(vs_id: str, request: Request):
    body = await json_body(request, FileBody)
    return await stores(request).add_file(tenant_of(request), vs_id, body.file_id, wanted_by(request)[0])


@router.get("/v1/vector_stores/{vs_id}/files")
async def list_files(vs_id: str, request: Request):
    found = await run_in_threadpool(stores(request).files, tenant_of(request), vs_id)
    if (status := request.query_params.get("filter")) is not None:
        found = [f for f in found if f["status"] == status]
    return page(found, request)


@router.get("/v1/vector_stores/{vs_id}/files/{file_id}")
async def get_file(vs_id: str, file_id: str, request: Request):
    return await run_in_threadpool(stores(request).file, tenant_of(request), vs_id, file_id)


@router.delete("/v1/vector_stores/{vs_id}/files/{file_id}")
async def remove_file(vs_id: str, file_id: str, request: Request):
    return await run_in_threadpool(stores(request).remove_file, tenant_of(request), vs_id, file_id)


@router.post("/v1/vector_stores/{vs_id}/search")
async def search(vs_id: str, request: Request):
    """The store's passages for a query, best first, as an answer's evidence would cite them (the first
    stage, then REFORM's token gather over the candidates); nothing is generated."""
    body = await json_body(request, SearchBody)
    for name in ("filters", "rewrite_query"):
        if getattr(body, name):
            raise ApiError(400, f"'{name}' is not supported by this server's vector stores", param=name)
    query = body.query if isinstance(body.query, str) else " ".join(body.query)
    if not query.strip():
        raise ApiError(400, "the query is empty", param="query")
    service, tenant, (wanted, deadline) = service_of(request), tenant_of(request), wanted_by(request)
    shelf = await run_in_threadpool(stores(request).shelf, tenant, [vs_id])
    library = stores(request).asker(tenant)

    def work(job):
        try:
            return library.search(query, shelf=shelf)
        except ValueError as e:
            raise ApiError(400, str(e)) from None
    job = await service.enqueue(lambda: service.worker.submit(work, tenant=tenant.name), wanted, tenant)
    found = await Waiting(job, request, deadline, service.settings.request_timeout).result()
    by_title = {(d.title or name): name for name, d in shelf.items()}
    return {"object": "vector_store.search_results.page", "search_query": [query], "has_more": False,
            "next_page": None, "data": [
                {"file_id": by_title.get(p.document, ""), "filename": p.document, "score": p.score,
                 "attributes": {"page": p.page, "page_end": p.page_end, "section": p.section, "unit": p.unit},
                 "content": [{"type": "text", "text": p.text}]} for p in found[:body.max_num_results]]}


# ---------------------------------------------------------------------- file batches
def batch_object(request: Request, vs_id: str, batch_id: str) -> dict:
    """A batch's object: its files' statuses counted now (a batch is its files' ids, kept in the catalog)."""
    library = stores(request).library(tenant_of(request), vs_id)
    _, docs = library.catalog.read()
    batch = library.catalog.info.get("batches", {}).get(batch_id)
    if batch is None:
        raise ApiError(404, f"file batch {batch_id} not found", code="not_found")
    files = [stores(request).file_object(tenant_of(request), vs_id, docs[f]) for f in batch["file_ids"] if f in docs]
    counts = {s: sum(f["status"] == s for f in files) for s in ("in_progress", "completed", "failed", "cancelled")}
    return {"id": batch_id, "object": "vector_store.files_batch", "vector_store_id": vs_id,
            "created_at": batch["created_at"], "status": "in_progress" if counts["in_progress"] else "completed",
            "file_counts": {**counts, "total": len(batch["file_ids"])}, "files": files}


def remember_batch(request: Request, vs_id: str, file_ids: list[str]) -> str:
    library = stores(request).library(tenant_of(request), vs_id)
    batch_id = "vsfb_" + secrets.token_hex(12)
    with library.catalog.lock():
        maker, docs = library.catalog.read()
        library.catalog.info.setdefault("batches", {})[batch_id] = {"file_ids": file_ids,
                                                                    "created_at": int(time.time())}
        library.catalog.write(maker, docs)
    return batch_id


@router.post("/v1/vector_stores/{vs_id}/file_batches")
async def create_batch(vs_id: str, request: Request):
    body = await json_body(request, BatchBody)
    await stores(request).add_later(tenant_of(request), vs_id, body.file_ids)      # 404 before any work
    batch_id = await run_in_threadpool(remember_batch, request, vs_id, body.file_ids)
    return {k: v for k, v in (await run_in_threadpool(batch_object, request, vs_id, batch_id)).items() if k != "files"}


@router.get("/v1/vector_stores/{vs_id}/file_batches/{batch_id}")
async def get_batch(vs_id: str, batch_id: str, request: Request):
    return {k: v for k, v in (await run_in_threadpool(batch_object, request, vs_id, batch_id)).items() if k != "files"}


@router.get("/v1/vector_stores/{vs_id}/file_batches/{batch_id}/files")
async def list_batch_files(vs_id: str, batch_id: str, request: Request):
    return page((await run_in_threadpool(batch_object, request, vs_id, batch_id))["files"], request)
