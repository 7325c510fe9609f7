"""What recording costs on the exec hot path, against an empty call measured in the same run.

    .venv/bin/python bench/metrics_cost.py [--n 200000] [--json]

Per operation, in microseconds (best of 5 batches of n): an empty function call (the
baseline); ``crucible_exec_duration_seconds.observe``; ``crucible_execs_total`` with its
label looked up and incremented (what every exec does); the lease histogram with a label;
a ``tracing.span`` and a ``@tracing.traced`` call with tracing disabled (the default) and
with an SDK provider recording to no exporter (the cost once OTLP export is on, less the
export itself, which a batch thread does off the request path). None of it does I/O.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service import tracing  # noqa: E402
from service.metrics import EXEC_LATENCY, EXECS, LEASE_LATENCY  # noqa: E402


def per_op_us(fn: Callable[[], object], n: int) -> float:
    """Best of 5 batches of ``n`` calls of ``fn``: microseconds per call."""
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter_ns() - t0) / n / 1e3)
    return best


def _empty() -> None:
    return None


@tracing.traced("bench.traced")
def _traced() -> None:
    return None


def _span() -> None:
    with tracing.span("bench.span", k=1):
        pass


def measure(n: int) -> dict[str, float]:
    """Every operation's cost (µs per call)."""
    out = {
        "empty call (baseline)": per_op_us(_empty, n),
        "exec histogram observe": per_op_us(lambda: EXEC_LATENCY.observe(0.004), n),
        "exec counter labels+inc": per_op_us(lambda: EXECS.labels("ok").inc(), n),
        "lease histogram labels+observe": per_op_us(
            lambda: LEASE_LATENCY.labels("warm").observe(0.002), n
        ),
        "span, tracing disabled": per_op_us(_span, n),
        "traced call, tracing disabled": per_op_us(_traced, n),
    }
    from opentelemetry.sdk.trace import TracerProvider

    tracing.use_provider(TracerProvider())
    try:
        m = max(n // 10, 1000)
        out["span, SDK recording (no exporter)"] = per_op_us(_span, m)
        out["traced call, SDK recording (no exporter)"] = per_op_us(_traced, m)
    finally:
        tracing.use_provider(None)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    res = measure(args.n)
    base = res["empty call (baseline)"]
    if args.json:
        print(json.dumps({k: round(v, 4) for k, v in res.items()}, indent=2))
        return
    print(f"{'operation':44} {'us/op':>8} {'x empty call':>13}")
    for k, v in res.items():
        print(f"{k:44} {v:8.3f} {v / base:13.1f}")


if __name__ == "__main__":
    main()
