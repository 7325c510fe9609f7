"""Red team, CAD domain: unsolved parts that try to be paid anyway, through the public API
on bundled tasks. Each scores at most 0.05 (in practice exactly 0) with ``status=ok``:

- shapes that only match what the instruction states (a box filling the bounding box, a
  random solid in it), and the part without a feature the reference has;
- end states that make reading or measuring fail: a FIFO, a directory, a symlink loop or
  one to a device, non-manifold junk, NaN coordinates, too many triangles or shells;
- a pathological mesh within the caps is cut off at the task's measuring limit while
  ``/healthz`` keeps answering fast (measuring runs in a bounded worker process, not in
  the control plane).
"""

from __future__ import annotations

import shutil
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import manifold3d
import numpy as np
import pytest
import trimesh

from tests.integration.api.conftest import Stack, start_stack
from tests.integration.api.test_sandboxes_api import run
from tests.redteam import episodes
from tests.redteam.episodes import verify

pytestmark = [pytest.mark.docker, pytest.mark.redteam]

TASKS = Path(__file__).resolve().parents[2] / "tasks" / "cad"
PLATE, OUT = "plate-four-holes", "/app/out/plate.stl"
SLOW = "plate-slow-measure"  # the plate with a 1 s measuring limit and no render check
CAP = 0.05


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tasks = tmp_path_factory.mktemp("redteam-cad-tasks")
    shutil.copytree(TASKS, tasks / "cad")
    slow = tasks / "cad" / SLOW
    shutil.copytree(TASKS / PLATE, slow)
    toml = (slow / "task.toml").read_text()
    (slow / "task.toml").write_text(toml + "render = false\nmeasure_timeout_s = 1.0\n")
    yield from start_stack(
        tmp_path_factory.mktemp("redteam-cad"),
        pool_targets={},
        tasks_dir=tasks,
        max_upload_bytes=16 << 20,  # the blinded plate is 4.4 MB
    )


def start(stack: Stack, task: str = PLATE) -> dict[str, Any]:
    return episodes.start(stack, task, "cad")


def upload(stack: Stack, ep: dict[str, Any], data: bytes, path: str = OUT) -> None:
    episodes.upload(stack, ep, path, data)


def reference(task: str = PLATE) -> trimesh.Trimesh:
    return trimesh.load(TASKS / task / "tests" / "reference.stl", force="mesh")


def assert_unpaid(rec: dict[str, Any]) -> None:
    assert rec["verifier"]["status"] == "ok" and not rec["exclude_from_loss"], rec["verifier"]
    assert rec["reward"] <= CAP, rec["verifier"]
    assert "private" not in rec["verifier"]["details"]
    # no score that inverts to the reference's geometry (a fourth trial read its volume
    # off the public volume score): the gates only
    assert set(rec["reward_components"]) <= {"gate", "topology", "volume_gate"}


def test_shapes_that_only_fill_the_bounding_box_earn_nothing(stack: Stack) -> None:
    rng = np.random.default_rng(9)
    lo, hi = reference().bounds
    hull = trimesh.convex.convex_hull(np.vstack([lo + rng.random((60, 3)) * (hi - lo), lo, hi]))
    for mesh in (trimesh.creation.box(bounds=[lo, hi]), hull):
        ep = start(stack)
        upload(stack, ep, mesh.export(file_type="stl"))
        rec = verify(stack, ep)
        assert_unpaid(rec)
        assert rec["verifier"]["details"]["gate"].startswith(("topology", "volume"))


def test_the_part_without_a_feature_earns_nothing(stack: Stack) -> None:
    plate = manifold3d.Manifold.cube([80, 50, 6])
    for x, y in ((10, 10), (70, 10), (10, 40)):  # three of the four holes
        plate -= manifold3d.Manifold.cylinder(20, 3, 3, 64).translate([x, y, -5])
    m = plate.to_mesh()
    three = trimesh.Trimesh(vertices=m.vert_properties[:, :3], faces=m.tri_verts)
    ep = start(stack)
    upload(stack, ep, three.export(file_type="stl"))
    rec = verify(stack, ep)
    assert_unpaid(rec)
    assert rec["reward_components"] == {"gate": 1.0, "topology": 0.0}
    assert "genus 3" in rec["verifier"]["details"]["gate"]


