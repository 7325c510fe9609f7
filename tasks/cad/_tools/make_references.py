#!/usr/bin/env python3
"""(Re)generate the reference meshes of the CAD tasks by running each oracle in its sandbox.

For every task under ``tasks/cad/`` (or the ids given) this script builds the task image on
``crucible/cad:latest`` (``crucible images build cad`` first), starts a container from it
(network none), copies ``solution/`` to ``/solution``, runs ``bash /solution/solve.sh`` in
``/app`` and reads the file named by ``[crucible.settings] output``. It runs the oracle
twice, in two fresh containers, and fails unless both runs produce the same bytes (the
verifier's "an exact reproduction scores 1.0" rests on that). The mesh must pass the
verifier's gate (watertight solid). Then it is written to ``tests/<reference>`` (default
``tests/reference.<format>``), or with ``--check`` compared with the committed file.

Containers are labelled ``crucible.cadref=<run id>`` and removed at the end.

Usage: .venv/bin/python tasks/cad/_tools/make_references.py [TASK_ID ...] [--check]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import secrets
import sys
import tarfile
import time
from pathlib import Path

import docker
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))

from service.tasks.loader import load_suite  # noqa: E402
from service.tasks.registry import TaskRegistry  # noqa: E402
from service.verifiers import geometry  # noqa: E402
from service.verifiers.cad import CadSettings  # noqa: E402

SUITE = REPO / "tasks" / "cad"
BASE_IMAGE = "crucible/cad:latest"


def run_oracle(
    client: docker.DockerClient, image: str, task_dir: Path, output: str, run_id: str
) -> tuple[bytes, float]:
    """The oracle's output file and the seconds ``solve.sh`` took, in a fresh container."""
    ctr = client.containers.run(
        image,
        ["sleep", "infinity"],
        detach=True,
        network_mode="none",
        init=True,
        labels={"crucible.cadref": run_id},
        mem_limit="2g",
        working_dir="/app",
    )
    try:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(str(task_dir / "solution"), arcname="solution")
        ctr.put_archive("/", buf.getvalue())
        t0 = time.perf_counter()
        code, out = ctr.exec_run(["bash", "/solution/solve.sh"], workdir="/app")
        seconds = time.perf_counter() - t0
        if code != 0:
            raise RuntimeError(f"solve.sh exited {code}:\n{out.decode(errors='replace')[-3000:]}")
        stream, _ = ctr.get_archive(output)
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            member = tar.next()
            assert member is not None and member.isfile(), f"{output} is not a file"
            fh = tar.extractfile(member)
            assert fh is not None
            return fh.read(), seconds
    finally:
        ctr.remove(force=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ids", nargs="*", help="task ids (default: every CAD task)")
    ap.add_argument("--check", action="store_true", help="compare instead of writing")
    args = ap.parse_args()
    console = Console(width=160)
    suite = load_suite(SUITE)
    tasks = [t for t in suite if not args.ids or t.id in args.ids]
    unknown = set(args.ids) - {t.id for t in tasks}
    if unknown:
        console.print(f"[red]unknown task(s): {', '.join(sorted(unknown))}")
        return 2
    client = docker.from_env()
    registry = TaskRegistry([suite])
    run_id = secrets.token_hex(4)
    table = Table(title=f"CAD references ({'check' if args.check else 'write'})")
    for col in ("task", "triangles", "volume mm3", "bbox mm", "oracle s", "sha256", "result"):
        table.add_column(col)
    failed = 0
    try:
        for task in tasks:
            settings = CadSettings.model_validate(task.verifier_settings)
            ref_path = task.path / "tests" / settings.reference_name
            try:
                image = registry.ensure_image(task, base_image=BASE_IMAGE)
                first, seconds = run_oracle(client, image, task.path, settings.output, run_id)
                second, _ = run_oracle(client, image, task.path, settings.output, run_id)
                if first != second:
                    raise RuntimeError("two oracle runs produced different bytes")
                mesh = geometry.load_mesh(first, settings.format)
                gated = geometry.gate(mesh)
                if gated.reason or gated.inverted:
                    raise RuntimeError(f"the oracle's mesh fails the gate: {gated.reason}")
                if args.check:
                    same = ref_path.is_file() and ref_path.read_bytes() == first
                    verdict = "[green]same" if same else "[red]differs"
                    failed += not same
                else:
                    ref_path.parent.mkdir(parents=True, exist_ok=True)
                    ref_path.write_bytes(first)
                    verdict = f"[green]wrote tests/{ref_path.name}"
                lo, hi = mesh.bounds
                table.add_row(
                    task.id,
                    str(len(mesh.faces)),
                    f"{geometry.volume(mesh):.3f}",
                    f"{lo.round(3).tolist()}..{hi.round(3).tolist()}",
                    f"{seconds:.2f}",
                    hashlib.sha256(first).hexdigest()[:12],
                    verdict,
                )
            except Exception as e:  # report every task, then fail
                failed += 1
                table.add_row(task.id, "-", "-", "-", "-", "-", f"[red]{e}")
    finally:
        for ctr in client.containers.list(all=True, filters={"label": f"crucible.cadref={run_id}"}):
            ctr.remove(force=True)
    console.print(table)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
