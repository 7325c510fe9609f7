"""The CAD-domain verifier: measure the part the agent exported against the task's reference
mesh, and render both to compare silhouettes.

Flow (nothing ever runs in the agent's sandbox; nothing heavy runs in the control plane):

1. The output file named by the task (``[crucible.settings] output``) is read engine-side
   (``get_archive``, symbolic links followed engine-side too, at most 8) from the episode's
   frozen container (every process suspended: nothing changes it while it is read), at
   most ``max_file_bytes``.
2. **Gate** ("must build"), in a bounded worker process (``service.verifiers.bounded``:
   ``measure_timeout_s`` of wall clock, ``measure_memory_mb`` of memory): the bytes parse
   as the stated ``format`` (STL or OBJ), hold at most ``max_triangles`` triangles and
   ``max_shells`` separate shells, and bound a closed solid (watertight, consistently
   wound, non-zero volume, accepted by manifold3d).
3. **Geometry first**, in the same worker: the solid's topology must equal the
   reference's (connected components, and genus: the number of through-holes, from the
   Euler characteristic; ``geometry.topology``), and its volume must be within
   ``volume_zero`` of the reference's. A part that only fills the bounding box, or misses
   a hole the reference has, fails here. Any failed gate scores 0.
4. **Measures**, in a second bounded worker (``service.verifiers.geometry``; lengths in
   mm, the tasks' unit): volumetric IoU (exact booleans, absolute coordinates), surface
   deviation (two-sided Hausdorff estimate, 2048 seeded samples each way, exact
   point-to-surface distances), wrong depth (exact booleans against the reference grown
   and shrunk by two levels, computed once per reference: ``cad_offsets``), Chamfer
   distance as CAD-Recode computes it (unit-box normalized, 8192 points, seed 0),
   relative volume error and the largest bounding-box deviation in mm.
5. **Render check** (in parallel with 4): a fresh sandbox of the episode's pristine image
   (the task image on ``crucible/cad``, which the agent could not modify; from the warm pool
   when it holds one) receives both meshes; Blender renders each from three fixed
   orthographic cameras (top, front, right; framed on the reference's bounding box, 128 px;
   see ``blender_silhouettes``) and the PNGs are read engine-side. ``silhouette`` is the
   lowest of the three per-view silhouette IoUs.
6. **Reward**. Each measure maps to a score in [0, 1] (linear between a full- and a
   zero-credit bound; the Chamfer score linear in log distance):

   ============ ====== ===================================== ============ ============
   component    weight measure                               full credit  zero credit
   ============ ====== ===================================== ============ ============
   iou          core   volumetric IoU                        >= 0.99      <= 0.90
   surface      core   surface deviation (mm)                <= 0.1       >= 1.0
   depth        core   wrong depth (mm, exact; see below)    <= 0.1       >= 1.0
   chamfer      refine CAD-Recode Chamfer distance           <= 1e-3      >= 2e-2 (log)
   silhouette   refine worst of 3 silhouette IoUs            >= 0.99      <= 0.90
   volume       refine abs(V - V_ref) / V_ref                <= 0.01      >= 0.10
   bbox         refine max abs bound difference (mm)         <= 0.1       >= 1.0
   ============ ====== ===================================== ============ ============

   ``core = min(iou, surface, depth)``: the measures that see the actual shape in place,
   and all must hold. (Their mean paid a part with every feature misplaced: the envelope the
   instruction states keeps most of the IoU, and a trial's plate with its four holes
   elsewhere scored 0.23; its surface deviation, the distance from where its holes are to
   where they belong, is 0, and so is its core now.)
   ``refine`` = the mean of the others, which a wrong shape can satisfy: the bounding box
   is stated in the instruction, the Chamfer distance ignores placement and scale, volume
   and silhouettes ignore where material is. ``reward = core * (0.6 + 0.4 * refine)``:
   what the instruction gives away earns credit only in proportion to the shape being
   right, and a part with ``core = 0`` scores 0 whatever else matches. A task may move any
   bound in ``[crucible.settings]`` (``iou_full``, ``iou_zero``, ...); with
   ``render = false`` ``refine`` is the mean of the other three. The full-credit bounds sit
   above the noise of an honest re-modelling (circles of 32 to 128 segments against the
   reference's 64: at most 0.5 % IoU, 0.6 % volume, 0.05 mm of surface deviation at
   r = 10 mm; two tessellations of one shape sample to a Chamfer distance of about 5e-4);
   an exact reproduction scores exactly 1.0. A plate missing one of four 6 mm holes keeps
   an IoU of 0.993 but fails the topology gate.

   ``depth`` is what the sampled measures cannot be made to miss. The part is tested
   exactly (``geometry.wrong_beyond``) against the reference grown and shrunk by the
   depth levels ``surface_full_mm`` and the middle of the surface ramp (0.1 and 0.55 mm):
   within the first it scores 1, within the second 0.5 (the ramp at 0.55), beyond both 0.
   A hole filled or closed by a lid, a membrane or a plug, however it is hollowed, grooved
   or pinholed to keep the genus, and whatever area the part adds to thin out the surface
   samples, is wrong beyond 0.55 mm: two trials' forges (0.99 with a filled hole's
   grooves and pinhole and area-inflating cuts; 1.0 with a lidded hole whose only empty
   space was the band the sampled "side" probes came from, and a content seed searched
   offline until no surface sample fell on the lid) score 0.

What tenants see (``details``): the output path and format, the gate that failed and why
(in terms of the agent's own part: its triangle count, its components and genus, never the
reference's), ``passed``, timings; ``components`` holds the gates (``gate``,
``topology``, ``volume_gate`` as 1/0). The scores (``core``, ``iou``, ``surface``,
``chamfer``, ``silhouette``, ``volume``, ``bbox``: each inverts to a measure of the
reference given the agent's own part), raw measures, reference volume, bounding box and
topology are in ``details["private"]`` (admins only; ``service.rewards.redact``).

Dodges: an output that is a directory, a FIFO or another special file, a link loop,
larger than a cap, non-finite, or that makes the worker run out of time or memory or
crash scores 0 (``status=ok``) with the reason in ``gate`` and its cause in
``details["dodge"]``. Infrastructure failures (engine errors, no worker process, a render
check that fails on the reference alone, a missing or broken reference) are
``status=error`` with reward None. Never a silent 0.

The render's cost is the agent's to choose (a trial's 199,996 slivers, each spanning the
view, made Blender test nearly every triangle on every ray: a wrong part past the time
limit was ``status=timeout``, excluded from the loss, instead of its 0). So the render is
waited for only when its score can change the reward (``core > 0``), and a render past
its time limit scores its silhouette 0 (``details["private"]["render"]`` says so). An
honest part renders in about 5 s against the 60 s limit. Likewise a render that fails
with the part in it while the reference alone renders (the control, run only then): the
part made Blender fail, and its silhouette scores 0; a failure of the control too is the
verifier's (``status=error``).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import posixpath
import tarfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import trimesh
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from service.errors import CrucibleError, NotFound
from service.runtime.base import ROOT, ExecRequest, SandboxRuntime
from service.tasks.models import Task
from service.verifiers import cad_offsets, geometry
from service.verifiers.base import VerifierResult
from service.verifiers.bounded import BoundExceeded, WorkerUnavailable, run_bounded
from service.verifiers.readback import engine_reads_container
from service.verifiers.registry import EndState, register

NAME = "cad"
VERSION = "3"

#: The measures that see the actual shape in place (their minimum is ``core``).
CORE = ("iou", "surface", "depth")
#: The measures a wrong shape can satisfy (their mean is ``refine``; module docstring).
REFINE = ("chamfer", "silhouette", "volume", "bbox")
#: Share of the reward that ``core`` alone earns: ``core * (CORE_SHARE + (1 - CORE_SHARE)
#: * refine)``.
CORE_SHARE = 0.6
#: The components a record shows its tenant: the gates, each 1 or 0 (the measures' scores
#: go to ``details["private"]["scores"]``).
PUBLIC = ("gate", "topology", "volume_gate")
#: Every scored measure (the scores an exact reproduction has at 1.0).
WEIGHTS: dict[str, float] = {
    **{k: CORE_SHARE / len(CORE) for k in CORE},
    **{k: (1 - CORE_SHARE) / len(REFINE) for k in REFINE},
}
#: The render check's cameras: unit direction from the frame centre to the camera, the
#: camera's Euler rotation (XYZ, radians; a Blender camera looks down its local -Z), and
#: the two world axes the view sees (for framing).
VIEWS: dict[str, tuple[tuple[float, float, float], tuple[float, float, float], tuple[int, int]]] = {
    "top": ((0.0, 0.0, 1.0), (0.0, 0.0, 0.0), (0, 1)),
    "front": ((0.0, -1.0, 0.0), (math.pi / 2, 0.0, 0.0), (0, 2)),
    "right": ((1.0, 0.0, 0.0), (math.pi / 2, 0.0, math.pi / 2), (1, 2)),
}
FRAME_MARGIN = 1.1  # ortho scale = margin x the reference's larger visible extent
RENDER_DIR = "/render"
RENDER_SCRIPT = Path(__file__).with_name("blender_silhouettes.py")
MAX_SYMLINKS = 8
MAX_PNG_BYTES = 4 << 20


class CadSettings(BaseModel):
    """``[crucible.settings]`` of a CAD task.

    ``output``: absolute path of the file the agent must write; ``format``: ``stl`` or
    ``obj``; ``units``: ``mm`` (coordinates in the file are millimetres); ``reference``:
    the reference mesh's file name in the task's ``tests/`` (same format rules; default
    ``reference.<format>``). ``*_full`` / ``*_zero``: the score bounds of each measure (see
    the module docstring; ``volume_zero`` is also the volume gate); ``render``: run the
    silhouette check; ``render_px``: silhouette resolution; ``render_timeout_s``: Blender's
    time limit in seconds; ``max_file_bytes`` / ``max_triangles`` / ``max_shells``: caps on
    the agent's file; ``measure_timeout_s`` / ``measure_memory_mb``: the wall-clock and
    memory limits of each bounded worker step (gate, measures).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    output: str = Field(pattern=r"^/[^\x00]+$")
    format: Literal["stl", "obj"]
    units: Literal["mm"] = "mm"
    reference: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]+$")
    iou_full: float = Field(0.99, gt=0, le=1)
    iou_zero: float = Field(0.90, ge=0, lt=1)
    surface_full_mm: float = Field(0.1, gt=0)
    surface_zero_mm: float = Field(1.0, gt=0)
    chamfer_full: float = Field(1e-3, gt=0)
    chamfer_zero: float = Field(2e-2, gt=0)
    silhouette_full: float = Field(0.99, gt=0, le=1)
    silhouette_zero: float = Field(0.90, ge=0, lt=1)
    volume_full: float = Field(0.01, ge=0)
    volume_zero: float = Field(0.10, gt=0)
    bbox_full_mm: float = Field(0.1, ge=0)
    bbox_zero_mm: float = Field(1.0, gt=0)
    render: bool = True
    render_px: int = Field(128, ge=16, le=1024)
    render_timeout_s: float = Field(60.0, gt=0)
    max_file_bytes: int = Field(32 << 20, gt=0)
    max_triangles: int = Field(200_000, gt=0)
    max_shells: int = Field(64, gt=0)
    measure_timeout_s: float = Field(60.0, gt=0, le=600)
    measure_memory_mb: int = Field(3072, ge=256)

    @model_validator(mode="after")
    def _bounds(self) -> CadSettings:
        for name in ("iou", "silhouette"):
            if getattr(self, f"{name}_zero") >= getattr(self, f"{name}_full"):
                raise ValueError(f"{name}_zero must be below {name}_full")
        for name in ("surface", "chamfer", "volume", "bbox"):
            suffix = "_mm" if name in ("surface", "bbox") else ""
            if getattr(self, f"{name}_full{suffix}") >= getattr(self, f"{name}_zero{suffix}"):
                raise ValueError(f"{name}_full{suffix} must be below {name}_zero{suffix}")
        return self

    @property
    def depth_levels(self) -> tuple[float, float]:
        """The levels of the depth measure (mm): ``surface_full_mm`` and the middle of the
        surface ramp (``geometry.wrong_depth``; module docstring)."""
        return (self.surface_full_mm, (self.surface_full_mm + self.surface_zero_mm) / 2)

    @property
    def reference_name(self) -> str:
        """The reference file's name in ``tests/``."""
        return self.reference or f"reference.{self.format}"


