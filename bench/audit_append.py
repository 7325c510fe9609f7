"""Audit appends per second on PostgreSQL, against a bare commit measured in the same run.

    CRUCIBLE_TEST_POSTGRES_URL=... .venv/bin/python bench/audit_append.py [--seconds 5]

Every audited action (each lease, exec, release, verify) appends one event to the single
hash chain (``service.audit``): the append bumps one head row, whose row lock serializes
every appender of the deployment, on every replica. This measures that ceiling: threads
(1, 4, 16) each committing one-event transactions for ``--seconds``, beside the same threads
committing an empty transaction (``SELECT 1``: the round trip and commit alone) and a
one-row INSERT into a scratch table (a write that takes no shared lock). Runs in a
fresh schema of the test database (``tests.dbutil.fresh_database``), dropped afterwards.
Figures feed docs/scale-out.md (the audit chain is the first shared bottleneck).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import text

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service import audit  # noqa: E402
from service.db.engine import Database  # noqa: E402
from tests.dbutil import fresh_database  # noqa: E402


def rate(db: Database, work: Callable[[object], None], *, threads: int, seconds: float) -> float:
    """Transactions per second of ``threads`` threads each running ``work(session)``."""
    stop = time.monotonic() + seconds
    counts = [0] * threads

    def run(i: int) -> None:
        while time.monotonic() < stop:
            with db.session() as s:
                work(s)
            counts[i] += 1

    ts = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    t0 = time.monotonic()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(counts) / (time.monotonic() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args()
    out: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp, fresh_database("postgres", Path(tmp)) as db:
        with db.session() as s:
            s.execute(text("CREATE TABLE bench_scratch (id bigserial PRIMARY KEY, v text)"))
        for n in (1, 4, 16):
            bare = rate(db, lambda s: s.execute(text("SELECT 1")), threads=n, seconds=args.seconds)
            insert = rate(
                db,
                lambda s: s.execute(text("INSERT INTO bench_scratch (v) VALUES ('x')")),
                threads=n,
                seconds=args.seconds,
            )
            appends = rate(
                db,
                lambda s: audit.record(s, "bench.append", details={"n": 1}),
                threads=n,
                seconds=args.seconds,
            )
            out[f"{n} threads"] = {
                "bare_commits_per_s": round(bare, 1),
                "row_inserts_per_s": round(insert, 1),
                "audit_appends_per_s": round(appends, 1),
                "append_over_insert": round(appends / insert, 3),
            }
            print(
                f"{n:2} threads: bare commit {bare:8.1f}/s  row insert {insert:8.1f}/s  "
                f"audit append {appends:8.1f}/s",
                flush=True,
            )
        check = audit.verify_chain(db)
        assert check.first_broken_seq is None, check
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
