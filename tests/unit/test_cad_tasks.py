"""The bundled CAD tasks: every one loads, names a valid reference, and its reference is the
part its instruction describes.

Each part is rebuilt here from the instruction's numbers alone with manifold3d (an
independent CAD kernel, not Blender), and must match the committed reference (which
``tasks/cad/_tools/make_references.py`` made by running the Blender oracle): volumetric IoU
above 0.99999, and the full verifier score (render check aside) exactly 1.0.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import manifold3d as m3
import numpy as np
import pytest
import trimesh

from service.tasks.loader import load_suite
from service.verifiers import cad, geometry

SUITE = load_suite(Path(__file__).resolve().parents[2] / "tasks" / "cad")
TASKS = {t.id: t for t in SUITE}


def circle(cx: float, cy: float, r: float, n: int = 64) -> list[tuple[float, float]]:
    return [
        (cx + r * math.cos(2 * math.pi * k / n), cy + r * math.sin(2 * math.pi * k / n))
        for k in range(n)
    ]


def rect(x0: float, y0: float, x1: float, y1: float) -> list[tuple[float, float]]:
    return [(x0, y0), (x1, y0), (x1, y1), (x0, y1)]


def prism(outline: list[tuple[float, float]], z0: float, z1: float) -> m3.Manifold:
    return m3.Manifold.extrude(m3.CrossSection([outline]), z1 - z0).translate((0, 0, z0))


def along_x(part: m3.Manifold) -> m3.Manifold:
    """A part built along Z, turned so that (x, y, z) -> (z, x, y)."""
    return part.transform(np.array([[0, 0, 1, 0], [1, 0, 0, 0], [0, 1, 0, 0]], dtype=float))


def plate_four_holes() -> m3.Manifold:
    part = prism(rect(0, 0, 80, 50), 0, 6)
    for x, y in [(10, 10), (70, 10), (10, 40), (70, 40)]:
        part -= prism(circle(x, y, 3), -1, 7)
    return part


def l_bracket() -> m3.Manifold:
    part = prism(rect(0, 0, 60, 40), 0, 5) + prism(rect(0, 0, 5, 40), 0, 50)
    return part - prism(circle(35, 20, 4), -1, 6) - along_x(prism(circle(20, 30, 4), -1, 6))


def stepped_shaft() -> m3.Manifold:
    sections = [(10, 0, 30), (7, 30, 55), (5, 55, 70)]
    return m3.Manifold.batch_boolean(
        [prism(circle(0, 0, r), z0, z1) for r, z0, z1 in sections], m3.OpType.Add
    )


def open_top_box() -> m3.Manifold:
    return prism(rect(-30, -20, 30, 20), 0, 30) - prism(rect(-27, -17, 27, 17), 3, 31)


def washer() -> m3.Manifold:
    return prism(circle(0, 0, 12), 0, 2.5) - prism(circle(0, 0, 6.5), -1, 3.5)


def bolted_flange() -> m3.Manifold:
    part = prism(circle(0, 0, 50), 0, 12) + prism(circle(0, 0, 30), 12, 30)
    part -= prism(circle(0, 0, 20), -1, 31)
    for k in range(6):
        a = math.radians(60 * k)
        part -= prism(circle(40 * math.cos(a), 40 * math.sin(a), 4.5), -1, 13)
    return part


def t_slot_block() -> m3.Manifold:
    part = prism(rect(0, -30, 100, 30), 0, 40)
    part -= along_x(prism(rect(-6, 28, 6, 41), -1, 101))
    return part - along_x(prism(rect(-12, 18, 12, 28), -1, 101))


def counterbored_plate() -> m3.Manifold:
    part = prism(rect(0, 0, 60, 60), 0, 12)
    for x, y in [(15, 15), (45, 15), (15, 45), (45, 45)]:
        part -= prism(circle(x, y, 3.3), -1, 13) + prism(circle(x, y, 5.5), 5.5, 13)
    return part


def pin_grid() -> m3.Manifold:
    pins = [prism(circle(x, y, 3), 5, 15) for x in (10, 30, 50, 70, 90) for y in (10, 30, 50)]
    return m3.Manifold.batch_boolean([prism(rect(0, 0, 100, 60), 0, 5), *pins], m3.OpType.Add)


def hex_standoff() -> m3.Manifold:
    r = 10 / math.sqrt(3)
    corners = [
        (r * math.cos(math.radians(30 + 60 * k)), r * math.sin(math.radians(30 + 60 * k)))
        for k in range(6)
    ]
    return prism(corners, 0, 20) - prism(circle(0, 0, 2.5), -1, 21)


def obround(x0: float, x1: float, r: float, z0: float, z1: float) -> m3.Manifold:
    ends = prism(circle(x0, 0, r), z0, z1) + prism(circle(x1, 0, r), z0, z1)
    return ends + prism(rect(x0, -r, x1, r), z0, z1)


def slotted_link() -> m3.Manifold:
    part = obround(0, 60, 10, 0, 5)
    part -= prism(circle(0, 0, 4), -1, 6) + prism(circle(60, 0, 4), -1, 6)
    return part - obround(20, 40, 3, -1, 6)


def u_channel() -> m3.Manifold:
    part = prism(rect(0, -20, 120, 20), 0, 30) - prism(rect(-1, -16, 121, 16), 4, 31)
    return part - prism(circle(30, 0, 3), -1, 5) - prism(circle(90, 0, 3), -1, 5)


FROM_SPEC: dict[str, Callable[[], m3.Manifold]] = {
    "plate-four-holes": plate_four_holes,
    "l-bracket": l_bracket,
    "stepped-shaft": stepped_shaft,
    "open-top-box": open_top_box,
    "washer": washer,
    "bolted-flange": bolted_flange,
    "t-slot-block": t_slot_block,
    "counterbored-plate": counterbored_plate,
    "pin-grid": pin_grid,
    "hex-standoff": hex_standoff,
    "slotted-link": slotted_link,
    "u-channel": u_channel,
}


def test_suite_has_at_least_ten_cad_tasks_and_each_is_rebuilt_here() -> None:
    assert len(SUITE) >= 10 and SUITE.errors == ()
    assert set(TASKS) == set(FROM_SPEC)


@pytest.mark.parametrize("task_id", sorted(TASKS))
def test_task_is_well_formed(task_id: str) -> None:
    task = TASKS[task_id]
    assert (task.domain, task.verifier) == ("cad", "cad")
    check = cad.check_for(task)
    assert check.reference_path.is_file()
    assert task.solution_path is not None and task.solution_path.is_file()
    assert check.settings.output in task.instruction
    assert not (task.path / "environment" / "reference.stl").exists()
    reference = cad.load_reference(check.reference_path, check.settings.format)
    assert geometry.volume(reference) > 0


@pytest.mark.parametrize("task_id", sorted(FROM_SPEC))
def test_reference_is_the_part_the_instruction_describes(task_id: str) -> None:
    check = cad.check_for(TASKS[task_id])
    reference = cad.load_reference(check.reference_path, check.settings.format)
    out = FROM_SPEC[task_id]().to_mesh64()
    rebuilt = trimesh.Trimesh(out.vert_properties[:, :3], out.tri_verts)
    assert geometry.volumetric_iou(rebuilt, reference) > 0.99999
    m = cad.measure(rebuilt, reference)
    # STL stores float32, OBJ 6 decimals: agreement to about 1e-7
    assert m.volume_rel_error < 1e-6 and m.bbox_deviation_mm < 1e-5
    reward, components = cad.score(m, None, check.settings)
    assert reward == 1.0, components
