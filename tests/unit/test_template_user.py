"""The sandbox user of templates: built-in templates from their data file, the task.toml
``[environment]`` user, and which request ``user`` values a template allows."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from pydantic import ValidationError

from service.errors import Forbidden, TaskFormatError
from service.tasks import load_task, template_for
from service.templates import Template, builtin_templates, request_user

GOOD = Path(__file__).resolve().parents[1] / "fixtures" / "tasks" / "good"


def _task_with(tmp_path: Path, extra: str) -> Path:
    folder = shutil.copytree(GOOD / "harbor-hello", tmp_path / "suite" / "harbor-hello")
    toml = folder / "task.toml"
    toml.write_text(
        toml.read_text().replace('workdir = "/srv/work"', f'workdir = "/srv/work"\n{extra}')
    )
    return folder


def test_builtin_templates_come_from_the_data_file() -> None:
    found = {t.name: t for t in builtin_templates("pfx")}
    assert sorted(found) == ["cad", "document", "terminal"]
    assert found["terminal"].image == "pfx/terminal:latest"
    for t in found.values():
        assert (t.user, t.uid, t.gid, t.exec_user) == ("agent", 1000, 1000, "1000:1000")
        assert t.env["HOME"] == t.workdir
    assert [found[n].allow_root for n in ("terminal", "document", "cad")] == [True, False, False]


def test_root_is_uid_zero_and_always_allows_root() -> None:
    root = Template(name="r", image="i")
    assert (root.exec_user, root.allow_root) == ("root", True)
    assert request_user(root, "daemon") == "daemon"
    for user, uid in (("root", 5), ("agent", 0)):
        with pytest.raises(ValidationError, match="root is uid 0"):
            Template(name="x", image="i", user=user, uid=uid)


def test_request_user_needs_allow_root_for_anyone_else() -> None:
    locked = Template(name="l", image="i", user="agent", uid=1000, gid=1001)
    for same in (None, "agent", "1000", "1000:1001"):
        assert request_user(locked, same) is None
    for other in ("root", "0", "0:0", "root:root", "1000:0", "1000:1000", "1", "daemon"):
        with pytest.raises(Forbidden) as info:
            request_user(locked, other)
        assert (info.value.status, info.value.field) == (403, "user")
    opened = locked.model_copy(update={"allow_root": True})
    assert request_user(opened, "0") == "0"
    assert request_user(opened, "agent") is None


def test_task_toml_user_by_uid(tmp_path: Path) -> None:
    plain = template_for(load_task(_task_with(tmp_path / "a", "")), "img:1")
    assert (plain.user, plain.uid, plain.gid, plain.allow_root) == ("root", 0, 0, True)
    by_uid = template_for(load_task(_task_with(tmp_path / "b", "uid = 2000")), "img:1")
    assert (by_uid.user, by_uid.uid, by_uid.gid, by_uid.allow_root) == ("agent", 2000, 2000, False)
    named = load_task(
        _task_with(tmp_path / "c", 'user = "build"\nuid = 2000\ngid = 3000\nallow_root = true')
    )
    t = template_for(named, "img:1")
    assert (t.user, t.uid, t.gid, t.allow_root, t.exec_user) == (
        "build",
        2000,
        3000,
        True,
        "2000:3000",
    )


def test_task_toml_user_by_name_needs_the_image(tmp_path: Path) -> None:
    task = load_task(_task_with(tmp_path, 'user = "daemon"'))
    with pytest.raises(TaskFormatError) as info:
        template_for(task, "img:1")
    assert info.value.field == "environment.user"
    t = template_for(task, "img:1", ids=(1, 1))
    assert (t.user, t.uid, t.gid, t.exec_user) == ("daemon", 1, 1, "1:1")


@pytest.mark.parametrize(
    "extra,message",
    [
        ("gid = 5", "gid needs uid"),
        ('user = "root"\nuid = 5', "user root is uid 0"),
        ('user = "agent"\nuid = 0', "uid 0 is root"),
        ('user = "a b"', "user"),
        ("uid = -1", "uid"),
    ],
)
def test_task_toml_user_errors_name_the_field(tmp_path: Path, extra: str, message: str) -> None:
    with pytest.raises(TaskFormatError, match=message) as info:
        load_task(_task_with(tmp_path, extra))
    assert "environment" in (info.value.field or "")


def test_a_non_root_owner_gets_u_rwx_on_its_uploaded_directories() -> None:
    import io
    import tarfile

    from service.files import sanitize_tar

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        d = tarfile.TarInfo("pkg")
        d.type, d.mode = tarfile.DIRTYPE, 0o644  # tarfile's default mode
        t.addfile(d)
        f = tarfile.TarInfo("pkg/a.txt")
        f.size, f.mode = 1, 0o600
        t.addfile(f, io.BytesIO(b"A"))

    def modes(uid: int) -> dict[str, int]:
        out, _ = sanitize_tar(buf.getvalue(), uid=uid, gid=uid, max_expanded_bytes=1 << 20)
        with tarfile.open(fileobj=io.BytesIO(out)) as t:
            return {m.name: m.mode for m in t.getmembers()}

    assert modes(1000) == {"pkg": 0o744, "pkg/a.txt": 0o600}
    assert modes(0) == {"pkg": 0o644, "pkg/a.txt": 0o600}  # root reads through anyway
