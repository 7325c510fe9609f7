"""The CAD verifier's pure parts: settings, reading the output engine-side (with a fake
runtime), scoring and its weights, render framing and PNG decoding."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import trimesh
from PIL import Image

from service.errors import NotFound
from service.verifiers import cad
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
    assert comps["gate"] == 1.0 and comps["silhouette_value"] == 1.0


def test_weights_sum_to_one() -> None:
    assert sum(cad.WEIGHTS.values()) == pytest.approx(1.0, abs=1e-12)


def test_each_component_costs_its_weight() -> None:
    worst = {
        "iou": measures(iou=0.5),
        "surface": measures(surface_deviation_mm=3.0),
        "chamfer": measures(chamfer=1.0),
        "volume": measures(volume_rel_error=0.5),
        "bbox": measures(bbox_deviation_mm=5.0),
    }
    for name, m in worst.items():
        reward, comps = cad.score(m, 1.0, SETTINGS)
        assert comps[name] == 0.0
        assert reward == pytest.approx(1.0 - cad.WEIGHTS[name]), name
    reward, comps = cad.score(measures(), 0.5, SETTINGS)
    assert comps["silhouette"] == 0.0 and reward == pytest.approx(0.9)


def test_partial_scores_are_linear_between_bounds() -> None:
    # IoU halfway between zero (0.90) and full (0.99) credit: half of its 0.3 weight.
    reward, comps = cad.score(measures(iou=0.945), 1.0, SETTINGS)
    assert comps["iou"] == pytest.approx(0.5) and reward == pytest.approx(0.85)
    # A surface deviation of 0.55 mm: halfway between 0.1 and 1.0 mm.
    reward, comps = cad.score(measures(surface_deviation_mm=0.55), 1.0, SETTINGS)
    assert comps["surface"] == pytest.approx(0.5) and reward == pytest.approx(0.85)


def test_render_off_shares_the_silhouette_weight_out() -> None:
    reward, comps = cad.score(measures(), None, SETTINGS)
    assert reward == 1.0 and "silhouette" not in comps
    reward, _ = cad.score(measures(iou=0.5), None, SETTINGS)
    assert reward == pytest.approx(1 - 0.3 / 0.9)


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


def test_gate_reasons_name_the_problem() -> None:
    box = trimesh.creation.box(extents=(1, 1, 1))
    mesh, problem, facts = cad._gate(box.export(file_type="stl"), None, SETTINGS)
    assert problem is None and mesh is not None and facts["triangles"] == 12
    open_box = box.copy()
    open_box.update_faces(np.arange(12) != 0)
    mesh, problem, _ = cad._gate(open_box.export(file_type="stl"), None, SETTINGS)
    assert mesh is None and problem is not None and "not watertight" in problem
    small = CadSettings(output="/a.stl", format="stl", max_triangles=10)
    _, problem, _ = cad._gate(box.export(file_type="stl"), None, small)
    assert problem == "12 triangles exceed the limit of 10"
    _, problem, _ = cad._gate(b"garbage", None, SETTINGS)
    assert problem is not None and problem.startswith("/app/out/part.stl:")
    assert cad._gate(None, "no file at /x", SETTINGS)[1] == "no file at /x"


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
