"""Prometheus metrics of the control plane (``GET /metrics``).

``/metrics`` needs no key (as scrapers expect), so no metric carries a tenant id or anything
else that identifies a tenant: labels are routes, templates, domains, states and outcomes.

Recording is in-memory only (``prometheus_client`` takes a lock and adds to a float): an
``observe`` on the exec path costs about a microsecond (``bench/metrics_cost.py``) and does
no I/O. Gauges that need a query (pool levels, coordination, anomalies) are refreshed when
``/metrics`` is scraped, never on a request path.

Histogram buckets are seconds. The exec buckets start at 1 ms (an exec over the channel
takes a few ms); lease and cold-start buckets span a warm claim (ms) to a cold start of a
large image (tens of s); verify buckets reach the verifiers' own caps (minutes).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from service.verifiers.base import VerifierResult

REGISTRY = CollectorRegistry(auto_describe=True)

_FAST_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_SLOW_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)

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
    buckets=_FAST_S,
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
    buckets=(*_FAST_S, 300),
)
LEASE_LATENCY = Histogram(
    "crucible_lease_duration_seconds",
    "Time to lease a sandbox (seconds), by source: warm (claimed from the pool) or cold "
    "(started for this lease; includes the cold start).",
    ["source"],
    registry=REGISTRY,
    buckets=_FAST_S,
)
COLD_START_LATENCY = Histogram(
    "crucible_cold_start_duration_seconds",
    "Container create + start + ready (seconds), for warm refills and cold leases alike.",
    registry=REGISTRY,
    buckets=_FAST_S,
)
VERIFY_LATENCY = Histogram(
    "crucible_verify_duration_seconds",
    "Verification of an episode's end state (seconds; freeze, fresh sandbox, checks) by domain.",
    ["domain"],
    registry=REGISTRY,
    buckets=_SLOW_S,
)
VERIFICATIONS = Counter(
    "crucible_verifications_total",
    "Verifications by domain, verifier status (ok, error, timeout) and outcome: pass "
    "(reward >= 1), fail, dodge (a 0 the end state caused: details.dodge), none (not ok).",
    ["domain", "status", "outcome"],
    registry=REGISTRY,
)
POOL_CREATED = Counter(
    "crucible_pool_created_total",
    "Warm sandboxes started by refill, per template.",
    ["template"],
    registry=REGISTRY,
)
POOL_DESTROYED_UNLEASED = Counter(
    "crucible_pool_destroyed_unleased_total",
    "Sandboxes destroyed without ever being leased, per template and reason (trim: above "
    "target; drain: shutdown; failed: the start failed; reconcile, reclaim: left by a crash "
    "or a dead replica). In steady state this stays flat.",
    ["template", "reason"],
    registry=REGISTRY,
)
COORDINATION_UP = Gauge(
    "crucible_coordination_up",
    "1 when the coordination backend (redis, inprocess) answers, else 0 (refreshed per scrape).",
    ["backend"],
    registry=REGISTRY,
)
REFILL_LOCK_HELD = Gauge(
    "crucible_refill_lock_held",
    "1 when this replica was the template's one refiller at its last refill or trim that had "
    "work, else 0 (summed over replicas: 1 per template under deficit, never 2).",
    ["template"],
    registry=REGISTRY,
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


def verification_outcome(result: VerifierResult) -> str:
    """``pass``, ``fail``, ``dodge`` or ``none`` (see ``crucible_verifications_total``)."""
    if result.status != "ok":
        return "none"
    if result.details.get("dodge"):
        return "dodge"
    return "pass" if (result.reward or 0.0) >= 1.0 else "fail"


def observe_verification(domain: str, result: VerifierResult, *, duration_s: float) -> None:
    """Count one verification of ``domain`` and record its duration (seconds)."""
    VERIFICATIONS.labels(domain, result.status, verification_outcome(result)).inc()
    VERIFY_LATENCY.labels(domain).observe(duration_s)
