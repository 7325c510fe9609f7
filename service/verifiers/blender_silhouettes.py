"""Blender script of the CAD verifier's render check: silhouettes of meshes from fixed
orthographic cameras. It runs INSIDE a fresh CAD sandbox (never imported by the service)::

    blender -b --factory-startup --python-exit-code 1 \
        --python blender_silhouettes.py -- /render/job.json

``job.json``: ``{"meshes": {name: npz path}, "views": {view: {"location": [x, y, z],
"rotation": [rx, ry, rz], "ortho_scale": s}}, "resolution_px": n, "clip_end": d,
"out_dir": path}`` (lengths in mesh units, angles in radians); each npz holds ``vertices``
(float64, (n, 3)) and ``faces`` (int32, (m, 3)). For every mesh and view it writes
``<out_dir>/<name>_<view>.png``: an RGBA image whose alpha is 255 where the mesh covers the
pixel centre, else 0.

Renderer: Cycles on the CPU (EEVEE and Workbench need an OpenGL context that a headless
sandbox lacks) with one sample per pixel, a near-zero pixel filter (the sample sits at the
pixel centre), no bounces, no denoising and a fixed seed, over a transparent film: a
deterministic ray-cast silhouette that takes a few milliseconds per view after the first.
"""

from __future__ import annotations

import json
import os
import sys


def main(job_path: str) -> None:
    import bpy
    import numpy as np

    with open(job_path, encoding="utf-8") as fh:
        job = json.load(fh)
    bpy.ops.wm.read_factory_settings(use_empty=True)
    scene = bpy.context.scene
    render = scene.render
    render.engine = "CYCLES"
    render.resolution_x = render.resolution_y = int(job["resolution_px"])
    render.resolution_percentage = 100
    render.film_transparent = True
    render.image_settings.file_format = "PNG"
    render.image_settings.color_mode = "RGBA"
    render.image_settings.color_depth = "8"
    cycles = scene.cycles
    cycles.device = "CPU"
    cycles.samples = 1
    cycles.use_adaptive_sampling = False
    cycles.use_denoising = False
    cycles.filter_width = 0.01
    cycles.max_bounces = 0
    cycles.seed = 0

    camera_data = bpy.data.cameras.new("silhouette")
    camera_data.type = "ORTHO"
    camera_data.clip_start = 1e-3
    camera_data.clip_end = float(job["clip_end"])
    camera = bpy.data.objects.new("silhouette", camera_data)
    scene.collection.objects.link(camera)
    scene.camera = camera

    objects = {}
    for name, path in sorted(job["meshes"].items()):
        data = np.load(path, allow_pickle=False)
        vertices = np.ascontiguousarray(data["vertices"], dtype=np.float64)
        faces = np.ascontiguousarray(data["faces"], dtype=np.int32)
        mesh = bpy.data.meshes.new(name)
        mesh.vertices.add(len(vertices))
        mesh.vertices.foreach_set("co", vertices.astype(np.float32).ravel())
        mesh.loops.add(faces.size)
        mesh.loops.foreach_set("vertex_index", faces.ravel())
        mesh.polygons.add(len(faces))
        mesh.polygons.foreach_set("loop_start", np.arange(0, faces.size, 3, dtype=np.int32))
        mesh.polygons.foreach_set("loop_total", np.full(len(faces), 3, dtype=np.int32))
        mesh.update()
        obj = bpy.data.objects.new(name, mesh)
        scene.collection.objects.link(obj)
        objects[name] = obj

    os.makedirs(job["out_dir"], exist_ok=True)
    for name, obj in objects.items():
        for other in objects.values():
            other.hide_render = other is not obj
        for view, pose in sorted(job["views"].items()):
            camera.location = pose["location"]
            camera.rotation_euler = pose["rotation"]
            camera_data.ortho_scale = float(pose["ortho_scale"])
            render.filepath = os.path.join(job["out_dir"], f"{name}_{view}.png")
            bpy.ops.render.render(write_still=True)


if __name__ == "__main__":
    main(sys.argv[sys.argv.index("--") + 1])
