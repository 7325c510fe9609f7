"""Append-only, hash-chained audit events.

Each event's hash is ``sha256(prev_hash || canonical_json(event fields))`` where the
canonical JSON is ``json.dumps(..., sort_keys=True, separators=(",", ":"),
ensure_ascii=False)`` of ``{seq, ts, tenant_id, key_id, action, sandbox_id, details}``,
UTF-8 encoded. The first event's ``prev_hash`` is 64 zeros. Appends bump the single
``audit_chain`` head row first, which serializes concurrent appenders on both SQLite and
PostgreSQL (the UPDATE takes the row lock) and keeps ``seq`` gap-free.

An event is written in the same transaction as the state change it records, so the log
and the state never disagree.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import bindparam, insert, select, update
from sqlalchemy.orm import Session

from service.db.engine import Database
from service.db.models import AuditChain, AuditEvent
from service.events import note_audit

GENESIS_HASH = "0" * 64

_HEAD = AuditChain.__table__
_INSERT_EVENT = insert(AuditEvent.__table__)
_SET_HEAD_HASH = update(_HEAD).where(_HEAD.c.id == 1).values(last_hash=bindparam("head_hash"))
# The two head statements as the driver's own SQL (no JSON, no type processing to do):
# SQLAlchemy's Core path costs ~16-23 us a statement, this ~7-18 us (SQLite, one core).
_BUMP_HEAD_SQL = "UPDATE audit_chain SET seq = seq + 1 WHERE id = 1 RETURNING seq, last_hash"
_SET_HEAD_SQL = {  # by the driver's paramstyle; another style: the Core statement
    style: f"UPDATE audit_chain SET last_hash = {mark} WHERE id = 1"
    for style, mark in (("qmark", "?"), ("format", "%s"), ("pyformat", "%s"), ("numeric", ":1"))
}


def canonical_hash(prev_hash: str, fields: dict[str, Any]) -> str:
    """The chain hash of one event (hex sha256), formula in the module docstring."""
    body = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(prev_hash.encode() + body.encode("utf-8")).hexdigest()


def _fields(ev: AuditEvent) -> dict[str, Any]:
    return {
        "seq": ev.seq,
        "ts": ev.ts,
        "tenant_id": ev.tenant_id,
        "key_id": ev.key_id,
        "action": ev.action,
        "sandbox_id": ev.sandbox_id,
        "details": ev.details,
    }


@dataclass(frozen=True, slots=True)
class Appended:
    """One event as ``record`` stored it (plain values: no ORM object on the hot path)."""

    seq: int
    ts: str
    tenant_id: str | None
    key_id: str | None
    action: str
    sandbox_id: str | None
    details: dict[str, Any]
    prev_hash: str
    hash: str


_SCALARS = (str, int, bool, type(None))
_NOT_PLAIN: Any = object()  # _plain_copy's answer for a value JSON would change


def _plain_copy(value: Any) -> Any:
    """A copy of ``value`` when it is already what JSON stores (dicts with ``str`` keys,
    lists, ``str``/``int``/``bool``/``None``, finite ``float``s, exact types only), so that
    ``json.loads(json.dumps(value))`` would give an equal value of the same types; else
    ``_NOT_PLAIN``."""
    t = type(value)
    if t in _SCALARS or (t is float and value - value == 0):  # not NaN or an infinity
        return value
    if t is dict:
        out = {}
        for k, v in value.items():
            if type(k) is not str or (c := _plain_copy(v)) is _NOT_PLAIN:
                return _NOT_PLAIN
            out[k] = c
        return out
    if t is list:
        items = []
        for v in value:
            if (c := _plain_copy(v)) is _NOT_PLAIN:
                return _NOT_PLAIN
            items.append(c)
        return items
    return _NOT_PLAIN


def normalize_details(details: dict[str, Any] | None) -> dict[str, Any]:
    """``details`` as JSON stores it, a copy: ``json.loads(json.dumps(details or {}))``,
    without the round trip when the value is already JSON-plain (the usual case)."""
    if not details:
        return {}
    plain = _plain_copy(details)
    return json.loads(json.dumps(details)) if plain is _NOT_PLAIN else plain


def record(
    session: Session,
    action: str,
    *,
    tenant_id: str | None = None,
    key_id: str | None = None,
    sandbox_id: str | None = None,
    details: dict[str, Any] | None = None,
) -> Appended:
    """Append one event inside ``session``'s transaction and return it.

    ``details`` must be JSON-serializable; it is stored and hashed as JSON reads it back
    (``normalize_details``: a copy, so changing the caller's dict later changes nothing
    stored or streamed). The returned ``Appended`` holds the stored values.
    """
    # The head row is created by the initial migration; this UPDATE takes its row lock and
    # returns the new head in the same statement (SQLite >= 3.35 and PostgreSQL: RETURNING).
    # Prebuilt Core statements on the tables, run on the session's connection: no ORM
    # bulk-persistence path, no statement building per call, compiled once (~5x cheaper).
    # The event's fields are plain values, hashed and inserted as they are: no ORM object.
    conn = session.connection()
    seq, prev_hash = conn.exec_driver_sql(_BUMP_HEAD_SQL).one()
    fields = {
        "seq": seq,
        "ts": datetime.now(UTC).isoformat(timespec="microseconds"),
        "tenant_id": tenant_id,
        "key_id": key_id,
        "action": action,
        "sandbox_id": sandbox_id,
        "details": normalize_details(details),
    }
    digest = canonical_hash(prev_hash, fields)
    conn.execute(_INSERT_EVENT, {**fields, "prev_hash": prev_hash, "hash": digest})
    set_head = _SET_HEAD_SQL.get(conn.dialect.paramstyle)
    if set_head is None:
        conn.execute(_SET_HEAD_HASH, {"head_hash": digest})
    else:
        conn.exec_driver_sql(set_head, (digest,))
    note_audit(session, fields)  # the live stream sees it once the transaction commits
    return Appended(**fields, prev_hash=prev_hash, hash=digest)


@dataclass(frozen=True)
class ChainCheck:
    """Result of ``verify_chain``: ``first_broken_seq`` is None when the chain is intact."""

    events_checked: int
    first_broken_seq: int | None
    reason: str | None


def iter_events(
    db: Database, *, batch: int = 1000, upto: int | None = None
) -> Iterator[AuditEvent]:
    """Every event in ``seq`` order (up to ``upto`` when given), read in batches."""
    last = 0
    while True:
        query = select(AuditEvent).where(AuditEvent.seq > last)
        if upto is not None:
            query = query.where(AuditEvent.seq <= upto)
        with db.session() as s:
            rows = s.execute(query.order_by(AuditEvent.seq).limit(batch)).scalars().all()
        if not rows:
            return
        yield from rows
        last = rows[-1].seq


def verify_chain(db: Database) -> ChainCheck:
    """Recompute every hash up to the chain's head as it stood when the check began; name
    the first event whose hash, link or sequence is wrong.

    The head is read first and the events up to it after: the head moves in the same
    transaction as each append, so every event it counts is committed, and events appended
    meanwhile lie beyond it. (The head read last made a busy server's chain look
    truncated: "events after the last stored one were deleted", on the dashboard of a CI
    run whose warm pools were filling.)
    """
    with db.session() as s:
        head = s.get(AuditChain, 1)
        upto = head.seq if head is not None else None
        head_hash = head.last_hash if head is not None else None
    prev_hash, expected_seq, n = GENESIS_HASH, 1, 0
    for ev in iter_events(db, upto=upto):
        n += 1
        if ev.seq != expected_seq:
            return ChainCheck(n, ev.seq, f"sequence gap: expected {expected_seq}, found {ev.seq}")
        if ev.prev_hash != prev_hash:
            return ChainCheck(n, ev.seq, "prev_hash does not match the previous event's hash")
        if canonical_hash(ev.prev_hash, _fields(ev)) != ev.hash:
            return ChainCheck(n, ev.seq, "hash does not match the event's contents")
        prev_hash, expected_seq = ev.hash, expected_seq + 1
    if upto is not None and (upto != expected_seq - 1 or head_hash != prev_hash):
        return ChainCheck(n, expected_seq, "events after the last stored one were deleted")
    return ChainCheck(n, None, None)
