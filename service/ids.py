"""Prefixed random ids (``sb_``, ``snap_``, ...): 16 hex chars of randomness after the prefix."""

from __future__ import annotations

import secrets


def new_id(prefix: str) -> str:
    """A new id like ``sb_3f9a0c1d2e4b5a6c`` (64 random bits)."""
    return f"{prefix}_{secrets.token_hex(8)}"
