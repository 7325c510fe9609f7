"""The session screen's emulator feed (``service.sessions.feed_terminal``): what a sandbox
prints can make pyte fail or crawl, never make a screen read raise or run unbounded."""

from __future__ import annotations

import time

import pytest

from service import sessions


def _feed(data: bytes, **kw: float) -> tuple[list[str], sessions.Fed]:
    screen, stream = sessions._new_screen(24, 80)
    fed = sessions.feed_terminal(screen, stream, data, **kw)
    return [line.rstrip() for line in screen.display], fed


@pytest.mark.parametrize(
    "bad",
    [b"\x1b[4J", b"\x1b[79J", b"\x1b[" + b"9" * 5000 + b"m", b"\x1b[?" + b"1" * 4400 + b"h"],
    ids=["erase-4", "erase-79", "huge-param", "huge-private-param"],
)
def test_a_sequence_pyte_fails_on_is_skipped_and_the_rest_renders(bad: bytes) -> None:
    display, fed = _feed(b"before\r\n" + bad + b"ok\r\n$ ")
    assert display[:3] == ["before", "ok", "$"]
    assert fed.errors == 1 and fed.dropped == 0
    screen, stream = sessions._new_screen(24, 80)
    for part in (b"a\r\n", bad, b"b\r\n"):  # across reads too, and the stream stays usable
        fed = sessions.feed_terminal(screen, stream, part)
        stream = fed.stream
    assert [line.rstrip() for line in screen.display][:2] == ["a", "b"]


def test_normal_output_renders_exactly_as_pyte_does() -> None:
    import pyte

    data = b"".join(b"\x1b[1;3%dmline %d\x1b[0m \xc3\xa9\r\n" % (i % 8, i) for i in range(3000))
    ref = pyte.HistoryScreen(80, 24, history=sessions.HISTORY_LINES, ratio=0.5)
    ref.set_mode(pyte.modes.LNM)
    pyte.ByteStream(ref).feed(data)
    screen, stream = sessions._new_screen(24, 80)
    for i in range(0, len(data), 7000):  # reads split anywhere, even inside a sequence
        # what is checked is the rendering, not the budget: a loaded host (CI with other
        # work on its 2 cores) took over the default second for 7,000 bytes and dropped some
        fed = sessions.feed_terminal(screen, stream, data[i : i + 7000], budget_s=120)
        assert fed.dropped == 0 and fed.errors == 0
        stream = fed.stream
    assert screen.display == ref.display
    assert [sessions._line(r, 80) for r in screen.history.top] == [
        sessions._line(r, 80) for r in ref.history.top
    ]


def test_a_decaln_flood_is_cut_to_the_budget_and_the_newest_bytes_still_show() -> None:
    flood = b"\x1b#8" * 60000 + b"\r\nafter the flood\r\n$ "
    t0 = time.perf_counter()
    display, fed = _feed(flood)
    assert time.perf_counter() - t0 < sessions.FEED_BUDGET_S + 1.0
    assert 0 < fed.dropped < len(flood)
    # A terminal shows the same: the E's DECALN filled the screen with, the text over them.
    assert display[1].startswith("after the flood") and display[2].startswith("$ E")
    # A small budget: the same, scaled.
    t0 = time.perf_counter()
    _, fed = _feed(b"\x1b#8" * 60000, budget_s=0.2)
    assert time.perf_counter() - t0 < 0.7 and fed.dropped > 0
