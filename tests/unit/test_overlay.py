"""Reading an upper directory on the host never follows what the sandbox planted."""

from __future__ import annotations

import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.runtime import overlay


def _upper(tmp_path: Path) -> tuple[Path, Path]:
    upper, host = tmp_path / "upper", tmp_path / "host"
    (upper / "logs" / "verifier").mkdir(parents=True)
    host.mkdir()
    (host / "secret").write_text("host secret")
    return upper, host


def test_read_regular_reads_files_and_refuses_links_fifos_and_large(tmp_path: Path) -> None:
    upper, host = _upper(tmp_path)
    v = upper / "logs" / "verifier"
    (v / "reward.txt").write_text("1.0")
    (v / "reward.json").symlink_to(host / "secret")
    os.mkfifo(v / "junit.xml")
    (v / "big").write_bytes(b"x" * 11)
    got = overlay.read_regular(
        str(upper),
        [],
        "/logs/verifier",
        ["reward.txt", "reward.json", "junit.xml", "big", "no"],
        max_bytes=10,
    )
    assert got == {
        "reward.txt": b"1.0",
        "reward.json": None,  # a symlink, even to a readable host file
        "junit.xml": None,  # a FIFO: not opened for reading, so no hang
        "big": None,
        "no": None,
    }


def test_read_regular_refuses_a_symlinked_directory(tmp_path: Path) -> None:
    upper, host = _upper(tmp_path)
    (upper / "logs" / "verifier").rmdir()
    (upper / "logs" / "verifier").symlink_to(host)
    (host / "reward.txt").write_text("1.0")
    with pytest.raises(overlay.UnreadablePath):
        overlay.read_regular(str(upper), [], "/logs/verifier", ["reward.txt"], max_bytes=10)


def test_read_regular_leaves_a_directory_a_lower_layer_holds_to_the_engine(
    tmp_path: Path,
) -> None:
    upper, _ = _upper(tmp_path)
    lower = tmp_path / "lower"
    (lower / "logs" / "verifier").mkdir(parents=True)
    with pytest.raises(overlay.UnreadablePath):
        overlay.read_regular(str(upper), [str(lower)], "/logs/verifier", ["a"], max_bytes=10)
    missing = overlay.read_regular(str(upper), [], "/nothing/here", ["a"], max_bytes=10)
    assert missing == {"a": None}


def test_entries_keep_links_as_links_and_refuse_symlinked_ancestors(tmp_path: Path) -> None:
    upper, host = _upper(tmp_path)
    app = upper / "app"
    (app / "d").mkdir(parents=True)
    (app / "d" / "f").write_text("data")
    (app / "d" / "link").symlink_to(host / "secret")
    os.link(app / "d" / "f", app / "d" / "hard")
    members = [
        (i.name, i.type, r.read() if r else None)
        for i, r in overlay.entries(str(upper), ["/app/d"])
    ]
    assert members == [
        ("app", tarfile.DIRTYPE, None),
        ("app/d", tarfile.DIRTYPE, None),
        ("app/d/f", tarfile.REGTYPE, b"data"),
        ("app/d/hard", tarfile.LNKTYPE, None),
        ("app/d/link", tarfile.SYMTYPE, None),
    ]
    (upper / "esc").symlink_to(host)
    with pytest.raises(overlay.UnreadablePath):
        overlay.entries(str(upper), ["/esc/secret"])
    with pytest.raises(overlay.UnreadablePath):
        overlay.entries(str(upper), ["/app/missing"])


def test_changes_mark_type_changes_and_tolerate_a_file_below(tmp_path: Path) -> None:
    upper, lower = tmp_path / "u", tmp_path / "l"
    (lower / "etc").mkdir(parents=True)
    (lower / "etc" / "was-file").write_text("x")
    (lower / "etc" / "was-dir").mkdir()
    (lower / "etc" / "same").write_text("x")
    (upper / "etc" / "was-file").mkdir(parents=True)
    (upper / "etc" / "was-file" / "inside").write_text("y")
    (upper / "etc" / "was-dir").write_text("z")
    (upper / "etc" / "same").write_text("w")
    got = {(c.path, c.kind, c.replaced) for c in overlay.changes(str(upper), [str(lower)])}
    assert got == {
        ("/etc", "modified", False),
        ("/etc/was-file", "modified", True),
        ("/etc/was-file/inside", "added", False),
        ("/etc/was-dir", "modified", True),
        ("/etc/same", "modified", False),
    }


def test_changes_never_follow_a_symlink_in_an_image_layer(tmp_path: Path) -> None:
    # Found by a new-user trial: the image's /var/run -> /run pointed the opaque-directory
    # listing at the HOST's /run, whose names became "deleted" entries of the plan.
    host = tmp_path / "host-run"
    (host / "docker.sock").mkdir(parents=True)
    upper, lower = tmp_path / "u", tmp_path / "l"
    (lower / "var").mkdir(parents=True)
    (lower / "var" / "run").symlink_to(host)  # absolute, as in Debian images
    (upper / "var" / "run").mkdir(parents=True)
    (upper / "var" / "run" / "x").write_text("")
    os.setxattr(upper / "var" / "run", "trusted.overlay.opaque", b"y")
    got = {(c.path, c.kind, c.replaced) for c in overlay.changes(str(upper), [str(lower)])}
    assert got == {
        ("/var", "modified", False),
        ("/var/run", "modified", True),  # a symlink replaced by a directory
        ("/var/run/x", "added", False),  # not looked up through the host's directory
    }
    with pytest.raises(overlay.UnreadablePath):
        overlay.read_regular(str(upper), [str(lower)], "/var", ["a"], max_bytes=1)
    (host / "reward.txt").write_text("1")
    (tmp_path / "empty-upper").mkdir()
    with pytest.raises(overlay.UnreadablePath):  # the engine reads it, inside the sandbox
        overlay.read_regular(
            str(tmp_path / "empty-upper"), [str(lower)], "/var/run", ["reward.txt"], max_bytes=9
        )


