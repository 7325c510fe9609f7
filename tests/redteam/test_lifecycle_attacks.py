"""Red team: what a tenant's own calls around verification could do to its rewards (issue 9,
a third trial). ``status=error`` is excluded from loss, so no tenant call may produce it,
and a job's groups hold only their own samples:

- releasing the episode's sandbox, then verifying: an error; now a 0 (``sandbox_released``);
- releasing or snapshotting it while it is verified: an error; now refused (409) and the
  verdict stands; a snapshot in flight when the verdict is asked for is waited out;
- a full snapshot quota with ``keep_episode_snapshots``: every verify an error; now the
  record is kept without its snapshot;
- an ad-hoc episode naming another job's group joined its records and moved its
  advantages: ``job_id`` and ``group_id`` come only with a claimed work item;
- (a fourth trial) writing into the end state through the files API while it was verified
  made the verifier's read fail: the sandbox is the verifier's (``verifying``) and every
  tenant call on it is refused; a job's records were named after any policy the verify
  call sent: they carry the job's.
"""

from __future__ import annotations

import io
import tarfile
import threading
import time

import pytest
from sqlalchemy import select

from service import tenants
from service.db.models import Episode, Sandbox
from tests.integration.api.conftest import Stack
from tests.redteam.episodes import TRAJ, sh, start, verify

pytestmark = [pytest.mark.docker, pytest.mark.redteam]

TASK = "word-frequency-top20"


def test_a_released_sandbox_scores_zero_not_an_error(stack: Stack) -> None:
    ep = start(stack, TASK, "terminal")
    assert stack.alice.delete(f"/v1/sandboxes/{ep['sandbox_id']}").status_code == 200
    r = stack.alice.post(f"/v1/episodes/{ep['id']}/verify", json=TRAJ)
    if r.status_code == 409:
        # the pool's tick got there first: an ad-hoc episode whose lease ended is abandoned
        # (no record, never an error record in the loss)
        assert stack.alice.get(f"/v1/episodes/{ep['id']}").json()["state"] == "abandoned"
        return
    assert r.status_code == 200, r.text
    rec = r.json()
    v = rec["verifier"]
    assert (rec["reward"], v["status"], v["details"]["dodge"]) == (0.0, "ok", "sandbox_released")


def test_the_end_state_cannot_be_taken_away_while_it_is_verified(stack: Stack) -> None:
    ep = start(stack, TASK, "terminal")
    sid = ep["sandbox_id"]
    got: dict = {}
    t = threading.Thread(target=lambda: got.update(rec=verify(stack, ep)))
    t.start()
    try:

        def verifying() -> bool:
            with stack.ctx.db.read() as s:
                state = s.execute(select(Episode.state).where(Episode.id == ep["id"])).scalar()
            return state == "verifying"

        stack.wait_for(verifying, timeout_s=60)
        release = stack.alice.delete(f"/v1/sandboxes/{sid}")
        snap = stack.alice.post(f"/v1/sandboxes/{sid}/snapshots")
    finally:
        t.join(timeout=300)
    assert (release.status_code, snap.status_code) == (409, 409), (release.text, snap.text)
    assert "being verified" in release.json()["detail"]
    v = got["rec"]["verifier"]
    assert (got["rec"]["reward"], v["status"]) == (0.0, "ok"), v
    assert v["details"].get("dodge") is None, v["details"]  # the tests ran and failed


