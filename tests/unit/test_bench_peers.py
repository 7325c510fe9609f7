"""The pure helpers of the peer benches: the client's JSON answer and the one-line error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import peer_env  # noqa: E402


def test_last_json_line_skips_log_lines_around_it() -> None:
    out = (
        "2026-12-01 INFO starting {not json\n"
        '{"error": "unable to apply caps", "after_s": 3.0}\n'
        "2026-12-01 ERROR close failed\n"
    )
    assert peer_env.last_json_line(out) == {"error": "unable to apply caps", "after_s": 3.0}


def test_last_json_line_takes_the_last_object() -> None:
    assert peer_env.last_json_line('{"a": 1}\n{"a": 2}\n') == {"a": 2}


def test_last_json_line_names_the_output_when_there_is_none() -> None:
    with pytest.raises(ValueError, match="no JSON object.*Traceback"):
        peer_env.last_json_line("Traceback (most recent call last):\n[1, 2]\n")


def test_error_text_keeps_the_last_stderr_lines_on_one_line() -> None:
    e = subprocess.CalledProcessError(1, ["pip"], stderr="a\n\nb\nc\nERROR: no harbor\n")
    assert peer_env.error_text(e) == "CalledProcessError: b | c | ERROR: no harbor"
    assert peer_env.error_text(OSError("gone"), limit=12) == "OSError: gon"


def test_peer_status_says_what_it_took_or_why_not() -> None:
    import peers

    ran = {"version": "0.26.0", "setup_s": 0.5, "start_s": 3.47, "one_shot": object()}
    assert peers._peer_status("Harbor", ran) == (
        "Harbor: measured (version 0.26.0, setup_s 0.5, start_s 3.47)"
    )
    refused = {"version": "1.11.0", "setup_s": 6.2, "error": "unable to apply caps"}
    assert peers._peer_status("ROCK", refused) == (
        "ROCK: not measured (version 1.11.0, setup_s 6.2): unable to apply caps"
    )
    assert peers._peer_status("SWE-ReX", {"error": "skipped"}) == "SWE-ReX: skipped"
    shimmed = {"version": "1.11.0", "start_s": 0.9, "note": "--privileged replaced: refused"}
    shimmed["session_error"] = "HTTPError: 500"
    assert peers._peer_status("ROCK", shimmed) == (
        "ROCK: measured (version 1.11.0, start_s 0.9); --privileged replaced: refused;"
        " session_error HTTPError: 500"
    )
