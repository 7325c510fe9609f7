"""The stack's PostgreSQL, Redis and Prometheus build contexts live in ``sandbox_images/``
but are not sandbox images: ``crucible images build`` (``make images``) must not discover
them."""

from __future__ import annotations

from pathlib import Path

from service.images import discover_images

ROOT = Path(__file__).resolve().parents[3]


def test_stack_service_images_are_not_sandbox_images() -> None:
    names = {d.name for d in discover_images(ROOT / "sandbox_images")}
    assert {"postgres", "redis", "prometheus"}.isdisjoint(names), names
    assert {"base", "terminal", "document", "cad"} <= names, names
    for folder in ("postgres", "redis", "prometheus"):
        assert (ROOT / "sandbox_images" / folder / "Dockerfile").is_file()


def test_a_skip_line_elsewhere_in_the_file_is_not_the_directive(tmp_path: Path) -> None:
    (tmp_path / "svc").mkdir()
    (tmp_path / "svc" / "Dockerfile").write_text("# crucible-images: skip\nFROM x\n")
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "Dockerfile").write_text("FROM x\nRUN echo '# crucible-images: skip'\n")
    assert {d.name for d in discover_images(tmp_path)} == {"base", "img"}