@dataclass(frozen=True, kw_only=True)
class CadCheck:
    """What one task asks of the verifier: its settings, the reference file (host side) and
    the reward at or above which an episode counts as passed."""

    settings: CadSettings
    reference_path: Path
    pass_threshold: float = 1.0


@dataclass(frozen=True, kw_only=True)
class Measures:
    """The geometric measures of a result against its reference (see ``geometry``).

    Volumes in mm^3, lengths in mm, ``chamfer`` in squared units of the normalized cube.
    ``surface_deviation_mm`` is the bounding-box deviation (its lower bound) when
    ``surface_skipped``. ``wrong_depth_mm`` is the smallest depth level the part's
    differences from the reference lie within (``geometry.wrong_depth``), ``inf`` when
    they reach beyond every level or the surface was skipped.
    """

    iou: float
    surface_deviation_mm: float
    chamfer: float
    volume: float
    reference_volume: float
    volume_rel_error: float
    bbox_deviation_mm: float
    bbox: list[list[float]]
    reference_bbox: list[list[float]]
    surface_skipped: bool = False
    wrong_depth_mm: float = 0.0


@dataclass(frozen=True, kw_only=True)
class Reference:
    """A task's reference part: its mesh, volume (mm^3) and topology."""

    mesh: trimesh.Trimesh
    volume: float
    topology: geometry.Topology


