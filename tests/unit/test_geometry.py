"""The CAD verifier's geometric measures, on shapes whose answers are known exactly."""

from __future__ import annotations

import math

import numpy as np
import pytest
import trimesh

from service.verifiers import geometry as g


def cube(side: float = 1.0, at: tuple[float, float, float] = (0.0, 0.0, 0.0)) -> trimesh.Trimesh:
    """An axis-aligned cube with its minimum corner at ``at``."""
    lo = np.asarray(at, dtype=float)
    return trimesh.creation.box(bounds=[lo, lo + side])


def stl(mesh: trimesh.Trimesh) -> bytes:
    return mesh.export(file_type="stl")


# --------------------------------------------------------------------------- volume and bbox


def test_volume_and_bbox_of_known_primitives() -> None:
    box = trimesh.creation.box(bounds=[[0, 0, 0], [80, 50, 6]])
    assert g.volume(box) == pytest.approx(24000.0, rel=1e-12)
    assert g.bounding_box(box).tolist() == [[0, 0, 0], [80, 50, 6]]
    # A regular n-gon prism: area n/2 r^2 sin(2 pi / n) times the height.
    prism = trimesh.creation.cylinder(radius=10, height=30, sections=64)
    expected = 64 / 2 * 100 * math.sin(2 * math.pi / 64) * 30
    assert g.volume(prism) == pytest.approx(expected, rel=1e-12)
    assert g.bounding_box(prism)[:, 2].tolist() == [-15, 15]


def test_overlapping_shells_count_once_and_cavities_subtract() -> None:
    # Two unit cubes joined without a boolean, overlapping by half: the solid is 1.5.
    joined = trimesh.util.concatenate([cube(), cube(at=(0.5, 0, 0))])
    assert joined.volume == pytest.approx(2.0)  # the naive signed volume double counts
    assert g.volume(joined) == pytest.approx(1.5, rel=1e-12)
    # A closed box with an inward-facing inner shell: a hollow box of 3^3 - 1^3.
    inner = cube(at=(1, 1, 1))
    inner.invert()
    hollow = trimesh.util.concatenate([cube(3.0), inner])
    assert g.gate(hollow).reason is None
    assert g.volume(hollow) == pytest.approx(26.0, rel=1e-12)


def test_bbox_deviation_and_relative_volume_error() -> None:
    assert g.bbox_deviation(cube(), cube(at=(0.25, 0, 0))) == pytest.approx(0.25)
    assert g.bbox_deviation(cube(), cube(2.0)) == pytest.approx(1.0)
    assert g.relative_volume_error(110.0, 100.0) == pytest.approx(0.1)
    assert g.relative_volume_error(100.0, 100.0) == 0.0


# --------------------------------------------------------------------------- IoU


def test_iou_of_unit_cubes_offset_by_half_a_side_is_one_third() -> None:
    # intersection 0.5, union 1.5
    assert g.volumetric_iou(cube(), cube(at=(0.5, 0, 0))) == pytest.approx(1 / 3, abs=1e-12)


def test_iou_of_identical_meshes_is_one_and_of_disjoint_is_zero() -> None:
    part = trimesh.creation.cylinder(radius=3, height=7, sections=64)
    assert g.volumetric_iou(part, part.copy()) == 1.0
    assert g.volumetric_iou(cube(), cube(at=(5, 0, 0))) == 0.0


def test_iou_of_nested_cubes_is_their_volume_ratio() -> None:
    assert g.volumetric_iou(cube(2.0), cube(1.0, at=(0.5, 0.5, 0.5))) == pytest.approx(1 / 8)


# --------------------------------------------------------------------------- Chamfer


def test_chamfer_of_identical_meshes_is_zero() -> None:
    part = trimesh.creation.annulus(r_min=6.5, r_max=12, height=2.5, sections=64)
    assert g.chamfer_distance(part, part.copy()) == 0.0


