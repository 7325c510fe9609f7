"""Prometheus metrics of the control plane (``GET /metrics``).

``/metrics`` needs no key (as scrapers expect), so no metric carries a tenant id or anything
else that identifies a tenant: labels are routes, templates, states and outcomes only.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

HTTP_REQUESTS = Counter(
    "crucible_http_requests_total",
    "HTTP requests by route and status.",
    ["method", "route", "status"],
    registry=REGISTRY,
)
HTTP_LATENCY = Histogram(
    "crucible_http_request_duration_seconds",
    "HTTP request latency (seconds) by route.",
    ["method", "route"],
    registry=REGISTRY,
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
LEASES = Counter(
    "crucible_leases_total",
    "Leases by template and how they were served (warm or cold).",
    ["template", "source"],
    registry=REGISTRY,
)
EXECS = Counter(
    "crucible_execs_total",
    "Execs by outcome (ok, nonzero, timeout, oom, error).",
    ["outcome"],
    registry=REGISTRY,
)
EXEC_LATENCY = Histogram(
    "crucible_exec_duration_seconds",
    "Exec duration inside the sandbox (seconds).",
    registry=REGISTRY,
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)
QUOTA_REFUSALS = Counter(
    "crucible_quota_refusals_total",
    "Leases refused over quota (all tenants; per tenant in the audit log, quota.refused).",
    registry=REGISTRY,
)
AUTH_FAILURES = Counter("crucible_auth_failures_total", "Rejected API keys.", registry=REGISTRY)
POOL_LEVEL = Gauge(
    "crucible_pool_sandboxes",
    "Sandboxes per template and state (warm, starting, leased).",
    ["template", "state"],
    registry=REGISTRY,
)
POOL_TARGET = Gauge(
    "crucible_pool_target",
    "Warm pool target size per template.",
    ["template"],
    registry=REGISTRY,
)
EXPIRED = Counter("crucible_leases_expired_total", "Leases ended by the reaper.", registry=REGISTRY)
