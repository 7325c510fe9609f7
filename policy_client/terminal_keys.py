"""tmux key names in Terminus-style keystrokes, as the bytes an xterm sends.

Terminus (Terminal-Bench's agent) types each ``keystrokes`` string with ``tmux send-keys``
and tells its model to "use tmux-style escape sequences: C-c for Ctrl+C, C-d for Ctrl+D";
tmux sends a string that is exactly a key name as that key, anything else as its text. A
session episode does the same (``key_bytes``), so a Terminus-trained model's ``"C-c"``
interrupts instead of typing three characters.

The client's own copy of the names it needs (the server's table, for the ``keys`` list of
``POST .../keys``, is ``service/terminal_keys.toml``; ``tests/unit/test_terminal_keys.py``
checks the two agree). Names match case-insensitively, as tmux's do.
"""

from __future__ import annotations

import string

# The server's names (service/terminal_keys.toml), the same bytes.
KEYS: dict[str, str] = {
    "Enter": "\r",
    "Tab": "\t",
    "BSpace": "\x7f",
    "Escape": "\x1b",
    "Space": " ",
    "Up": "\x1b[A",
    "Down": "\x1b[B",
    "Right": "\x1b[C",
    "Left": "\x1b[D",
    "Home": "\x1b[H",
    "End": "\x1b[F",
    "PageUp": "\x1b[5~",
    "PageDown": "\x1b[6~",
    "Delete": "\x1b[3~",
    "C-a": "\x01",
    "C-b": "\x02",
    "C-c": "\x03",
    "C-d": "\x04",
    "C-e": "\x05",
    "C-k": "\x0b",
    "C-l": "\x0c",
    "C-r": "\x12",
    "C-u": "\x15",
    "C-w": "\x17",
    "C-z": "\x1a",
    "C-\\": "\x1c",
}
# tmux's other spellings of the same keys, and the rest of its control letters.
TMUX_ALIASES: dict[str, str] = {
    "NPage": "\x1b[6~",
    "PgDn": "\x1b[6~",
    "PPage": "\x1b[5~",
    "PgUp": "\x1b[5~",
    "DC": "\x1b[3~",
    "BTab": "\x1b[Z",
    "C-[": "\x1b",
    "C-Space": "\x00",
    **{f"C-{c}": chr(ord(c) - 96) for c in string.ascii_lowercase},
}
_BY_NAME: dict[str, str] = {k.lower(): v for k, v in {**TMUX_ALIASES, **KEYS}.items()}


def key_bytes(keystrokes: str) -> str | None:
    """The bytes (as text) of ``keystrokes`` when it is exactly one key name (``"C-c"``,
    ``"Enter"``, ``"escape"``), else None: then it is typed as written."""
    return _BY_NAME.get(keystrokes.lower()) if 1 < len(keystrokes) <= 9 else None
