"""Replay a verified episode: re-run its recorded actions on the same image digest and task
version in a new sandbox, compare each turn's exit code and output and the final reward.

What is compared: per turn with a command, the exit code (the record's ``turns``) and the
output (``sha256`` of stdout and stderr as the exec audit event of the original sandbox has
them; events older than that field compare byte counts); then the reward the task's verifier
gives the replayed end state. The policy's preparation is not an action: files it uploaded
cannot be replayed (their bytes are not kept) and the report says so (``uploads``). Only for
an admin, an ``oracle`` record's preparation is re-done (the task's ``solution/`` uploaded
to ``/solution``, as ``OraclePolicy.prepare`` does): a trial named its own record's policy
``oracle`` (the name is the runner's to send), read the solution in the replay's sandbox and
verified the replay episode to 1.0, so task-private files never enter a tenant's sandbox
on a tenant's word. The replay episode starts ``replaying``, which ``verify`` refuses.

A divergence on the same task version and image digest means the task (or its
environment) is nondeterministic: ``nondeterministic`` is set. The replayed episode's end
state is verified without storing a record (a replay is not a sample) and its sandbox
released; the replay episode ends ``abandoned`` with ``replay_of`` in its audit event.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import tarfile
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import select, update

from service import audit, episodes, files, rewards, sandboxes
from service.context import ServiceContext
from service.db.models import AuditEvent, Episode, Sandbox, utcnow
from service.errors import Conflict, CrucibleError, NotFound
from service.tasks.models import Task
from service.tenants import Principal

REWARD_EPS = 1e-9


@dataclass
class TurnReplay:
    """One turn: the recorded and replayed exit codes and output digests (or byte counts)."""

    turn: int
    action: str
    recorded_exit: int | None
    replayed_exit: int | None
    recorded_output: dict[str, Any]
    replayed_output: dict[str, Any]


@dataclass
class Divergence:
    """What differed: ``kind`` is task_version, image_digest, uploads, action_truncated,
    exit_code, output or reward; ``turn`` is None for the episode-level ones."""

    kind: str
    turn: int | None
    recorded: Any
    replayed: Any


@dataclass
class ReplayReport:
    """The replay of ``episode_id`` as ``replay_episode_id``."""

    episode_id: str
    replay_episode_id: str | None
    task_id: str
    suite: str
    task_version: str
    image_digest: str
    recorded_reward: float | None
    replayed_reward: float | None
    turns: list[TurnReplay] = field(default_factory=list)
    divergences: list[Divergence] = field(default_factory=list)
    nondeterministic: bool = False

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return asdict(self)


def _exec_events(ctx: ServiceContext, sandbox_id: str) -> list[dict[str, Any]]:
    with ctx.db.read() as s:
        rows = s.execute(
            select(AuditEvent.action, AuditEvent.details)
            .where(
                AuditEvent.sandbox_id == sandbox_id,
                AuditEvent.action.in_(("sandbox.exec", "sandbox.file_put")),
            )
            .order_by(AuditEvent.seq)
        ).all()
    return [{"action": a, **(d or {})} for a, d in rows]


def _output(event: dict[str, Any] | None) -> dict[str, Any]:
    if event is None:
        return {}
    if "stdout_sha256" in event:
        return {"stdout_sha256": event["stdout_sha256"], "stderr_sha256": event["stderr_sha256"]}
    return {"stdout_bytes": event.get("stdout_bytes"), "stderr_bytes": event.get("stderr_bytes")}


def _solution_tar(task: Task) -> bytes:
    """The oracle's upload: the ``solution/`` folder (Harbor) or ``solution.sh`` (TB1)."""
    script = task.solution_path
    if script is None:
        raise Conflict(f"task {task.key} has no oracle solution to replay with")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        if script.parent.name == "solution":
            t.add(str(script.parent), arcname=".")
        else:
            t.add(str(script), arcname=script.name)
    return buf.getvalue()


