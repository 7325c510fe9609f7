"""The judge's leftover mark (``crucible_observer.leftover_mark``) reads the clock exactly: a
process that started in the mark's own tick is never taken for one started after it (CI:
``1024.09 * 100`` through a float is one tick short, and a fixture's server started in that
tick was ended with the test's call)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PY = Path(__file__).resolve().parents[2] / "service" / "runtime" / "supervisor" / "py"

# In a fresh interpreter: importing the plugin edits os.environ (PYTEST_PLUGINS).
DRIVER = """
import json, sys
sys.path.insert(0, {py!r})
import crucible_observer as c
cases = [f"{{s}}.{{cs:02d}} 7.00" for s in range(1000, 1100) for cs in range(100)]
print(json.dumps({{
    "hz100": [c.uptime_ticks(t, 100) for t in cases],
    "hz250": c.uptime_ticks("1024.09 3.5", 250),
    "one_decimal": c.uptime_ticks("5.5 1.0", 100),
    "whole": c.uptime_ticks("42 1", 100),
    "mark": list(c.leftover_mark()),
}}))
"""


def test_uptime_ticks_are_exact_for_every_centisecond() -> None:
    out = subprocess.run(
        [sys.executable, "-c", DRIVER.format(py=str(PY))],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    got = json.loads(out)
    expected = [s * 100 + cs for s in range(1000, 1100) for cs in range(100)]
    wrong = [(e, g) for e, g in zip(expected, got["hz100"], strict=True) if e != g]
    assert wrong == [], wrong[:5]
    assert got["hz250"] == 256022  # 1024.09 s * 250 = 256022.5, rounded down as the kernel does
    assert (got["one_decimal"], got["whole"]) == (550, 4200)
    last_pid, ticks = got["mark"]
    assert last_pid > 0 and ticks > 0