@dataclass(frozen=True, kw_only=True)
class GateOutcome:
    """What the gate worker found. ``problem`` is None when the part passed every gate;
    then ``vertices`` / ``faces`` are the solid to measure (turned right way out when its
    triangles faced inwards). ``gate`` names the gate that failed (``build``, ``topology``,
    ``volume``); ``dodge`` is set when the failure is a cap or an unreadable file;
    ``facts`` are public (about the agent's part), ``private`` are not."""

    problem: str | None = None
    gate: str | None = None
    dodge: str | None = None
    vertices: np.ndarray | None = None
    faces: np.ndarray | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    private: dict[str, Any] = field(default_factory=dict)


class VerifierFailure(Exception):
    """An infrastructure failure of the verifier (``status`` error or timeout)."""

    def __init__(self, reason: str, *, status: Literal["error", "timeout"] = "error") -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


class RenderTimeout(VerifierFailure):
    """Blender did not finish the render check within ``render_timeout_s``: the agent's
    mesh chose that cost, so ``verify`` scores the silhouette 0 instead."""


class RenderRefused(VerifierFailure):
    """The render check failed with the agent's part in it while the reference alone renders
    in the same sandbox (the control): the part made Blender fail, so ``verify`` scores the
    silhouette 0 instead of an error."""


# --------------------------------------------------------------------------- settings


def check_for(task: Task) -> CadCheck:
    """The CAD check of ``task`` (``VerifierFailure`` when its settings are invalid)."""
    try:
        settings = CadSettings.model_validate(task.verifier_settings)
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "(settings)"
        raise VerifierFailure(
            f"task {task.key}: [crucible.settings] {where}: {first['msg']}"
        ) from None
    if task.tests_dir is None:
        raise VerifierFailure(f"task {task.key} has no tests/ folder with a reference mesh")
    return CadCheck(
        settings=settings,
        reference_path=task.tests_dir / settings.reference_name,
        pass_threshold=task.pass_threshold,
    )


# --------------------------------------------------------------------------- reference meshes

_REFERENCES: dict[tuple[str, int, int], Reference] = {}
_REFERENCES_LOCK = threading.Lock()


def load_reference(path: Path, fmt: geometry.MeshFormat) -> trimesh.Trimesh:
    """The reference mesh at ``path`` (see ``load_reference_part``)."""
    return load_reference_part(path, fmt).mesh


