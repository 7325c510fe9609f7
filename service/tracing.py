"""OpenTelemetry traces of the control plane: request -> lease / exec / verify spans.

Spans (names are stable; attributes never carry a tenant's data, only ids and outcomes):

- ``HTTP <method> <route>``: every request (``TracingMiddleware``); its parent is the
  caller's W3C ``traceparent`` when one is sent.
- ``sandbox.lease`` (template, source warm|cold), with ``sandbox.start`` (the cold start)
  under it; ``sandbox.exec`` (exit_code, duration_ms); ``episode.verify`` (domain,
  verifier, status) with ``verifier.<name>`` (the verifier's own run) under it.

Disabled (the default) every ``span()`` is one shared ``nullcontext``: no tracer, no context
variable, no allocation on the exec path. ``configure_from_env()`` enables export when
``OTEL_EXPORTER_OTLP_ENDPOINT`` is set (the ``crucible[otel]`` extra: opentelemetry-sdk and
the OTLP/HTTP exporter; standard ``OTEL_*`` variables configure it). ``use_provider`` installs
any SDK ``TracerProvider`` (tests use an in-memory exporter).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any

from opentelemetry import propagate, trace

log = logging.getLogger("crucible.tracing")

_NOOP = contextlib.nullcontext()
_tracer: trace.Tracer | None = None


def enabled() -> bool:
    """Whether spans are being recorded."""
    return _tracer is not None


def use_provider(provider: trace.TracerProvider | None) -> None:
    """Record spans with ``provider`` (None: stop recording)."""
    global _tracer
    _tracer = None if provider is None else provider.get_tracer("crucible")


def configure_from_env(environ: Mapping[str, str] | None = None) -> bool:
    """Enable OTLP export when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or the traces-only
    ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set; returns whether tracing is on.

    A missing SDK or exporter is logged (install ``crucible[otel]``) and tracing stays off:
    the service never fails to start for want of a tracing backend.
    """
    env = os.environ if environ is None else environ
    endpoint = env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    )
    if not endpoint:
        return False
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as e:
        log.warning("OTEL_EXPORTER_OTLP_ENDPOINT is set but %s: pip install 'crucible[otel]'", e)
        return False
    name = env.get("OTEL_SERVICE_NAME", "crucible")
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))  # off the request path
    trace.set_tracer_provider(provider)
    use_provider(provider)
    log.info("tracing: OTLP export to %s", endpoint)
    return True


def span(name: str, **attributes: Any) -> contextlib.AbstractContextManager[Any]:
    """A context manager around one span named ``name`` (a shared no-op when disabled).

    The value it yields is the span (``set_attribute`` on it), or None when disabled.
    """
    tracer = _tracer
    if tracer is None:
        return _NOOP
    return tracer.start_as_current_span(name, attributes=_clean(attributes))


def set_attributes(**attributes: Any) -> None:
    """Set attributes on the current span (nothing when disabled or no span is current)."""
    if _tracer is None:
        return
    current = trace.get_current_span()
    if current.is_recording():
        current.set_attributes(_clean(attributes))


def current_trace_id() -> str | None:
    """The current span's trace id (32 hex), or None when none is recording."""
    if _tracer is None:
        return None
    ctx = trace.get_current_span().get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else None


def _clean(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """OTel attribute values: str, bool, int, float; None dropped; anything else as str."""
    out: dict[str, Any] = {}
    for k, v in attributes.items():
        if v is None:
            continue
        out[k] = v if isinstance(v, str | bool | int | float) else str(v)
    return out


@contextlib.contextmanager
def request_span(scope: Mapping[str, Any]) -> Iterator[Any]:
    """The server span of one ASGI HTTP request, child of the caller's ``traceparent``."""
    tracer = _tracer
    if tracer is None:
        yield None
        return
    carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])}
    parent = propagate.extract(carrier)
    with tracer.start_as_current_span(
        f"HTTP {scope['method']}",
        context=parent,
        kind=trace.SpanKind.SERVER,
        attributes={"http.request.method": scope["method"], "url.path": scope["path"]},
    ) as s:
        yield s


class TracingMiddleware:
    """Wraps every HTTP request in its server span (``HTTP <method> <route>``, status code);
    a pass-through when tracing is disabled."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if _tracer is None or scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = {"code": 500}

        async def _send(message: Any) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        with request_span(scope) as s:
            try:
                await self.app(scope, receive, _send)
            finally:
                route = getattr(scope.get("route"), "path", None) or "unmatched"
                s.update_name(f"HTTP {scope['method']} {route}")
                s.set_attribute("http.route", route)
                s.set_attribute("http.response.status_code", status["code"])
                if status["code"] >= 500:
                    s.set_status(trace.StatusCode.ERROR)


def traced(name: str) -> Any:
    """Decorator: run the function inside a span ``name`` (a plain call when disabled)."""

    def wrap(fn: Any) -> Any:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            tracer = _tracer
            if tracer is None:
                return fn(*args, **kwargs)
            with tracer.start_as_current_span(name):
                return fn(*args, **kwargs)

        return inner

    return wrap
