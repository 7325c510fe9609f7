"""Jinja2 environment (autoescaping every template) and the HTML response of a page.

Every page carries a Content-Security-Policy that allows scripts, styles and images from
this origin only (no inline script or style), so markup that slipped past escaping still
could not run.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse
from jinja2 import Environment, FileSystemLoader

TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"
STATIC_DIR = Path(__file__).resolve().parent / "static"

SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; connect-src 'self'; form-action 'self'; base-uri 'none'; "
    "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def _when(value: datetime | str | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return value
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _number(v: Any) -> bool:
    """True for an int or float (not a bool): details are free-form JSON, so anything else
    (missing, text, null) renders as "-" instead of failing the page."""
    return isinstance(v, int | float) and not isinstance(v, bool)


def _bytes(n: Any) -> str:
    if not _number(n):
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _ms(v: Any) -> str:
    return "-" if not _number(v) else (f"{v:.0f} ms" if v < 10_000 else f"{v / 1000:.1f} s")


def _rate(v: Any) -> str:
    return "-" if not _number(v) else f"{v * 100:.0f}%"


def _cap(text: Any, n: int = 300) -> str:
    text = "" if text is None else str(text)
    return text if len(text) <= n else f"{text[:n]}… ({len(text) - n} more characters)"


def _json(value: Any, indent: int | None = 2) -> str:
    return json.dumps(value, indent=indent, sort_keys=True, ensure_ascii=False, default=str)


def _environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(TEMPLATES_DIR),
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(when=_when, bytes=_bytes, ms=_ms, rate=_rate, cap=_cap, tojson_pretty=_json)
    return env


ENV = _environment()


def page(request: Request, name: str, *, status: int = 200, **context: Any) -> HTMLResponse:
    """Render template ``name`` with ``context`` (plus ``request``) as an HTML response."""
    html = ENV.get_template(name).render(request=request, **context)
    return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)
