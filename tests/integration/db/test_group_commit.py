"""Group commit: concurrent units share one commit, in order, each acknowledged only once
durable; the audit chain stays exact."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service import audit
from service.db.engine import Database
from service.db.models import AuditEvent
from service.groupcommit import GroupCommitter


def _event(i: int):  # noqa: ANN202 - a unit of work
    def unit(s: Session) -> int:
        return audit.record(s, "test.event", tenant_id="t1", details={"i": i}).seq

    return unit


def _hold(committer: GroupCommitter) -> tuple[threading.Event, Future[None]]:
    """Occupy the writer in a unit of its own until the event is set, so the units
    submitted meanwhile queue up and form the next batch."""
    entered, release = threading.Event(), threading.Event()

    def blocker(_s: Session) -> None:
        entered.set()
        release.wait(30)

    fut = committer.submit(blocker)
    assert entered.wait(30)
    return release, fut


def _stored(db: Database) -> int:
    with db.read() as s:
        return s.execute(select(func.count()).select_from(AuditEvent)).scalar_one()


def test_concurrent_appends_share_one_commit_in_submission_order(db: Database) -> None:
    committer = GroupCommitter(db)
    release, held = _hold(committer)
    futures: list[Future[int]] = []
    submitted = threading.Lock()

    def submit(i: int) -> None:
        with submitted:  # submission order = i
            futures.append(committer.submit(_event(i)))

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    time.sleep(0.1)
    # Never acknowledged before durable: nothing is done, nothing stored, while queued.
    assert not any(f.done() for f in futures)
    assert _stored(db) == 0
    batches = committer.batches
    release.set()
    held.result(30)
    seqs = [f.result(30) for f in futures]
    assert committer.batches == batches + 2  # the held unit's, then all 20 in one
    with db.read() as s:
        events = s.execute(select(AuditEvent).order_by(AuditEvent.seq)).scalars().all()
    assert seqs == [e.seq for e in events] == list(range(1, 21))
    assert [e.details["i"] for e in events] == list(range(20))  # in submission order
    check = audit.verify_chain(db)
    assert (check.events_checked, check.first_broken_seq) == (20, None)
    committer.close()


def test_a_failing_unit_is_undone_alone_and_leaves_no_gap(db: Database) -> None:
    committer = GroupCommitter(db)
    release, held = _hold(committer)

    def broken(s: Session) -> None:
        audit.record(s, "test.event", details={"i": "broken"})  # appended, then undone
        raise ValueError("unit fails after its append")

    first = committer.submit(_event(0))
    bad = committer.submit(broken)
    last = committer.submit(_event(1))
    release.set()
    held.result(30)
    assert first.result(30) == 1
    with pytest.raises(ValueError, match="unit fails"):
        bad.result(30)
    assert last.result(30) == 2  # the undone append took its seq back with it
    with db.read() as s:
        details = [e.details for e in s.scalars(select(AuditEvent).order_by(AuditEvent.seq))]
    assert details == [{"i": 0}, {"i": 1}]
    assert audit.verify_chain(db).first_broken_seq is None
    committer.close()


def test_group_commits_interleave_with_direct_appends(db: Database) -> None:
    """Units and ordinary transactions append to one chain (the head row serializes)."""
    committer = GroupCommitter(db)

    def direct(w: int) -> None:
        for i in range(10):
            with db.session() as s:
                audit.record(s, "test.direct", details={"w": w, "i": i})

    def grouped(w: int) -> None:
        for f in [committer.submit(_event(w * 100 + i)) for i in range(10)]:
            f.result(30)

    threads = [threading.Thread(target=direct, args=(w,)) for w in range(2)]
    threads += [threading.Thread(target=grouped, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check = audit.verify_chain(db)
    assert (check.events_checked, check.first_broken_seq) == (60, None)
    committer.close()
