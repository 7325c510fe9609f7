"""File upload and download with path confinement.

Rules (DESIGN.md section 5): a path is resolved inside the sandbox (relative paths against
the template's workdir, symlinks followed by ``realpath`` in the sandbox) and must stay under
the template's ``files_root``; upload creates parent directories and never replaces a
directory with a file; a tar upload (plain or compressed, its expansion bounded by the
upload limit) is rewritten member by member, refusing absolute names, ``..``, members
written through the archive's own symlinks, links that leave the destination, and special
files; ownership follows the template's uid/gid.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import posixpath
import tarfile
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

from service import audit
from service.context import ServiceContext
from service.errors import (
    Conflict,
    CrucibleError,
    InvalidRequest,
    PathOutsideRoot,
    PayloadTooLarge,
    SandboxError,
)
from service.runtime.base import SandboxRuntime
from service.sandboxes import get_live, runtime_failure, tenant_engine_work
from service.templates import Template
from service.tenants import Principal


def within(path: str, root: str) -> bool:
    """True when normalized absolute ``path`` equals ``root`` or lies below it."""
    root = root.rstrip("/") or "/"
    return root == "/" or path == root or path.startswith(root + "/")


# Mounts the engine's archive API cannot see into: it would write beneath them, invisibly.
KERNEL_MOUNTS = ("/proc", "/sys", "/dev")


NAME_MAX_BYTES = 255  # the longest file name Linux filesystems take (NAME_MAX)
PATH_MAX_BYTES = 4095  # PATH_MAX (4096) less the terminating NUL


def confine(path: str, template: Template) -> str:
    """Normalize ``path`` (relative to the workdir) and check it stays under ``files_root``,
    outside the kernel filesystems, and within the kernel's name limits (255 bytes a
    component, 4095 in all, as UTF-8).

    Raises:
        InvalidRequest: empty path, NUL byte, a name too long. PathOutsideRoot: escapes
            ``files_root`` or lies under /proc, /sys or /dev.
    """
    if not path or "\0" in path:
        raise InvalidRequest("path must be non-empty and contain no NUL", field="path")
    absolute = posixpath.normpath(posixpath.join(template.workdir, path))
    if absolute.startswith("//"):
        absolute = "/" + absolute.lstrip("/")
    encoded = absolute.encode("utf-8", "surrogateescape")
    if len(encoded) > PATH_MAX_BYTES:
        raise InvalidRequest(
            f"path is {len(encoded)} bytes long; the limit is {PATH_MAX_BYTES}", field="path"
        )
    for part in absolute.split("/"):
        if len(part.encode("utf-8", "surrogateescape")) > NAME_MAX_BYTES:
            raise InvalidRequest(
                f"path component {part[:40]!r}... is longer than {NAME_MAX_BYTES} bytes",
                field="path",
            )
    return allowed(absolute, path, template)


def allowed(absolute: str, path: str, template: Template, *, resolved: bool = False) -> str:
    """``absolute`` (normalized, or ``resolved`` in the sandbox) when the file API may touch
    it: under ``files_root`` and not under a kernel filesystem.

    Raises:
        PathOutsideRoot: it is not (the message names ``path`` as the client gave it).
    """
    how = "resolves (through a symlink) to" if resolved else "resolves to"
    if not within(absolute, template.files_root):
        raise PathOutsideRoot(
            f"path {path!r} {how} {absolute!r}, outside {template.files_root!r}", field="path"
        )
    if any(within(absolute, k) for k in KERNEL_MOUNTS):
        raise PathOutsideRoot(
            f"path {path!r} is under a kernel filesystem ({absolute!r}); the file API does not "
            "reach /proc, /sys or /dev",
            field="path",
        )
    return absolute


_MAX_NAME_BYTES = 4096  # PATH_MAX: a longer member name or link target cannot be written
_MAX_LINK_HOPS = 40  # symlinks followed in one resolution, as the kernel's MAXSYMLINKS
_MAX_LINK_STEPS = 2_000_000  # path components walked to check one archive's links
# Compressed uploads by magic number; anything else is read as a plain tar.
_DECOMPRESSORS: tuple[tuple[bytes, Callable[[BinaryIO], BinaryIO]], ...] = (
    (b"\x1f\x8b", lambda f: gzip.GzipFile(fileobj=f, mode="rb")),
    (b"BZh", lambda f: bz2.BZ2File(f, mode="rb")),
    (b"\xfd7zXZ\x00", lambda f: lzma.LZMAFile(f, mode="rb")),  # noqa: SIM115 - closed by caller
)
# What reading a damaged archive raises: tarfile's errors, a truncated or corrupt
# compressed stream (EOFError, OSError, zlib.error, LZMAError), a short member (OSError).
_UNREADABLE = (tarfile.TarError, EOFError, OSError, zlib.error, lzma.LZMAError)


class _Expansion:
    """The uncompressed bytes of an upload, read on demand; raises ``PayloadTooLarge`` as
    soon as more than ``limit`` bytes come out, so memory stays bounded by the limit."""

    def __init__(self, source: BinaryIO, limit: int) -> None:
        self._source = source
        self.limit = limit
        self.count = 0

    def read(self, size: int = -1) -> bytes:
        room = self.limit - self.count + 1  # one byte past the limit tells it is exceeded
        data = self._source.read(room if size is None or size < 0 else min(size, room))
        self.count += len(data)
        if self.count > self.limit:
            raise PayloadTooLarge(
                f"the archive expands to more than {self.limit} bytes (the upload limit)",
                field="body",
            )
        return data


class _Links:
    """The archive's symlink members seen so far, to resolve paths lexically inside the
    destination as the extraction will: through the links the archive itself makes.

    ``current``: name -> target of the symlinks standing now (a later member of the same
    name replaces one). ``ever``: every name a symlink member had (nothing may be written
    below one of them). Names are normalized and relative to the destination.
    """

    def __init__(self) -> None:
        self.current: dict[str, str] = {}
        self.ever: set[str] = set()
        self._steps = 0
        self._hops = 0

    def through(self, parts: list[str]) -> str | None:
        """The first proper prefix of ``parts`` that names a symlink member, else None."""
        prefix = ""
        for part in parts[:-1]:
            prefix = f"{prefix}/{part}" if prefix else part
            if prefix in self.ever:
                return prefix
        return None

    def resolve(self, base: list[str], target: str, member: str) -> list[str] | None:
        """``target`` resolved against directory ``base`` (components), following the
        current symlinks: the location as its prefixes (``["a", "a/b"]`` for ``a/b``;
        ``[]`` is the destination), or None when it leaves the destination.

        Raises:
            InvalidRequest: a symlink loop, or links too many to check (names ``member``).
        """
        self._hops = 0
        prefixes: list[str] = []
        for part in base:
            prefixes.append(f"{prefixes[-1]}/{part}" if prefixes else part)
        return self._walk(prefixes, target, member)

    def locate(self, target: str, member: str) -> str | None:
        """Where ``target`` (relative to the destination) is, like ``resolve`` but a final
        symlink not followed (as ``link(2)``); None when outside or the destination."""
        if target.startswith("/"):
            return None
        head, _, last = target.rstrip("/").rpartition("/")
        if last in ("", ".", ".."):
            found = self.resolve([], target, member)
            return found[-1] if found else None
        parent = self.resolve([], head, member)
        if parent is None:
            return None
        return f"{parent[-1]}/{last}" if parent else last

    def _walk(self, prefixes: list[str], target: str, member: str) -> list[str] | None:
        if target.startswith("/"):
            return None
        for part in target.split("/"):
            self._steps += 1
            if self._steps > _MAX_LINK_STEPS:
                raise InvalidRequest(
                    f"the archive's links are too many to check (at tar member {member!r})",
                    field="body",
                )
            if part in ("", "."):
                continue
            if part == "..":
                if not prefixes:
                    return None
                prefixes.pop()
                continue
            prefixes.append(f"{prefixes[-1]}/{part}" if prefixes else part)
            link = self.current.get(prefixes[-1])
            if link is None:
                continue
            self._hops += 1
            if self._hops > _MAX_LINK_HOPS:
                raise InvalidRequest(
                    f"tar member {member!r}: too many levels of symbolic links",
                    field=f"tar:{member}",
                )
            resolved = self._walk(prefixes[:-1], link, member)
            if resolved is None:
                return None
            prefixes = resolved
        return prefixes


def _member_name(m: tarfile.TarInfo) -> str:
    """The member's name normalized (no ``.`` or empty components); empty for the root.

    Raises:
        PathOutsideRoot: an absolute name or a ``..`` component. InvalidRequest: too long.
    """
    if m.name.startswith("/") or ".." in m.name.split("/"):
        raise PathOutsideRoot(
            f"tar member {m.name!r} escapes the destination", field=f"tar:{m.name}"
        )
    for what, value in (("name", m.name), ("link target", m.linkname)):
        if len(value.encode("utf-8", "surrogateescape")) > _MAX_NAME_BYTES:
            raise InvalidRequest(
                f"tar member {m.name[:200]!r}: {what} longer than {_MAX_NAME_BYTES} bytes",
                field=f"tar:{m.name}",
            )
    return "/".join(p for p in m.name.split("/") if p not in ("", "."))


def _check_links(m: tarfile.TarInfo, name: str, links: _Links) -> None:
    """Refuse a member written through an earlier symlink member, and a link leaving the
    destination (resolved through the symlinks defined so far); record symlinks."""
    parts = name.split("/")
    via = links.through(parts)
    if via is not None:
        raise PathOutsideRoot(
            f"tar member {m.name!r} goes through {via!r}, a symlink defined earlier in "
            "the archive; members may not be written through links",
            field=f"tar:{m.name}",
        )
    links.current.pop(name, None)  # the member replaces whatever stood at its name
    if m.issym():
        if links.resolve(parts[:-1], m.linkname, m.name) is None:
            raise PathOutsideRoot(
                f"tar member {m.name!r} links to {m.linkname!r}, outside the destination",
                field=f"tar:{m.name}",
            )
        links.current[name] = m.linkname
        links.ever.add(name)
    elif m.islnk():
        # The engine cleans the target lexically before link(2), GNU tar does not: both
        # readings must stay inside. link(2) does not follow a final symlink: linking to a
        # symlink member makes another symlink, with the same target, at this member.
        for target in dict.fromkeys((m.linkname, posixpath.normpath(m.linkname))):
            found = links.locate(target, m.name)
            if not found:
                raise PathOutsideRoot(
                    f"tar member {m.name!r} hard-links to {m.linkname!r}, outside the destination",
                    field=f"tar:{m.name}",
                )
            copied = links.current.get(found)
            if copied is not None:
                if links.resolve(parts[:-1], copied, m.name) is None:
                    raise PathOutsideRoot(
                        f"tar member {m.name!r} hard-links to the symlink {m.linkname!r}, "
                        f"which leads outside the destination from {m.name!r}",
                        field=f"tar:{m.name}",
                    )
                links.current[name] = copied
                links.ever.add(name)


def _open_source(data: bytes) -> tuple[BinaryIO, bool]:
    """A reader of ``data`` uncompressed (gzip, bzip2 and xz by magic number), and
    whether it was compressed."""
    raw = io.BytesIO(data)
    for magic, opener in _DECOMPRESSORS:
        if data.startswith(magic):
            return opener(raw), True
    return raw, False


MAX_TAR_MTIME = 8**11 - 1  # the largest ustar mtime (year 2242)


def sanitize_tar(data: bytes, *, uid: int, gid: int, max_expanded_bytes: int) -> tuple[bytes, int]:
    """Validate an uploaded tar (plain, gzip, bzip2 or xz) and rewrite it, uncompressed,
    with safe members; return (tar, member count).

    Members are read one at a time; the uncompressed bytes may not exceed
    ``max_expanded_bytes`` (counted as they are read, and a member's declared size is
    checked before its data is), so memory stays bounded by the limit. Refused: absolute
    names, ``..``, names or link targets over 4096 bytes, special files, a member whose
    path goes through a symlink member defined earlier in the archive, and a symlink or
    hard link whose target, resolved lexically through the archive's symlinks, leaves the
    destination (symlinks are checked when defined and again once all are known, since a
    later one can change where an earlier one leads). Owners become ``uid``/``gid``;
    setuid and setgid bits are dropped; a non-root owner's directories get u+rwx;
    modification times are clamped to [0, ``MAX_TAR_MTIME``].

    Raises:
        InvalidRequest: not a readable tar (also truncated or corrupt; field ``body``), a
            special file, a symlink loop. PathOutsideRoot: a member or link escapes (the
            field names the member). PayloadTooLarge: expands past ``max_expanded_bytes``.
    """
    source, compressed = _open_source(data)
    expansion = _Expansion(source, max_expanded_bytes)
    links = _Links()
    out = io.BytesIO()
    n = 0
    try:
        with (
            source,
            tarfile.open(fileobj=expansion, mode="r|") as src,
            tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as dst,
        ):
            while (m := src.next()) is not None:
                src.members.clear()  # members are not looked up again: keep memory flat
                name = _member_name(m)
                if not name:
                    continue
                if m.isfile():
                    if not compressed and not m.issparse() and m.offset_data + m.size > len(data):
                        raise InvalidRequest(
                            f"body is not a readable tar archive: tar member {m.name!r} "
                            f"declares {m.size} bytes past the end of the body "
                            "(truncated, or a corrupt size field)",
                            field="body",
                        )
                    if m.offset_data + m.size > max_expanded_bytes:
                        raise PayloadTooLarge(
                            f"the archive expands to more than {max_expanded_bytes} bytes "
                            f"(the upload limit): tar member {m.name!r} holds {m.size} bytes",
                            field="body",
                        )
                    m.type = tarfile.REGTYPE  # sparse and contiguous files become plain
                elif not (m.isdir() or m.issym() or m.islnk()):
                    raise InvalidRequest(
                        f"tar member {m.name!r}: only files, directories and links are allowed",
                        field=f"tar:{m.name}",
                    )
                _check_links(m, name, links)
                m.name = name
                m.uid, m.gid, m.uname, m.gname = uid, gid, "", ""
                m.mode &= 0o1777  # no setuid/setgid
                if m.isdir() and uid != 0:
                    # A non-root owner needs u+rwx to use its directory (root never did):
                    # tarfile's default mode 0644 would lock it out of its own upload. It
                    # could chmod the directory itself, so this grants nothing.
                    m.mode |= 0o700
                # Times the engine's archive code refuses (a mtime of 10**20 was an engine
                # 500, found by a fuzzing trial) are clamped to what an ustar field holds.
                m.mtime = min(max(int(m.mtime), 0), MAX_TAR_MTIME)
                for key in ("mtime", "atime", "ctime"):  # PAX records would carry them on
                    m.pax_headers.pop(key, None)
                dst.addfile(m, src.extractfile(m) if m.isfile() else None)
                n += 1
            if compressed:  # read to the end of the stream: its checksum is checked there
                while expansion.read(1 << 16):
                    pass
            for name, target in links.current.items():  # the links as they finally stand
                if links.resolve(name.split("/")[:-1], target, name) is None:
                    raise PathOutsideRoot(
                        f"tar member {name!r} links to {target!r}, which leaves the "
                        "destination once the archive's later symlinks are in place",
                        field=f"tar:{name}",
                    )
    except _UNREADABLE as e:
        raise InvalidRequest(f"body is not a readable tar archive: {e}", field="body") from e
    return out.getvalue(), n


def _missing_dirs(ctx: ServiceContext, container_id: str, directory: str) -> tuple[str, list[str]]:
    """(the deepest existing ancestor of ``directory``, its missing components top down);
    one engine stat per level, no exec. An ancestor that is a file is returned as is: the
    put then fails as the filesystem refuses it (409)."""
    missing: list[str] = []
    while directory != "/" and ctx.runtime.stat_path(container_id, directory) is None:
        missing.append(posixpath.basename(directory))
        directory = posixpath.dirname(directory)
    return directory, missing[::-1]


def _dir_members(parents: list[str], *, uid: int, gid: int) -> list[tarfile.TarInfo]:
    out = []
    for i in range(len(parents)):
        info = tarfile.TarInfo("/".join(parents[: i + 1]))
        info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, int(time.time())
        info.uid, info.gid = uid, gid
        out.append(info)
    return out


def _under_dirs(tar: bytes, parents: list[str], *, uid: int, gid: int) -> bytes:
    """A sanitized archive moved below ``parents`` (made as directory members owned by
    ``uid``/``gid``): names and hard-link targets get the prefix; symlinks, relative,
    move with the tree."""
    if not parents:
        return tar
    prefix = "/".join(parents)
    out = io.BytesIO()
    with (
        tarfile.open(fileobj=io.BytesIO(tar)) as src,
        tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as dst,
    ):
        for d in _dir_members(parents, uid=uid, gid=gid):
            dst.addfile(d)
        for m in src:
            m.name = f"{prefix}/{m.name}"
            if m.islnk():
                m.linkname = f"{prefix}/{m.linkname}"
            dst.addfile(m, src.extractfile(m) if m.isfile() else None)
    return out.getvalue()


def _one_file_tar(
    name: str, data: bytes, *, uid: int, gid: int, parents: list[str] | None = None
) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for d in _dir_members(parents or [], uid=uid, gid=gid):
            t.addfile(d)
        info = tarfile.TarInfo("/".join([*(parents or []), name]))
        info.size, info.mode, info.mtime, info.uid, info.gid = (
            len(data),
            0o644,
            int(time.time()),
            uid,
            gid,
        )
        t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def plain_path(
    runtime: SandboxRuntime, container_id: str, path: str, *, final_may_be_missing: bool
) -> str | None:
    """``path`` itself when it needs no resolution in the sandbox: every component but the
    last is an existing directory (not a symlink), and the last is a directory or, with
    ``final_may_be_missing``, a regular file or missing. Else None (the caller resolves in
    the sandbox). Costs one engine stat per component (~1 ms each), no exec.
    """
    parts = [p for p in path.split("/") if p]
    prefix = ""
    for i, part in enumerate(parts):
        prefix += "/" + part
        found = runtime.stat_path(container_id, prefix)
        last = i == len(parts) - 1
        if found is not None and found.kind == "dir":
            continue
        if last and final_may_be_missing and (found is None or found.kind == "file"):
            return path
        return None
    return path or "/"


def _resolve(
    ctx: ServiceContext, container_id: str, path: str, template: Template, *, create_parents: bool
) -> str:
    plain = plain_path(ctx.runtime, container_id, path, final_may_be_missing=True)
    if plain is not None:
        return plain  # confine() already kept it under files_root: no symlink moves it
    resolved = ctx.runtime.resolve_path(container_id, path, create_parents=create_parents)
    # The refusals apply to where the path leads: a symlink may lead out of the root or
    # into /proc, /sys or /dev.
    return allowed(resolved, path, template, resolved=True)


def put(
    ctx: ServiceContext,
    principal: Principal,
    sandbox_id: str,
    *,
    path: str,
    data: bytes,
    is_tar: bool,
) -> tuple[str, int]:
    """Upload ``data`` to ``path`` (a file) or extract it (a tar) into directory ``path``.

    A file never replaces a directory: ``path`` naming one is a ``Conflict`` (asked of the
    engine, no exec). What the sandbox's filesystem refuses (a read-only mount, a dangling
    symlink or a file on the way, a name too long) is the client's error (400/409, field
    ``path`` or ``tar:<member>``), not the runtime's. Returns (resolved path, bytes
    written). Audited as ``sandbox.file_put``.

    Raises:
        InvalidRequest, PathOutsideRoot, PayloadTooLarge: see ``confine`` and
            ``sanitize_tar``. Conflict: a directory in the way, the filesystem refuses.
        NotFound, SandboxError: the sandbox or the runtime failed.
    """
    row = get_live(ctx, principal, sandbox_id)
    tpl = ctx.templates.get(row.template)
    target = confine(path, tpl)
    if is_tar:
        tar, _ = sanitize_tar(
            data, uid=tpl.uid, gid=tpl.gid, max_expanded_bytes=ctx.settings.max_upload_bytes
        )
    elif target == "/" or path.endswith("/"):
        raise InvalidRequest(
            "path names a directory; send a tar with Content-Type: application/x-tar",
            field="path",
        )
    try:
        # Missing parents are not made in the sandbox (its user may not write where they
        # go): they travel in the archive as directory members owned by the template's user,
        # extracted below the deepest directory that exists.
        if is_tar:
            dest = plain_path(ctx.runtime, row.container_id, target, final_may_be_missing=False)
            if dest is None:
                # the resolved path of a child of ``target`` names where ``target`` leads
                child = _resolve(
                    ctx, row.container_id, posixpath.join(target, "_"), tpl, create_parents=False
                )
                dest, missing = _missing_dirs(ctx, row.container_id, posixpath.dirname(child))
                tar = _under_dirs(tar, missing, uid=tpl.uid, gid=tpl.gid)
        else:
            resolved = _resolve(ctx, row.container_id, target, tpl, create_parents=False)
            found = ctx.runtime.stat_path(row.container_id, resolved)
            if found is not None and found.kind == "dir":
                raise Conflict(
                    f"path is a directory ({resolved}); send a tar with "
                    "Content-Type: application/x-tar to extract into it",
                    field="path",
                )
            dest, missing = posixpath.dirname(resolved), []
            if found is None:
                dest, missing = _missing_dirs(ctx, row.container_id, dest)
            tar = _one_file_tar(
                posixpath.basename(resolved), data, uid=tpl.uid, gid=tpl.gid, parents=missing
            )
            target = resolved
        # Checked again at the write: reading and sanitizing a large upload takes long
        # enough for a verification to take the sandbox meanwhile (a fourth trial). The
        # engine's extraction is the tenant's work: marked before that check, so a
        # verification taking the sandbox after it waits for it or scores it the tenant's.
        with tenant_engine_work(ctx, sandbox_id):
            get_live(ctx, principal, sandbox_id)
            ctx.runtime.put_archive(row.container_id, dest, tar)
    except (InvalidRequest, Conflict) as e:
        if not is_tar and e.field and e.field.startswith("tar:"):
            raise type(e)(e.detail, field="path") from e  # the one member is ``path``
        raise
    except CrucibleError as e:
        raise runtime_failure(ctx, principal, sandbox_id, e) from e
    with ctx.db.session() as s:
        audit.record(
            s,
            "sandbox.file_put",
            tenant_id=principal.tenant_id,
            key_id=principal.key_id,
            sandbox_id=sandbox_id,
            details={"path": target, "bytes": len(data), "kind": "tar" if is_tar else "file"},
        )
    return target, len(data)


@dataclass
class Download:
    """A download: a single file's bytes, or a tar of a directory, streamed."""

    path: str
    kind: str  # "file" | "tar"
    size: int
    chunks: Iterator[bytes]