def test_chamfer_is_invariant_to_translation_and_uniform_scale() -> None:
    # Both shapes are normalized to a unit bounding box, and the seeded sampler picks the same
    # faces and barycentric coordinates on a scaled copy: the samples coincide after
    # normalization, so the distance is 0 up to rounding (shape only, CAD-Recode's measure).
    moved = cube().apply_scale(37.5).apply_translation([100.0, -20.0, 3.0])
    assert g.chamfer_distance(cube(), moved) == pytest.approx(0.0, abs=1e-24)


def test_chamfer_is_deterministic_and_orders_shapes() -> None:
    box, flat = cube(), trimesh.creation.box(extents=(1, 1, 0.9))
    cyl = trimesh.creation.cylinder(radius=0.5, height=1, sections=64)
    first = g.chamfer_distance(box, flat)
    assert first == g.chamfer_distance(box, flat)  # fixed seed: same samples every time
    assert 0 < first < g.chamfer_distance(box, cyl)
    # Symmetric by construction (sum of both directions).
    assert g.chamfer_distance(box, cyl) == pytest.approx(g.chamfer_distance(cyl, box), rel=1e-12)


def test_normalize_unit_bbox_is_cad_recode_cube() -> None:
    out = g.normalize_unit_bbox(trimesh.creation.box(bounds=[[10, 0, 0], [30, 5, 2]]))
    expected = [[0.0, 0.375, 0.45], [1.0, 0.625, 0.55]]
    assert np.allclose(out.bounds, expected, rtol=0, atol=1e-12)


def test_retessellation_stays_below_the_full_credit_bound() -> None:
    # The noise floor of the measure: one shape, two tessellations.
    fine = trimesh.creation.cylinder(radius=10, height=30, sections=128)
    coarse = trimesh.creation.cylinder(radius=10, height=30, sections=64)
    assert g.chamfer_distance(fine, coarse) < 1e-3
    assert g.chamfer_distance(cube(), cube().subdivide().subdivide()) < 1e-3


# --------------------------------------------------------------------------- surface deviation


def test_surface_deviation_of_offset_cubes_is_the_offset() -> None:
    # The far face of each cube is 0.25 from the other: the two-sided maximum is exact.
    assert g.surface_deviation(cube(), cube(at=(0.25, 0, 0))) == pytest.approx(0.25, abs=1e-12)
    assert g.surface_deviation(cube(), cube()) == pytest.approx(0.0, abs=1e-12)


def test_surface_deviation_sees_a_missing_hole_that_iou_hardly_sees() -> None:
    plate = trimesh.creation.box(bounds=[[0, 0, 0], [80, 50, 6]])
    hole = trimesh.creation.cylinder(radius=3, height=10, sections=64)
    holed = trimesh.Trimesh(
        *_mesh_arrays(g.solid(plate) - g.solid(hole.apply_translation([10, 10, 3])))
    )
    assert g.volumetric_iou(plate, holed) > 0.99
    # The true deviation is 3 mm (mid-height of the hole wall, 3 mm from both faces); the
    # seeded samples come within a few tenths of it.
    assert 2.5 < g.surface_deviation(plate, holed) <= 3.0


def test_surface_deviation_of_a_retessellated_circle_is_below_its_sagitta() -> None:
    fine = trimesh.creation.cylinder(radius=10, height=30, sections=128)
    coarse = trimesh.creation.cylinder(radius=10, height=30, sections=64)
    assert g.surface_deviation(fine, coarse) <= 10 * (1 - math.cos(math.pi / 64)) + 1e-9


def _mesh_arrays(solid: object) -> tuple[np.ndarray, np.ndarray]:
    out = solid.to_mesh64()  # type: ignore[attr-defined]
    return out.vert_properties[:, :3], out.tri_verts


# --------------------------------------------------------------------------- gate and loading