def test_no_tenant_call_reaches_a_sandbox_while_it_is_verified(stack: Stack) -> None:
    # A fourth trial wrote into the frozen end state through the files API between the
    # verifier's diff and its read of the changes (the engine extracts into a paused
    # container): the read failed and the 0 became an error. The sandbox is the verifier's
    # now (``verifying``), so every call that could change it is refused, whichever it is.
    ep = start(stack, TASK, "terminal")
    sid = ep["sandbox_id"]
    got: dict = {}
    t = threading.Thread(target=lambda: got.update(rec=verify(stack, ep)))
    t.start()
    try:

        def taken() -> bool:
            with stack.ctx.db.read() as s:
                return s.execute(select(Sandbox.state).where(Sandbox.id == sid)).scalar() == (
                    "verifying"
                )

        stack.wait_for(taken, timeout_s=60)
        a, base = stack.alice, f"/v1/sandboxes/{sid}"
        octet = {"content-type": "application/octet-stream"}
        calls = {
            "put file": a.put(
                f"{base}/files", params={"path": "/app/x"}, content=b"x", headers=octet
            ),
            "put tar": a.put(
                f"{base}/files",
                params={"path": "/"},
                content=b"\0" * 1024,
                headers={"content-type": "application/x-tar"},
            ),
            "exec": a.post(f"{base}/exec", json={"cmd": ["true"]}),
            "process": a.post(f"{base}/processes", json={"cmd": ["sleep", "9"]}),
            "session": a.post(f"{base}/sessions", json={}),
            "snapshot": a.post(f"{base}/snapshots"),
            "heartbeat": a.post(f"{base}/heartbeat", json={}),
            "release": a.delete(base),
        }
        state = a.get(base).json()["state"]
    finally:
        t.join(timeout=300)
    assert {k: r.status_code for k, r in calls.items()} == dict.fromkeys(calls, 409), {
        k: r.text for k, r in calls.items()
    }
    assert state == "verifying"
    v = got["rec"]["verifier"]
    assert (got["rec"]["reward"], v["status"]) == (0.0, "ok"), v
    assert a.get(base).json()["state"] == "released"


def test_a_snapshot_in_flight_is_waited_out(stack: Stack) -> None:
    ep = start(stack, TASK, "terminal")
    got: dict = {}
    t = threading.Thread(
        target=lambda: got.update(r=stack.alice.post(f"/v1/sandboxes/{ep['sandbox_id']}/snapshots"))
    )
    t.start()
    time.sleep(0.05)  # the trial sent its verify 0.15 s after the snapshot
    rec = verify(stack, ep)
    t.join(timeout=120)
    assert got["r"].status_code in (201, 409), got["r"].text
    v = rec["verifier"]
    assert (rec["reward"], v["status"]) == (0.0, "ok"), v


def test_a_full_snapshot_quota_does_not_void_a_verdict(stack: Stack) -> None:
    with stack.ctx.db.session() as s:
        tenants.create_tenant(
            s, "quota-full", max_sandboxes=4, max_cpus=8, max_memory_mb=1 << 14, max_snapshots=0
        )
        key = tenants.create_key(s, "quota-full")
    client = stack.make_client(key)
    keep = stack.ctx.settings.keep_episode_snapshots
    stack.ctx.settings.keep_episode_snapshots = True
    try:
        r = client.post("/v1/episodes", json={"task_id": TASK, "suite": "terminal"})
        assert r.status_code == 201, r.text
        ep = r.json()["episodes"][0]
        r = client.post(f"/v1/episodes/{ep['id']}/verify", json=TRAJ)
        assert r.status_code == 200, r.text
    finally:
        stack.ctx.settings.keep_episode_snapshots = keep
        client.close()
    rec = r.json()
    assert (rec["reward"], rec["verifier"]["status"]) == (0.0, "ok"), rec["verifier"]


def test_an_ad_hoc_episode_cannot_join_a_jobs_group(stack: Stack) -> None:
    job = stack.alice.post(
        "/v1/jobs", json={"suite": "terminal", "task_ids": [TASK], "policy": {"name": "t"}}
    ).json()
    for field, value in (("job_id", job["id"]), ("group_id", "grp_0123456789abcdef")):
        r = stack.alice.post(
            "/v1/episodes", json={"task_id": TASK, "suite": "terminal", field: value}
        )
        assert r.status_code == 400, r.text
        assert r.headers["content-type"].startswith("application/problem+json")
        assert field in r.text
    assert stack.alice.post(f"/v1/jobs/{job['id']}/cancel").status_code == 200