def load_reference_part(path: Path, fmt: geometry.MeshFormat) -> Reference:
    """The reference part at ``path`` (cached by path, mtime and size); its format is its
    suffix (``.stl``, ``.obj``), else ``fmt``. References are the task's own small files,
    measured in the control plane.

    Raises ``VerifierFailure`` when it is missing, does not parse or is not a closed solid
    (a broken task, never the agent's fault).
    """
    try:
        st = path.stat()
    except OSError as e:
        raise VerifierFailure(f"reference mesh {path} is unreadable: {e.strerror}") from None
    key = (str(path), st.st_mtime_ns, st.st_size)
    with _REFERENCES_LOCK:
        cached = _REFERENCES.get(key)
    if cached is not None:
        return cached
    suffix = path.suffix.lower().lstrip(".")
    file_format: geometry.MeshFormat = (
        "obj" if suffix == "obj" else "stl" if suffix == "stl" else fmt
    )
    try:
        mesh = geometry.load_mesh(path.read_bytes(), file_format)
        gated = geometry.gate(mesh)
        if gated.reason is not None or gated.inverted:
            raise VerifierFailure(f"reference mesh {path.name} is not a closed solid")
        part = Reference(
            mesh=gated.mesh,
            volume=geometry.volume(gated.mesh),
            topology=geometry.topology(gated.mesh),
        )
    except geometry.MeshError as e:
        raise VerifierFailure(f"reference mesh {path.name} is broken: {e}") from None
    with _REFERENCES_LOCK:
        _REFERENCES[key] = part
    return part


# --------------------------------------------------------------------------- reading the output


@dataclass(frozen=True, kw_only=True)
class OutputRead:
    """The agent's output file: ``data``, or why there is none to score (``problem``;
    ``dodge`` names the cause when it is a special file, a cap or a link loop rather than
    a missing file)."""

    data: bytes | None
    problem: str | None = None
    dodge: str | None = None


def read_output(
    runtime: SandboxRuntime, container_id: str, path: str, *, max_bytes: int
) -> tuple[bytes | None, str | None]:
    """``(content, None)`` of the regular file at ``path`` in the container, read engine-side,
    or ``(None, reason)`` (see ``read_output_file``)."""
    got = read_output_file(runtime, container_id, path, max_bytes=max_bytes)
    return got.data, got.problem


def read_output_file(
    runtime: SandboxRuntime, container_id: str, path: str, *, max_bytes: int
) -> OutputRead:
    """The regular file at ``path`` in the container, read engine-side, or why there is none
    the agent could be scored on (missing, a directory or special file, too large, a link
    loop). Symbolic links are followed (at most 8), each resolved in the container's tree.

    Raises ``CrucibleError`` for engine failures.
    """
    current = posixpath.normpath(path)
    for _ in range(MAX_SYMLINKS + 1):
        try:
            chunks = runtime.get_archive(container_id, current)
        except NotFound:
            where = f" (link to {current})" if current != path else ""
            return OutputRead(data=None, problem=f"no file at {path}{where}")
        except CrucibleError as e:
            if not engine_reads_container(runtime, container_id):
                raise
            why = f"{path} cannot be read: {e.detail[:200]}"
            return OutputRead(data=None, problem=why, dodge="unreadable_path")
        data = _read_capped(chunks, max_bytes + (64 << 10))
        if data is None:
            return OutputRead(
                data=None,
                problem=f"{path} is larger than {max_bytes} bytes",
                dodge="file_too_large",
            )
        try:
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                member = tar.next()
                if member is None:
                    return OutputRead(data=None, problem=f"no file at {path}")
                if member.issym():
                    base = posixpath.dirname(current)
                    current = posixpath.normpath(posixpath.join(base, member.linkname))
                    continue
                if member.isdir():
                    return OutputRead(
                        data=None, problem=f"{path} is a directory, not a file", dodge="not_a_file"
                    )
                if not member.isfile():
                    return OutputRead(
                        data=None, problem=f"{path} is not a regular file", dodge="not_a_file"
                    )
                if member.size > max_bytes:
                    return OutputRead(
                        data=None,
                        problem=f"{path} is larger than {max_bytes} bytes",
                        dodge="file_too_large",
                    )
                fh = tar.extractfile(member)
                return OutputRead(data=fh.read() if fh else b"")
        except tarfile.TarError as e:
            raise VerifierFailure(f"reading {path}: the engine returned a bad archive: {e}") from e
    return OutputRead(
        data=None, problem=f"{path}: more than {MAX_SYMLINKS} symbolic links", dodge="link_loop"
    )


def _read_capped(chunks: Iterator[bytes], cap: int) -> bytes | None:
    buf = bytearray()
    try:
        for chunk in chunks:
            buf += chunk
            if len(buf) > cap:
                return None
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
    return bytes(buf)


# --------------------------------------------------------------------------- the bounded steps


