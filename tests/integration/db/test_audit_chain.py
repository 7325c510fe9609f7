"""The audit log is append-only and hash-chained; verify names the first broken event."""

from __future__ import annotations

import copy
import enum
import json
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


class _Kind(enum.IntEnum):
    ONE = 1


DETAILS = [
    {},
    {"template": "terminal", "ttl_s": 600, "warm": True},
    {"cmd": "echo 'héllo' ✓", "n": [1, {"a": None, "b": [2.5, -0.0, 1e-07]}], "big": 2**70},
    # not JSON-plain: normalised by the round trip, as before
    {"t": (1, "x"), 3: "int key", "k": _Kind.ONE, "f": float("1e300") * 10, "nan": float("nan")},
]


def _old_way(prev_hash: str, stored: AuditEvent, given: dict) -> str:
    """The hash as the former ``record`` computed it: the details through a JSON round trip,
    every field from the stored row's values."""
    return audit.canonical_hash(
        prev_hash,
        {
            "seq": stored.seq,
            "ts": stored.ts,
            "tenant_id": stored.tenant_id,
            "key_id": stored.key_id,
            "action": stored.action,
            "sandbox_id": stored.sandbox_id,
            "details": json.loads(json.dumps(given)),
        },
    )


def test_record_stores_and_hashes_as_before(db: Database) -> None:
    """``record`` builds no ORM object and skips the round trip for plain details; what it
    stores, hashes and returns is what the round trip gave, and the chain verifies."""
    given_all = copy.deepcopy(DETAILS)
    if db.url.startswith("postgresql"):  # PostgreSQL's json refuses NaN and Infinity
        given_all = [{k: v for k, v in d.items() if k not in ("f", "nan")} for d in given_all]
    appended = []
    with db.session() as s:
        for i, given in enumerate(given_all):
            kw = {"tenant_id": "t1", "key_id": "k1", "sandbox_id": f"sb_{i}"} if i % 2 else {}
            appended.append(audit.record(s, f"test.plain{i}", details=given, **kw))
    for given in given_all:  # the caller's dict is not the stored one
        given.setdefault("later", 1) if given else None
    with db.session() as s:
        rows = s.execute(select(AuditEvent).order_by(AuditEvent.seq)).scalars().all()
    prev = audit.GENESIS_HASH
    for ev, row, given in zip(appended, rows, given_all, strict=True):
        row_given = {k: v for k, v in given.items() if k != "later"}
        assert row.prev_hash == prev
        assert row.hash == _old_way(prev, row, row_given)
        assert row.hash == audit.canonical_hash(row.prev_hash, audit._fields(row))
        expected = json.loads(json.dumps(row_given))
        if "nan" in expected:  # NaN != NaN: compare the JSON texts
            assert json.dumps(row.details) == json.dumps(expected) == json.dumps(ev.details)
        else:
            assert row.details == expected == ev.details
            assert json.dumps(ev.details, sort_keys=True) == json.dumps(expected, sort_keys=True)
        assert (ev.seq, ev.ts, ev.tenant_id, ev.key_id, ev.action, ev.sandbox_id) == (
            row.seq,
            row.ts,
            row.tenant_id,
            row.key_id,
            row.action,
            row.sandbox_id,
        )
        assert (ev.prev_hash, ev.hash) == (row.prev_hash, row.hash)
        prev = row.hash
    check = audit.verify_chain(db)
    assert (check.events_checked, check.first_broken_seq) == (len(given_all), None)


def test_normalize_details_matches_the_json_round_trip() -> None:
    for given in [*DETAILS[:3], {"t": (1,), 3: "x", "k": _Kind.ONE}, None]:
        out = audit.normalize_details(given)
        assert out == json.loads(json.dumps(given or {}))
        assert json.dumps(out) == json.dumps(json.loads(json.dumps(given or {})))
        if given:
            assert out is not given
