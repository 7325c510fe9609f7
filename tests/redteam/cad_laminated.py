"""A plate built to dilute the surface deviation (trial 21): ``plate-four-holes`` with some
holes filled but for a hairline annular groove at the reference's hole wall (the
reference's samples there find a surface near them) and a 40 um pinhole through the plug
(the genus stays 4), plus thin blind cuts just under the faces that inflate the part's
area about 20 times, so the part's own area-weighted samples almost never fall on the
filled holes' caps. No seed search: 10 of 12 such variants passed before. It scored 0.99
(``passed``) with one hole missing, 0.73 with all four."""

from __future__ import annotations

import manifold3d as mf
import numpy as np
import trimesh

HOLES = [(10, 10), (70, 10), (10, 40), (70, 40)]


def build(*, missing: tuple[int, ...], cuts: int = 60, spacing: float = 0.0013) -> bytes:
    """The STL bytes of the plate with the holes at the indices ``missing`` (into
    ``HOLES``) filled as above, ``cuts`` thin cuts under each face ``spacing`` mm apart."""
    groove, pin, thick = 0.01, 0.02, 0.0004
    removed = []
    for i, (x, y) in enumerate(HOLES):
        if i in missing:
            ring = mf.Manifold.cylinder(6.1, 3 + groove / 2, 3 + groove / 2, 64) - (
                mf.Manifold.cylinder(6.3, 3 - groove / 2, 3 - groove / 2, 64).translate(
                    [0, 0, -0.1]
                )
            )
            removed.append(ring.translate([x, y, 0.01]))
            removed.append(mf.Manifold.cylinder(8, pin, pin, 8).translate([x, y, -1]))
        else:
            removed.append(mf.Manifold.cylinder(8, 3, 3, 64).translate([x, y, -1]))
    for k in range(cuts):
        d = 0.003 + k * spacing
        removed.append(mf.Manifold.cube([80, 22, thick]).translate([-1, 14, 6 - d - thick]))
        removed.append(mf.Manifold.cube([80, 22, thick]).translate([-1, 14, d]))
        removed.append(mf.Manifold.cube([80, thick, 5.8]).translate([-1, d, 0.1]))
        removed.append(mf.Manifold.cube([80, thick, 5.8]).translate([-1, 50 - d - thick, 0.1]))
    plate = mf.Manifold.cube([80, 50, 6]) - mf.Manifold.batch_boolean(removed, mf.OpType.Add)
    out = plate.to_mesh()
    mesh = trimesh.Trimesh(
        vertices=np.asarray(out.vert_properties[:, :3], dtype=np.float64),
        faces=np.asarray(out.tri_verts),
        process=False,
    )
    return mesh.export(file_type="stl")