def test_a_layer_that_cannot_be_read_is_an_error_not_an_absence(tmp_path: Path) -> None:
    # Only a missing path, a file in the way or a refused symlink reads as "not there";
    # anything else (here: a layer directory that is gone) must surface.
    upper = tmp_path / "u"
    (upper / "etc").mkdir(parents=True)
    (upper / "etc" / "x").write_text("")
    with pytest.raises(FileNotFoundError):
        overlay.changes(str(upper), [str(tmp_path / "no-such-layer")])


def test_a_tree_too_deep_for_the_host_is_the_end_states_outcome(tmp_path: Path) -> None:
    # Issue 9: an end state the host-side reader cannot read (a path longer than PATH_MAX
    # once under the layer's prefix) scores 0 as the agent's outcome, while any other host
    # failure stays Crucible's (status error).
    import errno

    from service.errors import SandboxError
    from service.runtime.base import EndStateUnreadable
    from service.runtime.docker import _read_error, _read_errors_mapped

    upper = tmp_path / "upper"
    deep = upper / "app"
    deep.mkdir(parents=True)
    fd = os.open(deep, os.O_RDONLY)
    try:
        for _ in range(30):  # 30 x 200 bytes: past PATH_MAX as a host path
            name = "d" * 200
            os.mkdir(name, dir_fd=fd)
            nfd = os.open(name, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = nfd
    finally:
        os.close(fd)
    members = _read_errors_mapped(overlay.entries(str(upper), ["/app"]), "reading")
    with pytest.raises(EndStateUnreadable, match="File name too long"):
        list(members)
    assert isinstance(_read_error(OSError(errno.EIO, "I/O error"), "x"), SandboxError)
    assert not isinstance(_read_error(OSError(errno.EIO, "I/O error"), "x"), EndStateUnreadable)


def test_a_tree_deeper_than_the_recursion_limit_is_read(tmp_path: Path) -> None:
    # Trial 24: 1,100 nested directories (2.2 KB of path, within every cap) made os.walk
    # (recursive in Python 3.11) raise RecursionError in the diff: the verify answered 500,
    # stored no record and left the episode verifying. The walks keep their own stacks.
    upper = tmp_path / "upper"
    (upper / "app").mkdir(parents=True)
    fd = os.open(upper / "app", os.O_RDONLY)
    try:
        for _ in range(1100):
            os.mkdir("d", dir_fd=fd)
            nfd = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = nfd
        os.close(os.open("f", os.O_CREAT | os.O_WRONLY, dir_fd=fd))
    finally:
        os.close(fd)
    found = overlay.changes(str(upper), [])
    assert len(found) == 1 + 1100 + 1 and all(c.kind == "added" for c in found)
    assert found[0].path == "/app" and found[-1].path.endswith("/d/f")
    names = [info.name for info, _ in overlay.entries(str(upper), ["/app"])]
    assert len(names) == 1102 and names == sorted(names, key=len)
    for name in reversed(names):  # deepest first: pytest's own rmtree recurses too
        (os.rmdir if not name.endswith("/f") else os.unlink)(upper / name)


def test_an_mtime_next_to_the_epoch_is_written_without_an_exponent(tmp_path: Path) -> None:
    # Trial 25: touch -d @0.00001 gave a PAX mtime of "1e-05", which the engine's untar
    # refused (status error) and GNU tar read as 1 s.
    import io

    upper = tmp_path / "upper"
    (upper / "app").mkdir(parents=True)
    (upper / "app" / "f").write_text("x")
    os.utime(upper / "app" / "f", (1e-05, 1e-05))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for info, f in overlay.entries(str(upper), ["/app/f"]):
            t.addfile(info, f)
    assert b"e-05" not in buf.getvalue()
    with tarfile.open(fileobj=io.BytesIO(buf.getvalue())) as t:
        assert t.getmember("app/f").mtime == 0


def test_a_path_that_changes_while_a_frozen_end_state_is_read_is_the_end_states() -> None:
    # A fourth trial: a write accepted before the verifier took the sandbox landed while
    # its changes were read (an ancestor became a file): an error record before, a 0 now.
    from service.runtime.base import EndStateUnreadable
    from service.runtime.docker import _read_errors_mapped

    def members() -> Iterator[tuple[tarfile.TarInfo, None]]:
        yield from ()
        raise overlay.UnreadablePath("/var/tmp/y")

    with pytest.raises(EndStateUnreadable, match="changed while it was read"):
        list(_read_errors_mapped(members(), "reading the changes of container c"))
