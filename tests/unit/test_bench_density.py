"""The pure helpers of bench/density.py: kernel file parsing, working set, per-GiB, line fit."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import density  # noqa: E402

STATUS = "Name:\tpython\nPPid:\t41\nVmRSS:\t  113632 kB\nThreads:\t7\n"
SMAPS_ROLLUP = (
    "55d0c0000000-7ffd0000000 ---p 00000000 00:00 0    [rollup]\n"
    "Rss:                5120 kB\nPss:                3073 kB\n"
)
MEMORY_STAT_V1 = "cache 4096\nrss 520192\ntotal_inactive_file 4096\ntotal_active_file 0\n"


def test_parse_kv_reads_proc_status_in_bytes() -> None:
    got = density.parse_kv(STATUS)
    assert got == {"PPid": 41, "VmRSS": 113632 * 1024, "Threads": 7}


def test_parse_kv_skips_the_rollup_header_and_converts_kb() -> None:
    assert density.parse_kv(SMAPS_ROLLUP) == {"Rss": 5120 * 1024, "Pss": 3073 * 1024}


def test_working_set_subtracts_inactive_file_v1_and_v2() -> None:
    v1 = density.parse_kv(MEMORY_STAT_V1)
    assert density.working_set_bytes(600_000, v1) == 600_000 - 4096
    assert density.working_set_bytes(10_000, {"inactive_file": 2_500}) == 7_500
    assert density.working_set_bytes(1_000, {"inactive_file": 5_000}) == 0
    assert density.working_set_bytes(1_000, {}) == 1_000


def test_parse_environ_splits_on_nul_and_keeps_equals_in_values() -> None:
    raw = b"CRUCIBLE_DEPLOYMENT=bench-1a2b\0OPTS=a=b\0NOEQUALS\0"
    assert density.parse_environ(raw) == {"CRUCIBLE_DEPLOYMENT": "bench-1a2b", "OPTS": "a=b"}


def test_per_gib() -> None:
    assert density.per_gib(4 << 20) == 256.0
    assert density.per_gib(0) == float("inf")


def test_linear_fit_exact_line_and_refusals() -> None:
    slope, icpt = density.linear_fit([0, 8, 16], [100.0, 116.0, 132.0])
    assert slope == pytest.approx(2.0) and icpt == pytest.approx(100.0)
    with pytest.raises(ValueError, match="two distinct"):
        density.linear_fit([8, 8], [1.0, 2.0])


def test_reading_charges_the_control_plane_growth_per_sandbox() -> None:
    r = density.Reading(
        n=16,
        cgroup_mean=1 << 20,
        shim_pss_mean=3 << 20,
        control_plane_rss=0,
        control_plane_growth=16 << 20,
        daemons_growth=0,
        host_drop=0,
    )
    assert r.per_sandbox == 5 << 20
    assert r.per_gib == pytest.approx(1024 / 5)
    shrunk = density.Reading(16, 1 << 20, 1 << 20, 0, -(8 << 20), 0, 0)
    assert shrunk.per_sandbox == 2 << 20  # an RSS that fell is not a negative cost
