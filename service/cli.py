"""The ``crucible`` command: a root app with one sub-app per area (``crucible images ...``).

Human output by default (rich), ``--json`` for programs. Errors are ``CrucibleError``s,
printed as one line and exit status 1. Add an area with ``app.add_typer(x_app, name="x")``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from service.errors import CrucibleError

app = typer.Typer(
    name="crucible",
    help="Crucible: sandboxed agent environments for RL post-training.",
    no_args_is_help=True,
    add_completion=False,
)
images_app = typer.Typer(help="Build and inspect the sandbox images.", no_args_is_help=True)
app.add_typer(images_app, name="images")

console = Console()
err_console = Console(stderr=True)

JsonOption = Annotated[bool, typer.Option("--json", help="Machine-readable output on stdout.")]


@contextmanager
def _errors() -> Iterator[None]:
    """Turn Crucible's errors into one red line and exit status 1."""
    try:
        yield
    except CrucibleError as exc:
        err_console.print(f"[red]error:[/] {exc.detail}", highlight=False)
        raise typer.Exit(1) from exc


def _print_json(data: Any) -> None:
    def default(value: object) -> object:
        return str(value) if isinstance(value, Path) else repr(value)

    print(json.dumps(data, indent=2, default=default))


# --------------------------------------------------------------------------- images


@images_app.command("build")
def images_build(
    names: Annotated[
        list[str] | None, typer.Argument(help="Images to build (default: all).")
    ] = None,
    base_image: Annotated[
        str | None,
        typer.Option(help="Use this image as base instead of debootstrap (debian:bookworm-slim)."),
    ] = None,
    force: Annotated[bool, typer.Option(help="Rebuild without the layer cache.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Build the sandbox images whose content hash has no image yet."""
    from service.images import RichProgress, build_images

    with _errors(), RichProgress(err_console) as progress:
        results = build_images(names or None, base_image=base_image, force=force, progress=progress)
    if as_json:
        _print_json([{**asdict(r), "cached": r.cached} for r in results])


@images_app.command("list")
def images_list(as_json: JsonOption = False) -> None:
    """Show each sandbox image, its tags and whether a build would change it."""
    from service.images import list_images

    with _errors():
        rows = list_images()
    if as_json:
        _print_json([asdict(r) for r in rows])
        return
    table = Table("image", "status", "size", "created")
    table.add_column("tag", no_wrap=True)
    colour = {"current": "green", "stale": "yellow", "missing": "red"}
    for r in rows:
        size = f"{r.size_bytes / 1e6:.0f} MB" if r.size_bytes is not None else "-"
        table.add_row(
            r.name,
            f"[{colour[r.status]}]{r.status}[/]",
            size,
            (r.created or "-")[:16].replace("T", " "),
            "\n".join(t for t in r.tags if not t.endswith(":latest")) or "-",
        )
    console.print(table)


# Operational commands register themselves on `app` (serve, keys, audit, db).
import service.cli_builds  # noqa: E402, F401
import service.cli_ops  # noqa: E402, F401
import service.cli_replay  # noqa: E402, F401
import service.cli_rollout  # noqa: E402, F401

if __name__ == "__main__":
    app()