def gate_output(
    data: bytes,
    settings: CadSettings,
    ref_volume: float,
    ref_topology: geometry.Topology,
) -> GateOutcome:
    """The gates of module docstring steps 2 and 3 on the agent's file (runs in a bounded
    worker; pure). Never raises for anything in ``data``."""
    out = settings.output
    facts: dict[str, Any] = {"file_bytes": len(data)}
    try:
        mesh = geometry.load_mesh(data, settings.format)
    except geometry.MeshError as e:
        dodge = "non_finite" if "non-finite" in str(e) else None
        return GateOutcome(problem=f"{out}: {e}", gate="build", dodge=dodge, facts=facts)
    facts["triangles"] = int(len(mesh.faces))
    if len(mesh.faces) > settings.max_triangles:
        return GateOutcome(
            problem=f"{len(mesh.faces)} triangles exceed the limit of {settings.max_triangles}",
            gate="build",
            dodge="too_many_triangles",
            facts=facts,
        )
    gated = geometry.gate(mesh)
    if gated.reason is not None:
        return GateOutcome(problem=gated.reason, gate="build", facts=facts)
    shells = int(gated.mesh.body_count)
    if shells > settings.max_shells:
        return GateOutcome(
            problem=f"{shells} separate shells exceed the limit of {settings.max_shells}",
            gate="build",
            dodge="too_many_shells",
            facts=facts,
        )
    try:
        topo = geometry.topology(gated.mesh)
        vol = geometry.volume(gated.mesh)
    except geometry.MeshError as e:
        return GateOutcome(problem=str(e), gate="build", facts=facts)
    facts["inverted_normals"] = gated.inverted
    facts["components"], facts["genus"] = topo.components, topo.genus
    private = {
        "topology": asdict(topo),
        "reference_topology": asdict(ref_topology),
        "volume": vol,
        "reference_volume": ref_volume,
    }
    if topo != ref_topology:
        return GateOutcome(
            problem=f"topology: the solid has {topo.components} connected component(s) of "
            f"total genus {topo.genus} (through-holes); the part's differ",
            gate="topology",
            facts=facts,
            private=private,
        )
    rel = geometry.relative_volume_error(vol, ref_volume)
    private["volume_rel_error"] = rel
    if rel >= settings.volume_zero:
        return GateOutcome(
            problem=f"volume: {vol:.6g} mm^3 is {settings.volume_zero:.0%} or more away from "
            "the part's",
            gate="volume",
            facts=facts,
            private=private,
        )
    return GateOutcome(
        vertices=np.asarray(gated.mesh.vertices, dtype=np.float64),
        faces=np.asarray(gated.mesh.faces, dtype=np.int64),
        facts=facts,
        private=private,
    )


def measure_arrays(
    vertices: np.ndarray,
    faces: np.ndarray,
    ref_vertices: np.ndarray,
    ref_faces: np.ndarray,
    surface_zero_mm: float,
    offsets: list[geometry.Offset],
) -> Measures:
    """``measure`` on meshes given as arrays (runs in a bounded worker)."""
    result = trimesh.Trimesh(vertices=vertices, faces=faces, process=False)
    reference = trimesh.Trimesh(vertices=ref_vertices, faces=ref_faces, process=False)
    return measure(result, reference, surface_zero_mm=surface_zero_mm, offsets=offsets)


# --------------------------------------------------------------------------- measures and score


def measure(
    result: trimesh.Trimesh,
    reference: trimesh.Trimesh,
    *,
    surface_zero_mm: float = math.inf,
    offsets: list[geometry.Offset] | None = None,
) -> Measures:
    """Every geometric measure of a gated ``result`` against ``reference``.

    The surface deviation is measured on the solid's boundary with a seed from its content
    (``geometry.surface_deviation``), and skipped when the bounding boxes already differ by
    ``surface_zero_mm`` or more (it cannot be smaller, and far-off meshes make the
    point-to-surface queries needlessly expensive); the wrong depth is then ``inf``. The
    wrong depth is tested exactly against ``offsets``, the reference grown and shrunk by
    each depth level (``cad_offsets.reference_offsets``); without them it is 0 (not
    measured: for callers that want the other measures alone).
    """
    v, v_ref = geometry.volume(result), geometry.volume(reference)
    bbox_dev = geometry.bbox_deviation(result, reference)
    skipped = bbox_dev >= surface_zero_mm
    if skipped:
        deviation, depth = bbox_dev, math.inf
    else:  # on the solid's own surface, sampled as only its content says (geometry)
        outer = geometry.boundary(result)
        deviation = geometry.surface_deviation(
            outer, reference, a_seed=geometry.content_seed(outer)
        )
        depth = geometry.wrong_depth(result, offsets) if offsets else 0.0
    return Measures(
        iou=geometry.volumetric_iou(result, reference),
        surface_deviation_mm=deviation,
        chamfer=geometry.chamfer_distance(result, reference),
        volume=v,
        reference_volume=v_ref,
        volume_rel_error=geometry.relative_volume_error(v, v_ref),
        bbox_deviation_mm=bbox_dev,
        bbox=geometry.bounding_box(result).round(6).tolist(),
        reference_bbox=geometry.bounding_box(reference).round(6).tolist(),
        surface_skipped=skipped,
        wrong_depth_mm=depth,
    )


