"""The client's tmux key names (``policy_client.terminal_keys``) against the server's table
(``service/terminal_keys.toml``), and what a Terminus keystrokes string becomes."""

from __future__ import annotations

import pytest

from policy_client.terminal_keys import KEYS, key_bytes
from service.sessions import KEYS as SERVER_KEYS


def test_the_client_copy_is_the_server_table() -> None:
    assert KEYS == SERVER_KEYS


@pytest.mark.parametrize(
    ("keystrokes", "sent"),
    [
        ("C-c", "\x03"),
        ("c-c", "\x03"),  # tmux matches names case-insensitively
        ("C-d", "\x04"),
        ("C-x", "\x18"),  # any control letter, as tmux
        ("Escape", "\x1b"),
        ("enter", "\r"),
        ("Up", "\x1b[A"),
        ("NPage", "\x1b[6~"),
        ("BSpace", "\x7f"),
        ("C-\\", "\x1c"),
        ("C-c\n", None),  # not exactly a name: typed as written
        ("ls -la\n", None),
        ("q", None),  # one character: itself
        ("", None),
        ("echo C-c", None),
    ],
)
def test_key_bytes(keystrokes: str, sent: str | None) -> None:
    assert key_bytes(keystrokes) == sent
