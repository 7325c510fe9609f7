"""The CAD verifier's pure parts: settings, reading the output engine-side (with a fake
runtime), scoring and its weights, render framing and PNG decoding."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from pathlib import Path

import manifold3d
import numpy as np
import pytest
import trimesh
from PIL import Image

from service.errors import NotFound
from service.verifiers import cad, geometry
from service.verifiers.cad import CadSettings, Measures, VerifierFailure

SETTINGS = CadSettings(output="/app/out/part.stl", format="stl")


def measures(**overrides: float) -> Measures:
    base = dict(
        iou=1.0,
        surface_deviation_mm=0.0,
        chamfer=0.0,
        volume=100.0,
        reference_volume=100.0,
        volume_rel_error=0.0,
        bbox_deviation_mm=0.0,
        bbox=[[0, 0, 0], [1, 1, 1]],
        reference_bbox=[[0, 0, 0], [1, 1, 1]],
    )
    return Measures(**{**base, **overrides})


# --------------------------------------------------------------------------- settings


def test_settings_defaults_and_reference_name() -> None:
    assert SETTINGS.reference_name == "reference.stl"
    assert CadSettings(output="/a.obj", format="obj").reference_name == "reference.obj"
    assert CadSettings(output="/a.stl", format="stl", reference="r.stl").reference_name == "r.stl"


@pytest.mark.parametrize(
    "bad",
    [
        {"output": "relative/part.stl", "format": "stl"},
        {"output": "/a.stl", "format": "step"},
        {"output": "/a.stl", "format": "stl", "units": "in"},
        {"output": "/a.stl", "format": "stl", "iou_zero": 0.995},
        {"output": "/a.stl", "format": "stl", "chamfer_full": 0.5},
        {"output": "/a.stl", "format": "stl", "toleranse": 1},
        {"output": "/a.stl", "format": "stl", "reference": "../../etc/passwd"},
    ],
)
def test_settings_refuse_mistakes(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        CadSettings.model_validate(bad)


# --------------------------------------------------------------------------- score


def test_exact_reproduction_scores_exactly_one() -> None:
    reward, comps = cad.score(measures(), 1.0, SETTINGS)
    assert reward == 1.0
    assert {k: comps[k] for k in cad.WEIGHTS} == dict.fromkeys(cad.WEIGHTS, 1.0)
    assert comps["gate"] == comps["topology"] == comps["volume_gate"] == comps["core"] == 1.0
    # raw measures never become components (they are private details)
    assert not any(k.endswith(("_value", "_mm", "_error")) for k in comps)


def test_weights_sum_to_one() -> None:
    assert sum(cad.WEIGHTS.values()) == pytest.approx(1.0, abs=1e-12)


def test_core_terms_must_both_hold_and_refine_terms_add() -> None:
    # reward = core * (0.6 + 0.4 * refine); core = min(iou, surface): the surface right
    # and the volume wrong (or the reverse: a trial's plate with its holes misplaced) is 0
    reward, comps = cad.score(measures(iou=0.5), 1.0, SETTINGS)
    assert comps["iou"] == 0.0 and comps["core"] == 0.0 and reward == 0.0
    reward, comps = cad.score(measures(iou=0.95, surface_deviation_mm=5.0), 1.0, SETTINGS)
    assert comps["iou"] > 0.5 and comps["core"] == 0.0 and reward == 0.0
    reward, _ = cad.score(measures(iou=0.5, surface_deviation_mm=3.0), 1.0, SETTINGS)
    assert reward == 0.0  # every refine term right, the shape wrong: nothing
    for name, m in {
        "chamfer": measures(chamfer=1.0),
        "volume": measures(volume_rel_error=0.5),
        "bbox": measures(bbox_deviation_mm=5.0),
    }.items():
        reward, comps = cad.score(m, 1.0, SETTINGS)
        assert comps[name] == 0.0
        assert reward == pytest.approx(1.0 - cad.WEIGHTS[name]), name
    reward, comps = cad.score(measures(), 0.5, SETTINGS)
    assert comps["silhouette"] == 0.0 and reward == pytest.approx(0.9)


def test_partial_scores_are_linear_between_bounds() -> None:
    # IoU halfway between zero (0.90) and full (0.99) credit: core 0.5.
    reward, comps = cad.score(measures(iou=0.945), 1.0, SETTINGS)
    assert comps["iou"] == pytest.approx(0.5) and reward == pytest.approx(0.5)
    # A surface deviation of 0.55 mm: halfway between 0.1 and 1.0 mm.
    reward, comps = cad.score(measures(surface_deviation_mm=0.55), 1.0, SETTINGS)
    assert comps["surface"] == pytest.approx(0.5) and reward == pytest.approx(0.5)


def test_render_off_leaves_the_silhouette_out_of_refine() -> None:
    reward, comps = cad.score(measures(), None, SETTINGS)
    assert reward == 1.0 and "silhouette" not in comps
    reward, _ = cad.score(measures(bbox_deviation_mm=5.0), None, SETTINGS)
    assert reward == pytest.approx(0.6 + 0.4 * 2 / 3)


def test_surface_deviation_is_skipped_when_the_bbox_already_scores_zero() -> None:
    box = trimesh.creation.box(bounds=[[0, 0, 0], [10, 10, 10]])
    far = box.copy().apply_translation([5.0, 0, 0])
    m = cad.measure(far, box, surface_zero_mm=1.0)
    assert m.surface_skipped and m.surface_deviation_mm == m.bbox_deviation_mm == 5.0
    near = box.copy().apply_translation([0.25, 0, 0])
    m = cad.measure(near, box, surface_zero_mm=1.0)
    assert not m.surface_skipped and m.surface_deviation_mm == pytest.approx(0.25)
    assert m.iou == pytest.approx(9.75 / 10.25) and m.chamfer == pytest.approx(0.0, abs=1e-24)


# --------------------------------------------------------------------------- reading the output


class FakeRuntime:
    """``get_archive`` over an in-memory file system: path -> bytes, or ('link', target),
    or 'dir'."""

    def __init__(self, files: dict[str, object]) -> None:
        self.files = files
        self.reads: list[str] = []

    def get_archive(self, container_id: str, path: str) -> Iterator[bytes]:
        self.reads.append(path)
        entry = self.files.get(path)
        if entry is None:
            raise NotFound(f"no such path {path}")
        buf = io.BytesIO()
        name = path.rsplit("/", 1)[-1]
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo(name)
            if entry == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif isinstance(entry, tuple):
                info.type, info.linkname = tarfile.SYMTYPE, entry[1]
                tar.addfile(info)
            else:
                assert isinstance(entry, bytes)
                info.size = len(entry)
                tar.addfile(info, io.BytesIO(entry))
        data = buf.getvalue()
        return iter([data[i : i + 512] for i in range(0, len(data), 512)])


def read(files: dict[str, object], path: str = "/app/out/part.stl", max_bytes: int = 1 << 20):
    rt = FakeRuntime(files)
    return cad.read_output(rt, "cid", path, max_bytes=max_bytes), rt  # type: ignore[arg-type]


def test_read_output_regular_file() -> None:
    (data, problem), _ = read({"/app/out/part.stl": b"solid"})
    assert (data, problem) == (b"solid", None)


def test_read_output_follows_links_engine_side() -> None:
    (data, problem), rt = read(
        {
            "/app/out/part.stl": ("link", "../build/final.stl"),
            "/app/build/final.stl": ("link", "/data/p.stl"),
            "/data/p.stl": b"mesh",
        }
    )
    assert (data, problem) == (b"mesh", None)
    assert rt.reads == ["/app/out/part.stl", "/app/build/final.stl", "/data/p.stl"]


@pytest.mark.parametrize(
    ("files", "reason"),
    [
        ({}, "no file at /app/out/part.stl"),
        ({"/app/out/part.stl": "dir"}, "is a directory"),
        ({"/app/out/part.stl": ("link", "/nowhere")}, "link to /nowhere"),
        ({"/app/out/part.stl": ("link", "part.stl")}, "more than 8 symbolic links"),
        ({"/app/out/part.stl": b"x" * 5000}, "larger than 1000 bytes"),
    ],
)
def test_read_output_reasons(files: dict[str, object], reason: str) -> None:
    (data, problem), _ = read(files, max_bytes=1000)
    assert data is None and problem is not None and reason in problem


# --------------------------------------------------------------------------- gate of the verifier


BOX = trimesh.creation.box(bounds=[[0, 0, 0], [10, 10, 10]])
BOX_TOPOLOGY = geometry.Topology(components=1, genus=0)


def gate(data: bytes, settings: CadSettings = SETTINGS) -> cad.GateOutcome:
    return cad.gate_output(data, settings, 1000.0, BOX_TOPOLOGY)


def test_gate_reasons_name_the_problem() -> None:
    g = gate(BOX.export(file_type="stl"))
    assert g.problem is None and g.vertices is not None and g.facts["triangles"] == 12
    assert g.private["reference_volume"] == 1000.0
    open_box = BOX.copy()
    open_box.update_faces(np.arange(12) != 0)
    g = gate(open_box.export(file_type="stl"))
    assert (g.gate, g.vertices) == ("build", None) and "not watertight" in (g.problem or "")
    small = CadSettings(output="/a.stl", format="stl", max_triangles=10)
    g = gate(BOX.export(file_type="stl"), small)
    assert (g.problem, g.dodge) == ("12 triangles exceed the limit of 10", "too_many_triangles")
    g = gate(b"garbage")
    assert g.problem is not None and g.problem.startswith("/app/out/part.stl:")


def test_topology_and_volume_gate_before_any_measure() -> None:
    drilled = (
        geometry.solid(BOX) - manifold3d.Manifold.cylinder(30, 1.0, 1.0, 64).translate([5, 5, -10])
    ).to_mesh()
    holed = trimesh.Trimesh(vertices=drilled.vert_properties[:, :3], faces=drilled.tri_verts)
    g = gate(holed.export(file_type="stl"))
    assert (g.gate, g.facts["genus"]) == ("topology", 1), g.problem
    assert "reference" not in (g.problem or "") and g.private["reference_topology"]["genus"] == 0
    two = trimesh.util.concatenate([BOX, BOX.copy().apply_translation([20, 0, 0])])
    g = gate(two.export(file_type="stl"))
    assert (g.gate, g.facts["components"]) == ("topology", 2)
    big = BOX.copy().apply_scale(1.1)  # 33 % more volume, same topology
    g = gate(big.export(file_type="stl"))
    assert g.gate == "volume" and "1000" not in (g.problem or "")


def test_too_many_shells_is_a_capped_dodge() -> None:
    cubes = trimesh.util.concatenate(
        [
            trimesh.creation.box(extents=(1, 1, 1)).apply_translation([2 * i, 0, 0])
            for i in range(70)
        ]
    )
    g = gate(cubes.export(file_type="stl"))
    assert (g.gate, g.dodge) == ("build", "too_many_shells")


def test_non_finite_vertices_fail_the_build_gate() -> None:
    facets = "".join(
        f"facet normal 0 0 1\nouter loop\nvertex {a}\nvertex 1 0 0\nvertex 0 1 0\n"
        "endloop\nendfacet\n"
        for a in ("nan 0 0", "0 0 0")
    )
    g = gate(f"solid x\n{facets}endsolid x\n".encode())
    assert g.gate == "build" and g.problem is not None and g.vertices is None


# ------------------------------------------------------------------------ render framing, PNGs


def test_render_job_frames_each_view_on_the_reference() -> None:
    ref = trimesh.creation.box(bounds=[[0, 0, 0], [80, 50, 6]])
    job = cad.render_job(ref, resolution_px=128)
    assert set(job["views"]) == {"top", "front", "right"}
    top, front, right = (job["views"][v] for v in ("top", "front", "right"))
    assert top["location"] == [40.0, 25.0, 3.0 + 800.0]
    assert front["location"] == [40.0, 25.0 - 800.0, 3.0]
    assert right["location"] == [40.0 + 800.0, 25.0, 3.0]
    assert top["ortho_scale"] == pytest.approx(88.0)  # 1.1 x max(80, 50)
    assert front["ortho_scale"] == pytest.approx(88.0)  # 1.1 x max(80, 6)
    assert right["ortho_scale"] == pytest.approx(55.0)  # 1.1 x max(50, 6)
    assert job["clip_end"] > 2 * 800


def png(alpha: np.ndarray) -> bytes:
    rgba = np.zeros((*alpha.shape, 4), dtype=np.uint8)
    rgba[..., 3] = alpha
    buf = io.BytesIO()
    Image.fromarray(rgba, "RGBA").save(buf, format="PNG")
    return buf.getvalue()


def test_decode_masks_thresholds_alpha() -> None:
    alpha = np.array([[0, 127], [128, 255]], dtype=np.uint8)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in [("out/result_top.png", png(alpha)), ("out/notes.txt", b"x")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    masks = cad.decode_masks(buf.getvalue())
    assert list(masks) == ["result_top"]
    assert masks["result_top"].tolist() == [[False, False], [True, True]]


def test_render_script_is_shipped_beside_the_verifier() -> None:
    text = cad.RENDER_SCRIPT.read_text()
    assert "CYCLES" in text and "film_transparent" in text


# --------------------------------------------------------------------------- references


def test_broken_reference_is_a_verifier_error(tmp_path: Path) -> None:
    missing = tmp_path / "reference.stl"
    with pytest.raises(VerifierFailure, match="unreadable"):
        cad.load_reference(missing, "stl")
    open_box = trimesh.creation.box(extents=(1, 1, 1))
    open_box.update_faces(np.arange(12) != 0)
    missing.write_bytes(open_box.export(file_type="stl"))
    with pytest.raises(VerifierFailure, match="not a closed solid"):
        cad.load_reference(missing, "stl")
