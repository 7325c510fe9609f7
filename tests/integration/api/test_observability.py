"""What an operator watches, through real HTTP on a real control plane: per-stage latency
histograms and outcome counters on /metrics, request ids in headers, problem bodies and
JSON log lines, and one trace from the API through the runtime to the verifier."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from service import logs, tracing
from tests.integration.api.conftest import Stack
from tests.integration.api.test_episodes_api import run_oracle, start, verify
from tests.integration.api.test_sandboxes_api import run

pytestmark = pytest.mark.docker


def scrape(stack: Stack) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics: (name, sorted labels) -> value."""
    r = httpx.get(f"{stack.url}/metrics")
    assert r.status_code == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(r.text)
        for s in fam.samples
    }


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_provider(provider)
    try:
        yield exporter
    finally:
        tracing.use_provider(None)


def test_stage_histograms_and_outcomes_count_one_episode(stack: Stack) -> None:
    before = scrape(stack)
    stack.wait_for(lambda: stack.ctx.pools.levels()["terminal"]["warm"] >= 1, timeout_s=60)
    warm = stack.alice.post("/v1/sandboxes", json={"template": "terminal"})
    cold = stack.alice.post("/v1/sandboxes", json={"template": "tiny"})  # no pool: cold
    assert warm.status_code == cold.status_code == 201, (warm.text, cold.text)
    assert run(stack.alice, warm.json()["id"], "echo hi")["exit_code"] == 0
    ep = start(stack)["episodes"][0]
    run_oracle(stack, ep)
    assert verify(stack, ep)["reward"] == 1.0
    for sb in (warm, cold):
        stack.alice.delete(f"/v1/sandboxes/{sb.json()['id']}")
    after = scrape(stack)

    def grew(name: str, by: float = 1, **labels: str) -> bool:
        return value(after, name, **labels) - value(before, name, **labels) >= by

    assert grew("crucible_lease_duration_seconds_count", source="warm")
    assert grew("crucible_lease_duration_seconds_count", source="cold")
    assert grew("crucible_cold_start_duration_seconds_count")
    assert grew("crucible_exec_duration_seconds_count", by=2)  # echo and the oracle
    assert grew("crucible_exec_duration_seconds_bucket", le="0.005") or grew(
        "crucible_exec_duration_seconds_bucket", le="0.05"
    )  # sub-10 ms buckets exist and fill
    assert grew("crucible_verify_duration_seconds_count", domain="terminal")
    assert grew("crucible_verifications_total", domain="terminal", status="ok", outcome="pass")
    assert grew("crucible_pool_created_total", template="terminal")
    assert value(after, "crucible_coordination_up", backend="inprocess") == 1.0
    assert value(after, "crucible_refill_lock_held", template="terminal") == 1.0


def test_pool_trim_counts_as_destroyed_unleased(stack: Stack) -> None:
    stack.wait_for(lambda: stack.ctx.pools.levels()["terminal"]["warm"] >= 1, timeout_s=60)
    before = scrape(stack)
    r = stack.admin.put("/v1/pools/terminal", json={"target_size": 0})
    assert r.status_code == 200, r.text
    stack.wait_for(lambda: stack.ctx.pools.levels()["terminal"]["warm"] == 0, timeout_s=30)
    after = scrape(stack)
    name = "crucible_pool_destroyed_unleased_total"
    assert value(after, name, template="terminal", reason="trim") > value(
        before, name, template="terminal", reason="trim"
    )
    assert stack.admin.put("/v1/pools/terminal", json={"target_size": 1}).status_code == 200


