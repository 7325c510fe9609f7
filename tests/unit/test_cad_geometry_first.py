"""Geometry first, on every bundled CAD task: the reference scores 1.0; a box filling the
bounding box, random solids in it (volume-matched too), and the part without the features
the reference has score at most 0.05 (in practice 0: a gate fails). Measured in-process
(the verifier runs the same functions in its bounded workers), without the render check."""

from __future__ import annotations

from pathlib import Path

import manifold3d
import numpy as np
import pytest
import trimesh

from service.tasks.loader import load_suite
from service.verifiers import cad, cad_offsets

TASKS = {t.id: t for t in load_suite(Path(__file__).resolve().parents[2] / "tasks" / "cad")}
CAP = 0.05


def reward(task_id: str, mesh: trimesh.Trimesh) -> float:
    check = cad.check_for(TASKS[task_id])
    s = check.settings
    ref = cad.load_reference_part(check.reference_path, s.format)
    data = mesh.export(file_type="stl") if s.format == "stl" else mesh.export(file_type="obj")
    gated = cad.gate_output(data if isinstance(data, bytes) else data.encode(), s, ref.volume,
                            ref.topology)  # fmt: skip
    if gated.problem is not None:
        return 0.0
    offsets = cad_offsets.reference_offsets(ref.mesh, s.depth_levels)
    m = cad.measure_arrays(gated.vertices, gated.faces, ref.mesh.vertices, ref.mesh.faces,
                           s.surface_zero_mm, offsets)  # fmt: skip
    return cad.score(m, None, s)[0]


def reference(task_id: str) -> cad.Reference:
    check = cad.check_for(TASKS[task_id])
    return cad.load_reference_part(check.reference_path, check.settings.format)


@pytest.mark.parametrize("task_id", sorted(TASKS))
def test_reference_scores_one_and_bbox_fillers_score_nothing(task_id: str) -> None:
    ref = reference(task_id)
    assert reward(task_id, ref.mesh) == 1.0
    lo, hi = ref.mesh.bounds
    assert reward(task_id, trimesh.creation.box(bounds=[lo, hi])) <= CAP
    rng = np.random.default_rng(len(task_id))
    for _ in range(8):
        hull = trimesh.convex.convex_hull(np.vstack([lo + rng.random((40, 3)) * (hi - lo), lo, hi]))
        assert reward(task_id, hull) <= CAP
        # the same hull scaled about its centre to the reference's volume
        k = (ref.volume / hull.volume) ** (1 / 3)
        centre = hull.bounds.mean(axis=0)
        matched = hull.copy().apply_translation(-centre).apply_scale(k).apply_translation(centre)
        assert reward(task_id, matched) <= CAP


def test_the_plate_without_its_holes_scores_nothing() -> None:
    assert reward("plate-four-holes", trimesh.creation.box(bounds=[[0, 0, 0], [80, 50, 6]])) == 0
    plate = manifold3d.Manifold.cube([80, 50, 6])
    for x, y in ((10, 10), (70, 10), (10, 40)):  # three of the four holes
        plate -= manifold3d.Manifold.cylinder(20, 3, 3, 64).translate([x, y, -5])
    m = plate.to_mesh()
    three = trimesh.Trimesh(vertices=m.vert_properties[:, :3], faces=m.tri_verts)
    assert reward("plate-four-holes", three) <= CAP
