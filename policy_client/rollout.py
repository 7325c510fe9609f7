"""``RolloutRunner``: claims a job's work items and runs their episodes concurrently.

Per work item (one task x group size): claim it (a 60 s lease, renewed by a heartbeat every
third of it while the item runs), start the group (the server forks sandboxes from one
prepared state for the samples still without a record), run every episode's turn loop,
verify each into a reward record, and complete the item. A verifier failure completes it
failed with ``cause="verifier"`` (an attempt used; the server retries it a bounded number of
times); losing the server or the claim mid-episode (transport errors, 502/503 after the
client's retries, the episode's sandbox or claim gone) is an ``infrastructure`` failure: the
episode is not verified, the item is re-queued without using an attempt, and a retry re-runs
only the samples still missing. When the heartbeat finds the claim gone (it lapsed, or the
server timed it out as a long tail, ``schedule.timeout``), the runner cuts the group at once:
it cancels the episodes still in their turn loop and releases their sandboxes rather than
running them on to their turn limit (their work can no longer count); the claim's next
holder runs the item, resuming checkpointed samples. Each of the ``concurrency`` slots claims
as its own worker (``f"{worker}.{slot}"``), so when the server hands a claim one slot lost to
another slot of the same runner, the first one's heartbeat and complete are refused rather
than renewing or completing the second one's claim. A start the server refuses with a 4xx
(a task image that does not build, ``TaskBuildFailed``; a malformed or removed task) fails the
same way on every try: it completes the item with ``cause="verifier"`` and the server's
reason, using an attempt.
The SDK retries every call but exec through restarts, so a worker rides out a control-plane
restart; a worker killed mid-job loses at most its in-flight episodes, whose claims lapse
back to the queue within the lease. Policy calls from all running episodes are gathered into
batches (``batch_size`` requests, or whatever arrived within ``batch_wait_s``) and run in a
worker thread, so a GPU policy sees full batches.

An episode stops at the done marker (``complete``), after ``max_turns`` policy turns
(``max_turns``), when the task's agent timeout has passed (``agent_timeout``), when the
policy reports a full context window (``context_length``), when the sandbox's container
stopped under it (``sandbox_stopped``: as root the agent can kill everything in it; the end
state as it stopped is verified like any other, so stopping the sandbox is no way out of a
0), or on a client or policy failure (``error``, excluded from the loss; the record's
``error`` says what failed). Its record
carries the prompt (``instruction``, ``prompt_messages``), ``prompt_ids`` and, per turn, the
observation tokens (``loss_mask`` 0, logprob 0.0) then the sampled tokens (``loss_mask`` 1,
their logprobs), so ``loss_mask`` and ``rollout_logprobs`` align with ``response_ids``. Token
lists are all or nothing: if any turn came back as text without tokens, the record has none
(an honest "no tokens" rather than a sequence with holes), and the record's ``missing``
(``token_ids``, ``logprobs``) and ``missing_reason`` say what is absent and why.

Checkpoints (``checkpoint_every = K`` > 0): before turns K, 2K, ... the runner stores a
checkpoint of the episode (the server snapshots its sandbox; the runner sends the chat and
trajectory so far, token ids included). A claim of an item that has checkpoints (its last
worker was lost, timed out or restarted) resumes those samples: each goes on in a sandbox
forked from its checkpoint, at the checkpoint's turn, with the stored trajectory; the
record's ``resumed_from`` names the checkpoint.

Stragglers: a job whose ``schedule.straggler`` is ``{min_samples: m, deadline_s}`` (read once
per job from ``GET /v1/jobs/{id}``) does not wait for its group's long tail. Once the claim is
``deadline_s`` seconds old (timed from when the claim came back) and at least ``m`` of the
group's samples have records (this claim's plus those an earlier claim recorded), the runner
cancels the episodes still in their turn loop (an episode past it, closing up or verifying, is
waited for), releases their sandboxes (``DELETE /v1/sandboxes/{id}``; the server then
abandons those episodes, as a lapsed claim's) and completes the item ok: the server marks the
missing samples ``stragglers`` (``progress.schedule.stragglers``) and expects no record of
them. A recorded sample that failed verification still fails the item (``cause="verifier"``),
as without a cut; an episode lost before the cut is one more missing sample. Before ``m``
samples are recorded the deadline changes nothing (the group runs on, and is cut as soon as
the ``m``-th record comes); a group whose samples all end before the deadline completes as
usual. ``RolloutRunner.stragglers`` lists the episodes cut.

Bounded staleness: every claim carries ``RolloutConfig.policy_version`` (the trainer sets it
after each weight update); a job with ``max_staleness`` refuses such a claim (``run_job``
raises the server's ``ConflictError``) or flags its samples.

Session episodes (``RolloutConfig(mode="session")``, ``session_episode.py``): the episode opens
a bash session on a pseudo-terminal in the workdir, the policy answers Terminus-style JSON
(``session_prompt.py``: keystrokes + duration, ``task_complete``), and each turn sends keys
and reads the screen; its trajectory turn records the ``keys`` sent and the ``screen`` read.

A group whose samples all took the same actions while the policy samples at a temperature
above 0 is suspicious (a seed repeated per request, a server ignoring the temperature): the
runner logs a warning and keeps it in ``warnings``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import json
import logging
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from policy_client.calls import Call
from policy_client.client import AsyncClient, Client
from policy_client.errors import (
    APIError,
    BadRequest,
    ClientError,
    ConflictError,
    NotFoundError,
    QuotaError,
    SandboxStopped,
    ServerError,
    TransportError,
)
from policy_client.policies.base import (
    EpisodeContext,
    Policy,
    PolicyAction,
    PolicyRequest,
    Traffic,
)
from policy_client.prompt import (
    PROMPT_VERSION,
    encodable,
    initial_messages,
    observation,
    parse_action,
)
from policy_client.schemas import EpisodeOut, RewardRecord, ScreenOut, SessionOut, WorkItemOut
from policy_client.session_episode import play_turn, turn_record
from policy_client.session_prompt import (
    SESSION_PROMPT_VERSION,
    parse_keys_action,
    screen_observation,
    session_initial_messages,
)

log = logging.getLogger(__name__)

# Failures of the control plane or the episode's sandbox (released when its claim lapsed):
# the episode is not verified and its sample is re-run by the item's retry.
INFRASTRUCTURE = (TransportError, ServerError, ConflictError, NotFoundError)

# The worker name a claim is held under: ``RolloutConfig.worker`` plus the runner's slot
# (set by each of ``run_job``'s slots for the tasks it starts).
_CLAIMANT: contextvars.ContextVar[str] = contextvars.ContextVar("claimant")


class _SessionEnded(Exception):
    """A session episode's shell is gone while its sandbox is still leased (it exited, or the
    agent killed it): the episode ends (``sandbox_stopped``) and is verified."""


# Why a group was cut short: the straggler policy's quorum, or the claim found gone.
Cut = Literal["stragglers", "claim_lost"] | None


def _start_cause(error: ClientError) -> str:
    """Why starting a group failed, as ``complete`` takes it: a 4xx answer other than a
    conflict (the task's image does not build, the task is malformed or gone, the request
    is invalid) is the same on every try, so it uses an attempt (``verifier``: the task's
    side, not the policy's); transport errors and 5xx are ``infrastructure`` (re-queued)."""
    if isinstance(error, APIError) and 400 <= error.status < 500 and error.status not in (409, 429):
        return "verifier"
    return "infrastructure"


@dataclass(kw_only=True)
class RolloutConfig:
    """Runner knobs. Times in seconds."""

    concurrency: int = 4  # work items (groups) in flight
    max_turns: int = 30
    batch_size: int = 16
    batch_wait_s: float = 0.02
    exec_timeout_s: float = 180.0
    # How long one verify may take before the runner gives up on the answer. Not the
    # client's per-call timeout (120 s by default): a verification runs the task's tests
    # to their own limit (120 s on the bundled tasks) plus its steps, and waits its turn
    # for a bounded worker; a verify past the client timeout was taken for an
    # infrastructure failure and the sample re-rolled (two trials: a test that hangs, a
    # FIFO the replay reads, four slow CAD parts in one group).
    verify_timeout_s: float = 3600.0
    claim_lease_s: float = 60.0  # the claim lapses this long after the worker's last beat
    traffic: Traffic = "batch"  # PolicyRequest.traffic of every request
    # "exec": each turn one command (prompt.py); "session": each turn keys sent to a PTY
    # session, then the screen read (session_prompt.py, session_episode.py)
    mode: Literal["exec", "session"] = "exec"
    session_rows: int = 24
    session_cols: int = 80
    checkpoint_every: int = 0  # turns between episode checkpoints (0: none, no resume)
    # The version of the weights sampling now (a trainer sets it after each update); every
    # claim carries it, so a job's max_staleness refuses or flags claims from older ones.
    policy_version: int | None = None
    # Names this runner's claims: slot i of ``concurrency`` claims as ``f"{worker}.{i}"``.
    worker: str = field(default_factory=lambda: f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}")


class Batcher:
    """Gathers ``PolicyRequest``s from concurrent episodes into ``policy.act`` batches."""

    def __init__(self, policy: Policy, *, batch_size: int, wait_s: float) -> None:
        self.policy, self.batch_size, self.wait_s = policy, batch_size, wait_s
        self._queue: asyncio.Queue[tuple[PolicyRequest, asyncio.Future]] = asyncio.Queue()
        self._task: asyncio.Task | None = None
        self.batches: list[int] = []  # sizes, for reports

    async def act(self, request: PolicyRequest) -> PolicyAction:
        """Queue one request and wait for its action."""
        if self._task is None:
            self._task = asyncio.create_task(self._loop())
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        await self._queue.put((request, fut))
        return await fut

    async def _loop(self) -> None:
        while True:
            first = await self._queue.get()
            items = [first]
            deadline = asyncio.get_running_loop().time() + self.wait_s
            while len(items) < self.batch_size:
                timeout = deadline - asyncio.get_running_loop().time()
                if timeout <= 0:
                    break
                try:
                    items.append(await asyncio.wait_for(self._queue.get(), timeout))
                except TimeoutError:
                    break
            self.batches.append(len(items))
            try:
                actions = await asyncio.to_thread(self.policy.act, [r for r, _ in items])
                if len(actions) != len(items):
                    raise RuntimeError(f"policy returned {len(actions)} actions for {len(items)}")
                for (_, fut), action in zip(items, actions, strict=True):
                    if not fut.done():  # a cancelled episode's (a straggler cut) is done
                        fut.set_result(action)
            except Exception as e:  # noqa: BLE001 - handed to every waiting episode
                for _, fut in items:
                    if not fut.done():
                        fut.set_exception(e)

    async def close(self) -> None:
        """Stop the batching loop."""
        if self._task:
            self._task.cancel()


@dataclass
class EpisodeOutcome:
    """One finished episode: its record and where its time went."""

    record: RewardRecord
    task_id: str


@dataclass(frozen=True)
class StragglerPolicy:
    """A job's ``schedule.straggler`` as the runner applies it: once a claim is
    ``deadline_s`` seconds old and at least ``min_samples`` of the group's samples have
    records, the group's other episodes are cut and the item completed (the server marks
    the missing samples stragglers)."""

    min_samples: int
    deadline_s: float

    @classmethod
    def of(cls, schedule: dict[str, Any] | None) -> StragglerPolicy | None:
        """The policy in a job's ``schedule`` (``JobOut.schedule``), or None when it has
        none. Raises ``KeyError``/``TypeError``/``ValueError`` on a malformed one (the
        server validates schedules, so that is a server bug)."""
        st = (schedule or {}).get("straggler")
        if not st:
            return None
        return cls(min_samples=int(st["min_samples"]), deadline_s=float(st["deadline_s"]))


class RolloutRunner:
    """Drives a rollout job against a Crucible server with one policy.

    ``on_record`` is called with each ``RewardRecord`` as it is stored (progress bars).
    ``stragglers`` lists the episode ids the runner cut under the job's straggler policy.
    Raises ``ValueError`` at once when the policy declares ``modes`` without
    ``config.mode`` (a scripted policy of the other format would burn every turn on parse
    errors and score 0 without a word).
    """

    def __init__(
        self,
        client: AsyncClient,
        policy: Policy,
        *,
        config: RolloutConfig | None = None,
        sync_client: Client | None = None,
        on_record: Callable[[RewardRecord], None] | None = None,
    ) -> None:
        self.client, self.policy = client, policy
        self.config = config or RolloutConfig()
        modes = getattr(policy, "modes", None)
        if modes is not None and self.config.mode not in modes:
            raise ValueError(
                f"policy {policy.name!r} cannot drive {self.config.mode!r} episodes "
                f"(RolloutConfig(mode={self.config.mode!r})): it answers only in "
                f"{', '.join(map(repr, modes))} mode, whatever the prompt asks"
            )
        self.sync_client = sync_client or Client(client.base_url, client.api_key)
        self.on_record = on_record
        self.batcher = Batcher(
            policy, batch_size=self.config.batch_size, wait_s=self.config.batch_wait_s
        )
        self.outcomes: list[EpisodeOutcome] = []
        self._resume: dict[str, dict[str, Any]] = {}  # episode id -> checkpoint state
        self._stragglers: dict[str, StragglerPolicy | None] = {}  # job id -> its policy
        self._verifying: set[str] = set()  # episodes past their turn loop (closing, verifying)
        self.stragglers: list[str] = []  # episode ids cut as stragglers, for reports
        self.warnings: list[str] = []  # e.g. identical samples in a group at temperature > 0

    async def run_job(self, job_id: str) -> list[EpisodeOutcome]:
        """Work on ``job_id`` until no item is queued or claimed; return the outcomes."""
        try:
            await asyncio.gather(
                *(self._worker(job_id, slot) for slot in range(self.config.concurrency))
            )
        finally:
            await self.batcher.close()
        return self.outcomes

    async def _worker(self, job_id: str, slot: int) -> None:
        # each slot claims as its own worker: when the server hands one slot's lost claim
        # (lapsed, timed out) to another, the first slot's heartbeat and complete are refused
        # instead of renewing or completing the other's claim
        _CLAIMANT.set(f"{self.config.worker}.{slot}")
        while True:
            item = await self.client.claim(
                job_id,
                worker=_CLAIMANT.get(),
                lease_s=self.config.claim_lease_s,
                policy_version=self.config.policy_version,
            )
            if item is None:
                job = await self.client.get_job(job_id)
                items = job.progress["items"]
                final = ("done", "partial", "failed", "cancelled")
                if job.state in final or items["queued"] + items["claimed"] == 0:
                    return
                await asyncio.sleep(1.0)  # others hold the rest; their claims may expire
                continue
            await self._run_item(item, claimed=time.monotonic())

    async def _heartbeat(self, item: WorkItemOut) -> None:
        """Renew the claim every third of its lease until cancelled (or the claim is lost)."""
        every = max(0.5, self.config.claim_lease_s / 3)
        while True:
            await asyncio.sleep(every)
            try:
                await self.client.heartbeat_item(
                    item.id, worker=_CLAIMANT.get(), lease_s=self.config.claim_lease_s
                )
            except ConflictError:
                return  # the claim lapsed or timed out: the group's episodes are cut
            except ClientError:
                continue  # the server is away; keep trying while the lease lasts

    async def _complete(
        self, item: WorkItemOut, *, ok: bool, error: str | None, cause: str
    ) -> None:
        # Conflict: the claim lapsed (or a replayed complete already finished the item).
        with contextlib.suppress(ConflictError, NotFoundError):
            await self.client.complete(
                item.id, worker=_CLAIMANT.get(), ok=ok, error=error, cause=cause
            )

    async def _run_item(self, item: WorkItemOut, *, claimed: float) -> None:
        queue_ms = max(0.0, (datetime.now(UTC) - item.created_at).total_seconds() * 1e3)
        beat = asyncio.create_task(self._heartbeat(item))
        try:
            await self._run_claimed(item, queue_ms, claimed, beat)
        finally:
            beat.cancel()

    async def _straggler_policy(self, job_id: str) -> StragglerPolicy | None:
        """The job's straggler policy (read once per job from ``GET /v1/jobs/{id}``)."""
        if job_id not in self._stragglers:
            job = await self.client.get_job(job_id)
            self._stragglers[job_id] = StragglerPolicy.of(job.schedule)
        return self._stragglers[job_id]

    async def _gather_group(
        self,
        item: WorkItemOut,
        group: list[EpisodeOut],
        queue_ms: float,
        claimed: float,
        beat: asyncio.Task,
    ) -> tuple[list[EpisodeOutcome | BaseException], Cut]:
        """Run the group's episodes; return each one's outcome or exception (in group order)
        and why the group was cut short (None: every episode ran to its end).

        ``"claim_lost"``: the heartbeat (``beat``, which ends only when the server refuses
        it) found the claim gone (lapsed, or timed out as a long tail): the episodes' work
        can no longer count, so they are cut at once rather than run to their turn limit.
        ``"stragglers"``: the job has a straggler policy, the claim is ``deadline_s`` old
        (``claimed``: ``time.monotonic()`` when the claim came back, no earlier than the
        server's ``claimed_at``) and at least ``min_samples`` samples have records (those
        recorded before this claim, which the group start left out, plus this claim's).
        A cut cancels the episodes still in their turn loop (one past it, closing up or
        verifying, is waited for) and releases their sandboxes; their results are
        ``asyncio.CancelledError``."""
        try:
            policy = await self._straggler_policy(item.job_id) if group else None
        except ClientError as e:  # the server is away: run the group out without the policy
            log.warning(
                "job %s: straggler policy unread (%s); running every sample", item.job_id, e
            )
            policy = None
        tasks = [asyncio.create_task(self.run_episode(ep, queue_ms=queue_ms)) for ep in group]
        try:
            why = await self._watch_group(item, group, tasks, policy, claimed, beat)
            if why is not None:
                await self._cut(item, group, tasks, why)
        except BaseException:  # cancelled meanwhile (the worker stops): no orphan episodes
            for t in tasks:
                t.cancel()
            raise
        results = await asyncio.gather(*tasks, return_exceptions=True)
        return list(results), why

    async def _watch_group(
        self,
        item: WorkItemOut,
        group: list[EpisodeOut],
        tasks: list[asyncio.Task],
        policy: StragglerPolicy | None,
        claimed: float,
        beat: asyncio.Task,
    ) -> Cut:
        """Wait until every episode of ``group`` (``tasks``, in group order) ended (None),
        the heartbeat ``beat`` ended (``"claim_lost"``), or, under ``policy``, the claim is
        ``deadline_s`` old with ``min_samples`` samples recorded (``"stragglers"``).
        ``claimed``: ``time.monotonic()`` of the claim."""
        before = item.group_size - len(group)  # samples recorded ok by an earlier claim
        while True:
            pending = {t for t in tasks if not t.done()}
            if not pending:
                return None
            if beat.done():
                return "claim_lost"
            timeout = None
            if policy is not None:
                recorded = sum(
                    1 for t in tasks if t.done() and not t.cancelled() and t.exception() is None
                )
                now, deadline = time.monotonic(), claimed + policy.deadline_s
                if now >= deadline and before + recorded >= policy.min_samples:
                    return "stragglers"
                # before the deadline, wake at it; after it, only a new record changes things
                timeout = deadline - now if now < deadline else None
            await asyncio.wait(
                pending | {beat}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )

    async def _cut(
        self, item: WorkItemOut, group: list[EpisodeOut], tasks: list[asyncio.Task], why: Cut
    ) -> None:
        """Cancel the episodes of ``group`` still in their turn loop (``tasks`` in group
        order), wait for them to unwind, and release their sandboxes (the server abandons
        the episodes once the item is no longer under this claim, as a lapsed claim's)."""
        cut = [
            (ep, t)
            for ep, t in zip(group, tasks, strict=True)
            if not t.done() and ep.id not in self._verifying
        ]
        for _, t in cut:
            t.cancel()
        await asyncio.gather(*(t for _, t in cut), return_exceptions=True)
        for ep, _ in cut:
            log.info("item %s: sample %d cut (%s)", item.id, ep.sample_idx, why)
            if why == "stragglers":
                self.stragglers.append(ep.id)
            await self._release(ep.sandbox_id)

    async def _release(self, sandbox_id: str, *, tries: int = 20, wait_s: float = 0.5) -> None:
        """Release a cut episode's sandbox. A 409 (the sandbox is mid-snapshot: a checkpoint
        the cut interrupted goes on server-side) is retried ``tries`` times ``wait_s`` apart;
        other errors are logged and left to the server's sweep."""
        for _ in range(tries):
            try:
                await self.client.release(sandbox_id)
                return
            except ConflictError:
                await asyncio.sleep(wait_s)
            except ClientError as e:
                log.warning("releasing %s failed: %s", sandbox_id, e)
                return
        log.warning("releasing %s: still busy after %d tries", sandbox_id, tries)

    async def _run_claimed(
        self, item: WorkItemOut, queue_ms: float, claimed: float, beat: asyncio.Task
    ) -> None:
        try:
            group = await self._start_group(item)
        except ConflictError as e:
            if "is recorded" in str(e):  # every sample has its record: nothing left to run
                await self._complete(item, ok=True, error=None, cause="policy")
            return  # else the claim is gone: its new holder runs the item
        except ClientError as e:
            await self._complete(
                item, ok=False, error=f"{type(e).__name__}: {e}"[:2000], cause=_start_cause(e)
            )
            return
        results, why = await self._gather_group(item, group, queue_ms, claimed, beat)
        outcomes = [r for r in results if isinstance(r, EpisodeOutcome)]
        lost = [r for r in results if not isinstance(r, EpisodeOutcome)]
        self.outcomes.extend(outcomes)
        self._check_diversity(item, [o.record for o in outcomes])
        for r in lost:
            if why is not None and isinstance(r, asyncio.CancelledError):
                continue  # cut: a straggler, or an episode of a claim that is gone
            if not isinstance(r, ClientError):
                raise r
        if why == "claim_lost":
            return  # the claim's new holder runs the item (this claim's complete is refused)
        if lost and why is None:  # after a straggler cut a lost episode is one more missing
            await self._complete(
                item,
                ok=False,
                error=f"{len(lost)} of {len(results)} episodes lost: {lost[0]}"[:2000],
                cause="infrastructure",
            )
            return
        bad = [o for o in outcomes if o.record.verifier.status != "ok"]
        error = None
        if bad:
            error = (
                f"{len(bad)} of {len(outcomes)} episodes failed verification: "
                + str(bad[0].record.verifier.details.get("reason", ""))[:500]
            )
        await self._complete(item, ok=not bad, error=error, cause="verifier")

    def _check_diversity(self, item: WorkItemOut, records: list[RewardRecord]) -> None:
        """Warn when every sample of a group took the same actions at temperature > 0."""
        temperature = getattr(self.policy, "temperature", None)
        if len(records) < 2 or not temperature or temperature <= 0:
            return
        runs = {
            (tuple(t.action for t in r.turns), tuple(r.response_ids))
            for r in records
            if r.stop_reason != "error"
        }
        if len(runs) == 1 and sum(r.stop_reason != "error" for r in records) > 1:
            msg = (
                f"task {item.task_id}: all {len(records)} samples of group {item.group_id} are "
                f"identical at temperature {temperature:g} (a fixed seed per request, or a "
                "server ignoring the temperature?): the group carries no GRPO signal"
            )
            log.warning(msg)
            self.warnings.append(msg)

    async def _resume_samples(self, item: WorkItemOut) -> None:
        """Resume the item's checkpointed samples under this claim (they then come back as
        live episodes of the claim from the group start)."""
        cks = json.loads(
            await self.client.run(
                Call("GET", f"/v1/work-items/{item.id}/checkpoints", idempotent=True)
            )
        )
        for ck in cks:
            try:
                raw = await self.client.run(
                    Call(
                        "POST",
                        f"/v1/work-items/{item.id}/resume",
                        json={"sample_idx": ck["sample_idx"]},
                        keyed=True,
                    )
                )
            except (ConflictError, NotFoundError):
                continue  # recorded meanwhile, or the checkpoint expired: start afresh
            ep = EpisodeOut.model_validate_json(raw)
            self._resume[ep.id] = {**ck["state"], "checkpoint_id": ck["id"]}

    async def _checkpoint(
        self, ep: EpisodeOut, turn: int, messages: list, traj: _Trajectory
    ) -> None:
        """Store a checkpoint after ``turn`` turns (a failure is logged, not fatal)."""
        state = {"turn": turn, "messages": messages, "trajectory": dataclasses.asdict(traj)}
        try:
            await self.client.run(
                Call(
                    "POST", f"/v1/episodes/{ep.id}/checkpoints", json={"turn": turn, "state": state}
                )
            )
        except ClientError as e:
            log.warning("checkpoint of %s at turn %d failed: %s", ep.id, turn, e)

    async def _start_group(self, item: WorkItemOut) -> list[EpisodeOut]:
        if self.config.checkpoint_every > 0:
            await self._resume_samples(item)
        for _ in range(60):
            try:
                started = await self.client.start_episodes(
                    item.task_id,
                    suite=item.suite,
                    group_size=item.group_size,
                    job_id=item.job_id,
                    work_item_id=item.id,
                    group_id=item.group_id,
                )
                return started.episodes
            except QuotaError as e:
                await asyncio.sleep(e.retry_after_s)
        raise QuotaError(429, "Quota exceeded", "gave up waiting for quota")

    async def run_episode(self, ep: EpisodeOut, *, queue_ms: float) -> EpisodeOutcome:
        """Run one episode's turn loop, then verify it into a record."""
        try:
            return await self._run_episode(ep, queue_ms=queue_ms)
        finally:
            self._verifying.discard(ep.id)

    async def _run_episode(self, ep: EpisodeOut, *, queue_ms: float) -> EpisodeOutcome:
        ctx = EpisodeContext(
            episode_id=ep.id,
            sandbox_id=ep.sandbox_id,
            task_id=ep.task_id,
            suite=ep.suite,
            instruction=ep.instruction,
            workdir=ep.workdir,
            mode=self.config.mode,
        )
        messages = initial_messages(ep.instruction)
        traj = _Trajectory(instruction=ep.instruction, prompt_messages=list(messages))
        first, every = 0, self.config.checkpoint_every
        resumed = self._resume.pop(ep.id, None)
        if resumed is not None:  # go on from the checkpoint: its chat, trajectory and turn
            messages, traj, first = (
                resumed["messages"],
                _Trajectory(**resumed["trajectory"]),
                resumed["turn"],
            )
        stop = "max_turns"
        spent_s = (traj.policy_ms + traj.env_ms) / 1e3
        deadline = time.monotonic() + ep.agent_timeout_s - spent_s
        session: SessionOut | None = None
        screen: ScreenOut | None = None
        try:
            await asyncio.to_thread(self.policy.prepare, ctx, self.sync_client)
            if self.config.mode == "session":
                session = await self.client.create_session(
                    ep.sandbox_id,
                    cwd=ep.workdir,
                    rows=self.config.session_rows,
                    cols=self.config.session_cols,
                )
                screen = await self.client.screen(ep.sandbox_id, session.id)
                if resumed is None:
                    messages = session_initial_messages(ep.instruction, screen)
                    traj.prompt_messages = list(messages)
            for turn in range(first, self.config.max_turns):
                if every and turn > first and turn % every == 0:
                    await self._checkpoint(ep, turn, messages, traj)
                if time.monotonic() >= deadline:
                    stop = "agent_timeout"
                    break
                t0 = time.perf_counter()
                try:
                    action = await self.batcher.act(
                        PolicyRequest(
                            episode=ctx,
                            messages=list(messages),
                            turn=turn,
                            traffic=self.config.traffic,
                        )
                    )
                except Exception as e:  # noqa: BLE001 - a policy failure ends this episode only
                    stop = "error"
                    traj.error = f"policy: {type(e).__name__}: {e}"
                    break
                action.text = encodable(action.text)  # no request could carry a lone surrogate
                traj.policy_ms += (time.perf_counter() - t0) * 1e3
                traj.add_tokens(action)
                if action.info.get("text_only") and traj.missing_reason is None:
                    traj.missing_reason = str(action.info["text_only"])[:1000]
                if action.context_exhausted:
                    stop = "context_length"
                    break
                if session is not None and screen is not None:
                    messages.append({"role": "assistant", "content": action.text})
                    done, screen = await self._session_turn(
                        ep, session.id, action.text, screen, messages, traj, deadline
                    )
                    if done:
                        stop = "complete"
                        break
                    continue
                parsed = parse_action(action.text)
                messages.append({"role": "assistant", "content": action.text})
                if parsed.done:
                    stop = "complete"
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    stop = "agent_timeout"
                    break
                if parsed.command is None:
                    traj.turns.append({"action": action.text[:2000], "exit_code": None})
                    messages.append(
                        {"role": "user", "content": observation(None, error=parsed.error)}
                    )
                    continue
                t0 = time.perf_counter()
                try:
                    res = await self.client.exec(
                        ep.sandbox_id,
                        parsed.command,
                        cwd=ep.workdir,
                        timeout_s=min(self.config.exec_timeout_s, remaining),
                    )
                except (BadRequest, ConflictError) as e:
                    if not await self._refused_by_its_sandbox(ep.sandbox_id, e):
                        raise
                    traj.env_ms += (time.perf_counter() - t0) * 1e3
                    traj.turns.append({"action": parsed.command[:4000], "exit_code": None})
                    refused = f"the command was refused: {e.detail}"
                    messages.append({"role": "user", "content": observation(None, error=refused)})
                    continue
                traj.env_ms += (time.perf_counter() - t0) * 1e3
                traj.turns.append(
                    {
                        "action": parsed.command[:4000],
                        "exit_code": res.exit_code,
                        "duration_ms": res.duration_ms,
                        "truncated": res.stdout_truncated or res.stderr_truncated,
                    }
                )
                messages.append({"role": "user", "content": observation(res)})
                if res.timed_out and time.monotonic() >= deadline:
                    stop = "agent_timeout"
                    break
        except (SandboxStopped, _SessionEnded):  # the agent's doing (a 409 too: caught first)
            stop = "sandbox_stopped"
        except INFRASTRUCTURE:
            raise  # the server or the sandbox went away: not the policy's failure
        except ClientError as e:
            stop = "error"
            traj.error = f"{type(e).__name__}: {e}"
        finally:
            self._verifying.add(ep.id)  # the turn loop is over: a straggler cut waits for it
            if session is not None:
                with contextlib.suppress(ClientError):  # verification ends it anyway
                    await self.client.close_session(ep.sandbox_id, session.id)
            await asyncio.to_thread(self.policy.end_episode, ep.id)
        version = SESSION_PROMPT_VERSION if self.config.mode == "session" else PROMPT_VERSION
        record = await self.client.verify(
            ep.id,
            traj.payload(self.policy, stop, queue_ms, prompt_version=version),
            timeout_s=self.config.verify_timeout_s,
        )
        if self.on_record:
            self.on_record(record)
        return EpisodeOutcome(record=record, task_id=ep.task_id)

    async def _refused_by_its_sandbox(self, sandbox_id: str, error: APIError) -> bool:
        """Whether an exec the server refused (``error``: 400 or 409) is the policy's outcome,
        to show it as the turn's observation: a command the API cannot take (a NUL byte in
        it, a bad field) or a sandbox that refuses it while still leased (its own processes
        hold every pid). A 409 on a sandbox no longer leased (released when its claim
        lapsed) is infrastructure, and a stopped sandbox ends the episode (the caller).
        A trial's policy turned its 0s into excluded errors with a NUL byte, and into re-rolls
        with a fork bomb (the next exec a 409)."""
        if isinstance(error, SandboxStopped):
            return False
        if isinstance(error, BadRequest):
            return True
        return await self._leased(sandbox_id)

    async def _leased(self, sandbox_id: str) -> bool:
        """Whether the server still holds the sandbox leased (False when it cannot say)."""
        try:
            box = await self.client.get_sandbox(sandbox_id)
        except ClientError:
            return False
        return box.state == "leased"

    async def _session_turn(
        self,
        ep: EpisodeOut,
        session_id: str,
        text: str,
        screen: ScreenOut,
        messages: list[dict[str, str]],
        traj: _Trajectory,
        deadline: float,
    ) -> tuple[bool, ScreenOut]:
        """One session turn: parse the reply, send its keys, read the screen; record the
        turn and the observation. Returns (task_complete, the screen now)."""
        parsed = parse_keys_action(text)
        if parsed.error is not None:
            traj.turns.append(turn_record(text, None))
            messages.append(
                {"role": "user", "content": screen_observation(None, error=parsed.error)}
            )
            return False, screen
        try:
            played = await play_turn(
                self.client,
                ep.sandbox_id,
                session_id,
                [(c.keystrokes, c.duration_s) for c in parsed.commands],
                before=screen,
                remaining_s=max(0.0, deadline - time.monotonic()),
            )
        except (BadRequest, ConflictError, NotFoundError) as e:
            if isinstance(e, BadRequest):  # keys the API refuses (over its size): shown
                traj.turns.append(turn_record(text, None))
                seen = screen_observation(None, error=f"the keys were refused: {e.detail}")
                messages.append({"role": "user", "content": seen})
                return False, screen
            if isinstance(e, SandboxStopped) or not await self._leased(ep.sandbox_id):
                raise  # stopped: the caller ends the episode; not leased: infrastructure
            # The sandbox is leased but its session is gone (the shell exited, or the
            # agent killed it): no more keys can reach it, so the episode ends and its end
            # state is verified (a trial's `exit` re-rolled the sample 30 times).
            raise _SessionEnded(str(e)) from e
        traj.env_ms += played.env_ms
        traj.turns.append(turn_record(text, played))
        messages.append({"role": "user", "content": screen_observation(played.screen)})
        return parsed.done, played.screen


@dataclass
class _Trajectory:
    """What an episode accumulates for its record.

    Shapes: ``prompt_ids`` (P,); ``response_ids``, ``loss_mask``, ``logprobs`` (R,) each,
    observation tokens with mask 0 and logprob 0.0, sampled tokens with mask 1 and their
    logprobs. ``has_tokens`` / ``has_logprobs`` turn False for good once a turn lacks them.
    """

    instruction: str = ""
    prompt_messages: list[dict[str, str]] = field(default_factory=list)
    turns: list[dict[str, Any]] = field(default_factory=list)
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    has_tokens: bool = True
    has_logprobs: bool = True
    policy_ms: float = 0.0
    env_ms: float = 0.0
    error: str | None = None
    missing_reason: str | None = None

    def add_tokens(self, a: PolicyAction) -> None:
        """Append a turn's tokens: observation (mask 0, logprob 0.0), then sampled (mask 1)."""
        if a.text and not a.response_ids:
            self.has_tokens = False  # a text-only turn: the token sequence would have a hole
        if a.prompt_ids and not self.prompt_ids:
            self.prompt_ids = list(a.prompt_ids)
        self.response_ids += a.observation_ids
        self.loss_mask += [0] * len(a.observation_ids)
        self.logprobs += [0.0] * len(a.observation_ids)
        self.response_ids += a.response_ids
        self.loss_mask += [1] * len(a.response_ids)
        if len(a.logprobs) != len(a.response_ids):
            self.has_logprobs = False
            self.logprobs += [0.0] * len(a.response_ids)
        else:
            self.logprobs += list(a.logprobs)

    def payload(
        self, policy: Policy, stop: str, queue_ms: float, *, prompt_version: str = PROMPT_VERSION
    ) -> dict[str, Any]:
        """The verify request body (``policy.version`` names the prompt format too)."""
        tokens = self.has_tokens and bool(self.prompt_ids or self.response_ids)
        logprobs = tokens and self.has_logprobs
        missing = ([] if tokens else ["token_ids"]) + ([] if logprobs else ["logprobs"])
        reason = None
        if missing:
            reason = (
                self.missing_reason
                or getattr(policy, "missing_reason", None)
                or f"policy {policy.name} returned no {' and no '.join(missing)}"
            )
        return {
            "policy": {"name": policy.name, "version": f"{policy.version}+prompt{prompt_version}"},
            "stop_reason": stop,
            "error": self.error[:4000] if self.error else None,
            "exclude_from_loss": stop == "error",
            "turns": self.turns,
            "instruction": self.instruction,
            "prompt_messages": self.prompt_messages,
            "prompt_ids": self.prompt_ids if tokens else [],
            "response_ids": self.response_ids if tokens else [],
            "loss_mask": self.loss_mask if tokens else [],
            "rollout_logprobs": self.logprobs if logprobs else [],
            "missing": missing,
            "missing_reason": reason[:1000] if reason else None,
            "timing": {
                "queue_ms": round(queue_ms, 3),
                "policy_ms": round(self.policy_ms, 3),
                "env_ms": round(self.env_ms, 3),
            },
        }