@pytest.mark.parametrize(
    "holes",
    [
        [(25, 25), (40, 25), (55, 25), (40, 12)],  # a fourth trial: 0.23 before
        [(12, 12), (72, 12), (12, 42), (72, 42)],  # each 2 mm off in x and in y
    ],
    ids=["elsewhere", "two-mm-off"],
)
def test_the_part_with_its_features_misplaced_earns_nothing(
    stack: Stack, holes: list[tuple[int, int]]
) -> None:
    # The stated envelope with the right hole count passes the gates and keeps most of the
    # IoU; the features are what the task asks for.
    plate = manifold3d.Manifold.cube([80, 50, 6])
    for x, y in holes:
        plate -= manifold3d.Manifold.cylinder(20, 3, 3, 64).translate([x, y, -5])
    m = plate.to_mesh()
    ep = start(stack)
    upload(
        stack,
        ep,
        trimesh.Trimesh(vertices=m.vert_properties[:, :3], faces=m.tri_verts).export(
            file_type="stl"
        ),
    )
    rec = verify(stack, ep)
    assert_unpaid(rec)
    assert rec["reward_components"]["topology"] == 1.0  # it passed the gates
    assert rec["reward"] == 0.0, rec["verifier"]  # core = 0: the surface is wrong


def test_a_wrong_part_cannot_hide_its_surface_from_the_deviation(stack: Stack) -> None:
    # A fourth trial: 4 mm holes for 6 mm, ghost tubes inside the material at the right hole
    # walls and triangles ordered around the known samples: 0.92 before; now the deviation
    # is measured on the solid's boundary with samples only its content decides.
    from tests.redteam import cad_blind

    recs = {}
    for trick in (False, True):
        ep = start(stack)
        upload(stack, ep, cad_blind.build(trick=trick))
        recs[trick] = verify(stack, ep)
        assert_unpaid(recs[trick])
    assert recs[True]["reward"] == recs[False]["reward"]


@pytest.mark.parametrize("missing", [(3,), (0, 1, 2, 3)], ids=["one hole", "four holes"])
def test_a_part_cannot_dilute_the_surface_check_with_its_own_area(
    stack: Stack, missing: tuple[int, ...]
) -> None:
    # Trial 21: holes filled but for a hairline groove at the wall and a pinhole for the
    # genus, and the part's area inflated ~20x by thin cuts under its faces, so its own
    # surface samples missed the filled holes: 0.99 (passed) with one hole missing, 0.73
    # with four. Now the exact depth test (the reference grown and shrunk, booleans)
    # finds the fill, which nothing the part adds can dilute.
    from tests.redteam import cad_laminated

    ep = start(stack)
    upload(stack, ep, cad_laminated.build(missing=missing))
    rec = verify(stack, ep)
    assert_unpaid(rec)
    assert rec["reward_components"]["topology"] == 1.0  # it passed the gates
    assert rec["reward"] == 0.0, rec["verifier"]


def test_a_lidded_hole_with_a_searched_seed_earns_nothing(stack: Stack) -> None:
    # Trial 22: the hole closed by a lid, with a pin and a wall lining that left empty only
    # the band the sampled side probes were drawn from, thin cuts that inflate the area,
    # and a content seed searched offline (shifts of 8e-6 mm) until neither the surface
    # samples nor the side probes saw the lid: 1.0, passed. The exact depth test has no
    # samples to search around.
    from tests.redteam import cad_laminated

    data = cad_laminated.search_seed(cad_laminated.solid(missing=(3,), fill="lid"), reference())
    assert data is not None
    ep = start(stack)
    upload(stack, ep, data)
    rec = verify(stack, ep)
    assert_unpaid(rec)
    assert rec["reward_components"]["topology"] == 1.0  # it passed the gates
    assert rec["reward"] == 0.0, rec["verifier"]


def binary_stl(triangles: np.ndarray, *, declared: int | None = None) -> bytes:
    n = len(triangles) if declared is None else declared
    rows = np.zeros(len(triangles), dtype=[("n", "<f4", 3), ("v", "<f4", (3, 3)), ("a", "<u2")])
    rows["v"] = triangles
    return b"\0" * 80 + struct.pack("<I", n) + rows.tobytes()


