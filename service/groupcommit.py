"""Group commit: many callers' small write transactions share one commit (one fsync).

A durable commit costs one WAL fsync on SQLite (``synchronous=FULL``) or one WAL flush on
PostgreSQL, whatever it holds; writers that each commit alone queue behind each other's
fsyncs. ``GroupCommitter`` runs the units of work submitted from any thread or event loop on
one writer thread: it takes every unit waiting (up to ``max_batch``), runs them in one
transaction, commits once, and only then completes each unit's future. When a unit raises,
the transaction is rolled back and the batch run again with each unit in its own SAVEPOINT
(so units must touch nothing but the session: they may run twice, the first run undone).

Guarantees:
- A future completes only after the commit that holds its unit returned (durable), or with
  the exception that undid it: nothing is acknowledged before it is durable.
- Units run in submission order; a unit that raises is undone alone (its caller gets the
  exception), the others commit.
- A commit that fails fails every unit of the batch (none is acknowledged), and the writer
  goes on with the next batch.
- What a unit's statements queued for after the commit (``session.info`` lists: the event
  stream's messages) is dropped with the unit when it is rolled back.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from sqlalchemy.orm import Session

from service.db.engine import Database

log = logging.getLogger(__name__)

T = TypeVar("T")
_STOP = object()


class _Undo(Exception):
    """A unit raised in a plain run: the transaction is rolled back."""


class GroupCommitter:
    """One writer thread that commits concurrent units of work together (module docstring).

    Args:
        db: the database written. max_batch: most units in one transaction.
    """

    def __init__(self, db: Database, *, max_batch: int = 256) -> None:
        self._db, self._max_batch = db, max_batch
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self.batches = 0  # transactions committed (for tests and benches)
        self.units = 0  # units committed

    @property
    def pending(self) -> int:
        """Units queued and not yet taken into a batch."""
        return self._queue.qsize()

    def submit(self, fn: Callable[[Session], T]) -> Future[T]:
        """Queue ``fn(session)`` for the next batch; its future holds what it returned
        once the batch committed, or the exception that undid it."""
        self._ensure_started()
        fut: Future[T] = Future()
        self._queue.put((fn, fut))
        return fut

    def run(self, fn: Callable[[Session], T]) -> T:
        """``submit`` and wait (a thread-pool caller). Raises what ``fn`` or the commit
        raised."""
        return self.submit(fn).result()

    async def run_async(self, fn: Callable[[Session], T]) -> T:
        """``submit`` and await (an event-loop caller; the loop is never blocked). Raises
        what ``fn`` or the commit raised. A cancelled caller's unit still commits."""
        return await asyncio.shield(asyncio.wrap_future(self.submit(fn)))

    def close(self) -> None:
        """Commit what is queued, then stop the writer thread."""
        with self._start_lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(_STOP)
            thread.join(timeout=30)

    def _ensure_started(self) -> None:
        if self._thread is not None:
            return
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="crucible-group-commit", daemon=True
                )
                self._thread.start()

    def _loop(self) -> None:
        while True:
            first = self._queue.get()
            if first is _STOP:
                return
            batch = [first]
            stop = False
            while len(batch) < self._max_batch:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is _STOP:
                    stop = True
                    break
                batch.append(item)
            self._commit(batch)
            if stop:
                return

    def _commit(self, batch: list[tuple[Callable[[Session], Any], Future[Any]]]) -> None:
        try:
            outcomes = self._run_plain(batch)
            if outcomes is None:  # a unit raised: the batch again, each unit in a savepoint
                outcomes = self._run_isolated(batch)
        except Exception as e:  # noqa: BLE001 - the commit failed: no unit is durable
            log.warning("group commit of %d units failed: %s", len(batch), e)
            for _, fut in batch:
                if fut.set_running_or_notify_cancel():
                    fut.set_exception(e)
            return
        self.batches += 1
        self.units += sum(ok for ok, _ in outcomes)
        for (_, fut), (ok, value) in zip(batch, outcomes, strict=True):
            if not fut.set_running_or_notify_cancel():
                continue
            if ok:
                fut.set_result(value)
            else:
                fut.set_exception(value)

    def _run_plain(self, batch: list[tuple[Callable[[Session], Any], Future[Any]]]) -> Any:
        """Every unit in one transaction without savepoints (a SAVEPOINT and its RELEASE
        cost more than an audit append); None, all rolled back, when one raised."""
        try:
            with self._db.session() as s:
                outcomes: list[tuple[bool, Any]] = []
                for fn, _ in batch:
                    try:
                        outcomes.append((True, fn(s)))
                    except Exception as e:
                        raise _Undo from e
        except _Undo:
            return None
        return outcomes

    def _run_isolated(
        self, batch: list[tuple[Callable[[Session], Any], Future[Any]]]
    ) -> list[tuple[bool, Any]]:
        """Every unit in its own savepoint of one transaction, so one that raises is
        undone alone."""
        outcomes: list[tuple[bool, Any]] = []
        with self._db.session() as s:
            for fn, _ in batch:
                # what hooks queued for after the commit (the event stream's messages):
                # a unit rolled back to its savepoint takes its own back with it
                info = {k: list(v) if isinstance(v, list) else v for k, v in s.info.items()}
                try:
                    with s.begin_nested():
                        outcomes.append((True, fn(s)))
                except Exception as e:  # noqa: BLE001 - handed to that unit's caller
                    s.info.clear()
                    s.info.update(info)
                    outcomes.append((False, e))
        return outcomes