def get(ctx: ServiceContext, principal: Principal, sandbox_id: str, *, path: str) -> Download:
    """Download ``path``: a regular file as its bytes, anything else as a tar.

    Not audited here: the caller records ``audit_download`` once the response is ready, so
    a download that failed is never in the log.

    Raises:
        InvalidRequest, PathOutsideRoot: see ``confine``. NotFound, Conflict, SandboxError:
            the sandbox, the path or the runtime (an archive the engine sent unreadable).
    """
    row = get_live(ctx, principal, sandbox_id)
    tpl = ctx.templates.get(row.template)
    spool = tempfile.SpooledTemporaryFile(max_size=8 << 20)  # noqa: SIM115 - closed by chunks()
    try:
        resolved = _resolve(ctx, row.container_id, confine(path, tpl), tpl, create_parents=False)
        with tenant_engine_work(ctx, sandbox_id):  # the engine holds the container's lock
            get_live(ctx, principal, sandbox_id)
            for chunk in ctx.runtime.get_archive(row.container_id, resolved):
                spool.write(chunk)
        tar_size = spool.tell()
        spool.seek(0)
        with tarfile.open(fileobj=spool, mode="r:") as t:
            first = t.next()
            single = first is not None and first.isfile() and t.next() is None
            size = first.size if single else tar_size
            offset = first.offset_data if single else 0
    except tarfile.TarError as e:
        spool.close()
        raise SandboxError(f"the engine sent an unreadable archive of {path!r}: {e}") from e
    except CrucibleError as e:
        spool.close()
        if isinstance(e, InvalidRequest):
            raise
        raise runtime_failure(ctx, principal, sandbox_id, e) from e
    spool.seek(offset)

    def chunks() -> Iterator[bytes]:
        left = size
        try:
            while left > 0:
                b = spool.read(min(left, 1 << 16))
                if not b:
                    break
                left -= len(b)
                yield b
        finally:
            spool.close()

    return Download(path=resolved, kind="file" if single else "tar", size=size, chunks=chunks())


def audit_download(
    ctx: ServiceContext, principal: Principal, sandbox_id: str, download: Download
) -> None:
    """Record ``sandbox.file_get`` (path, byte count, kind) for a download about to be sent."""
    with ctx.db.session() as s:
        audit.record(
            s,
            "sandbox.file_get",
            tenant_id=principal.tenant_id,
            key_id=principal.key_id,
            sandbox_id=sandbox_id,
            details={"path": download.path, "bytes": download.size, "kind": download.kind},
        )