def test_request_id_is_kept_or_made_and_named_in_problems_and_logs(stack: Stack) -> None:
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.addFilter(logs.RequestIdFilter())
    handler.setFormatter(logs.JsonFormatter())
    logs.access_log.addHandler(handler)
    old_level = logs.access_log.level
    logs.access_log.setLevel(logging.INFO)
    try:
        r = stack.alice.get("/v1/sandboxes/sb-nope", headers={"X-Request-ID": "trial-42.a:b"})
        assert r.status_code == 404
        assert r.headers["x-request-id"] == "trial-42.a:b"
        assert r.json()["request_id"] == "trial-42.a:b"
        for bad in ("a b", "x" * 129, "", "id\u00e9"):  # not echoed: a fresh id instead
            r2 = stack.alice.get("/healthz", headers={"X-Request-ID": bad.encode("utf-8")})
            rid = r2.headers["x-request-id"]
            assert rid != bad and len(rid) == 16 and int(rid, 16) >= 0
        r3 = stack.alice.get("/healthz")
        assert len(r3.headers["x-request-id"]) == 16
    finally:
        logs.access_log.removeHandler(handler)
        logs.access_log.setLevel(old_level)
    lines = [json.loads(line) for line in buf.getvalue().splitlines()]
    mine = [line for line in lines if line["request_id"] == "trial-42.a:b"]
    assert len(mine) == 1, lines
    assert mine[0]["route"] == "/v1/sandboxes/{sandbox_id}" and mine[0]["status"] == 404
    assert mine[0]["logger"] == "crucible.access" and mine[0]["level"] == "INFO"


def test_one_lease_exec_verify_is_one_trace_down_to_the_verifier(
    stack: Stack, spans: InMemorySpanExporter
) -> None:
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    caller = "00f067aa0ba902b7"
    hdr = {"traceparent": f"00-{trace_id}-{caller}-01"}
    sb = stack.alice.post("/v1/sandboxes", json={"template": "tiny"}, headers=hdr)
    assert sb.status_code == 201, sb.text
    r = stack.alice.post(
        f"/v1/sandboxes/{sb.json()['id']}/exec", json={"cmd": "echo hi"}, headers=hdr
    )
    assert r.status_code == 200, r.text
    stack.alice.delete(f"/v1/sandboxes/{sb.json()['id']}", headers=hdr)
    ep = start(stack)["episodes"][0]
    run_oracle(stack, ep)
    v = stack.alice.post(
        f"/v1/episodes/{ep['id']}/verify",
        json={"policy": {"name": "test", "version": "1"}},
        headers=hdr,
    )
    assert v.status_code == 200, v.text
    lease_http, exec_http = "HTTP POST /v1/sandboxes", "HTTP POST /v1/sandboxes/{sandbox_id}/exec"
    verify_http = "HTTP POST /v1/episodes/{episode_id}/verify"
    by_name: dict = {}

    def ended() -> bool:  # a server span ends just after its response's last byte is sent
        got = spans.get_finished_spans()
        by_name.update({s.name: s for s in got if format(s.context.trace_id, "032x") == trace_id})
        return {lease_http, exec_http, verify_http} <= set(by_name)

    stack.wait_for(ended, timeout_s=10)

    def child_of(name: str, parent: str) -> None:
        assert name in by_name, sorted(by_name)
        assert by_name[name].parent is not None, name
        assert by_name[name].parent.span_id == by_name[parent].context.span_id, (name, parent)

    for name in (lease_http, exec_http, verify_http):
        assert name in by_name, sorted(by_name)
        assert by_name[name].parent.span_id == int(caller, 16), name  # the caller's span
    child_of("sandbox.lease", lease_http)
    child_of("sandbox.start", "sandbox.lease")  # tiny has no pool: a cold start
    child_of("sandbox.exec", exec_http)
    child_of("episode.verify", verify_http)
    child_of("verifier.terminal", "episode.verify")
    assert by_name["sandbox.lease"].attributes["source"] == "cold"
    assert by_name["sandbox.exec"].attributes["exit_code"] == 0
    assert by_name["episode.verify"].attributes["domain"] == "terminal"
    assert by_name["episode.verify"].attributes["status"] == "ok"
    assert by_name[lease_http].attributes["http.response.status_code"] == 201