def score(
    measures: Measures, silhouette: float | None, settings: CadSettings
) -> tuple[float, dict[str, float]]:
    """``(reward, components)`` of a part that passed every gate, from its measures and the
    worst silhouette IoU (None when the render check is off: ``refine`` is then the mean of
    the other three). ``reward = core * (CORE_SHARE + (1 - CORE_SHARE) * refine)`` (module
    docstring); components hold the scores only (raw measures are private)."""
    s = settings
    scores = {
        "iou": geometry.ramp_up(measures.iou, full=s.iou_full, zero=s.iou_zero),
        "surface": geometry.ramp_down(
            measures.surface_deviation_mm, full=s.surface_full_mm, zero=s.surface_zero_mm
        ),
        "depth": geometry.ramp_down(
            measures.wrong_depth_mm, full=s.surface_full_mm, zero=s.surface_zero_mm
        ),
        "chamfer": geometry.log_ramp_down(
            measures.chamfer, full=s.chamfer_full, zero=s.chamfer_zero
        ),
        "volume": geometry.ramp_down(
            measures.volume_rel_error, full=s.volume_full, zero=s.volume_zero
        ),
        "bbox": geometry.ramp_down(
            measures.bbox_deviation_mm, full=s.bbox_full_mm, zero=s.bbox_zero_mm
        ),
    }
    if silhouette is not None:
        scores["silhouette"] = geometry.ramp_up(
            silhouette, full=s.silhouette_full, zero=s.silhouette_zero
        )
    core = min(scores[k] for k in CORE)
    refined = [scores[k] for k in REFINE if k in scores]
    refine = sum(refined) / len(refined)
    reward = core * (CORE_SHARE + (1 - CORE_SHARE) * refine)
    reward = round(min(1.0, max(0.0, reward)), 6)
    return reward, {"gate": 1.0, "topology": 1.0, "volume_gate": 1.0, "core": core, **scores}


# --------------------------------------------------------------------------- render check


def render_job(reference: trimesh.Trimesh, *, resolution_px: int) -> dict[str, Any]:
    """The camera set-up of the render check, framed on ``reference``'s bounding box: each
    view's camera sits 10 extents from the box centre; its ortho scale is ``FRAME_MARGIN``
    times the larger extent the view sees."""
    lo, hi = geometry.bounding_box(reference)
    centre, extent = (lo + hi) / 2.0, hi - lo
    reach = float(max(extent.max(), 1e-6))
    distance = 10.0 * reach
    views = {}
    for name, (direction, rotation, (ax, ay)) in VIEWS.items():
        views[name] = {
            "location": (centre + distance * np.asarray(direction)).tolist(),
            "rotation": list(rotation),
            "ortho_scale": FRAME_MARGIN * float(max(extent[ax], extent[ay], 1e-6)),
        }
    return {
        "views": views,
        "resolution_px": resolution_px,
        "clip_end": 2.0 * distance + 1000.0 * reach,
    }


def _npz(mesh: trimesh.Trimesh) -> bytes:
    buf = io.BytesIO()
    np.savez(
        buf,
        vertices=np.asarray(mesh.vertices, dtype=np.float64),
        faces=np.asarray(mesh.faces, dtype=np.int32),
    )
    return buf.getvalue()


def _render_tar(meshes: Mapping[str, trimesh.Trimesh], job: dict[str, Any], *, run: str) -> bytes:
    """The render's inputs as a tar for ``/``: ``RENDER_DIR/<run>/`` holds the meshes, the
    job and the script, and the images go to ``RENDER_DIR/<run>/out``."""
    files: dict[str, bytes] = {f"{name}.npz": _npz(m) for name, m in meshes.items()}
    where = f"{RENDER_DIR}/{run}"
    job = {
        **job,
        "meshes": {name: f"{where}/{name}.npz" for name in meshes},
        "out_dir": f"{where}/out",
    }
    files["job.json"] = json.dumps(job).encode()
    files["silhouettes.py"] = RENDER_SCRIPT.read_bytes()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for folder in (RENDER_DIR, where):
            d = tarfile.TarInfo(folder.strip("/"))
            d.type, d.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(d)
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(f"{where.strip('/')}/{name}")
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def decode_masks(tar_bytes: bytes) -> dict[str, np.ndarray]:
    """``{<mesh>_<view>: boolean mask}`` from a tar of the render's PNGs (alpha > 127)."""
    from PIL import Image

    masks: dict[str, np.ndarray] = {}
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
        for member in tar:
            name = posixpath.basename(member.name)
            if not (member.isfile() and name.endswith(".png") and member.size <= MAX_PNG_BYTES):
                continue
            fh = tar.extractfile(member)
            if fh is None:
                continue
            with Image.open(io.BytesIO(fh.read())) as img:
                alpha = np.asarray(img.convert("RGBA"))[..., 3]
            masks[name[: -len(".png")]] = alpha > 127
    return masks


def render_silhouettes(
    runtime: SandboxRuntime,
    container_id: str,
    *,
    result: trimesh.Trimesh,
    reference: trimesh.Trimesh,
    settings: CadSettings,
) -> dict[str, float]:
    """Render both meshes in ``container_id`` (a fresh sandbox of the pristine task image,
    made and disposed of by the caller) and return the silhouette IoU of each view.

    When that render fails (Blender's exit status, missing or unreadable images), the
    reference is rendered alone in the same sandbox: the render check works without the
    part, so the part made it fail (``RenderRefused``, its silhouette 0; a mesh the gates
    passed is data, and no list of what Blender chokes on can be complete). Only a failure
    of that control too is the verifier's (``VerifierFailure``, status error).

    Raises ``RenderTimeout`` (past ``render_timeout_s``), ``RenderRefused``,
    ``VerifierFailure`` or ``CrucibleError`` (engine).
    """
    job = render_job(reference, resolution_px=settings.render_px)
    try:
        masks = _render(
            runtime,
            container_id,
            {"result": result, "reference": reference},
            job,
            settings=settings,
            run="check",
        )
    except RenderTimeout:
        raise
    except VerifierFailure as failed:
        try:
            _render(
                runtime,
                container_id,
                {"reference": reference},
                job,
                settings=settings,
                run="control",
            )
        except VerifierFailure:
            raise failed from None
        raise RenderRefused(
            f"the render check failed with the part in it ({failed.reason[:300]}); "
            "the reference alone renders"
        ) from None
    return {
        view: geometry.silhouette_iou(masks[f"result_{view}"], masks[f"reference_{view}"])
        for view in VIEWS
    }


