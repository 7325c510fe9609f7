"""Session episodes: each turn is keys sent to a PTY session, then the screen read.

``RolloutRunner`` runs an episode this way with ``RolloutConfig(mode="session")``. The
episode opens one bash session on a pseudo-terminal in the task's workdir; the policy sees
the instruction and the first screen (``session_prompt``), answers Terminus-style JSON
(``commands``: keystrokes + duration, ``task_complete``), and after each turn's keys sees the
screen again. A keystrokes string that is exactly a tmux key name (``C-c``, ``Escape``,
``Enter``...: ``terminal_keys``) is sent as that key, as Terminus's ``tmux send-keys`` does;
anything else is typed as written. Each trajectory turn records the reply (``action``), the
``keys`` sent in order (as written), and the ``screen`` read after them. The session is
closed before verification.

Waiting for the terminal (``wait_for_screen``): after keys, the screen is read with the
server's ``wait_s`` (answered as soon as new bytes arrive) until the shell prompts again
(the cursor right after ``$``, with new bytes since the keys) and nothing more arrives for
``quiet_s``, or the command's duration has passed, or the shell has exited.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from policy_client.client import AsyncClient
from policy_client.schemas import ScreenOut
from policy_client.session_prompt import at_prompt, screen_text
from policy_client.terminal_keys import key_bytes

QUIET_S = 0.25
POLL_S = 1.0


@dataclass(frozen=True)
class SessionTurn:
    """What one turn did: the ``keys`` sent, the ``screen`` read after them, and the wall
    time the terminal took (``env_ms``)."""

    keys: list[str]
    screen: ScreenOut
    env_ms: float


async def wait_for_screen(
    client: AsyncClient,
    sandbox_id: str,
    session_id: str,
    *,
    before_bytes: int,
    max_s: float,
    quiet_s: float = QUIET_S,
) -> ScreenOut:
    """The screen once the terminal settled (see the module docstring), or at ``max_s``
    seconds. ``before_bytes``: the terminal's ``bytes_total`` before the keys were sent."""
    deadline = time.monotonic() + max_s
    screen = await client.screen(sandbox_id, session_id, wait_s=min(quiet_s, max_s))
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not screen.running:
            return screen
        if at_prompt(screen) and screen.bytes_total > before_bytes:
            nxt = await client.screen(sandbox_id, session_id, wait_s=min(quiet_s, left))
            if nxt.bytes_total == screen.bytes_total:
                return nxt
            screen = nxt
            continue
        screen = await client.screen(sandbox_id, session_id, wait_s=min(POLL_S, left))


async def play_turn(
    client: AsyncClient,
    sandbox_id: str,
    session_id: str,
    commands: list[tuple[str, float]],
    *,
    before: ScreenOut,
    remaining_s: float,
) -> SessionTurn:
    """Send each ``(keystrokes, duration_s)`` in order (a key name as its key:
    ``terminal_keys.key_bytes``), waiting on the screen after each (never past
    ``remaining_s`` seconds in all); return what was sent (as written) and the last screen."""
    t0 = time.perf_counter()
    deadline = time.monotonic() + remaining_s
    sent: list[str] = []
    screen = before
    for keys, duration_s in commands:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        if keys:
            named = key_bytes(keys)  # "C-c", "Escape": that key, as tmux send-keys does
            await client.send_keys(sandbox_id, session_id, text=keys if named is None else named)
            sent.append(keys)
        screen = await wait_for_screen(
            client,
            sandbox_id,
            session_id,
            before_bytes=screen.bytes_total,
            max_s=min(duration_s, left),
        )
    if not commands:
        screen = await client.screen(sandbox_id, session_id)
    return SessionTurn(keys=sent, screen=screen, env_ms=(time.perf_counter() - t0) * 1e3)


def turn_record(action: str, turn: SessionTurn | None) -> dict[str, Any]:
    """The trajectory turn of a session episode (``TurnIn``: the reply as ``action``, the
    ``keys`` sent, the ``screen`` read after them; no turn: a reply that did not parse)."""
    if turn is None:
        return {"action": action[:4000], "exit_code": None, "keys": [], "screen": None}
    return {
        "action": action[:4000],
        "exit_code": None,
        "duration_ms": turn.env_ms,
        "keys": [k[:4000] for k in turn.keys],  # a summary, as ``action`` is
        "screen": screen_text(turn.screen),
    }
