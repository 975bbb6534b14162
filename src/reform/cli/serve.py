"""``reform serve``: the OpenAI-compatible server (see ``reform.server``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer

from .common import (CliError, LoadArgs, OcrOpt, app, check_load_options, checked_output, err, fail, limits_for,
                     pipeline_from, with_load_options)


@app.command()
@with_load_options
def serve(host: str = typer.Option("127.0.0.1", "--host", help="address to listen on (0.0.0.0: every interface)"),
          port: int = typer.Option(8000, "--port", min=1, max=65535),
          store: str = typer.Option("reform-store", "--store", help="folder or fsspec URL of saved contexts "
                                    "(kept across restarts; shared by every replica)"),
          store_max_gb: Optional[float] = typer.Option(None, "--store-max-gb", help="size budget of the store; "
                                                       "least recently used contexts go first"),
          api_key: Optional[str] = typer.Option(None, "--api-key", envvar="REFORM_API_KEY",
                                                help="require 'Authorization: Bearer KEY' (or set REFORM_API_KEY)"),
          keys: Optional[str] = typer.Option(None, "--keys", envvar="REFORM_KEYS_FILE",
                                             help="tenants, each with its own key, contexts and quotas: a .toml or "
                                             ".json file, or name:key lines (or set REFORM_KEYS_FILE)"),
          metrics_key: Optional[str] = typer.Option(None, "--metrics-key", envvar="REFORM_METRICS_KEY",
                                                    help="the operator's key for /metrics, /health's counts and "
                                                    "/openapi.json (also: admin = true for a tenant in --keys)"),
          served_model_name: Optional[str] = typer.Option(None, "--served-model-name", help="the model id "
                                                          "/v1/models lists and requests name (default: the model's)"),
          queue_size: int = typer.Option(16, "--queue-size", min=1, help="jobs queued for the model (per tenant)"),
          max_batch: Optional[int] = typer.Option(None, "--max-batch", min=1, help="answers decoded at once "
                                                  "(continuous batching; default: by free memory, at most 32)"),
          max_waiting: int = typer.Option(256, "--max-waiting", min=0, help="requests that wait in line (first "
                                          "come, first served) while the queue is full; more get 503"),
          memory_contexts: int = typer.Option(4, "--memory-contexts", min=1, help="recently used contexts "
                                              "kept loaded in memory"),
          max_body_mb: float = typer.Option(64.0, "--max-body-mb", help="largest request body (413 above)"),
          max_context_tokens: int = typer.Option(2_000_000, "--max-context-tokens", min=1,
                                                 help="largest context in tokens (413 above)"),
          timeout: float = typer.Option(900.0, "--timeout", help="seconds a request may take, encode included "
                                        "(504 after)"),
          max_tokens: int = typer.Option(512, "--max-tokens", min=1, help="longest answer when a request "
                                         "gives no max_tokens (shorter where the model's window has less room)"),
          allowed_origins: str = typer.Option("", "--allowed-origins", help="comma-separated web origins whose "
                                              "pages may call the API (CORS), e.g. http://localhost:3000; * for any"),
          shutdown_grace: float = typer.Option(30.0, "--shutdown-grace", help="seconds that requests in flight "
                                               "get to finish after SIGTERM / Ctrl-C before they are cut"),
          header_timeout: float = typer.Option(10.0, "--header-timeout", help="seconds a client has to send a "
                                               "request's headers (then 408 and the connection closed)"),
          keep_alive: int = typer.Option(5, "--keep-alive", min=1, help="seconds an idle keep-alive connection "
                                         "stays open"),
          log_level: str = typer.Option("info", "--log-level", help="the server's log on stderr: debug, info "
                                        "(encodes started and finished), warning or error (failed jobs, with "
                                        "their tracebacks)"),
          access_log: bool = typer.Option(True, "--access-log/--no-access-log", help="one JSON line per request "
                                          "on stderr (request id, path, status, seconds)"),
          ocr: str = OcrOpt,
          ray: bool = typer.Option(False, "--ray", help="run --replicas copies as Ray Serve replicas"),
          address: Optional[str] = typer.Option(None, "--address", envvar="RAY_ADDRESS",
                                                help="the Ray cluster (default: $RAY_ADDRESS, else a local one)"),
          replicas: int = typer.Option(2, "--replicas", min=1, help="Ray Serve replicas (with --ray)"),
          threads_per_replica: int = typer.Option(1, "--threads-per-replica", min=1, help="CPUs per replica "
                                                  "(with --ray)"),
          *, load: LoadArgs):
    """Serve the model over an OpenAI-compatible API (chat completions, saved contexts)."""
    from ..server import Settings, build_app
    from ..store import ContextFileError, ContextStore
    try:
        if store_max_gb is not None and not store_max_gb > 0:      # (NaN too)
            raise CliError("--store-max-gb must be positive")
        if not (max_body_mb > 0 and timeout > 0):
            raise CliError("--max-body-mb and --timeout must be positive")
        if not shutdown_grace >= 0:
            raise CliError("--shutdown-grace must be 0 or more")
        if not header_timeout > 0:
            raise CliError("--header-timeout must be positive")
        if log_level.lower() not in LOG_LEVELS:
            raise CliError(f"--log-level must be one of {', '.join(LOG_LEVELS)}, not {log_level!r}")
        origins = tuple(o.strip() for o in allowed_origins.split(",") if o.strip())
        if bad := [o for o in origins if o != "*" and not o.startswith(("http://", "https://"))]:
            raise CliError(f"--allowed-origins: {bad[0]!r} is not an origin (http://host[:port] or https://...)")
        if "://" not in store:
            store = str(checked_output(Path(store), "--store", folder=True).resolve())
        ContextStore(store)                         # refuse an unusable store before the model loads
        if api_key is not None and not api_key.strip():
            raise CliError("--api-key is empty")
        from ..server.tenants import KeysFileError, Tenants, check_key
        try:
            tenants = Tenants.of(api_key, keys)     # a bad keys file is refused before the model loads
        except KeysFileError as e:
            raise CliError(str(e)) from None
        if metrics_key is not None:
            try:
                check_key(metrics_key, "--metrics-key")
            except KeysFileError as e:
                raise CliError(str(e)) from None
        if keys is not None:
            keys = str(Path(keys).expanduser().resolve())       # Ray replicas read the same file
        check_port_free(host, port)
        load = load.load(documents=None)      # REFORM for text, the documents gather for files
        if served_model_name is not None and not served_model_name.strip():
            raise CliError("--served-model-name is empty")
        settings = Settings(api_key=api_key, keys_file=keys, metrics_key=metrics_key, model_id=served_model_name,
                            max_body_bytes=int(max_body_mb * 2**20),
                            max_context_tokens=max_context_tokens, request_timeout=timeout,
                            default_max_tokens=max_tokens, allowed_origins=origins, max_waiting=max_waiting,
                            limits=limits_for(ocr))
        options = {"store_max_bytes": None if store_max_gb is None else int(store_max_gb * 2**30),
                   "queue_size": queue_size, "memory_contexts": memory_contexts, "max_batch": max_batch}
        if ray:
            check_load_options(load)
            return serve_on_ray(load, store, options, settings, host, port, address, replicas, threads_per_replica,
                                tenants)
        web = build_app(lambda: pipeline_from(load), store, settings=settings, **options)   # loaded on its thread
        pipe = web.state.worker.pipe
    except ContextFileError as e:
        fail(CliError(str(e)))
    except CliError as e:
        fail(e)
    import uvicorn
    err.print(f"serving {pipe.model_name} ({methods_line(pipe.policy)}) on http://{host}:{port}/v1 · store {store}"
              + access_line(tenants), highlight=False)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import logging
    server_log = logging.StreamHandler()
    server_log.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger("reform").addHandler(server_log)
    logging.getLogger("reform").setLevel(log_level.upper())
    access = logging.getLogger("reform.access")
    access.propagate = False              # its lines are JSON, each on its own, not in the server log's format
    if access_log:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        access.addHandler(handler)
        access.setLevel(logging.INFO)
    from ..server.http import protocol
    uvicorn.run(web, host=host, port=port, log_level="warning", timeout_graceful_shutdown=shutdown_grace,
                http=protocol(header_timeout), timeout_keep_alive=keep_alive)


LOG_LEVELS = ("debug", "info", "warning", "error")


def methods_line(policy: dict) -> str:
    """``reform; documents: reform+rag`` (``Pipeline.policy``), or the one method that runs everything."""
    if policy["text"] == policy["documents"]:
        return policy["text"]
    return f"{policy['text']}; documents: {policy['documents']}"


def access_line(tenants) -> str:
    if tenants.open:
        return ""
    if tenants.names() == ["default"]:
        return " · API key required"
    return f" · {len(tenants.all)} tenants ({', '.join(tenants.names()[:5])}{', ...' if len(tenants.all) > 5 else ''})"


def serve_on_ray(load: dict, store: str, options: dict, settings, host: str, port: int, address: str | None,
                 replicas: int, threads_per_replica: int, tenants) -> None:
    """Serve the same API from ``replicas`` Ray Serve replicas over one store, until interrupted."""
    from ..cluster import serve as cluster_serve
    from .encode import connect_ray
    connect_ray(address)
    from ..methods import DOCUMENTS_METHOD
    policy = {"text": load["method"] or "reform", "documents": load["method"] or DOCUMENTS_METHOD[0]}
    err.print(f"serving {load.get('model') or 'the default model'} ({methods_line(policy)}) on http://{host}:{port}/v1 "
              f"from {replicas} Ray Serve replicas · store {store}" + access_line(tenants), highlight=False)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    cluster_serve.run(load, store, host=host, port=port, replicas=replicas, threads_per_replica=threads_per_replica,
                      options=options, settings=settings, blocking=True)


def check_port_free(host: str, port: int) -> None:
    """Refuse a port that is taken (or an address that is not this machine's) before the model loads."""
    import socket
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as e:
        raise CliError(f"--host {host}: {e.strerror or e}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)     # as uvicorn binds
        try:
            s.bind(address)
        except OSError as e:
            raise CliError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
