"""The event stream: what happened to pools, sandboxes, jobs and records, as it commits.

``EventBus.install(db)`` hooks the database's sessions: after a flush it collects the new
audit events (every action but the chatty ones in ``QUIET``), new reward records
(``record.stored``) and new unleased sandbox rows (``pool.refill``); after the commit it
publishes them on the coordinator's ``events`` channel (Redis pub/sub across replicas, a
direct call in one process); a rollback drops them. Publishing only queues a message, so a
request never waits on the network. Subscribers (the SSE endpoint, the key cache) get one
JSON object per event::

    {"action": "sandbox.lease", "seq": 41, "ts": "...", "tenant_id": "t", "key_id": "k",
     "sandbox_id": "sb_...", "details": {...}}

Pub/sub delivers to whoever listens now: a client that was away asks ``GET /v1/audit`` for
what it missed (events carry the audit ``seq``).
"""

from __future__ import annotations

import json
import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from service.coordination.base import Coordinator
from service.db.engine import Database
from service.db.models import AuditEvent, RewardRecordRow, Sandbox

log = logging.getLogger("crucible.events")

CHANNEL = "events"
QUIET = frozenset(
    {"sandbox.exec", "sandbox.file_get", "sandbox.file_put", "sandbox.heartbeat", "auth.failed"}
)
"""Audit actions left out of the stream (one per request on the hot paths)."""

_INFO_KEY = "crucible.events"
_BUSES: weakref.WeakKeyDictionary[Engine, EventBus] = weakref.WeakKeyDictionary()


def _of(obj: object) -> dict[str, Any] | None:
    """The stream's view of one newly flushed row (None: not streamed)."""
    if isinstance(obj, AuditEvent):
        if obj.action in QUIET:
            return None
        return {
            "action": obj.action,
            "seq": obj.seq,
            "ts": obj.ts,
            "tenant_id": obj.tenant_id,
            "key_id": obj.key_id,
            "sandbox_id": obj.sandbox_id,
            "details": obj.details,
        }
    if isinstance(obj, RewardRecordRow):
        return {
            "action": "record.stored",
            "tenant_id": obj.tenant_id,
            "details": {
                "record_id": obj.record_id,
                "job_id": obj.job_id,
                "episode_id": obj.episode_id,
                "task_id": obj.task_id,
                "domain": obj.domain,
                "reward": obj.reward,
                "status": obj.status,
            },
        }
    if isinstance(obj, Sandbox) and obj.tenant_id is None:
        return {
            "action": "pool.refill",
            "tenant_id": None,
            "sandbox_id": obj.id,
            "details": {"template": obj.template},
        }
    return None


def _bus_of(session: Session) -> EventBus | None:
    bind = session.bind
    return _BUSES.get(bind) if isinstance(bind, Engine) else None


@event.listens_for(Session, "after_flush")
def _collect(session: Session, _flush_context: object) -> None:
    if _bus_of(session) is None:
        return
    for obj in session.new:
        ev = _of(obj)
        if ev is not None:
            session.info.setdefault(_INFO_KEY, []).append(ev)


def note_written(session: Session, obj: object) -> None:
    """Queue the stream's view of ``obj``, a row written with a Core statement (the audit
    append: the ORM never flushes it, so ``_collect`` does not see it), for publication
    when ``session`` commits."""
    if _bus_of(session) is None:
        return
    ev = _of(obj)
    if ev is not None:
        session.info.setdefault(_INFO_KEY, []).append(ev)


def note_audit(session: Session, fields: dict[str, Any]) -> None:
    """Queue the stream's view of an audit event appended with Core statements
    (``audit.record``: ``fields`` are its ``seq``, ``ts``, ``tenant_id``, ``key_id``,
    ``action``, ``sandbox_id`` and ``details``), as ``note_written`` would for the row, for
    publication when ``session`` commits."""
    if fields["action"] in QUIET or _bus_of(session) is None:
        return
    session.info.setdefault(_INFO_KEY, []).append(
        {
            "action": fields["action"],
            "seq": fields["seq"],
            "ts": fields["ts"],
            "tenant_id": fields["tenant_id"],
            "key_id": fields["key_id"],
            "sandbox_id": fields["sandbox_id"],
            "details": fields["details"],
        }
    )


@event.listens_for(Session, "after_commit")
def _publish(session: Session) -> None:
    events = session.info.pop(_INFO_KEY, None)
    bus = _bus_of(session)
    if events and bus is not None:
        for ev in events:
            bus.publish(ev)


@event.listens_for(Session, "after_rollback")
def _drop(session: Session) -> None:
    session.info.pop(_INFO_KEY, None)


Listener = tuple[Callable[[dict[str, Any]], None], Callable[[], None]]


class EventBus:
    """Publishes one database's committed events; fans the stream out to listeners.

    Args:
        coordinator: carries the events between replicas (one subscription per process).
    """

    def __init__(self, coordinator: Coordinator) -> None:
        self._coord = coordinator
        self._listeners: dict[int, Listener] = {}
        self._next = 0
        self._lock = threading.Lock()
        coordinator.subscribe(CHANNEL, self._on_message, self._on_gap)

    def install(self, db: Database) -> None:
        """Publish the events of sessions on ``db``'s engine from now on."""
        _BUSES[db.engine] = self

    def publish(self, ev: dict[str, Any]) -> None:
        """Send ``ev`` to every replica's listeners (queued: never blocks)."""
        try:
            self._coord.publish(CHANNEL, json.dumps(ev, default=str))
        except Exception:  # noqa: BLE001 - a commit already happened; never fail it
            log.exception("publishing %s failed", ev.get("action"))

    def listen(
        self, on_event: Callable[[dict[str, Any]], None], on_gap: Callable[[], None]
    ) -> Callable[[], None]:
        """Call ``on_event`` with each event (on a background thread: be quick) and
        ``on_gap`` when some may have been missed. Returns the function that stops it."""
        with self._lock:
            self._next += 1
            handle = self._next
            self._listeners[handle] = (on_event, on_gap)

        def stop() -> None:
            with self._lock:
                self._listeners.pop(handle, None)

        return stop

    def _on_message(self, message: str) -> None:
        with self._lock:
            listeners = list(self._listeners.values())
        if not listeners:
            return
        try:
            ev = json.loads(message)
        except ValueError:
            log.warning("dropped an unreadable event")
            return
        for on_event, _ in listeners:
            on_event(ev)

    def _on_gap(self) -> None:
        with self._lock:
            listeners = list(self._listeners.values())
        for _, on_gap in listeners:
            on_gap()
