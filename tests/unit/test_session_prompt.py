"""The Terminus-style action format of session episodes: replies parsed into keystrokes,
durations and task_complete; malformed replies named, never raised; prompt detection."""

from __future__ import annotations

import pytest

from policy_client.prompt import encodable
from policy_client.schemas import ScreenOut
from policy_client.session_prompt import (
    MAX_DURATION_S,
    MAX_SCREEN_CHARS,
    KeysCommand,
    at_prompt,
    parse_keys_action,
    screen_observation,
)


def _screen(display: list[str], cursor: tuple[int, int], **kw: object) -> ScreenOut:
    fields = {"scrollback": [], "bytes_total": 10, "dropped": 0, "running": True, "exit_code": None}
    return ScreenOut(display=display, cursor=list(cursor), **{**fields, **kw})


def test_a_terminus_reply_parses_bare_or_fenced() -> None:
    reply = (
        '{"analysis": "a", "plan": "p", "commands": [{"keystrokes": "ls\\n", "duration": 0.5},'
        ' {"keystrokes": "\\u0003"}], "task_complete": false}'
    )
    want = [KeysCommand("ls\n", 0.5), KeysCommand("\x03", 1.0)]
    assert parse_keys_action(reply).commands == want
    fenced = parse_keys_action(f"Sure.\n```json\n{reply}\n```\nthanks")
    assert (fenced.commands, fenced.done, fenced.error) == (want, False, None)
    done = parse_keys_action('{"commands": [], "task_complete": true}')
    assert (done.commands, done.done, done.error) == ([], True, None)
    long = parse_keys_action('{"commands": [{"keystrokes": "x", "duration": 1e9}]}')
    assert long.commands == [KeysCommand("x", MAX_DURATION_S)]


@pytest.mark.parametrize(
    "reply,message",
    [
        ("ls -la", "not one JSON object"),
        ("[1, 2]", "not one JSON object"),
        ('{"commands": "ls"}', "commands must be a list"),
        ('{"commands": [], "task_complete": "yes"}', "task_complete a boolean"),
        ('{"commands": [{"keys": "ls"}]}', "commands[0] needs keystrokes"),
        ('{"commands": [{"keystrokes": "ls", "duration": -1}]}', "commands[0] needs"),
        ('{"commands": [{"keystrokes": 5}]}', "commands[0] needs"),
        # a trial's NaN passed `< 0` and erased the episode's deadline
        ('{"commands": [{"keystrokes": "ls", "duration": NaN}]}', "commands[0] needs"),
        ('{"commands": [{"keystrokes": "ls", "duration": Infinity}]}', "commands[0] needs"),
        # more keys than a turn's record holds: its verify was refused (a trial's re-rolls)
        ('{"commands": [' + ", ".join(['{"keystrokes": "x"}'] * 1025) + "]}", "at most 1024"),
    ],
)
def test_malformed_replies_say_why(reply: str, message: str) -> None:
    parsed = parse_keys_action(reply)
    assert parsed.error is not None and message in parsed.error
    assert parsed.commands == [] and not parsed.done


def test_keys_no_request_can_carry_become_a_replacement_character() -> None:
    # Regression: "\\ud800" in the JSON became a lone surrogate, and the client's request
    # raised UnicodeEncodeError, stopping the whole runner (a trial's).
    parsed = parse_keys_action('{"commands": [{"keystrokes": "a\\ud800b"}]}')
    assert parsed.commands == [KeysCommand("a\ufffdb", 1.0)]
    assert encodable("x\ud800y\udfffz") == "x\ufffdy\ufffdz"


def test_prompt_is_seen_at_the_cursor_only() -> None:
    assert at_prompt(_screen(["$ ls", "a b", "$"], (2, 2)))
    assert not at_prompt(_screen(["$ ls", "a b", "$"], (1, 3)))  # cursor elsewhere
    assert not at_prompt(_screen(["$ sleep 5", ""], (1, 0)))  # a command is running
    assert not at_prompt(_screen(["> "], (0, 2)))  # a heredoc's continuation prompt
    assert not at_prompt(_screen(["$"], (5, 0)))


def test_observation_keeps_the_bottom_of_a_long_screen() -> None:
    rows = [f"line {i}" for i in range(2000)] + ["$"]
    text = screen_observation(_screen(rows, (2000, 2)))
    assert len(text) == MAX_SCREEN_CHARS and text.endswith("line 1999\n$")
    gone = screen_observation(_screen(["bye"], (0, 3), running=False, exit_code=0))
    assert gone == "[the shell exited: 0]\nbye"
    assert screen_observation(None, error="bad") == "error: bad"


def test_a_reply_nested_past_the_decoders_recursion_is_a_parse_error() -> None:
    # Trial 20: "commands" as 100,000 opening then closing brackets made json.loads raise
    # RecursionError, which the parser did not catch: the whole runner stopped.
    reply = '{"commands": ' + "[" * 100_000 + "]" * 100_000 + ', "task_complete": false}'
    parsed = parse_keys_action(reply)
    assert parsed.commands == [] and not parsed.done
    assert parsed.error is not None and "RecursionError" in parsed.error