def _render(
    runtime: SandboxRuntime,
    container_id: str,
    meshes: Mapping[str, trimesh.Trimesh],
    job: dict[str, Any],
    *,
    settings: CadSettings,
    run: str,
) -> dict[str, np.ndarray]:
    """One Blender run over ``meshes`` in ``RENDER_DIR/<run>``: ``{<mesh>_<view>: mask}``
    with every mesh's every view. Raises ``RenderTimeout``, ``VerifierFailure`` (Blender's
    exit status, images missing or unreadable) or ``CrucibleError``."""
    where = f"{RENDER_DIR}/{run}"
    runtime.put_archive(container_id, "/", _render_tar(meshes, job, run=run))
    res = runtime.exec(
        container_id,
        ExecRequest(
            cmd=[
                "blender",
                "-b",
                "--factory-startup",
                "--python-exit-code",
                "1",
                "--python",
                f"{where}/silhouettes.py",
                "--",
                f"{where}/job.json",
            ],
            cwd=where,
            timeout_s=settings.render_timeout_s,
            user=ROOT,
            max_output_bytes=16 << 10,
        ),
    )
    tail = (res.stdout[-1500:] + res.stderr[-1500:]).decode("utf-8", "replace")
    if res.timed_out:
        raise RenderTimeout(
            f"the render check exceeded {settings.render_timeout_s} s", status="timeout"
        )
    if res.exit_code != 0:
        raise VerifierFailure(
            f"Blender exited with status {res.exit_code} in the render check: {tail}"
        )
    try:
        data = b"".join(runtime.get_archive(container_id, f"{where}/out"))
    except NotFound:
        raise VerifierFailure(f"the render check wrote no images: {tail}") from None
    try:
        masks = decode_masks(data)
    except Exception as e:  # noqa: BLE001 - a PNG PIL cannot read: the render's failure
        raise VerifierFailure(f"the render check's images are unreadable: {e}") from None
    for name in meshes:
        for view in VIEWS:
            if f"{name}_{view}" not in masks:
                raise VerifierFailure(f"the render check did not produce the {view} view")
    return masks


# --------------------------------------------------------------------------- the verifier


