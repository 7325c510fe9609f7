"""``service.files.sanitize_tar``: what an uploaded tar may hold, bounded expansion, and
damaged archives as client errors (never anything but a ``CrucibleError``)."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import random
import tarfile
import time
import tracemalloc
from collections.abc import Callable

import pytest

from service import files
from service.errors import CrucibleError, InvalidRequest, PathOutsideRoot, PayloadTooLarge
from service.files import sanitize_tar

MiB = 1 << 20
Member = tuple[str, str, bytes | str]  # (name, kind, data or link target)


def make_tar(members: list[Member], *, fmt: int = tarfile.GNU_FORMAT) -> bytes:
    """A tar of (name, kind, payload): kind ``file`` (bytes), ``dir``, ``sym`` or ``hard``
    (link target), ``fifo``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as t:
        for name, kind, payload in members:
            info = tarfile.TarInfo(name)
            info.mode = 0o644
            if kind == "file":
                assert isinstance(payload, bytes)
                info.size = len(payload)
                t.addfile(info, io.BytesIO(payload))
                continue
            info.type = {
                "dir": tarfile.DIRTYPE,
                "sym": tarfile.SYMTYPE,
                "hard": tarfile.LNKTYPE,
                "fifo": tarfile.FIFOTYPE,
                "chr": tarfile.CHRTYPE,
            }[kind]
            if kind in ("sym", "hard"):
                assert isinstance(payload, str)
                info.linkname = payload
            t.addfile(info)
    return buf.getvalue()


def sanitize(data: bytes, limit: int = 8 * MiB) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    """The members of the rewritten tar, each with its data (None when not a file)."""
    out, n = sanitize_tar(data, uid=1000, gid=1001, max_expanded_bytes=limit)
    with tarfile.open(fileobj=io.BytesIO(out), mode="r:") as t:
        members = [(m, t.extractfile(m).read() if m.isfile() else None) for m in t]  # type: ignore[union-attr]
    assert len(members) == n
    return members


class Zeros:
    """A file object of endless zeros (to write big members without holding them)."""

    def read(self, n: int = -1) -> bytes:
        return bytes(max(n, 0))


def gz_stream(members: list[tuple[str, int]], **pax: str) -> bytes:
    """A .tar.gz of zero-filled members (name, size), streamed; ``pax`` headers optional."""
    buf = io.BytesIO()
    fmt = tarfile.PAX_FORMAT if pax else tarfile.GNU_FORMAT
    with (
        gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=6) as gz,
        tarfile.open(fileobj=gz, mode="w|", format=fmt) as t,
    ):
        for name, size in members:
            info = tarfile.TarInfo(name)
            info.size = size
            info.pax_headers = dict(pax)
            t.addfile(info, Zeros() if size else None)  # type: ignore[arg-type]
    return buf.getvalue()


