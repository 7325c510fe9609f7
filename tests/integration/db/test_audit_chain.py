"""The audit log is append-only and hash-chained; verify names the first broken event."""

from __future__ import annotations

import threading

from sqlalchemy import select, update

from service import audit
from service.db.engine import Database
from service.db.models import AuditEvent


def _append(db: Database, n: int, **kw: object) -> None:
    for i in range(n):
        with db.session() as s:
            audit.record(s, "test.event", tenant_id="t1", details={"i": i, **kw})


def test_chain_links_and_verifies(db: Database) -> None:
    _append(db, 5)
    with db.session() as s:
        events = s.execute(select(AuditEvent).order_by(AuditEvent.seq)).scalars().all()
    assert [e.seq for e in events] == [1, 2, 3, 4, 5]
    assert events[0].prev_hash == audit.GENESIS_HASH
    assert all(b.prev_hash == a.hash for a, b in zip(events, events[1:], strict=False))
    check = audit.verify_chain(db)
    assert (check.events_checked, check.first_broken_seq) == (5, None)


def test_tampered_details_are_named(db: Database) -> None:
    _append(db, 4)
    with db.session() as s:
        s.execute(update(AuditEvent).where(AuditEvent.seq == 3).values(details={"i": 99}))
    check = audit.verify_chain(db)
    assert check.first_broken_seq == 3
    assert "contents" in (check.reason or "")


def test_deleted_middle_event_is_named(db: Database) -> None:
    _append(db, 4)
    with db.session() as s:
        s.execute(AuditEvent.__table__.delete().where(AuditEvent.seq == 2))
    assert audit.verify_chain(db).first_broken_seq == 3


def test_deleted_last_event_is_detected(db: Database) -> None:
    _append(db, 3)
    with db.session() as s:
        s.execute(AuditEvent.__table__.delete().where(AuditEvent.seq == 3))
    check = audit.verify_chain(db)
    assert check.first_broken_seq == 3
    assert "deleted" in (check.reason or "")


def test_concurrent_appends_keep_one_gapless_chain(db: Database) -> None:
    threads = [threading.Thread(target=_append, args=(db, 10), kwargs={"w": w}) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check = audit.verify_chain(db)
    assert (check.events_checked, check.first_broken_seq) == (40, None)


def test_unicode_and_nested_details_round_trip(db: Database) -> None:
    with db.session() as s:
        audit.record(s, "test.event", details={"cmd": "echo 'héllo' ✓", "n": [1, {"a": None}]})
    assert audit.verify_chain(db).first_broken_seq is None


def test_events_appended_while_it_verifies_are_not_a_truncation(db: Database, monkeypatch) -> None:
    # A CI run's dashboard showed "events after the last stored one were deleted" while
    # its warm pools were appending: the head was read after the events, and had moved.
    # Here an append lands right after the last event was read, the worst moment.
    _append(db, 3)
    reads = audit.iter_events

    def then_append(*args: object, **kwargs: object):
        yield from reads(*args, **kwargs)
        _append(db, 1, late=True)

    monkeypatch.setattr(audit, "iter_events", then_append)
    check = audit.verify_chain(db)
    assert (check.events_checked, check.first_broken_seq) == (3, None), check
    monkeypatch.undo()
    assert audit.verify_chain(db) == audit.ChainCheck(4, None, None)
