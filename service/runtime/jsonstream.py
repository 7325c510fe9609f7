"""The items of a JSON array read from a byte stream one at a time, so that a caller that
needs only the first N of an answer never holds the rest (the engine's filesystem diff of an
end state with millions of entries is one such answer)."""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterable, Iterator
from typing import Any

_SKIP = " \t\r\n"
_DELIMITERS = frozenset(_SKIP + ",]")


def array_items(chunks: Iterable[bytes]) -> Iterator[Any]:
    """Yield each item of the JSON array (RFC 8259) that ``chunks`` spell, in order; a JSON
    ``null`` in its place yields nothing.

    Only the current, unfinished item is buffered. Raises ``ValueError`` when the text is not
    an array (or null), an item is malformed, or the stream ends before the closing ``]``.
    """
    decoder = json.JSONDecoder()
    text = codecs.getincrementaldecoder("utf-8")()
    buf, started, expect_item = "", False, True
    for chunk in chunks:
        buf += text.decode(chunk)
        pos = 0
        while True:
            while pos < len(buf) and buf[pos] in _SKIP:
                pos += 1
            if pos >= len(buf):
                break
            if not started:
                if buf[pos] == "[":
                    started, pos = True, pos + 1
                    continue
                if len(buf) - pos < 4:
                    break  # perhaps the start of "null"
                if buf.startswith("null", pos):
                    return
                raise ValueError("the answer is not a JSON array")
            if buf[pos] == "]":
                return
            if buf[pos] == ",":
                if expect_item:
                    raise ValueError("an empty item in the JSON array")
                expect_item, pos = True, pos + 1
                continue
            if not expect_item:
                raise ValueError("items of the JSON array are not separated by commas")
            if buf[pos] in '{["':
                try:
                    item, end = decoder.raw_decode(buf, pos)
                except json.JSONDecodeError:
                    break  # unfinished: wait for the next chunk
            else:  # a number or literal: it ends at the next delimiter
                end = _delimiter(buf, pos)
                if end < 0:
                    break
                item = json.loads(buf[pos:end])
            yield item
            pos, expect_item = end, False
        buf = buf[pos:]
    buf += text.decode(b"", final=True)
    if buf.strip() == "null" and not started:
        return
    raise ValueError("the JSON array ended before its closing bracket")


def _delimiter(buf: str, pos: int) -> int:
    """Index of the first delimiter at or after ``pos``, or -1."""
    for i in range(pos, len(buf)):
        if buf[i] in _DELIMITERS:
            return i
    return -1