def test_a_work_item_runs_only_its_own_task(stack: Stack) -> None:
    """Trial finding: a claimed item of a hard task accepted episodes of an easy one, whose
    records completed the item at 1.0 (and, without ``job_id``, left the job's export)."""
    from policy_client.client import Client

    job = stack.alice.post(
        "/v1/jobs",
        json={"suite": "terminal", "task_ids": ["git-split-commit"], "policy": {"name": "t"}},
    ).json()
    key = stack.alice.headers["authorization"].split(" ", 1)[1]
    with Client(stack.url, key) as client:
        item = client.claim(job["id"], worker="w", lease_s=300)
    assert item is not None and item.task_id == "git-split-commit"
    for extra in ({"job_id": job["id"]}, {}):
        r = stack.alice.post(
            "/v1/episodes",
            json={"task_id": TASK, "suite": "terminal", "work_item_id": item.id, **extra},
        )
        assert r.status_code == 400 and "task_id" in r.text, r.text
    r = stack.alice.post(
        "/v1/episodes",
        json={"task_id": "git-split-commit", "suite": "terminal", "work_item_id": item.id},
    )
    assert r.status_code == 201, r.text
    assert {e["job_id"] for e in r.json()["episodes"]} == {job["id"]}  # the item's job
    for e in r.json()["episodes"]:
        stack.alice.delete(f"/v1/sandboxes/{e['sandbox_id']}")
    assert stack.alice.post(f"/v1/jobs/{job['id']}/cancel").status_code == 200


def test_a_jobs_records_carry_the_jobs_policy(stack: Stack) -> None:
    """Trial finding: a job's records were named after whatever policy the verify call
    sent (another policy's name in the job's export)."""
    from policy_client.client import Client

    job = stack.alice.post(
        "/v1/jobs",
        json={
            "suite": "terminal",
            "task_ids": [TASK],
            "group_size": 1,
            "policy": {"name": "policy-a", "version": "7"},
        },
    ).json()
    key = stack.alice.headers["authorization"].split(" ", 1)[1]
    with Client(stack.url, key) as client:
        item = client.claim(job["id"], worker="w", lease_s=300)
    assert item is not None
    r = stack.alice.post(
        "/v1/episodes", json={"task_id": TASK, "suite": "terminal", "work_item_id": item.id}
    )
    assert r.status_code == 201, r.text
    ep = r.json()["episodes"][0]
    r = stack.alice.post(
        f"/v1/episodes/{ep['id']}/verify",
        json={"policy": {"name": "policy-b", "version": "8+prompt1"}},
    )
    assert r.status_code == 200, r.text
    assert r.json()["policy"] == {"name": "policy-a", "version": "8+prompt1"}
    assert stack.alice.post(f"/v1/jobs/{job['id']}/cancel").status_code == 200


