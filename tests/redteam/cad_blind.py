"""A wrong plate built to blind the surface deviation (a fourth trial): the plate of
``plate-four-holes`` with 4 mm holes instead of 6 mm, closed "ghost" tubes inside its
material at the reference's hole walls (the reference's samples then find a surface near
them), and its triangles ordered so that no seed-0 sample of the part falls on its own
wrong surfaces. ``build(trick=False)`` is the same wrong plate, plain."""

from __future__ import annotations

import manifold3d as mf
import numpy as np
import trimesh

from service.verifiers import geometry

HOLES = [(10, 10), (70, 10), (10, 40), (70, 40)]
R_WRONG, R_RIGHT = 2.0, 3.0
SAMPLES = 2048


def _mesh(m: mf.Manifold) -> trimesh.Trimesh:
    out = m.to_mesh()
    return trimesh.Trimesh(vertices=out.vert_properties[:, :3], faces=out.tri_verts, process=False)


def _plate(r: float) -> mf.Manifold:
    p = mf.Manifold.cube([80, 50, 6])
    for x, y in HOLES:
        p -= mf.Manifold.cylinder(20, r, r, 64).translate([x, y, -5])
    return p


def _ghost(x: float, y: float) -> mf.Manifold:
    outer = mf.Manifold.cylinder(5.998, 3.05, 3.05, 128)
    inner = mf.Manifold.cylinder(8, 3.001, 3.001, 128).translate([0, 0, -1])
    return (outer - inner).translate([x, y, 0.001])


def build(*, trick: bool) -> bytes:
    """The STL bytes of the wrong plate, blinded (``trick``) or plain."""
    plate = _plate(R_WRONG)
    if not trick:
        return _mesh(plate).export(file_type="stl")
    parts = [_mesh(p.refine_to_length(1.0)) for p in [plate, *(_ghost(x, y) for x, y in HOLES)]]
    loaded = geometry.load_mesh(trimesh.util.concatenate(parts).export(file_type="stl"), "stl")
    tri = loaded.triangles
    near = np.full(tri.shape[:-1], np.inf)
    for x, y in HOLES:
        near = np.minimum(near, np.hypot(tri[..., 0] - x, tri[..., 1] - y))
    bad = near.min(axis=1) < R_RIGHT - 1e-6  # a corner where the reference has air
    area = loaded.area_faces
    total = area.sum()
    picks = np.sort(np.random.default_rng(0).random(SAMPLES) * total)
    good, pool = list(np.where(~bad)[0]), sorted(np.where(bad)[0], key=lambda i: -area[i])
    biggest = area[good].max()
    gaps = np.diff(np.concatenate([picks, [total]]))
    placed: dict[int, list[int]] = {}
    for k in np.argsort(-gaps):  # pack the wrong faces into the widest gaps between picks
        room, take, rest, used = gaps[k] - 3 * biggest, [], [], 0.0
        if room <= 0 or not pool:
            break
        for i in pool:
            if used + area[i] <= room:
                take.append(i)
                used += area[i]
            else:
                rest.append(i)
        pool = rest
        placed[int(k)] = take
    assert not pool, "the wrong faces did not fit between the samples"
    order: list[int] = []
    at, g = 0.0, 0
    for k in sorted(placed):
        while at < picks[k] and g < len(good):
            order.append(good[g])
            at += area[good[g]]
            g += 1
        for i in placed[k]:
            order.append(i)
            at += area[i]
    order += good[g:]
    mesh = trimesh.Trimesh(vertices=loaded.vertices, faces=loaded.faces[order], process=False)
    return mesh.export(file_type="stl")
