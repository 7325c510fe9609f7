"""Geometric measures of the CAD verifier: mesh loading, the "must build" gate, volume,
bounding box, volumetric IoU, Chamfer distance, silhouette IoU, and the ramps that map a
measure onto a score in [0, 1].

Everything here is pure (no engine, no files): bytes or arrays in, numbers out. Lengths are
in the mesh's own units (millimetres for the bundled tasks), volumes in cubic units.

Definitions:

* **volume**: the volume of the solid (``manifold3d``), after overlapping shells are merged
  (see ``solid``). A solid whose triangles all face inwards is turned the right way out.
* **bounding box**: axis-aligned ``[min, max]`` corners; ``bbox_deviation`` is the largest
  absolute difference of the six bounds (placement counts).
* **volumetric IoU**: ``vol(A ∩ B) / vol(A ∪ B)`` with exact mesh booleans (``manifold3d``),
  in absolute coordinates (placement counts). Two unit cubes offset by half a side: 1/3.
* **Chamfer distance**, as CAD-Recode computes it (Rukhovich et al. 2024,
  arXiv:2412.14042; the evaluation of github.com/filaPro/cad-recode): each mesh is
  normalized on its own to a unit bounding box (centred on its bounding-box centre, scaled
  by ``1 / max(extent)``, moved to the cube ``[0, 1]``), ``n_points`` (8192) points are
  sampled on each surface with ``trimesh.sample.sample_surface(..., seed=0)``, and the
  distance is ``mean(d(a, B)^2) + mean(d(b, A)^2)`` (nearest neighbours by KD-tree). It is
  therefore invariant to translation and uniform scale (shape only); CAD-Recode reports it
  multiplied by 1000. Identical meshes give exactly 0 (identical samples).
* **surface deviation** (a two-sided Hausdorff distance estimate, mesh units):
  ``n_points`` (2048) points are sampled on each surface (``sample_surface``) and the exact
  distance from each to the other surface is taken (``trimesh.proximity``); the measure is
  the largest of them, both ways. A part is measured on the boundary of the solid it
  bounds (``boundary``: shells inside its material are gone), sampled with a seed drawn
  from its own content (``content_seed``); the reference with seed 0. (A fourth trial hid
  a wrong part's true surface from seeded samples: closed "ghost" tubes inside the
  material at the reference's hole walls, and triangles ordered so that no sample of the
  known seed fell on the wrong surfaces. Any change to the mesh now draws other samples.)
  Unlike the Chamfer distance it is absolute and
  local: a missing 6 mm hole or a feature 2 mm off shows as 3 mm or 2 mm, however small
  the feature is against the part, while re-tessellating a circle of radius r with n >= 64
  segments moves it by at most the sagitta r (1 - cos(pi / n)) (0.012 mm at r = 10).
  It is never smaller than ``bbox_deviation``.
* **wrong depth** (exact, mesh units): the reference is grown and shrunk by a level
  ``t`` (Minkowski sum and difference with a polyhedral ball that contains the sphere of
  radius ``t``; ``offset``), and the part is wrong beyond ``t`` when any of its material
  lies outside the grown reference or any of the shrunk reference lies outside the part
  (``wrong_beyond``: two exact booleans, emptiness tested, nothing sampled). The measure is
  the smallest of a few levels the part is not wrong beyond (``wrong_depth``), ``inf``
  when it is wrong beyond them all. What the part adds elsewhere cannot dilute it and no
  wrong feature is too thin or too small for it: an honest re-tessellation (32 to 128
  segments for the reference's 64) is within 0.1 mm, a 6 mm hole closed by a 100 nm
  membrane is wrong beyond 0.55 mm. (Two trials beat the sampled measures it replaces: a
  hole filled but for a hairline groove at its wall and a pinhole, with thin cuts that
  inflated the part's area so its surface samples missed the fill, scored 0.99; a hole
  closed by a lid with a pin and a wall lining that left empty only the band the
  "side" probes were drawn from, with a content seed searched offline so no surface
  sample fell on the lid, scored 1.0.)
* **silhouette IoU**: ``|A ∧ B| / |A ∨ B|`` of two boolean masks (1.0 when both are empty).
* **topology** of a solid: its number of connected components and its genus (the number of
  through-holes, handles), from the Euler characteristic of each closed component,
  ``chi = V - E + F = 2 - 2g`` (manifold3d's ``decompose`` and ``genus``), after
  overlapping shells are merged (``solid``). A plate with four through-holes: one
  component of genus 4; the same plate without them: genus 0.
"""