def zeros_bomb(name: str, size: int) -> bytes:
    """A .tar.gz holding ``size`` (a multiple of 1 MiB) zero bytes as ``name``: gzip members
    in a row, each 1 MiB of zeros, so it is made in milliseconds."""
    info = tarfile.TarInfo(name)
    info.size = size
    chunk = gzip.compress(bytes(MiB))
    header = gzip.compress(info.tobuf(tarfile.GNU_FORMAT))
    return header + chunk * (size // MiB) + gzip.compress(bytes(2 * tarfile.BLOCKSIZE))


def peak_bytes(fn: Callable[[], object]) -> int:
    """Peak Python memory allocated while ``fn`` runs; ``fn`` must be refused with 413."""
    tracemalloc.start()
    try:
        with pytest.raises(PayloadTooLarge):
            fn()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


# ----------------------------------------------------------------------- the rewrite


def test_members_are_rewritten_with_owner_and_normalized_names() -> None:
    data = make_tar(
        [
            ("./", "dir", b""),
            ("./pkg//", "dir", b""),
            ("pkg/./a.txt", "file", b"A"),
            ("pkg/link", "sym", "a.txt"),
            ("pkg/hard", "hard", "pkg/a.txt"),
        ]
    )
    members = sanitize(data)
    assert [(m.name, m.type) for m, _ in members] == [
        ("pkg", tarfile.DIRTYPE),
        ("pkg/a.txt", tarfile.REGTYPE),
        ("pkg/link", tarfile.SYMTYPE),
        ("pkg/hard", tarfile.LNKTYPE),
    ]
    assert {(m.uid, m.gid, m.uname, m.gname) for m, _ in members} == {(1000, 1001, "", "")}
    assert members[1][1] == b"A"


def test_setuid_and_setgid_bits_are_dropped() -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        info = tarfile.TarInfo("suid")
        info.mode, info.size = 0o6755, 1
        t.addfile(info, io.BytesIO(b"x"))
    ((m, data),) = sanitize(buf.getvalue())
    assert (m.mode, data) == (0o755, b"x")


@pytest.mark.parametrize("compress", [gzip.compress, bz2.compress, lzma.compress])
def test_compressed_archives_are_read_and_written_plain(
    compress: Callable[[bytes], bytes],
) -> None:
    data = compress(make_tar([("d", "dir", b""), ("d/f.txt", "file", b"hello" * 1000)]))
    out, n = sanitize_tar(data, uid=0, gid=0, max_expanded_bytes=MiB)
    assert n == 2
    with tarfile.open(fileobj=io.BytesIO(out), mode="r:") as t:  # plain, not compressed
        assert t.extractfile("d/f.txt").read() == b"hello" * 1000  # type: ignore[union-attr]


def test_a_plain_tar_as_big_as_the_limit_is_accepted() -> None:
    data = make_tar([("a", "file", b"a" * 300_000), ("b", "file", b"b" * 200_000)])
    members = sanitize(data, limit=len(data))
    assert [data for _, data in members] == [b"a" * 300_000, b"b" * 200_000]


# --------------------------------------------------------------- bounded expansion


def test_a_compression_bomb_is_refused_before_it_expands() -> None:
    bomb = zeros_bomb("zeros.bin", 1 << 30)  # 1 GiB of zeros, ~1 MiB compressed
    assert len(bomb) < 2 * MiB
    with tarfile.open(fileobj=io.BytesIO(bomb[:200_000]), mode="r|gz") as t:  # well-formed
        assert t.next().size == 1 << 30  # type: ignore[union-attr]
    start = time.monotonic()
    with pytest.raises(PayloadTooLarge) as err:
        sanitize_tar(bomb, uid=0, gid=0, max_expanded_bytes=64 * MiB)
    assert err.value.field == "body" and "zeros.bin" in err.value.detail
    assert time.monotonic() - start < 1.0  # refused on its header: nothing inflated
    assert peak_bytes(lambda: sanitize_tar(bomb, uid=0, gid=0, max_expanded_bytes=64 * MiB)) < (
        4 * MiB
    )


def test_many_members_adding_up_past_the_limit_are_refused_with_memory_bounded() -> None:
    limit = 4 * MiB
    bomb = gz_stream([(f"part{i}", MiB) for i in range(64)])  # 64 MiB in all
    with pytest.raises(PayloadTooLarge) as err:
        sanitize_tar(bomb, uid=0, gid=0, max_expanded_bytes=limit)
    assert err.value.field == "body"
    assert peak_bytes(lambda: sanitize_tar(bomb, uid=0, gid=0, max_expanded_bytes=limit)) < (
        2 * limit
    )


def test_a_huge_pax_header_is_refused_with_memory_bounded() -> None:
    limit = MiB
    bomb = gz_stream([("p", 0)], comment="x" * (8 * MiB))
    with pytest.raises(PayloadTooLarge):
        sanitize_tar(bomb, uid=0, gid=0, max_expanded_bytes=limit)
    assert peak_bytes(lambda: sanitize_tar(bomb, uid=0, gid=0, max_expanded_bytes=limit)) < (
        3 * limit
    )


def test_many_empty_members_count_against_the_limit() -> None:
    bomb = gz_stream([(f"e{i}", 0) for i in range(20_000)])  # 10 MiB of headers
    with pytest.raises(PayloadTooLarge):
        sanitize_tar(bomb, uid=0, gid=0, max_expanded_bytes=MiB)


# ------------------------------------------------------------------- damaged archives


def _set_size(tar: bytes, header: int, size: int) -> bytes:
    """``tar`` with the size field of the header at offset ``header`` replaced (checksum
    fixed, so only the size is wrong)."""
    b = bytearray(tar)
    b[header + 124 : header + 136] = b"%011o\0" % size
    block = bytearray(b[header : header + 512])
    block[148:156] = b" " * 8
    b[header + 148 : header + 156] = b"%06o\0 " % sum(block)
    return bytes(b)


GOOD = make_tar([("first.txt", "file", b"1" * 600), ("second.txt", "file", bytes(range(256)) * 40)])
SECOND = 512 + 1024  # offset of the second member's header in GOOD


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(GOOD[: SECOND + 512 + 3000], id="truncated-in-data"),
        pytest.param(GOOD[: SECOND + 100], id="truncated-in-header"),
        pytest.param(GOOD[:300], id="truncated-first-header"),
        pytest.param(_set_size(GOOD, SECOND, 0o77777777777), id="corrupt-size"),
        pytest.param(_set_size(GOOD, SECOND, 20_000), id="size-past-the-end"),
        pytest.param(_set_size(GOOD, 0, 0o77777777), id="corrupt-first-size"),
        pytest.param(gzip.compress(_set_size(GOOD, SECOND, 20_000)), id="gz-size-past-the-end"),
        pytest.param(gzip.compress(GOOD)[:-300], id="gz-truncated"),
        pytest.param(gzip.compress(GOOD)[:-8] + b"\0" * 8, id="gz-bad-crc"),
        pytest.param(bz2.compress(GOOD)[:-50], id="bz2-truncated"),
        pytest.param(lzma.compress(GOOD)[:-50], id="xz-truncated"),
        pytest.param(b"\x1f\x8b" + b"not really gzip" * 10, id="gz-garbage"),
        pytest.param(b"\xfd7zXZ\x00" + b"not really xz" * 10, id="xz-garbage"),
        pytest.param(b"plain text, not a tar" * 30, id="not-a-tar"),
        pytest.param(b"", id="empty"),
    ],
)
def test_damaged_archives_are_invalid_requests(body: bytes) -> None:
    try:
        sanitize_tar(body, uid=0, gid=0, max_expanded_bytes=MiB)
    except PayloadTooLarge:
        pytest.fail("a damaged archive under the limit is not too large")
    except InvalidRequest as e:
        assert e.field == "body" and "not a readable tar archive" in e.detail
    else:  # a header cut short mid-archive reads as its end: tarfile's (and tar's) choice
        assert body == GOOD[: SECOND + 100]


