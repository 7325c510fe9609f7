"""The prompt template and action format, versioned (``PROMPT_VERSION``).

Version 1: the system prompt below; the user's first message is the task instruction; each
assistant turn is ONE fenced ``bash`` block (the command to run) or the done marker
``<done/>``; each following user message is the observation: the exit code and the output,
capped at ``MAX_OBSERVATION_CHARS`` (head and tail kept).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from policy_client.schemas import ExecOut

PROMPT_VERSION = "1"
DONE_MARKER = "<done/>"
MAX_OBSERVATION_CHARS = 4000
_SURROGATE = re.compile("[\ud800-\udfff]")


def encodable(text: str) -> str:
    """``text`` with every lone surrogate (U+D800..U+DFFF, which no UTF-8 request body can
    carry) replaced by U+FFFD: a policy's reply holding one made the client's request
    raise ``UnicodeEncodeError`` and the whole runner stop (a trial's)."""
    return _SURROGATE.sub("\ufffd", text)


SYSTEM_PROMPT = f"""You are an agent working in a Linux terminal to complete a task.
Each turn, reply with exactly one command in a fenced block:
```bash
<command>
```
You will see its exit code and output. When the task is complete, reply with {DONE_MARKER}."""

_BLOCK = re.compile(r"```(?:bash|sh|shell)?[ \t]*\n(.*?)```", re.DOTALL)


@dataclass(frozen=True)
class ParsedAction:
    """``command`` to run, or ``done``, or neither (``error`` says why)."""

    command: str | None
    done: bool
    error: str | None = None


def parse_action(text: str) -> ParsedAction:
    """Parse a model's turn: the first fenced bash block, else the done marker."""
    m = _BLOCK.search(text)
    if m and m.group(1).strip():
        return ParsedAction(m.group(1).strip(), False)
    if DONE_MARKER in text:
        return ParsedAction(None, True)
    return ParsedAction(None, False, "no ```bash block and no done marker in the reply")


def initial_messages(instruction: str) -> list[dict[str, str]]:
    """The chat an episode starts with."""
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": instruction}]


def observation(result: ExecOut | None, *, error: str | None = None) -> str:
    """The observation text for one turn, capped at ``MAX_OBSERVATION_CHARS``."""
    if error is not None:
        return f"error: {error}"
    assert result is not None
    out = result.stdout + (("\n[stderr]\n" + result.stderr) if result.stderr else "")
    if len(out) > MAX_OBSERVATION_CHARS:
        half = MAX_OBSERVATION_CHARS // 2
        out = out[:half] + f"\n[... {len(out) - 2 * half} characters cut ...]\n" + out[-half:]
    status = "timed out" if result.timed_out else f"exit code {result.exit_code}"
    return f"[{status}]\n{out}"