from __future__ import annotations

import hashlib
import io
import math
from dataclasses import dataclass
from typing import Literal

import manifold3d
import numpy as np
import trimesh
from scipy.spatial import cKDTree

MeshFormat = Literal["stl", "obj"]

#: Points sampled on each surface for the Chamfer distance (CAD-Recode uses 8192).
CHAMFER_POINTS = 8192
#: Seed of the surface sampling (fixed, so a measure is a function of the meshes only).
CHAMFER_SEED = 0
#: Points sampled on each surface for the surface deviation.
DEVIATION_POINTS = 2048


class MeshError(ValueError):
    """A file that does not parse as a mesh of the stated format, or has no triangles."""


@dataclass(frozen=True, kw_only=True)
class GateResult:
    """The "must build" gate: ``reason`` is None when the mesh is a closed solid.

    ``mesh`` is the mesh to measure (turned right way out when ``inverted``).
    """

    mesh: trimesh.Trimesh
    reason: str | None
    inverted: bool = False


# --------------------------------------------------------------------------- loading and the gate


def load_mesh(data: bytes, fmt: MeshFormat) -> trimesh.Trimesh:
    """Parse ``data`` as an STL (binary or ASCII) or OBJ file into one triangle mesh.

    Vertices at identical positions are merged (STL stores every triangle on its own); an
    OBJ with several objects becomes one mesh. Raises ``MeshError`` when the bytes do not
    parse or hold no triangles.
    """
    if not data:
        raise MeshError("the file is empty")
    try:
        loaded = trimesh.load(io.BytesIO(data), file_type=fmt, force="mesh", process=True)
    except Exception as e:  # trimesh raises many types for malformed files
        raise MeshError(f"not a valid {fmt.upper()} file: {type(e).__name__}: {e}") from None
    if not isinstance(loaded, trimesh.Trimesh) or len(loaded.faces) == 0:
        raise MeshError(f"the {fmt.upper()} file holds no triangles")
    if not np.isfinite(loaded.vertices).all():
        raise MeshError("the mesh has non-finite vertex coordinates")
    return loaded


def gate(mesh: trimesh.Trimesh) -> GateResult:
    """Check that ``mesh`` is a closed solid: watertight (every edge shared by exactly two
    triangles), consistently wound, with non-zero volume.

    A mesh whose winding is consistent but inside-out (negative signed volume) is flipped
    and passes (``inverted``); orientation is an export detail, not geometry.
    """
    if not mesh.is_watertight:
        open_edges = _boundary_edge_count(mesh)
        return GateResult(
            mesh=mesh,
            reason=f"the mesh is not watertight ({open_edges} edges are not shared by "
            "exactly two triangles)",
        )
    if not mesh.is_winding_consistent:
        return GateResult(mesh=mesh, reason="the mesh's triangles are not consistently wound")
    volume = float(mesh.volume)
    if not math.isfinite(volume) or abs(volume) <= 1e-12 * max(1.0, mesh.scale**3):
        return GateResult(mesh=mesh, reason="the mesh encloses no volume")
    if volume < 0:
        flipped = mesh.copy()
        flipped.invert()
        return GateResult(mesh=flipped, reason=None, inverted=True)
    return GateResult(mesh=mesh, reason=None)


def _boundary_edge_count(mesh: trimesh.Trimesh) -> int:
    edges = mesh.edges_sorted
    _, counts = np.unique(edges, axis=0, return_counts=True)
    return int((counts != 2).sum())


# --------------------------------------------------------------------------- solids and volume


def solid(mesh: trimesh.Trimesh) -> manifold3d.Manifold:
    """The solid a gated mesh bounds, as a ``manifold3d.Manifold``.

    When every connected shell faces outwards, the shells are united, so overlapping parts
    (objects joined without a boolean) count once. A mesh with inward-facing shells (cavities)
    is taken as a whole. Raises ``MeshError`` when manifold3d rejects the mesh.
    """
    shells = mesh.split(only_watertight=False)
    if len(shells) > 1 and all(float(s.volume) > 0 for s in shells):
        parts = [_manifold(s) for s in shells]
        return manifold3d.Manifold.batch_boolean(parts, manifold3d.OpType.Add)
    return _manifold(mesh)


