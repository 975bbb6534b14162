"""``GET /metrics`` in Prometheus' text format (prometheus-client), one registry per app: requests by
path and status, requests in flight and open streams (counted by the HTTP layer), and what the worker
knows at scrape time (queue depth, encodes, tokens and seconds encoded, the store's size). Per tenant,
labelled by its name (never its key): requests by status and in flight, tokens accepted for encoding,
quota refusals, and its store's contexts and bytes."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


class WorkerCollector:
    """Reads the worker's state when scraped (nothing to keep in step)."""

    def __init__(self, worker, lines, tenants):
        self.worker, self.lines, self.tenants = worker, lines, tenants

    def collect(self):
        w = self.worker
        yield GaugeMetricFamily("reform_queue_depth", "jobs waiting for the model thread", value=w.queued())
        yield GaugeMetricFamily("reform_requests_waiting", "requests waiting in line for a place in the queue",
                                value=sum(len(line) for line in self.lines.values()))
        yield GaugeMetricFamily("reform_batch_size", "answers decoding together now (continuous batching)",
                                value=len(w.together))
        yield GaugeMetricFamily("reform_max_batch", "answers that may decode together", value=w.max_batch)
        yield CounterMetricFamily("reform_decode_steps", "decoding steps run for the batch", value=w.steps)
        yield CounterMetricFamily("reform_decode_step_seconds", "seconds the decoding steps took",
                                  value=w.step_seconds)
        yield GaugeMetricFamily("reform_busy", "1 while the model thread runs a job or decodes answers", value=int(w.busy()))
        yield GaugeMetricFamily("reform_expected_wait_seconds", "expected wait of a job queued now",
                                value=w.expected_wait())
        yield CounterMetricFamily("reform_contexts_encoded", "contexts encoded by this process", value=w.contexts.encoded)
        yield CounterMetricFamily("reform_encoded_tokens", "context tokens encoded by this process",
                                  value=w.contexts.tokens_encoded)
        yield CounterMetricFamily("reform_encode_seconds", "seconds spent encoding contexts", value=w.contexts.encode_seconds)
        rate = w.contexts.tokens_encoded / w.contexts.encode_seconds if w.contexts.encode_seconds else 0.0
        yield GaugeMetricFamily("reform_encode_tokens_per_second", "mean encode rate of this process", value=rate)
        try:
            entries = w.store.entries()
        except OSError:
            entries = []
        yield GaugeMetricFamily("reform_store_bytes", "bytes of saved contexts in the store",
                                value=sum(e.bytes for e in entries))
        yield GaugeMetricFamily("reform_store_contexts", "saved contexts in the store", value=len(entries))
        size = GaugeMetricFamily("reform_tenant_store_bytes", "bytes of a tenant's saved contexts", labels=["tenant"])
        count = GaugeMetricFamily("reform_tenant_store_contexts", "a tenant's saved contexts", labels=["tenant"])
        for tenant in self.tenants.all:
            mine = [e for e in entries if e.key.rpartition("/")[0] == tenant.scope]
            size.add_metric([tenant.name], sum(e.bytes for e in mine))
            count.add_metric([tenant.name], len(mine))
        yield size
        yield count


class Metrics:
    def __init__(self, worker, lines, tenants):
        self.registry = CollectorRegistry()
        self.requests = Counter("reform_requests", "HTTP requests answered, by route and status",
                                ["path", "status"], registry=self.registry)
        self.in_flight = Gauge("reform_requests_in_flight", "HTTP requests being answered", registry=self.registry)
        self.streams = Gauge("reform_active_streams", "streamed chat completions open", registry=self.registry)
        self.tenant_requests = Counter("reform_tenant_requests", "a tenant's API requests answered, by status",
                                       ["tenant", "status"], registry=self.registry)
        self.tenant_in_flight = Gauge("reform_tenant_requests_in_flight", "a tenant's API requests being answered",
                                      ["tenant"], registry=self.registry)
        self.tenant_tokens = Counter("reform_tenant_encode_tokens", "context tokens accepted for encoding",
                                     ["tenant"], registry=self.registry)
        self.tenant_refused = Counter("reform_tenant_quota_refusals", "requests refused by a quota, by quota",
                                      ["tenant", "quota"], registry=self.registry)
        for tenant in tenants.all:          # every tenant's series exists from the start (at 0)
            self.tenant_in_flight.labels(tenant.name)
            self.tenant_tokens.labels(tenant.name)
        self.registry.register(WorkerCollector(worker, lines, tenants))
