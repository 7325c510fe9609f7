"""Server-rendered inline SVG plots (no JavaScript, no external assets).

Every label goes through ``markupsafe.escape``; colours come from CSS classes
(``series-0`` ... ``series-7`` in ``static/dashboard.css``), so the page's
Content-Security-Policy needs no inline styles.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from markupsafe import Markup, escape

from service.dashboard.stats import Bucket, Histogram

PALETTE = 8
"""Number of series colour classes in the stylesheet."""


def _stamp(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%m-%d %H:%M")


def line_chart(
    series: dict[str, list[Bucket]], *, title: str, width: int = 640, height: int = 220
) -> Markup:
    """Pass rate (0..1) over time, one polyline per key, with a legend."""
    pad_l, pad_r, pad_t, pad_b = 40, 10, 20, 30
    xs = [b.start_s for buckets in series.values() for b in buckets]
    parts = [
        f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{escape(title)}"><title>{escape(title)}</title>'
    ]
    iw, ih = width - pad_l - pad_r, height - pad_t - pad_b
    for frac in (0.0, 0.5, 1.0):
        y = pad_t + ih * (1 - frac)
        parts.append(
            f'<line class="grid" x1="{pad_l}" y1="{y:.1f}" x2="{width - pad_r}" y2="{y:.1f}"/>'
            f'<text class="axis" x="{pad_l - 4}" y="{y + 4:.1f}" text-anchor="end">'
            f"{frac:.1f}</text>"
        )
    if not xs:
        parts.append(
            f'<text class="axis" x="{pad_l + 8}" y="{pad_t + 20}">no verified records</text>'
        )
        return Markup("".join(parts) + "</svg>")
    x0, x1 = min(xs), max(xs)
    span = (x1 - x0) or 1.0

    def px(t: float) -> float:
        return pad_l + (t - x0) / span * iw if x1 > x0 else pad_l + iw / 2

    for t in (x0, x1):
        parts.append(
            f'<text class="axis" x="{px(t):.1f}" y="{height - 8}" text-anchor="middle">'
            f"{escape(_stamp(t))}</text>"
        )
    for i, (key, buckets) in enumerate(series.items()):
        cls = f"series-{i % PALETTE}"
        pts = " ".join(f"{px(b.start_s):.1f},{pad_t + ih * (1 - b.rate):.1f}" for b in buckets)
        parts.append(
            f'<polyline class="line {cls}" points="{pts}"><title>{escape(key)}</title></polyline>'
        )
        for b in buckets:
            parts.append(
                f'<circle class="dot {cls}" cx="{px(b.start_s):.1f}" '
                f'cy="{pad_t + ih * (1 - b.rate):.1f}" r="2.5"><title>{escape(key)} '
                f"{escape(_stamp(b.start_s))}: {b.rate:.2f} of {b.n}</title></circle>"
            )
        parts.append(
            f'<text class="legend {cls}" x="{pad_l + 6 + (i % 4) * 150}" '
            f'y="{12 + (i // 4) * 12}">{escape(key[:24])}</text>'
        )
    return Markup("".join(parts) + "</svg>")


def histogram(h: Histogram, *, title: str, width: int = 300, height: int = 140) -> Markup:
    """Bars of a reward histogram, with the bin range under the axis."""
    pad_l, pad_b, pad_t = 8, 22, 16
    top = max(h.counts) or 1
    bw = (width - 2 * pad_l) / len(h.counts)
    parts = [
        f'<svg class="chart small" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{escape(title)}"><title>{escape(title)}</title>'
        f'<text class="axis" x="{pad_l}" y="12">{escape(title)}</text>'
    ]
    ih = height - pad_b - pad_t
    step = (h.hi - h.lo) / len(h.counts)
    for i, n in enumerate(h.counts):
        bh = ih * n / top
        parts.append(
            f'<rect class="bar" x="{pad_l + i * bw + 1:.1f}" y="{pad_t + ih - bh:.1f}" '
            f'width="{bw - 2:.1f}" height="{bh:.1f}"><title>[{h.lo + i * step:.2f}, '
            f"{h.lo + (i + 1) * step:.2f}): {n}</title></rect>"
        )
    parts.append(
        f'<text class="axis" x="{pad_l}" y="{height - 6}">{h.lo:g}</text>'
        f'<text class="axis" x="{width - pad_l}" y="{height - 6}" text-anchor="end">{h.hi:g}</text>'
    )
    return Markup("".join(parts) + "</svg>")


def stacked_bar(parts: Sequence[tuple[str, int]], *, width: int = 240, height: int = 14) -> Markup:
    """One horizontal bar split by ``(label, count)`` parts (job progress, statuses)."""
    total = sum(n for _, n in parts) or 1
    out = [
        f'<svg class="bar-h" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        'role="img" aria-label="progress">'
    ]
    x = 0.0
    for label, n in parts:
        w = width * n / total
        if n:
            out.append(
                f'<rect class="part-{escape(label)}" x="{x:.1f}" y="0" width="{w:.1f}" '
                f'height="{height}"><title>{escape(label)}: {n}</title></rect>'
            )
        x += w
    return Markup("".join(out) + "</svg>")