def cubes(count: int) -> bytes:
    box = trimesh.creation.box(extents=(1, 1, 1))
    tris = box.triangles
    offsets = np.stack([np.arange(count) * 2.0, np.zeros(count), np.zeros(count)], axis=1)
    return binary_stl((tris[None] + offsets[:, None, None, :]).reshape(-1, 3, 3))


#: Run in the sandbox (python3 + numpy): ``argv[1]`` (a binary STL) is written to
#: ``argv[2]`` with every triangle split in 4, ``argv[3]`` times (the shape is unchanged;
#: shared edges split at identical midpoints, so it stays watertight), or, with ``argv[1]``
#: ``cubes:N``, N disjoint unit cubes. Uploads of the test stack are capped at 1 MiB.
GROW = r"""
import sys, numpy as np
src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = [("n", "<f4", 3), ("v", "<f4", (3, 3)), ("a", "<u2")]
if src.startswith("cubes:"):
    c = np.array([[0,0,0],[1,0,0],[1,1,0],[0,1,0],[0,0,1],[1,0,1],[1,1,1],[0,1,1]], "f4")
    f = [[0,2,1],[0,3,2],[4,5,6],[4,6,7],[0,1,5],[0,5,4],[1,2,6],[1,6,5],[2,3,7],[2,7,6],
         [3,0,4],[3,4,7]]
    k = int(src[6:])
    t = (c[f][None] + (np.arange(k, dtype="f4")[:, None, None, None] * [2, 0, 0])).reshape(-1, 3, 3)
else:
    t = np.fromfile(src, dtype=rows, offset=84)["v"].astype("f8")
    for _ in range(n):
        a, b, c = t[:, 0], t[:, 1], t[:, 2]
        ab, bc, ca = (a + b) / 2, (b + c) / 2, (c + a) / 2
        t = np.concatenate([np.stack(x, 1) for x in ((a, ab, ca), (ab, b, bc), (ca, bc, c),
                                                     (ab, bc, ca))])
out = np.zeros(len(t), dtype=rows)
out["v"] = t
with open(dst, "wb") as fh:
    fh.write(b"\0" * 80 + np.uint32(len(t)).tobytes() + out.tobytes())
"""


def grow_in_sandbox(stack: Stack, ep: dict[str, Any], src: str, times: int = 0) -> None:
    upload(stack, ep, GROW.encode(), "/tmp/grow.py")
    out = run(
        stack.alice,
        ep["sandbox_id"],
        f"mkdir -p /app/out && python3 /tmp/grow.py {src} {OUT} {times}",
    )
    assert out["exit_code"] == 0, out["stderr"]


@pytest.mark.parametrize(
    ("name", "setup", "dodge"),
    [
        ("FIFO", f"mkdir -p /app/out && mkfifo {OUT}", "not_a_file"),
        ("directory", f"mkdir -p {OUT}", "not_a_file"),
        ("symlink loop", f"mkdir -p /app/out && ln -s plate.stl {OUT}", "unreadable_path"),
        (
            "symlink chain",
            f"mkdir -p /app/out && for i in $(seq 1 12); do ln -s l$i /app/out/l$((i-1)); "
            f"done && ln -s l0 {OUT}",
            "link_loop",
        ),  # fmt: skip
        ("device", f"mkdir -p /app/out && ln -s /dev/zero {OUT}", "not_a_file"),
        (
            "huge tree",
            f"mkdir -p {OUT} && head -c 40000000 /dev/urandom > {OUT}/x",
            "file_too_large",
        ),  # fmt: skip
    ],
)
def test_unreadable_outputs_score_zero(
    stack: Stack, name: str, setup: str, dodge: str | None
) -> None:
    ep = start(stack)
    out = run(stack.alice, ep["sandbox_id"], setup)
    assert out["exit_code"] == 0, out["stderr"]
    rec = verify(stack, ep)
    assert_unpaid(rec)
    assert rec["reward"] == 0.0 and rec["verifier"]["details"].get("dodge") == dodge, name


def test_a_link_whose_target_is_not_utf8_scores_zero(stack: Stack) -> None:
    # A trial: the link's target reached the verdict's reason as a lone surrogate, the
    # record refused it and every verify answered 400, so the sample had no record.
    ep = start(stack, "washer")
    episodes.sh(stack, ep, "mkdir -p /app/out && ln -sf /app/$'\\xff' /app/out/washer.obj")
    rec = verify(stack, ep)
    assert_unpaid(rec)
    assert rec["reward"] == 0.0, rec["verifier"]