@pytest.mark.parametrize("compress", [None, gzip.compress, bz2.compress, lzma.compress])
def test_fuzzed_archives_raise_only_crucible_errors(
    compress: Callable[[bytes], bytes] | None,
) -> None:
    base = make_tar(
        [
            ("d", "dir", b""),
            ("d/a", "file", b"hello" * 50),
            ("d/l", "sym", "a"),
            ("d/h", "hard", "d/a"),
            ("e", "file", b"z" * 1000),
        ],
        fmt=tarfile.PAX_FORMAT,
    )
    source = compress(base) if compress else base
    rng = random.Random(1234)
    for _ in range(400):
        body = bytearray(source)
        for _ in range(rng.randint(1, 6)):
            body[rng.randrange(len(body))] = rng.randrange(256)
        if rng.random() < 0.3:
            body = body[: rng.randrange(len(body))]
        try:
            sanitize_tar(bytes(body), uid=0, gid=0, max_expanded_bytes=MiB)
        except CrucibleError as e:
            assert 400 <= e.status < 500, e


# --------------------------------------------------------------------- escaping members


@pytest.mark.parametrize(
    ("members", "member"),
    [
        ([("ok.txt", "file", b"x"), ("../evil.txt", "file", b"x")], "../evil.txt"),
        ([("/etc/evil", "file", b"x")], "/etc/evil"),
        ([("a/../../evil", "file", b"x")], "a/../../evil"),
        ([("esc", "sym", "/etc/passwd")], "esc"),
        ([("d", "dir", b""), ("d/esc", "sym", "../../etc")], "d/esc"),
        ([("h", "hard", "../outside")], "h"),
        ([("h", "hard", "/etc/shadow")], "h"),
    ],
)
def test_escaping_members_are_refused(members: list[Member], member: str) -> None:
    with pytest.raises(PathOutsideRoot) as err:
        sanitize(make_tar(members))
    assert err.value.field == f"tar:{member}" and repr(member) in err.value.detail


