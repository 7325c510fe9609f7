"""Oracle of slotted-link: slotted link, built with Blender's Python API."""

import math
import os

import bmesh
import bpy
from mathutils import Matrix

#: Turns a prism built along Z into one along X: (x, y, z) -> (z, x, y).
Z_TO_X = Matrix(((0, 0, 1, 0), (1, 0, 0, 0), (0, 1, 0, 0), (0, 0, 0, 1)))


def prism(outline, z0, z1):
    """A closed prism over the counter-clockwise polygon ``outline`` [(x, y), ...] from z0 to z1 (mm)."""
    bm = bmesh.new()
    bottom = [bm.verts.new((x, y, z0)) for x, y in outline]
    top = [bm.verts.new((x, y, z1)) for x, y in outline]
    bm.faces.new(list(reversed(bottom)))
    bm.faces.new(top)
    for i in range(len(outline)):
        j = (i + 1) % len(outline)
        bm.faces.new((bottom[i], bottom[j], top[j], top[i]))
    mesh = bpy.data.meshes.new("part")
    bm.to_mesh(mesh)
    bm.free()
    obj = bpy.data.objects.new("part", mesh)
    bpy.context.scene.collection.objects.link(obj)
    return obj


def rect(x0, y0, x1, y1):
    """The rectangle [x0, x1] x [y0, y1], counter-clockwise."""
    return [(x0, y0), (x1, y0), (x1, y1), (x0, y1)]


def circle(cx, cy, r, n=64):
    """A regular n-gon inscribed in the circle (cx, cy, r), first vertex on +X."""
    return [(cx + r * math.cos(2 * math.pi * k / n), cy + r * math.sin(2 * math.pi * k / n)) for k in range(n)]


def boolean(target, tool, operation):
    """Apply an exact boolean (DIFFERENCE, UNION, INTERSECT) of ``tool`` to ``target``; ``tool`` is removed."""
    mod = target.modifiers.new("boolean", "BOOLEAN")
    mod.operation = operation
    mod.solver = "EXACT"
    mod.object = tool
    bpy.context.view_layer.objects.active = target
    bpy.ops.object.modifier_apply(modifier=mod.name)
    bpy.data.objects.remove(tool)


def clean(obj):
    """Merge vertices closer than 1e-5 mm (exact booleans leave near-duplicates that a
    6-decimal OBJ would fuse), drop degenerate faces, triangulate."""
    bm = bmesh.new()
    bm.from_mesh(obj.data)
    bmesh.ops.remove_doubles(bm, verts=bm.verts, dist=1e-5)
    bmesh.ops.dissolve_degenerate(bm, dist=1e-5, edges=bm.edges)
    bmesh.ops.triangulate(bm, faces=bm.faces)
    bm.to_mesh(obj.data)
    bm.free()


def export(obj, path):
    """Binary STL, 1 unit = 1 mm, Z up (no axis conversion)."""
    clean(obj)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    bpy.ops.object.select_all(action="DESELECT")
    obj.select_set(True)
    bpy.ops.export_mesh.stl(
        filepath=path,
        use_selection=True,
        ascii=False,
        global_scale=1.0,
        use_scene_unit=False,
        axis_forward="Y",
        axis_up="Z",
    )


OUT = "/app/out/link.stl"


def obround(x0, x1, r, n=64):
    # Half circles of radius r around (x0, 0) and (x1, 0), counter-clockwise; each half
    # uses the vertices of the 64-gon it belongs to.
    right = [
        (x1 + r * math.cos(2 * math.pi * k / n), r * math.sin(2 * math.pi * k / n)) for k in range(-n // 4, n // 4 + 1)
    ]
    left = [
        (x0 + r * math.cos(2 * math.pi * k / n), r * math.sin(2 * math.pi * k / n))
        for k in range(n // 4, 3 * n // 4 + 1)
    ]
    return right + left


bpy.ops.wm.read_factory_settings(use_empty=True)
link = prism(obround(0, 60, 10), 0, 5)
for x in (0, 60):
    boolean(link, prism(circle(x, 0, 4), -1, 6), "DIFFERENCE")
boolean(link, prism(obround(20, 40, 3), -1, 6), "DIFFERENCE")
export(link, OUT)