def test_a_snapshot_still_committing_after_the_wait_scores_zero(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trial finding: 700,000 empty files made a tenant's snapshot take 88 s, past the 60 s
    the verdict waits, and the unsolved 0 became an error."""
    from service import episodes as episodes_module

    monkeypatch.setattr(episodes_module, "SNAPSHOT_WAIT_S", 0.0)
    ep = start(stack, TASK, "terminal")
    sid = ep["sandbox_id"]
    got: dict = {}
    t = threading.Thread(
        target=lambda: got.update(r=stack.alice.post(f"/v1/sandboxes/{sid}/snapshots"))
    )
    t.start()
    try:

        def snapshotting() -> bool:
            with stack.ctx.db.read() as s:
                state = s.execute(select(Sandbox.state).where(Sandbox.id == sid)).scalar()
            return state == "snapshotting"

        stack.wait_for(snapshotting, timeout_s=60)
        rec = verify(stack, ep)
    finally:
        t.join(timeout=120)
    v = rec["verifier"]
    assert (rec["reward"], v["status"]) == (0.0, "ok"), v
    assert v["details"]["dodge"] in ("snapshot_in_flight", None), v["details"]


STOPPED = (409, "Sandbox not running")


def test_killing_everything_a_user_may_is_the_commands_result(stack: Stack) -> None:
    # Regression: `kill -9 -1` killed the command's handler too, and the exec answered 502
    # (to a rollout runner "infrastructure": the sample re-rolled instead of scored).
    r = stack.alice.post("/v1/sandboxes", json={"template": "terminal", "ttl_s": 300})
    assert r.status_code == 201, r.text
    url = f"/v1/sandboxes/{r.json()['id']}/exec"  # runs as the template's user, not root
    r = stack.alice.post(url, json={"cmd": "kill -9 -1; sleep 5", "timeout_s": 30})
    assert r.status_code == 200, r.text
    out = r.json()
    assert (out["handler_lost"], out["exit_code"], out["signal"]) == (True, 137, 9)
    after = stack.alice.post(url, json={"cmd": "echo after"})
    assert after.status_code == 200 and after.json()["stdout"] == "after\n", after.text
    assert after.json()["handler_lost"] is False


def test_an_agent_that_stops_its_own_sandbox_scores_zero(stack: Stack) -> None:
    # Regression: as root, `kill -9 -1` also kills the sandbox's main process and the
    # container stops; that exec and each later one answered 502.
    ep = start(stack, TASK, "terminal")
    url = f"/v1/sandboxes/{ep['sandbox_id']}/exec"
    r = stack.alice.post(url, json={"cmd": "kill -9 -1; sleep 5", "timeout_s": 30})
    if r.status_code == 200:  # the runtime looked before the container had stopped
        assert r.json()["handler_lost"] is True and r.json()["exit_code"] == 137
    else:
        assert (r.status_code, r.json()["title"]) == STOPPED, r.text
    time.sleep(1)
    after = stack.alice.post(url, json={"cmd": "echo after"})
    assert (after.status_code, after.json()["title"]) == STOPPED, after.text
    rec = verify(stack, ep)
    assert (rec["reward"], rec["verifier"]["status"]) == (0.0, "ok"), rec


# Trial 31: a chain of 31 symlinks whose targets are ~4 KB of ``./`` each; every member
# of a tar named ``L0/...`` then costs the engine's untar ~80,000 path components.
_SLOW_LINKS = r"""
set -e
mkdir -p /app/x/real && cd /app/x
dots=$(printf './%.0s' $(seq 2040))
ln -s "${dots}real" L30
for i in $(seq 29 -1 0); do ln -s "${dots}L$((i+1))" "L$i"; done
"""


def test_an_upload_holding_the_engine_scores_zero_not_an_error(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trial 31 (3 of 3 runs): a files PUT the engine extracts for minutes holds the
    container's lock, which the verifier's freeze (``docker pause``) needs; the freeze
    timed out and the unsolved episode's 0 became an error (re-rolled, out of the loss).
    The tenant's engine work is now marked (``sandboxes.tenant_engine_work``): the
    verification waits for it briefly, and what still runs is the tenant's doing, a 0,
    answered without waiting for the engine."""
    from service import sandboxes

    monkeypatch.setattr(sandboxes, "TENANT_WORK_SETTLE_S", 1.0)
    ep = start(stack, TASK, "terminal")
    sid = ep["sandbox_id"]
    sh(stack, ep, _SLOW_LINKS)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as t:
        for i in range(600):
            t.addfile(tarfile.TarInfo(f"L0/f{i:06d}"), io.BytesIO(b""))
    put: dict[str, object] = {}

    def upload() -> None:
        r = stack.alice.put(
            f"/v1/sandboxes/{sid}/files",
            params={"path": "/app/x"},
            content=buf.getvalue(),
            headers={"content-type": "application/x-tar"},
            timeout=900,
        )
        put["status"] = r.status_code

    th = threading.Thread(target=upload)
    th.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the engine has begun: the first member is there
        r = stack.alice.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "ls /app/x/real | head -1"})
        if r.status_code == 200 and r.json()["stdout"].strip():
            break
        time.sleep(0.1)
    else:
        pytest.fail("the upload never began")
    t0 = time.monotonic()
    r = stack.alice.post(f"/v1/episodes/{ep['id']}/verify", json=TRAJ, timeout=900)
    took = time.monotonic() - t0
    th.join(timeout=900)
    assert r.status_code == 200, r.text
    rec = r.json()
    assert (rec["reward"], rec["verifier"]["status"]) == (0.0, "ok"), rec["verifier"]
    assert rec["verifier"]["details"]["dodge"] == "tenant_work_in_flight"
    assert took < 30, f"answered in {took:.1f} s: it waited for the engine"
    assert put["status"] == 200, "the upload itself went through"