@pytest.mark.parametrize(
    ("members", "member"),
    [
        # the tester's escape: s/up -> .. is inside, s/up2 -> up/.. is the parent
        (
            [("s/up", "sym", ".."), ("s/up2", "sym", "up/.."), ("s/up2/escaped.txt", "file", b"x")],
            "s/up2",
        ),
        # writing below an earlier symlink, even one that stays inside
        ([("s/in", "sym", "../t"), ("s/in/f.txt", "file", b"x")], "s/in/f.txt"),
        ([("l", "sym", "d"), ("l/sub", "dir", b"")], "l/sub"),
        ([("l", "sym", "d"), ("l/x", "sym", "y")], "l/x"),
        ([("l", "sym", "."), ("l/h", "hard", "f")], "l/h"),
        # a chain of links, each inside on its own
        ([("a/b", "sym", ".."), ("c", "sym", "a/b/.."), ("ok", "file", b"")], "c"),
        # a later symlink changes where an earlier one leads
        ([("a", "sym", "b/.."), ("b", "sym", ".")], "a"),
        # hard links whose target goes through the archive's links
        ([("s/up", "sym", ".."), ("h", "hard", "s/up/../x")], "h"),
        ([("s/up", "sym", ".."), ("s/up2", "sym", "up"), ("h", "hard", "s/up2/../x")], "h"),
        # a hard link to a symlink is a symlink at the new place
        ([("s/up", "sym", ".."), ("h", "hard", "s/up")], "h"),
    ],
)
def test_members_going_through_the_archives_symlinks_are_refused(
    members: list[Member], member: str
) -> None:
    with pytest.raises(PathOutsideRoot) as err:
        sanitize(make_tar(members))
    assert err.value.field == f"tar:{member}", err.value.detail
    assert repr(member) in err.value.detail


def test_links_that_stay_inside_are_kept() -> None:
    members = sanitize(
        make_tar(
            [
                ("lib/libfoo.so", "sym", "libfoo.so.1"),  # a chain defined backwards
                ("lib/libfoo.so.1", "sym", "libfoo.so.1.2"),
                ("lib/libfoo.so.1.2", "file", b"elf"),
                ("bin", "sym", "lib"),
                ("lib/up", "sym", ".."),
                ("lib/self", "sym", "."),
                ("lib/deep", "sym", "../lib/up/lib/up/bin"),
                ("hard", "hard", "lib/libfoo.so.1.2"),
                ("hardlink-to-link", "hard", "bin"),
                ("lib", "dir", b""),  # a directory again: fine
            ]
        )
    )
    assert len(members) == 10


def test_a_symlink_replaced_by_a_file_no_longer_leads_anywhere() -> None:
    members = sanitize(
        make_tar([("a", "sym", "b"), ("a", "file", b"now a file"), ("b", "sym", ".")])
    )
    assert [(m.name, data) for m, data in members] == [
        ("a", None),
        ("a", b"now a file"),
        ("b", None),
    ]


def test_a_symlink_loop_is_refused() -> None:
    with pytest.raises(InvalidRequest) as err:
        sanitize(make_tar([("a", "sym", "b"), ("b", "sym", "a")]))
    assert "too many levels of symbolic links" in err.value.detail


def test_link_checking_work_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(files, "_MAX_LINK_STEPS", 1000)
    many = [(f"l{i}", "sym", "/".join(["."] * 20)) for i in range(100)]
    with pytest.raises(InvalidRequest) as err:
        sanitize(make_tar(many))
    assert err.value.field == "body" and "too many to check" in err.value.detail


def test_many_links_are_checked_fast() -> None:
    members: list[Member] = [("d", "dir", b"")]
    for i in range(10_000):
        members += [(f"d/f{i}", "file", b""), (f"d/l{i}", "sym", f"../d/f{i}")]
    data = make_tar(members)
    start = time.monotonic()
    out, n = sanitize_tar(data, uid=0, gid=0, max_expanded_bytes=len(data))
    assert n == 20_001 and time.monotonic() - start < 10


@pytest.mark.parametrize(
    ("members", "member"),
    [
        ([("p", "fifo", b"")], "p"),
        ([("c", "chr", b"")], "c"),
    ],
)
def test_special_files_are_refused(members: list[Member], member: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        sanitize(make_tar(members))
    assert err.value.field == f"tar:{member}" and not isinstance(err.value, PathOutsideRoot)


def test_names_and_link_targets_over_path_max_are_refused() -> None:
    long = "/".join(["d" * 200] * 21)  # 4220 bytes
    with pytest.raises(InvalidRequest, match="longer than 4096"):
        sanitize(make_tar([(long, "file", b"")], fmt=tarfile.PAX_FORMAT))
    with pytest.raises(InvalidRequest, match="link target longer than 4096"):
        sanitize(make_tar([("l", "sym", long)], fmt=tarfile.PAX_FORMAT))
