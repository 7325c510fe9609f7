"""Request ids and JSON log lines (service.logs), and the no-op tracer (service.tracing)."""

from __future__ import annotations

import io
import json
import logging

import pytest
from fastapi import FastAPI
from starlette.testclient import TestClient

from service import logs, tracing
from service.api import problems


@pytest.mark.parametrize(
    "value", ["a b", "x" * 129, "", "line\nforged", "id\u00e9", "a/b", "<script>", None]
)
def test_implausible_request_ids_are_replaced(value: str | None) -> None:
    rid = logs.accept_request_id(value)
    assert rid != value and len(rid) == 16 and int(rid, 16) >= 0


@pytest.mark.parametrize("value", ["abc", "4bf92f35-77b3-4da6", "job.7:item-3_a", "x" * 128])
def test_plausible_request_ids_are_kept(value: str) -> None:
    assert logs.accept_request_id(value) == value


def capture(logger: logging.Logger) -> tuple[io.StringIO, logging.Handler]:
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.addFilter(logs.RequestIdFilter())
    handler.setFormatter(logs.JsonFormatter())
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    return buf, handler


def test_json_lines_are_one_object_each_with_extra_fields_and_tracebacks() -> None:
    lg = logging.getLogger("crucible.test.json")
    buf, handler = capture(lg)
    try:
        lg.info("two\nlines %s", "here", extra={"sandbox_id": "sb-1", "n": 3})
        try:
            raise ValueError("boom")
        except ValueError:
            lg.exception("failed")
    finally:
        lg.removeHandler(handler)
    first, second = (json.loads(line) for line in buf.getvalue().splitlines())
    assert first["message"] == "two\nlines here" and first["level"] == "INFO"
    assert first["sandbox_id"] == "sb-1" and first["n"] == 3 and first["request_id"] == "-"
    assert first["logger"] == "crucible.test.json" and first["ts"].endswith("+00:00")
    assert "ValueError: boom" in second["exc"] and second["level"] == "ERROR"


def test_every_line_of_a_request_carries_its_id_even_from_a_worker_thread() -> None:
    app = FastAPI()
    lg = logging.getLogger("crucible.test.route")

    @app.get("/sync")
    def sync_route() -> dict[str, str]:  # runs in the thread pool
        lg.info("inside the route")
        return {"ok": "yes"}

    app.add_middleware(logs.RequestIdMiddleware)
    buf, handler = capture(lg)
    abuf, ahandler = capture(logs.access_log)
    try:
        with TestClient(app) as client:
            r = client.get("/sync", headers={"X-Request-ID": "req-1"})
            r2 = client.get("/sync")
    finally:
        lg.removeHandler(handler)
        logs.access_log.removeHandler(ahandler)
    assert r.headers["x-request-id"] == "req-1"
    generated = r2.headers["x-request-id"]
    assert generated != "req-1" and len(generated) == 16
    inside = [json.loads(line)["request_id"] for line in buf.getvalue().splitlines()]
    assert inside == ["req-1", generated]
    access = [json.loads(line) for line in abuf.getvalue().splitlines()]
    assert [a["request_id"] for a in access] == ["req-1", generated]
    assert access[0]["route"] == "/sync" and access[0]["status"] == 200
    assert logs.request_id.get() is None  # reset after the request


def test_disabled_tracing_is_a_shared_no_op() -> None:
    tracing.use_provider(None)
    assert not tracing.enabled()
    assert tracing.span("a") is tracing.span("b", x=1)  # one nullcontext, nothing allocated
    with tracing.span("a") as s:
        assert s is None
    assert tracing.current_trace_id() is None
    assert tracing.configure_from_env({}) is False  # no endpoint: stays off


def test_an_unhandled_error_still_answers_and_logs_with_the_request_id() -> None:
    app = FastAPI()
    problems.install(app)

    @app.get("/boom")
    def boom() -> None:
        raise RuntimeError("not for the client")

    app.add_middleware(logs.RequestIdMiddleware)
    lg = logging.getLogger("crucible.api")
    buf, handler = capture(lg)
    try:
        with TestClient(app, raise_server_exceptions=False) as client:
            r = client.get("/boom", headers={"X-Request-ID": "req-500"})
    finally:
        lg.removeHandler(handler)
    assert r.status_code == 500 and r.headers["x-request-id"] == "req-500"
    assert r.json()["request_id"] == "req-500"
    assert "not for the client" not in r.text
    (line,) = (json.loads(ln) for ln in buf.getvalue().splitlines())
    assert line["request_id"] == "req-500" and "RuntimeError" in line["exc"]