def _manifold(mesh: trimesh.Trimesh) -> manifold3d.Manifold:
    m = manifold3d.Manifold(
        manifold3d.Mesh64(
            vert_properties=np.require(mesh.vertices, np.float64, ["C", "W"]),
            tri_verts=np.require(mesh.faces, np.uint64, ["C", "W"]),
        )
    )
    status = m.status()
    if status != manifold3d.Error.NoError:
        raise MeshError(f"not a manifold solid (manifold3d: {status.name})")
    return m


@dataclass(frozen=True, kw_only=True)
class Topology:
    """``components`` (connected pieces of the solid) and ``genus`` (their summed genus:
    through-holes and handles)."""

    components: int
    genus: int


def topology(mesh: trimesh.Trimesh) -> Topology:
    """The topology of the solid a gated ``mesh`` bounds (module docstring). Raises
    ``MeshError`` when manifold3d rejects the mesh."""
    parts = solid(mesh).decompose()
    return Topology(components=len(parts), genus=sum(int(p.genus()) for p in parts))


def volume(mesh: trimesh.Trimesh) -> float:
    """The volume of the solid ``mesh`` bounds (cubic mesh units); see ``solid``."""
    return float(solid(mesh).volume())


def bounding_box(mesh: trimesh.Trimesh) -> np.ndarray:
    """``[[xmin, ymin, zmin], [xmax, ymax, zmax]]`` in mesh units."""
    return np.asarray(mesh.bounds, dtype=np.float64)


def bbox_deviation(a: trimesh.Trimesh, b: trimesh.Trimesh) -> float:
    """The largest absolute difference between the six bounds of ``a`` and ``b`` (mesh units)."""
    return float(np.max(np.abs(bounding_box(a) - bounding_box(b))))


def relative_volume_error(result: float, reference: float) -> float:
    """``|result - reference| / reference`` (``reference`` must be positive)."""
    return abs(result - reference) / reference


# --------------------------------------------------------------------------- IoU and Chamfer


def volumetric_iou(a: trimesh.Trimesh, b: trimesh.Trimesh) -> float:
    """``vol(A ∩ B) / vol(A ∪ B)`` of the solids, exact (manifold3d booleans), in absolute
    coordinates. 1.0 for identical solids, 0.0 for disjoint ones."""
    sa, sb = solid(a), solid(b)
    inter = float((sa ^ sb).volume())
    union = float((sa + sb).volume())
    if union <= 0:
        return 0.0
    return min(1.0, max(0.0, inter / union))


def normalize_unit_bbox(mesh: trimesh.Trimesh) -> trimesh.Trimesh:
    """A copy of ``mesh`` centred in the cube ``[0, 1]^3`` with its largest extent 1
    (CAD-Recode's normalization: translate by the bounding-box centre, scale by
    ``1 / max(extent)``, translate by 0.5)."""
    out = mesh.copy()
    lo, hi = out.bounds
    out.apply_translation(-(lo + hi) / 2.0)
    out.apply_scale(1.0 / float(np.max(hi - lo)))
    out.apply_translation([0.5, 0.5, 0.5])
    return out


def chamfer_distance(
    a: trimesh.Trimesh,
    b: trimesh.Trimesh,
    *,
    n_points: int = CHAMFER_POINTS,
    seed: int = CHAMFER_SEED,
) -> float:
    """CAD-Recode's Chamfer distance between the surfaces of ``a`` and ``b`` (module
    docstring): squared distances in the normalized unit cube, summed both ways."""
    pa, _ = trimesh.sample.sample_surface(normalize_unit_bbox(a), n_points, seed=seed)
    pb, _ = trimesh.sample.sample_surface(normalize_unit_bbox(b), n_points, seed=seed)
    da, _ = cKDTree(pb).query(pa, k=1)
    db, _ = cKDTree(pa).query(pb, k=1)
    return float(np.mean(np.square(da)) + np.mean(np.square(db)))


def boundary(mesh: trimesh.Trimesh) -> trimesh.Trimesh:
    """The surface of the solid a gated ``mesh`` bounds (``solid``): shells inside another
    shell's material, which add nothing to the solid, are not on it. Raises ``MeshError``."""
    out = solid(mesh).to_mesh()
    return trimesh.Trimesh(
        vertices=np.asarray(out.vert_properties[:, :3], dtype=np.float64),
        faces=np.asarray(out.tri_verts, dtype=np.int64),
        process=False,
    )


