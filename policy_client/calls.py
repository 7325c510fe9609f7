"""The API's calls as data: method, path, body, whether a retry is safe, and the schema of
the answer. ``Client`` and ``AsyncClient`` execute the same calls, so they cannot drift."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, TypeAdapter

from policy_client.schemas import (
    EpisodeGroupOut,
    EpisodeOut,
    ExecOut,
    FileOut,
    ForkOut,
    JobOut,
    OutputOut,
    ProcessList,
    ProcessOut,
    RewardPage,
    RewardRecord,
    RunOut,
    SandboxList,
    SandboxOut,
    ScreenOut,
    SessionList,
    SessionOut,
    SnapshotOut,
    TaskList,
    TaskOut,
    TemplateOut,
    VerifyIn,
    WorkItemOut,
)


@dataclass(frozen=True)
class Call:
    """One HTTP call. ``idempotent`` calls are retried on transport errors and 502/503;
    ``keyed`` ones too, each carrying one ``Idempotency-Key`` across its retries (the server
    answers a replay with the first answer)."""

    method: str
    path: str
    json: Any = None
    params: dict[str, Any] = field(default_factory=dict)
    content: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    idempotent: bool = False
    keyed: bool = False
    model: Any = None  # a pydantic model / TypeAdapter target for the answer, or None (raw)
    empty_ok: bool = False  # 204 means "nothing" (returns None)


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def lease(
    template: str,
    *,
    ttl_s: int | None = None,
    metadata: dict | None = None,
    cpus: float | None = None,
    memory_mb: int | None = None,
) -> Call:
    limits = _drop_none({"cpus": cpus, "memory_mb": memory_mb}) or None
    return Call(
        "POST",
        "/v1/sandboxes",
        json=_drop_none(
            {"template": template, "ttl_s": ttl_s, "metadata": metadata or {}, "limits": limits}
        ),
        keyed=True,
        model=SandboxOut,
    )


def list_sandboxes(*, include_ended: bool = False) -> Call:
    return Call(
        "GET",
        "/v1/sandboxes",
        params={"include_ended": include_ended} if include_ended else {},
        idempotent=True,
        model=SandboxList,
    )


def get_sandbox(sandbox_id: str) -> Call:
    return Call("GET", f"/v1/sandboxes/{sandbox_id}", idempotent=True, model=SandboxOut)


def release(sandbox_id: str) -> Call:
    return Call("DELETE", f"/v1/sandboxes/{sandbox_id}", idempotent=True, model=SandboxOut)


def heartbeat(sandbox_id: str, ttl_s: int | None = None) -> Call:
    return Call(
        "POST",
        f"/v1/sandboxes/{sandbox_id}/heartbeat",
        json=_drop_none({"ttl_s": ttl_s}),
        idempotent=True,
        model=SandboxOut,
    )


def exec_(sandbox_id: str, cmd: str | list[str], **options: Any) -> Call:
    return Call(
        "POST",
        f"/v1/sandboxes/{sandbox_id}/exec",
        json=_drop_none({"cmd": cmd, **options}),
        model=ExecOut,
    )


# Sessions and kept processes: starting one, sending keys or stdin, signals and runs are
# never retried (they would act twice); reads are.


def create_session(sandbox_id: str, **options: Any) -> Call:
    """Options: shell, pty, rows, cols, env, cwd, max_output_bytes, user."""
    return Call(
        "POST", f"/v1/sandboxes/{sandbox_id}/sessions", json=_drop_none(options), model=SessionOut
    )


def list_sessions(sandbox_id: str) -> Call:
    return Call("GET", f"/v1/sandboxes/{sandbox_id}/sessions", idempotent=True, model=SessionList)


def session_run(sandbox_id: str, session_id: str, command: str, *, timeout_s: float) -> Call:
    return Call(
        "POST",
        f"/v1/sandboxes/{sandbox_id}/sessions/{session_id}/run",
        json={"command": command, "timeout_s": timeout_s},
        model=RunOut,
    )


def send_keys(
    sandbox_id: str,
    session_id: str,
    *,
    text: str | None = None,
    keys: list[str] | None = None,
    data_b64: str | None = None,
) -> Call:
    return Call(
        "POST",
        f"/v1/sandboxes/{sandbox_id}/sessions/{session_id}/keys",
        json=_drop_none({"text": text, "keys": keys or None, "data_b64": data_b64}),
        empty_ok=True,
    )


def screen(sandbox_id: str, session_id: str, *, wait_s: float = 0.0) -> Call:
    return Call(
        "GET",
        f"/v1/sandboxes/{sandbox_id}/sessions/{session_id}/screen",
        params={"wait_s": wait_s} if wait_s else {},
        idempotent=True,
        model=ScreenOut,
    )


def resize_session(sandbox_id: str, session_id: str, *, rows: int, cols: int) -> Call:
    return Call(
        "POST",
        f"/v1/sandboxes/{sandbox_id}/sessions/{session_id}/resize",
        json={"rows": rows, "cols": cols},
        idempotent=True,
        empty_ok=True,
    )


def close_session(sandbox_id: str, session_id: str) -> Call:
    return Call("DELETE", f"/v1/sandboxes/{sandbox_id}/sessions/{session_id}", empty_ok=True)


def start_process(sandbox_id: str, cmd: str | list[str], **options: Any) -> Call:
    """Options: cwd, env, max_output_bytes, user."""
    return Call(
        "POST",
        f"/v1/sandboxes/{sandbox_id}/processes",
        json=_drop_none({"cmd": cmd, **options}),
        model=ProcessOut,
    )


def list_processes(sandbox_id: str) -> Call:
    return Call("GET", f"/v1/sandboxes/{sandbox_id}/processes", idempotent=True, model=ProcessList)


def get_process(sandbox_id: str, handle: int) -> Call:
    return Call(
        "GET", f"/v1/sandboxes/{sandbox_id}/processes/{handle}", idempotent=True, model=ProcessOut
    )


def process_output(
    sandbox_id: str, handle: int, *, stream: str = "stdout", offset: int = 0, wait_s: float = 0.0
) -> Call:
    return Call(
        "GET",
        f"/v1/sandboxes/{sandbox_id}/processes/{handle}/output",
        params={"stream": stream, "offset": offset, "wait_s": wait_s},
        idempotent=True,
        model=OutputOut,
    )


def write_stdin(
    sandbox_id: str,
    handle: int,
    *,
    data: str | None = None,
    data_b64: str | None = None,
    close: bool = False,
) -> Call:
    return Call(
        "POST",
        f"/v1/sandboxes/{sandbox_id}/processes/{handle}/stdin",
        json=_drop_none({"data": data, "data_b64": data_b64, "close": close}),
        model=ProcessOut,
    )


def signal_process(sandbox_id: str, handle: int, *, signal: int = 15, grace_ms: int = 500) -> Call:
    return Call(
        "POST",
        f"/v1/sandboxes/{sandbox_id}/processes/{handle}/signal",
        json={"signal": signal, "grace_ms": grace_ms},
        model=ProcessOut,
    )


def release_process(sandbox_id: str, handle: int) -> Call:
    return Call("DELETE", f"/v1/sandboxes/{sandbox_id}/processes/{handle}", empty_ok=True)


def put_file(sandbox_id: str, path: str, data: bytes, *, tar: bool = False) -> Call:
    headers = {"content-type": "application/x-tar" if tar else "application/octet-stream"}
    return Call(
        "PUT",
        f"/v1/sandboxes/{sandbox_id}/files",
        params={"path": path},
        content=data,
        headers=headers,
        idempotent=True,
        model=FileOut,
    )


def get_file(sandbox_id: str, path: str) -> Call:
    return Call("GET", f"/v1/sandboxes/{sandbox_id}/files", params={"path": path}, idempotent=True)


def snapshot(sandbox_id: str) -> Call:
    return Call("POST", f"/v1/sandboxes/{sandbox_id}/snapshots", model=SnapshotOut)


def get_snapshot(snapshot_id: str) -> Call:
    return Call("GET", f"/v1/snapshots/{snapshot_id}", idempotent=True, model=SnapshotOut)


def delete_snapshot(snapshot_id: str) -> Call:
    # not retried: a retry after a delete that went through would answer 404
    return Call("DELETE", f"/v1/snapshots/{snapshot_id}", empty_ok=True)


def fork(snapshot_id: str, n: int, *, ttl_s: int | None = None) -> Call:
    return Call(
        "POST",
        f"/v1/snapshots/{snapshot_id}/fork",
        json=_drop_none({"n": n, "ttl_s": ttl_s}),
        model=ForkOut,
    )


def templates() -> Call:
    return Call("GET", "/v1/templates", idempotent=True, model=TypeAdapter(list[TemplateOut]))


def tasks(suite: str | None = None) -> Call:
    return Call(
        "GET", "/v1/tasks", params=_drop_none({"suite": suite}), idempotent=True, model=TaskList
    )


def get_task(suite: str, task_id: str) -> Call:
    return Call("GET", f"/v1/tasks/{suite}/{task_id}", idempotent=True, model=TaskOut)


def start_episodes(
    task_id: str,
    *,
    suite: str | None = None,
    group_size: int = 1,
    job_id: str | None = None,
    work_item_id: str | None = None,
    group_id: str | None = None,
    ttl_s: int | None = None,
) -> Call:
    return Call(
        "POST",
        "/v1/episodes",
        json=_drop_none(
            {
                "task_id": task_id,
                "suite": suite,
                "group_size": group_size,
                "job_id": job_id,
                "work_item_id": work_item_id,
                "group_id": group_id,
                "ttl_s": ttl_s,
            }
        ),
        keyed=True,
        model=EpisodeGroupOut,
    )


def get_episode(episode_id: str) -> Call:
    return Call("GET", f"/v1/episodes/{episode_id}", idempotent=True, model=EpisodeOut)


def verify(episode_id: str, trajectory: VerifyIn | dict[str, Any]) -> Call:
    # Verification is idempotent server-side: a repeat returns the stored record.
    if isinstance(trajectory, VerifyIn):
        trajectory = trajectory.model_dump(mode="json")
    return Call(
        "POST",
        f"/v1/episodes/{episode_id}/verify",
        json=trajectory,
        idempotent=True,
        keyed=True,
        model=RewardRecord,
    )


def create_job(
    *,
    suite: str,
    policy: dict[str, str],
    task_ids: list[str] | None = None,
    group_size: int = 1,
    priority: int = 0,
    max_attempts: int = 3,
) -> Call:
    return Call(
        "POST",
        "/v1/jobs",
        json=_drop_none(
            {
                "suite": suite,
                "policy": policy,
                "task_ids": task_ids,
                "group_size": group_size,
                "priority": priority,
                "max_attempts": max_attempts,
            }
        ),
        keyed=True,
        model=JobOut,
    )


def get_job(job_id: str) -> Call:
    return Call("GET", f"/v1/jobs/{job_id}", idempotent=True, model=JobOut)


def cancel_job(job_id: str) -> Call:
    # Cancelling twice leaves the job cancelled: safe to retry.
    return Call("POST", f"/v1/jobs/{job_id}/cancel", idempotent=True, model=JobOut)


def claim(
    job_id: str, *, worker: str, lease_s: float = 60, policy_version: int | None = None
) -> Call:
    body: dict[str, Any] = {"worker": worker, "lease_s": lease_s}
    if policy_version is not None:  # the version of the weights that samples the claim
        body["policy_version"] = policy_version
    return Call(
        "POST",
        f"/v1/jobs/{job_id}/claim",
        json=body,
        keyed=True,
        model=WorkItemOut,
        empty_ok=True,
    )


def complete(
    item_id: str, *, worker: str, ok: bool, error: str | None = None, cause: str = "policy"
) -> Call:
    return Call(
        "POST",
        f"/v1/work-items/{item_id}/complete",
        json=_drop_none({"worker": worker, "ok": ok, "error": error, "cause": cause}),
        keyed=True,
        model=WorkItemOut,
    )


def heartbeat_item(item_id: str, *, worker: str, lease_s: float = 60) -> Call:
    return Call(
        "POST",
        f"/v1/work-items/{item_id}/heartbeat",
        json={"worker": worker, "lease_s": lease_s},
        idempotent=True,
        model=WorkItemOut,
    )


def list_records(
    *,
    job_id: str | None = None,
    suite: str | None = None,
    domain: str | None = None,
    task_id: str | None = None,
    status: str | None = None,
    after: str | None = None,
    limit: int = 100,
) -> Call:
    return Call(
        "GET",
        "/v1/rewards",
        params=_drop_none(
            {
                "job_id": job_id,
                "suite": suite,
                "domain": domain,
                "task_id": task_id,
                "status": status,
                "after": after,
                "limit": limit,
            }
        ),
        idempotent=True,
        model=RewardPage,
    )


def export_records(
    *,
    fmt: str = "jsonl",
    normalize: str = "none",
    job_id: str | None = None,
    suite: str | None = None,
    domain: str | None = None,
    task_id: str | None = None,
) -> Call:
    return Call(
        "GET",
        "/v1/rewards/export",
        params=_drop_none(
            {
                "format": fmt,
                "normalize": normalize,
                "job_id": job_id,
                "suite": suite,
                "domain": domain,
                "task_id": task_id,
            }
        ),
        idempotent=True,
    )


def parse(call: Call, status: int, body: bytes) -> Any:
    """Decode an answer per ``call.model`` (raw bytes when it has none)."""
    if status == 204 and call.empty_ok:
        return None
    if call.model is None:
        return body
    if isinstance(call.model, TypeAdapter):
        return call.model.validate_json(body)
    if isinstance(call.model, type) and issubclass(call.model, BaseModel):
        return call.model.model_validate_json(body)
    raise TypeError(f"unsupported model {call.model!r}")