@pytest.mark.parametrize(
    ("name", "data", "dodge"),
    [
        ("100 cubes", lambda: cubes(100), "too_many_shells"),
        ("NaN corners", lambda: binary_stl(np.full((12, 3, 3), np.nan, dtype=np.float32)), None),
        ("lying header", lambda: binary_stl(np.zeros((2, 3, 3)), declared=1 << 31), None),
        (
            "non-manifold junk",
            lambda: binary_stl(np.random.default_rng(1).random((500, 3, 3))),
            None,
        ),  # fmt: skip
    ],
)
def test_meshes_that_break_measuring_score_zero(
    stack: Stack, name: str, data: Any, dodge: str | None
) -> None:
    ep = start(stack)
    upload(stack, ep, data())
    t0 = time.monotonic()
    rec = verify(stack, ep)
    assert_unpaid(rec)
    assert rec["reward"] == 0.0 and rec["verifier"]["details"].get("dodge") == dodge, name
    assert time.monotonic() - t0 < 30, name


def test_41000_cubes_are_refused_by_the_caps_fast(stack: Stack) -> None:
    ep = start(stack)
    grow_in_sandbox(stack, ep, "cubes:41000")  # 492,000 triangles; took 222 s in-process
    t0 = time.monotonic()
    rec = verify(stack, ep)
    assert_unpaid(rec)
    assert rec["reward"] == 0.0 and rec["verifier"]["details"]["dodge"] == "too_many_triangles"
    assert time.monotonic() - t0 < 30


def test_a_pathological_mesh_is_cut_off_while_the_api_stays_fast(stack: Stack) -> None:
    ep = start(stack, SLOW)
    # the reference split to 67,584 triangles: right topology and volume, ~3 s to measure
    upload(stack, ep, (TASKS / PLATE / "tests" / "reference.stl").read_bytes(), "/tmp/ref.stl")
    grow_in_sandbox(stack, ep, "/tmp/ref.stl", 3)
    worst, done = [0.0], threading.Event()

    def poll() -> None:
        while not done.is_set():
            t0 = time.monotonic()
            assert stack.alice.get("/healthz").status_code == 200
            worst[0] = max(worst[0], time.monotonic() - t0)
            time.sleep(0.05)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        rec = verify(stack, ep)
    finally:
        done.set()
        poller.join()
    assert_unpaid(rec)
    details = rec["verifier"]["details"]
    # cut off by its bounds: the 1 s wall limit, or the worker's memory limit first (which
    # one depends on the machine and the measuring libraries' allocations); on a loaded
    # machine reading and gating the mesh can already take the whole second
    assert rec["reward"] == 0.0, details
    cut_off = ("gate_timeout", "measure_timeout", "measure_memory", "measure_crashed")
    assert details["dodge"] in cut_off, details
    # the stage that was cut off (measuring, or gating when that took the whole second
    # on a loaded machine, as in one local run) ended well inside the bound
    assert all(ms < 10_000 for ms in details["timing_ms"].values()), details["timing_ms"]
    # /healthz took 29 s when measuring ran in the API process; loose for a loaded CI machine
    assert worst[0] < 5.0, worst


def test_a_mesh_that_overflows_the_gate_scores_zero(stack: Stack) -> None:
    """A seventh trial: a closed tetrahedron with a vertex at 1e110 overflowed a float in the
    gate (its scale cubed); the exception, which the verifier did not list, made the verdict
    an error, out of the loss. Whatever the worker raises on the agent's mesh is its 0."""
    ep = start(stack, "washer")
    obj = b"v 0 0 0\nv 1e110 0 0\nv 0 1 0\nv 0 0 1\nf 1 3 2\nf 1 2 4\nf 1 4 3\nf 2 3 4\n"
    upload(stack, ep, obj, "/app/out/washer.obj")
    rec = verify(stack, ep)
    assert_unpaid(rec)
    details = rec["verifier"]["details"]
    assert (rec["reward"], details.get("dodge")) == (0.0, "gate_crashed"), details