@dataclass
class _Clock:
    marks: dict[str, float] = field(default_factory=dict)

    @contextlib.contextmanager
    def time(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.marks[name] = round((time.perf_counter() - t0) * 1e3, 1)


class _Zero(Exception):
    """The agent's part scores 0: ``reason`` (public), ``components``, and ``dodge``."""

    def __init__(
        self, reason: str, components: dict[str, float], *, dodge: str | None = None
    ) -> None:
        super().__init__(reason)
        self.reason, self.components, self.dodge = reason, components, dodge


def _bounded(
    fn: Callable[..., Any], *args: Any, settings: CadSettings, step: str, what: str
) -> Any:
    """``fn(*args)`` in a bounded worker; an exceeded bound is the agent's 0, a dodge named
    ``<step>_<cause>`` (``measure_timeout``), and so is any exception the worker raises
    (``<step>_crashed``): it saw the agent's mesh and the fixed reference, so what raised is
    the mesh's doing (a trial's vertex at 1e110 overflowed a float in the gate, and the
    verdict was an error, out of the loss)."""
    try:
        return run_bounded(
            fn,
            *args,
            timeout_s=settings.measure_timeout_s,
            memory_mb=settings.measure_memory_mb,
            what=what,
        )
    except BoundExceeded as e:
        raise _Zero(e.message, {"gate": 0.0}, dodge=f"{step}_{e.cause}") from None
    except WorkerUnavailable as e:
        raise VerifierFailure(str(e)) from None
    except Exception as e:  # noqa: BLE001 (the mesh's doing: see above)
        reason = f"{what} failed on the output's content ({type(e).__name__})"
        raise _Zero(reason, {"gate": 0.0}, dodge=f"{step}_crashed") from None


def verify(
    runtime: SandboxRuntime,
    check: CadCheck,
    *,
    episode_container_id: str,
    fresh_sandbox: Callable[[], str],
    dispose: Callable[[str], object] | None = None,
) -> VerifierResult:
    """Verify the end state of the frozen ``episode_container_id`` against ``check`` (module
    docstring).

    ``fresh_sandbox()`` gives the render sandbox (a started, untouched container of the
    episode's pristine image); ``dispose`` removes it (default ``runtime.destroy`` inline).
    """
    t0 = time.perf_counter()
    dispose = dispose or runtime.destroy
    settings = check.settings
    clock = _Clock()
    details: dict[str, Any] = {"output": settings.output, "format": settings.format}
    private: dict[str, Any] = {}

    def done(
        status: Literal["ok", "error", "timeout"],
        reward: float | None,
        components: dict[str, float] | None = None,
        **extra: Any,
    ) -> VerifierResult:
        out = {**details, **extra, "timing_ms": clock.marks}
        if private:
            out["private"] = private
        return VerifierResult(
            name=NAME,
            version=VERSION,
            status=status,
            reward=reward,
            components=components or {},
            details=out,
            duration_ms=(time.perf_counter() - t0) * 1e3,
        )

    created: list[str] = []  # every container obtained here; disposed of at the end

    def render_sandbox() -> str:
        cid = fresh_sandbox()
        created.append(cid)
        return cid

    pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="crucible-cad")
    skip_render = False  # True: a render still running is not waited for
    try:
        # The render sandbox starts while the output is read (it needs nothing from it).
        render_box = None
        if settings.render:
            render_box = pool.submit(_timed, render_sandbox)
        with clock.time("reference"):
            ref = load_reference_part(check.reference_path, settings.format)
            offsets = _reference_offsets(ref, settings)
        with clock.time("read"):
            got = read_output_file(
                runtime, episode_container_id, settings.output, max_bytes=settings.max_file_bytes
            )
        if got.data is None:
            raise _Zero(got.problem or "no output", {"gate": 0.0}, dodge=got.dodge)
        with clock.time("gate"):
            gated: GateOutcome = _bounded(
                gate_output,
                got.data,
                settings,
                ref.volume,
                ref.topology,
                settings=settings,
                step="gate",
                what="reading and gating the mesh",
            )
        details.update(gated.facts)
        private.update(gated.private)
        if gated.problem is not None:
            comps = {"gate": 1.0 if gated.gate != "build" else 0.0}
            if gated.gate in ("topology", "volume"):
                comps["topology"] = 1.0 if gated.gate == "volume" else 0.0
            if gated.gate == "volume":
                comps["volume_gate"] = 0.0
            raise _Zero(gated.problem, comps, dodge=gated.dodge)
        assert gated.vertices is not None and gated.faces is not None
        render = None
        if render_box is not None:
            render_cid, clock.marks["render_sandbox"] = render_box.result()
            result_mesh = trimesh.Trimesh(vertices=gated.vertices, faces=gated.faces, process=False)
            render = pool.submit(
                _timed,
                render_silhouettes,
                runtime,
                render_cid,
                result=result_mesh,
                reference=ref.mesh,
                settings=settings,
            )
        with clock.time("measure"):
            measures: Measures = _bounded(
                measure_arrays,
                gated.vertices,
                gated.faces,
                np.asarray(ref.mesh.vertices, dtype=np.float64),
                np.asarray(ref.mesh.faces, dtype=np.int64),
                settings.surface_zero_mm,
                offsets,
                settings=settings,
                step="measure",
                what="measuring the mesh",
            )
        silhouettes, worst = None, None
        if render is not None and score(measures, None, settings)[1]["core"] > 0:
            try:
                silhouettes, clock.marks["render"] = render.result()
                worst = min(silhouettes.values())
            except (RenderTimeout, RenderRefused) as e:  # the part's doing (module docstring)
                private["render"] = e.reason
                worst = 0.0
        elif render is not None:  # core 0: the reward is 0 whatever the render says
            render.cancel()
            skip_render = True
        reward, components = score(measures, worst, settings)
        # The scores invert to the reference's geometry (a fourth trial read the
        # reference's volume to every digit off the public volume score and its own part's
        # volume): tenants see the gates, the reward and the reasons; admins the scores.
        private["scores"] = {k: v for k, v in components.items() if k not in PUBLIC}
        components = {k: v for k, v in components.items() if k in PUBLIC}
        private["measures"] = {
            **asdict(measures),
            "chamfer_x1e3": measures.chamfer * 1e3,
            "silhouette_iou": silhouettes,
        }
        return done(
            "ok", reward, components, weights=WEIGHTS, passed=reward >= check.pass_threshold
        )
    except _Zero as e:
        extra: dict[str, Any] = {"gate": e.reason, "passed": False}
        if e.dodge is not None:
            extra["dodge"] = e.dodge
        return done("ok", 0.0, e.components, **extra)
    except VerifierFailure as e:
        return done(e.status, None, reason=e.reason)
    except CrucibleError as e:
        return done("error", None, reason=f"verifier infrastructure failed: {e.detail}")
    except Exception as e:  # a verifier bug must never become a reward
        return done("error", None, reason=f"the CAD verifier failed: {type(e).__name__}: {e}")
    finally:
        pool.shutdown(wait=not skip_render)  # its sandbox goes below: a render in it ends
        for container in created:
            dispose(container)


def _reference_offsets(ref: Reference, settings: CadSettings) -> list[geometry.Offset]:
    """The reference grown and shrunk by each depth level (``cad_offsets``); a failure is
    the task's (``VerifierFailure``), never the agent's."""
    try:
        return cad_offsets.reference_offsets(ref.mesh, settings.depth_levels)
    except cad_offsets.OffsetsUnavailable as e:
        raise VerifierFailure(str(e)) from None


def _timed(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, round((time.perf_counter() - t0) * 1e3, 1)


def verify_episode(task: Task, end: EndState) -> VerifierResult:
    """Registry entry: verify ``task``'s end state against its reference mesh."""
    try:
        check = check_for(task)
    except VerifierFailure as e:
        return VerifierResult(
            name=NAME, version=VERSION, status="error", reward=None, details={"reason": e.reason}
        )
    return verify(
        end.runtime,
        check,
        episode_container_id=end.episode_container_id,
        fresh_sandbox=end.fresh_sandbox,
        dispose=end.dispose,
    )


register(NAME, verify_episode)