def test_gate_rejects_an_open_mesh() -> None:
    open_box = cube()
    open_box.update_faces(np.arange(len(open_box.faces)) != 0)  # drop one triangle
    result = g.gate(open_box)
    assert result.reason is not None and "not watertight" in result.reason
    assert "3 edges" in result.reason


def test_gate_flips_an_inside_out_solid() -> None:
    flipped = cube()
    flipped.invert()
    result = g.gate(flipped)
    assert result.reason is None and result.inverted
    assert result.mesh.volume == pytest.approx(1.0)


def test_gate_rejects_inconsistent_winding() -> None:
    bad = cube()
    faces = bad.faces.copy()
    faces[0] = faces[0][::-1]
    bad = trimesh.Trimesh(bad.vertices, faces, process=False)
    assert g.gate(bad).reason == "the mesh's triangles are not consistently wound"


def test_load_mesh_reads_stl_and_obj_and_merges_vertices() -> None:
    mesh = g.load_mesh(stl(cube()), "stl")
    assert (len(mesh.vertices), len(mesh.faces)) == (8, 12)
    obj = cube().export(file_type="obj").encode()
    assert g.volume(g.load_mesh(obj, "obj")) == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("data", "fmt", "message"),
    [
        (b"", "stl", "empty"),
        (b"solid x\nendsolid x\n", "stl", "no triangles"),
        (b"not a mesh at all \x00\x01", "stl", "STL"),
        (b"# nothing\n", "obj", "no triangles"),
    ],
)
def test_load_mesh_rejects_garbage(data: bytes, fmt: g.MeshFormat, message: str) -> None:
    with pytest.raises(g.MeshError, match=message):
        g.load_mesh(data, fmt)


# --------------------------------------------------------------------------- silhouettes


def test_silhouette_iou_on_known_masks() -> None:
    a = np.zeros((4, 4), dtype=bool)
    b = np.zeros((4, 4), dtype=bool)
    a[:, :2] = True  # left half: 8 pixels
    b[:2, :] = True  # top half: 8 pixels; overlap 4, union 12
    assert g.silhouette_iou(a, b) == pytest.approx(1 / 3)
    assert g.silhouette_iou(a, a) == 1.0
    assert g.silhouette_iou(a, ~a) == 0.0
    assert g.silhouette_iou(np.zeros((2, 2), bool), np.zeros((2, 2), bool)) == 1.0
    with pytest.raises(ValueError, match="shapes differ"):
        g.silhouette_iou(a, np.zeros((2, 2), bool))


# --------------------------------------------------------------------------- ramps


def test_ramps() -> None:
    assert g.ramp_up(0.995, full=0.99, zero=0.9) == 1.0
    assert g.ramp_up(0.945, full=0.99, zero=0.9) == pytest.approx(0.5)
    assert g.ramp_up(0.5, full=0.99, zero=0.9) == 0.0
    assert g.ramp_down(0.0, full=0.01, zero=0.1) == 1.0
    assert g.ramp_down(0.055, full=0.01, zero=0.1) == pytest.approx(0.5)
    assert g.ramp_down(0.2, full=0.01, zero=0.1) == 0.0
    # log ramp: halfway in log space between 1e-3 and 1e-1 is 1e-2
    assert g.log_ramp_down(1e-2, full=1e-3, zero=1e-1) == pytest.approx(0.5)
    assert g.log_ramp_down(0.0, full=1e-3, zero=1e-1) == 1.0
    assert g.log_ramp_down(1.0, full=1e-3, zero=1e-1) == 0.0


def test_a_measure_that_is_nan_scores_zero() -> None:
    # Trial 23: min() over the core scores skips a NaN that is not first (min([1.0, nan,
    # 1.0]) == 1.0), so a NaN measure could have counted as full credit.
    nan = float("nan")
    assert g.ramp_up(nan, full=0.99, zero=0.9) == 0.0
    assert g.ramp_down(nan, full=0.01, zero=0.1) == 0.0
    assert g.log_ramp_down(nan, full=1e-3, zero=1e-1) == 0.0