def replay(ctx: ServiceContext, principal: Principal, episode_id: str) -> ReplayReport:
    """Replay the tenant's verified episode ``episode_id`` (see the module docstring).

    Raises:
        NotFound: unknown episode, or its task is gone. Conflict: it has no record yet.
        QuotaExceeded, SandboxError: the replay's sandbox could not be started.
    """
    ep = episodes.get(ctx, principal, episode_id)
    rec = rewards.by_episode(ctx.db, episode_id)
    if rec is None:
        raise Conflict(f"episode {episode_id} has no record yet; verify it first")
    report = ReplayReport(
        episode_id=episode_id,
        replay_episode_id=None,
        task_id=rec.task_id,
        suite=rec.suite,
        task_version=rec.task_version,
        image_digest=rec.image_digest,
        recorded_reward=rec.reward,
        replayed_reward=None,
    )
    try:
        task = episodes.resolve_task(ctx, rec.task_id, rec.suite)
    except NotFound:
        raise NotFound(f"task {rec.suite}/{rec.task_id} is gone", field="episode_id") from None
    if task.version != rec.task_version:
        report.divergences.append(Divergence("task_version", None, rec.task_version, task.version))
        return report  # another task now: a replay would compare nothing meaningful
    events = _exec_events(ctx, ep.sandbox_id)
    execs = [e for e in events if e["action"] == "sandbox.exec"]
    uploads = [e for e in events if e["action"] == "sandbox.file_put"]
    started = episodes.start(
        ctx,
        principal,
        task_id=task.id,
        suite=task.suite,
        group_size=1,
        ttl_s=None,
        initial_state="replaying",
    )[0]
    new = started.episode
    report.replay_episode_id = new.id
    try:
        if new.image_digest != rec.image_digest:
            report.divergences.append(
                Divergence("image_digest", None, rec.image_digest, new.image_digest)
            )
        if rec.policy.name == "oracle" and principal.is_admin:
            tar = _solution_tar(task)
            files.put(ctx, principal, new.sandbox_id, path="/solution", data=tar, is_tar=True)
        elif uploads:
            report.divergences.append(
                Divergence("uploads", None, [u.get("path") for u in uploads], None)
            )
        _replay_turns(ctx, principal, task, new, rec, execs, report)
        with ctx.db.read() as s:
            sandbox = s.get(Sandbox, new.sandbox_id)
        result, snap = episodes.run_verifier(ctx, principal, new, task, sandbox)
        if snap:
            sandboxes.delete_snapshot(ctx, principal, snap)
        report.replayed_reward = result.reward
        if result.status != "ok" or _differs(rec.reward, result.reward):
            got = {"reward": result.reward, "status": result.status}
            report.divergences.append(Divergence("reward", None, rec.reward, got))
    finally:
        _end(ctx, principal, new, episode_id)
    kinds = {d.kind for d in report.divergences}
    report.nondeterministic = bool(kinds) and not kinds & {
        "task_version",
        "image_digest",
        "uploads",
        "action_truncated",
    }
    return report


def _differs(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is not b
    return abs(a - b) > REWARD_EPS


def _replay_turns(
    ctx: ServiceContext,
    principal: Principal,
    task: Task,
    new: Episode,
    rec: rewards.RewardRecord,
    execs: list[dict[str, Any]],
    report: ReplayReport,
) -> None:
    """Run each recorded command in order; compare with the recorded turn and exec event."""
    k = 0  # the next exec event of the original sandbox
    for i, turn in enumerate(rec.turns):
        if turn.exit_code is None:
            continue  # the action ran no command
        event = execs[k] if k < len(execs) else None
        k += 1
        cmd = (event or {}).get("cmd", turn.action)
        if (event or {}).get("cmd_truncated") or (event is None and len(turn.action) >= 4000):
            report.divergences.append(Divergence("action_truncated", i, len(cmd), None))
            break
        timeout = float((event or {}).get("timeout_s") or task.agent_timeout_s)
        req = sandboxes.build_exec_request(
            ctx,
            cmd=cmd,
            timeout_s=timeout,
            cwd=task.environment.workdir,
            env={},
            stdin=b"",
            max_output_bytes=None,
        )
        res = sandboxes.exec_command(ctx, principal, new.sandbox_id, req)
        recorded = _output(event)
        replayed = (
            _output({"stdout_sha256": _sha(res.stdout), "stderr_sha256": _sha(res.stderr)})
            if "stdout_sha256" in recorded
            else {"stdout_bytes": res.stdout_total_bytes, "stderr_bytes": res.stderr_total_bytes}
        )
        report.turns.append(
            TurnReplay(i, cmd[:200], turn.exit_code, res.exit_code, recorded, replayed)
        )
        if res.exit_code != turn.exit_code:
            report.divergences.append(Divergence("exit_code", i, turn.exit_code, res.exit_code))
        if recorded and recorded != replayed:
            report.divergences.append(Divergence("output", i, recorded, replayed))


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _end(ctx: ServiceContext, principal: Principal, new: Episode, replay_of: str) -> None:
    """Release the replay's sandbox and end its episode (``abandoned``: not a sample)."""
    with contextlib.suppress(CrucibleError):  # already gone
        sandboxes.release(ctx, principal, new.sandbox_id)
    with ctx.db.session() as s:
        s.execute(
            update(Episode)
            .where(Episode.id == new.id, Episode.state.in_(("replaying", "running", "verifying")))
            .values(state="abandoned", ended_at=utcnow())
            .execution_options(synchronize_session=False)
        )
        audit.record(
            s,
            "episode.replay",
            tenant_id=principal.tenant_id,
            key_id=principal.key_id,
            sandbox_id=new.sandbox_id,
            details={"episode_id": new.id, "replay_of": replay_of},
        )