def content_seed(mesh: trimesh.Trimesh) -> int:
    """A sampling seed that is a function of ``mesh``'s vertices and faces (SHA-256): the
    same mesh is measured the same way, and a mesh cannot be shaped to a seed known in
    advance (every change to it draws another)."""
    digest = hashlib.sha256()
    digest.update(np.ascontiguousarray(mesh.vertices, dtype=np.float64).tobytes())
    digest.update(np.ascontiguousarray(mesh.faces, dtype=np.int64).tobytes())
    return int.from_bytes(digest.digest()[:8], "little")


def surface_deviation(
    a: trimesh.Trimesh,
    b: trimesh.Trimesh,
    *,
    n_points: int = DEVIATION_POINTS,
    seed: int = CHAMFER_SEED,
    a_seed: int | None = None,
) -> float:
    """The two-sided surface deviation of ``a`` and ``b`` in mesh units (module docstring):
    the largest exact point-to-surface distance of seeded surface samples, both ways.
    ``a_seed`` samples ``a`` (default ``seed``, which samples ``b``)."""
    worst = 0.0
    for src, dst, src_seed in ((a, b, seed if a_seed is None else a_seed), (b, a, seed)):
        points, _ = trimesh.sample.sample_surface(src, n_points, seed=src_seed)
        _, distances, _ = trimesh.proximity.closest_point(dst, points)
        far = float(np.max(distances))
        worst = math.inf if math.isnan(far) else max(worst, far)  # NaN: not measured, worst
    return worst


# --------------------------------------------------------------------------- depth of what is wrong


def ball(radius: float) -> manifold3d.Manifold:
    """A polyhedral ball that contains the sphere of ``radius`` (mesh units) and reaches at
    most ``BALL_REACH`` times ``radius`` from its centre: manifold3d's geodesic sphere of
    ``BALL_SEGMENTS`` segments, scaled so its faces lie ``radius`` away at the nearest."""
    return manifold3d.Manifold.sphere(radius * BALL_REACH, BALL_SEGMENTS)


def _ball_reach() -> float:
    unit = manifold3d.Manifold.sphere(1.0, BALL_SEGMENTS).to_mesh64()
    v = np.asarray(unit.vert_properties[:, :3], dtype=np.float64)
    f = np.asarray(unit.tri_verts, dtype=np.int64)
    normals = np.cross(v[f[:, 1]] - v[f[:, 0]], v[f[:, 2]] - v[f[:, 0]])
    normals /= np.linalg.norm(normals, axis=1)[:, None]
    return 1.0 / float(np.min(np.abs(np.einsum("ij,ij->i", normals, v[f[:, 0]]))))


#: Circular segments of the ball that grows and shrinks the reference (18 vertices).
BALL_SEGMENTS = 8
#: How far the ball reaches against the radius it contains (about 1.22 at 8 segments).
BALL_REACH = _ball_reach()

#: A solid as arrays: ``(vertices (n, 3) float64, faces (m, 3) int64)``.
SolidArrays = tuple[np.ndarray, np.ndarray]


@dataclass(frozen=True, kw_only=True)
class Offset:
    """The reference grown and shrunk by ``level`` (mesh units): ``grown`` holds every
    point within ``level`` of its material, ``shrunk`` its material deeper than ``level``
    (both up to ``BALL_REACH`` times ``level``; ``offset``)."""

    level: float
    grown: SolidArrays
    shrunk: SolidArrays


def _arrays(m: manifold3d.Manifold) -> SolidArrays:
    out = m.to_mesh64()
    return (
        np.asarray(out.vert_properties[:, :3], dtype=np.float64),
        np.asarray(out.tri_verts, dtype=np.int64),
    )


def _from_arrays(arrays: SolidArrays) -> manifold3d.Manifold:
    vertices, faces = arrays
    if len(faces) == 0:
        return manifold3d.Manifold()
    return manifold3d.Manifold(
        manifold3d.Mesh64(
            vert_properties=np.require(vertices, np.float64, ["C", "W"]),
            tri_verts=np.require(faces, np.uint64, ["C", "W"]),
        )
    )


def offset(reference: trimesh.Trimesh, level: float) -> Offset:
    """``reference``'s solid grown and shrunk by ``level`` > 0: the Minkowski sum and
    difference with ``ball(level)`` (manifold3d; exact for that polyhedral ball). It costs
    seconds for a few thousand triangles (about 2 ms per reference triangle each way), so
    the verifier computes it once per reference and keeps it."""
    if not level > 0:
        raise ValueError(f"level must be positive, not {level}")
    b, tool = solid(reference), ball(level)
    return Offset(
        level=level,
        grown=_arrays(_without_stray_shells(b.minkowski_sum(tool))),
        shrunk=_arrays(_without_stray_shells(b.minkowski_difference(tool))),
    )


