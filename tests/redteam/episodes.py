"""What every red-team test does through the public API: start an episode of a bundled
task, act in its sandbox, verify it."""

from __future__ import annotations

from typing import Any

from tests.integration.api.conftest import Stack

TRAJ = {"policy": {"name": "redteam", "version": "1"}}


def start(stack: Stack, task: str, suite: str) -> dict[str, Any]:
    """A new episode of ``suite``/``task`` for tenant alice (its JSON)."""
    r = stack.alice.post("/v1/episodes", json={"task_id": task, "suite": suite})
    assert r.status_code == 201, r.text
    return r.json()["episodes"][0]


def upload(stack: Stack, ep: dict[str, Any], path: str, data: bytes) -> None:
    """Put ``data`` at ``path`` in the episode's sandbox."""
    r = stack.alice.put(
        f"/v1/sandboxes/{ep['sandbox_id']}/files",
        params={"path": path},
        content=data,
        headers={"content-type": "application/octet-stream"},
    )
    assert r.status_code == 200, r.text


def sh(stack: Stack, ep: dict[str, Any], script: str, timeout_s: float = 60) -> None:
    """Run ``script`` with bash in the episode's sandbox; it must exit 0."""
    r = stack.alice.post(
        f"/v1/sandboxes/{ep['sandbox_id']}/exec",
        json={"cmd": ["bash", "-c", script], "timeout_s": timeout_s},
    )
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["exit_code"] == 0, (out["stdout"], out["stderr"])


def verify(stack: Stack, ep: dict[str, Any]) -> dict[str, Any]:
    """Verify the episode as its worker would; the reward record (tenant's view)."""
    r = stack.alice.post(f"/v1/episodes/{ep['id']}/verify", json=TRAJ)
    assert r.status_code == 200, r.text
    return r.json()
