"""Text that can be stored and served: valid Unicode without lone surrogates.

JSON lets a client send ``"\\ud800"`` (a lone surrogate): Python decodes it into a ``str``
that cannot be encoded as UTF-8, so storing it would break every later read and export of
that row. Models reject such text at the door, naming the field.
"""

from __future__ import annotations

import math
from typing import Any


def _bad(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _safe(s: str) -> str:
    return s.encode("utf-8", "backslashreplace").decode("utf-8")


def find_unencodable(value: Any, path: str = "") -> str | None:
    """The dotted path (itself printable) of the first string, key or value, in ``value``
    that is not valid UTF-8 text, or None."""
    if isinstance(value, str):
        return (path or "value") if _bad(value) else None
    if isinstance(value, dict):
        for k, v in value.items():
            sub = f"{path}.{_safe(str(k))}" if path else _safe(str(k))
            if isinstance(k, str) and _bad(k):
                return sub
            if found := find_unencodable(v, sub):
                return found
        return None
    if isinstance(value, list | tuple):
        for i, v in enumerate(value):
            if found := find_unencodable(v, f"{path}.{i}" if path else str(i)):
                return found
    return None


MAX_ITEMS = 200
"""Most items of one list that ``recordable`` keeps (then a ``"... N more"`` item)."""
MAX_KEYS = 2000
"""Most keys of one mapping that ``recordable`` keeps (then a ``"..."`` key)."""
MAX_CHARS = 16384
"""Most characters of one string that ``recordable`` keeps."""


def recordable(value: Any) -> Any:
    """A copy of the JSON-like ``value`` that any record can hold, and of bounded size:
    every string and key with lone surrogates written as ``\\udXXX`` escapes and cut at
    ``MAX_CHARS``, non-finite floats as the strings ``"inf"``, ``"-inf"`` and ``"nan"``,
    tuples as lists, lists cut at ``MAX_ITEMS`` and mappings at ``MAX_KEYS`` (saying how
    many more there were). For what came from an end state into a verdict (an answer's
    keys, file names: a trial's 50,000 tampered paths made one record 83 MB), which the
    agent chooses."""
    if isinstance(value, str):
        value = _safe(value) if _bad(value) else value
        return value if len(value) <= MAX_CHARS else value[:MAX_CHARS] + "..."
    if isinstance(value, bool) or value is None or isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, dict):
        out = {
            recordable(str(k)): recordable(v)
            for _, (k, v) in zip(range(MAX_KEYS), value.items(), strict=False)
        }
        if len(value) > MAX_KEYS:
            out["..."] = f"{len(value) - MAX_KEYS} more"
        return out
    if isinstance(value, list | tuple):
        items = [recordable(v) for v in value[:MAX_ITEMS]]
        if len(value) > MAX_ITEMS:
            items.append(f"... {len(value) - MAX_ITEMS} more")
        return items
    return recordable(str(value))
