"""``reform serve --ray``: the same OpenAI-compatible app (``reform.server``) as N Ray Serve replicas.

Every replica loads the model once and runs its own model thread, and all of them read and write one
store (a shared folder or an fsspec URL), so a context uploaded to one replica is answerable from every
replica as soon as its encode is stored; each replica keeps its recently used contexts in memory. Ray
Serve's proxy spreads requests over the replicas and streams their server-sent events back.
"""

from __future__ import annotations

from dataclasses import asdict

from .encode import load_pipeline

APP_NAME = "reform"


class ReformReplica:
    """One replica: the pipeline and the FastAPI app over the shared store, built once the replica
    starts (Ray Serve calls ``__serve_build_asgi_app__`` after the constructor)."""

    def __init__(self, load: dict, store: str, options: dict, settings: dict, threads: int | None):
        self.load, self.store, self.options, self.settings, self.threads = load, store, options, settings, threads

    def __serve_build_asgi_app__(self):
        from ..server import Settings, build_app
        if self.threads:
            import torch
            torch.set_num_threads(self.threads)
        return build_app(lambda: load_pipeline(self.load), self.store, settings=Settings.from_json(self.settings),
                         **self.options)


def deployment(load: dict, store: str, *, replicas: int, threads_per_replica: int = 1, options: dict | None = None,
               settings=None):
    """The Ray Serve application: ``replicas`` copies of ``ReformReplica`` behind one HTTP route."""
    from ray import serve
    options = options or {}
    replica = serve.deployment(serve.ingress()(ReformReplica), name="ReformReplica", num_replicas=replicas,
                               ray_actor_options={"num_cpus": threads_per_replica},
                               max_ongoing_requests=options.get("queue_size", 16) + 1)
    return replica.bind(load, store, options, asdict(settings) if settings is not None else {}, threads_per_replica)


def run(load: dict, store: str, *, host: str, port: int, replicas: int, threads_per_replica: int = 1,
        options: dict | None = None, settings=None, blocking: bool = True):
    """Start Serve's HTTP proxy on ``host:port`` in the connected Ray cluster and deploy the replicas;
    with ``blocking``, serve until interrupted."""
    from ray import serve
    serve.start(http_options={"host": host, "port": port})
    app = deployment(load, store, replicas=replicas, threads_per_replica=threads_per_replica, options=options,
                     settings=settings)
    return serve.run(app, name=APP_NAME, route_prefix="/", blocking=blocking)