def _without_stray_shells(m: manifold3d.Manifold) -> manifold3d.Manifold:
    """``m`` without the inside-out shells that bound no cavity of its own material.

    manifold3d's Minkowski operations can leave such a shell (a trial found one of 0.004
    mm^3, 0.003 to 0.06 mm inside ``slotted-link``'s bottom face, in the reference shrunk
    by 0.1 mm): the booleans then count it as shrunk material, so an honest part 5 um off
    that face was wrong beyond 0.1 mm. A shell of negative volume is a cavity when it lies
    inside the shells of positive volume, and is cut from them; any other is dropped. A
    positive shell inside a cavity (an island) stays. One level of nesting.
    """
    parts = m.decompose()
    if all(p.volume() >= 0 for p in parts):
        return m
    solids = [p for p in parts if p.volume() >= 0]
    outer = manifold3d.Manifold.batch_boolean(solids, manifold3d.OpType.Add)
    cavities = []
    for p in parts:
        if p.volume() < 0:
            v, f = _arrays(p)
            cavity = _from_arrays((v, f[:, ::-1]))  # the shell the right way out
            if (cavity - outer).is_empty():
                cavities.append(cavity)
    if not cavities:
        return outer
    hollow = manifold3d.Manifold.batch_boolean(cavities, manifold3d.OpType.Add)
    islands = [p for p in solids if (p - hollow).is_empty()]
    return manifold3d.Manifold.batch_boolean([outer - hollow, *islands], manifold3d.OpType.Add)


def wrong_beyond(part: manifold3d.Manifold, at: Offset) -> bool:
    """Whether the ``part`` solid puts material farther than ``at.level`` outside the
    reference, or leaves empty reference material deeper than ``at.level``: exact booleans
    (``part - grown``, ``shrunk - part``), nothing sampled, so nothing the part adds
    elsewhere dilutes it and no feature is too thin for it (a 100 nm membrane across a
    hole shows)."""
    return (
        not (part - _from_arrays(at.grown)).is_empty()
        or not (_from_arrays(at.shrunk) - part).is_empty()
    )


def wrong_depth(part: trimesh.Trimesh, offsets: list[Offset]) -> float:
    """The smallest of the ``offsets``' levels within which every difference between the
    gated ``part`` and the reference lies (``wrong_beyond`` is False), or ``inf`` when none
    is: how deep the part's wrong material reaches, rounded up to a level (mesh units)."""
    solid_part = solid(part)
    for at in sorted(offsets, key=lambda o: o.level):
        if not wrong_beyond(solid_part, at):
            return at.level
    return math.inf


# --------------------------------------------------------------------------- silhouettes


def silhouette_iou(a: np.ndarray, b: np.ndarray) -> float:
    """``|A ∧ B| / |A ∨ B|`` of two boolean masks of one shape (1.0 when both are empty)."""
    a, b = np.asarray(a, dtype=bool), np.asarray(b, dtype=bool)
    if a.shape != b.shape:
        raise ValueError(f"mask shapes differ: {a.shape} vs {b.shape}")
    union = int(np.logical_or(a, b).sum())
    if union == 0:
        return 1.0
    return int(np.logical_and(a, b).sum()) / union


# --------------------------------------------------------------------------- scores


def ramp_up(value: float, *, full: float, zero: float) -> float:
    """Score of a measure where more is better: 1 at ``value >= full``, 0 at
    ``value <= zero`` or NaN, linear between (``zero < full``)."""
    if math.isnan(value):
        return 0.0
    if value >= full:
        return 1.0
    if value <= zero:
        return 0.0
    return (value - zero) / (full - zero)


def ramp_down(value: float, *, full: float, zero: float) -> float:
    """Score of an error where less is better: 1 at ``value <= full``, 0 at
    ``value >= zero`` or NaN, linear between (``full < zero``)."""
    if math.isnan(value):
        return 0.0
    if value <= full:
        return 1.0
    if value >= zero:
        return 0.0
    return (zero - value) / (zero - full)


def log_ramp_down(value: float, *, full: float, zero: float) -> float:
    """``ramp_down`` on a log scale (for errors that span decades, like the Chamfer
    distance): 1 at ``value <= full``, 0 at ``value >= zero`` or NaN, linear in
    ``log(value)``."""
    if math.isnan(value):
        return 0.0
    if value <= full:
        return 1.0
    if value >= zero:
        return 0.0
    return math.log(zero / value) / math.log(zero / full)
