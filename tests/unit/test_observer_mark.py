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


def _observe(driver: str) -> dict:
    """What ``driver`` (importing the observer from ``PY``) prints, read as JSON."""
    out = subprocess.run(
        [sys.executable, "-c", driver.format(py=str(PY))],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out)


def test_uptime_ticks_are_exact_for_every_centisecond() -> None:
    got = _observe(DRIVER)
    expected = [s * 100 + cs for s in range(1000, 1100) for cs in range(100)]
    wrong = [(e, g) for e, g in zip(expected, got["hz100"], strict=True) if e != g]
    assert wrong == [], wrong[:5]
    assert got["hz250"] == 256022  # 1024.09 s * 250 = 256022.5, rounded down as the kernel does
    assert (got["one_decimal"], got["whole"]) == (550, 4200)
    last_pid, ticks = got["mark"]
    assert last_pid > 0 and ticks > 0


# Trial 26: a process named in bytes that are not UTF-8 made the text read of its status
# raise, and the sweep took it for gone. Read here only (the sweep itself runs in a sandbox).
NAMED = """
import json, subprocess, sys, time
sys.path.insert(0, {py!r})
import crucible_observer as c
p = subprocess.Popen([sys.executable, "-c",
    "open('/proc/self/comm', 'wb').write(b'\\\\xff\\\\xfe'); import time; time.sleep(30)"])
time.sleep(0.5)
st, born = c._status(str(p.pid)), c._started(str(p.pid))
p.kill()
p.wait()
print(json.dumps({{"status": list(st) if isinstance(st, tuple) else repr(st),
                   "started": isinstance(born, int),
                   "gone": repr(c._status(str(p.pid)))}}))
"""


def test_a_process_named_in_bytes_that_are_not_utf8_is_read() -> None:
    got = _observe(NAMED)
    assert isinstance(got["status"], list) and got["status"][0] in "RSD", got
    assert got["started"] is True
    assert got["gone"] == "None"  # reaped: ENOENT
