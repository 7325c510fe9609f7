"""The prompt and action format of session episodes (Terminus style), versioned
(``SESSION_PROMPT_VERSION``).

Each assistant turn is ONE JSON object, as Terminal-Bench's Terminus agent answers::

    {"analysis": "...", "plan": "...",
     "commands": [{"keystrokes": "ls -la\\n", "duration": 1.0}],
     "task_complete": false}

``keystrokes`` go to the terminal exactly as written (a command ends with ``\\n``), except
that a string that is exactly a tmux key name is that key (``"C-c"`` is Ctrl-C, as
Terminus's prompt tells models; ``terminal_keys``); ``duration`` is the most seconds to
wait after them (the wait ends early once the shell prompts again and the screen is quiet).
Each following user message is the screen as a terminal emulator renders it, capped at
``MAX_SCREEN_CHARS``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field

from policy_client.prompt import encodable
from policy_client.schemas import ScreenOut

SESSION_PROMPT_VERSION = "terminus-2"  # 2: tmux key names (C-c, Escape...) are keys
MAX_SCREEN_CHARS = 8000
MAX_DURATION_S = 600.0
MAX_COMMANDS = 1024  # keys per turn the server records (``TurnIn.keys``)

SESSION_SYSTEM_PROMPT = """You are an agent at a Linux terminal: a bash shell on a pseudo-terminal.
Each turn, reply with exactly one JSON object:
{"analysis": "<what the screen shows>", "plan": "<what you do next>",
 "commands": [{"keystrokes": "<keys to type, e.g. ls -la\\n>", "duration": <seconds to wait>}],
 "task_complete": <true when the task is done>}
Keystrokes are typed as given: end a command with \\n. For special keys, send a keystrokes
string that is exactly a tmux key name: C-c for Ctrl+C, C-d for Ctrl+D, C-z, Escape, Enter,
Tab, BSpace, Up, Down, Left, Right. After your commands you see the screen."""

_FENCE = re.compile(r"```(?:json)?[ \t]*\n(.*?)```", re.DOTALL)


@dataclass(frozen=True)
class KeysCommand:
    """Keys to type, then wait at most ``duration_s`` seconds for the terminal."""

    keystrokes: str
    duration_s: float


@dataclass(frozen=True)
class ParsedKeys:
    """A parsed turn: ``commands`` in order, ``done`` (task_complete), or ``error``."""

    commands: list[KeysCommand] = field(default_factory=list)
    done: bool = False
    error: str | None = None


def parse_keys_action(text: str) -> ParsedKeys:
    """Parse a turn: the JSON object (bare, or in a ```json fence). Never raises: a reply
    that is not such an object comes back with ``error`` saying why."""
    m = _FENCE.search(text)
    body = m.group(1) if m else text[text.find("{") : text.rfind("}") + 1]
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as e:  # 100,000 nested brackets: RecursionError
        return ParsedKeys(error=f"the reply is not one JSON object: {type(e).__name__}: {e}")
    if not isinstance(data, dict):
        return ParsedKeys(error="the reply is not one JSON object")
    raw = data.get("commands", [])
    done = data.get("task_complete", False)
    if not isinstance(raw, list) or not isinstance(done, bool):
        return ParsedKeys(error="commands must be a list and task_complete a boolean")
    if len(raw) > MAX_COMMANDS:  # a verify of the turn would be refused (a trial's re-rolls)
        return ParsedKeys(error=f"at most {MAX_COMMANDS} commands per turn, not {len(raw)}")
    commands = []
    for i, c in enumerate(raw):
        keys = c.get("keystrokes") if isinstance(c, dict) else None
        duration = c.get("duration", 1.0) if isinstance(c, dict) else None
        if (
            not isinstance(keys, str)
            or not isinstance(duration, int | float)
            or not math.isfinite(duration)  # NaN passed `< 0` and erased the deadline
            or duration < 0
        ):
            return ParsedKeys(
                error=f"commands[{i}] needs keystrokes (a string) and duration (seconds >= 0)"
            )
        commands.append(KeysCommand(encodable(keys), min(float(duration), MAX_DURATION_S)))
    return ParsedKeys(commands=commands, done=done)


def screen_text(screen: ScreenOut) -> str:
    """The display as text (trailing blank rows dropped), capped at ``MAX_SCREEN_CHARS``
    (the bottom kept: it holds the prompt and the latest output)."""
    text = screen.text
    return text if len(text) <= MAX_SCREEN_CHARS else text[-MAX_SCREEN_CHARS:]


def session_initial_messages(instruction: str, screen: ScreenOut) -> list[dict[str, str]]:
    """The chat a session episode starts with: the system prompt, then the instruction and
    the terminal's first screen."""
    return [
        {"role": "system", "content": SESSION_SYSTEM_PROMPT},
        {"role": "user", "content": f"{instruction}\n\nThe terminal:\n{screen_text(screen)}"},
    ]


def screen_observation(screen: ScreenOut | None, *, error: str | None = None) -> str:
    """The observation of one session turn: the screen, or what was wrong with the reply."""
    if error is not None:
        return f"error: {error}"
    assert screen is not None
    state = "" if screen.running else f"[the shell exited: {screen.exit_code}]\n"
    return state + screen_text(screen)


def at_prompt(screen: ScreenOut, prompt: str = "$") -> bool:
    """Whether the cursor sits right after the shell's prompt (``PS1`` ``"$ "``, the
    session default) on its row."""
    row, col = screen.cursor[0], screen.cursor[1]
    if not 0 <= row < len(screen.display):
        return False
    return screen.display[row][:col].rstrip().endswith(prompt)
