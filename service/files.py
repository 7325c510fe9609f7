"""File upload and download with path confinement.

Rules (DESIGN.md section 5): a path is resolved inside the sandbox (relative paths against
the template's workdir, symlinks followed by ``realpath`` in the sandbox) and must stay under
the template's ``files_root``; upload creates parent directories; a tar upload is rewritten
member by member, refusing absolute names, ``..``, links that leave the destination, and
special files; ownership follows the template's uid/gid.
"""

from __future__ import annotations

import io
import posixpath
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass

from service import audit
from service.context import ServiceContext
from service.errors import CrucibleError, InvalidRequest, PathOutsideRoot
from service.sandboxes import get_live, runtime_failure
from service.templates import Template
from service.tenants import Principal


def within(path: str, root: str) -> bool:
    """True when normalized absolute ``path`` equals ``root`` or lies below it."""
    root = root.rstrip("/") or "/"
    return root == "/" or path == root or path.startswith(root + "/")


def confine(path: str, template: Template) -> str:
    """Normalize ``path`` (relative to the workdir) and check it stays under ``files_root``.

    Raises:
        InvalidRequest: empty path or NUL byte. PathOutsideRoot: escapes ``files_root``.
    """
    if not path or "\0" in path:
        raise InvalidRequest("path must be non-empty and contain no NUL", field="path")
    absolute = posixpath.normpath(posixpath.join(template.workdir, path))
    if absolute.startswith("//"):
        absolute = "/" + absolute.lstrip("/")
    if not within(absolute, template.files_root):
        raise PathOutsideRoot(
            f"path {path!r} resolves to {absolute!r}, outside {template.files_root!r}", field="path"
        )
    return absolute


def sanitize_tar(data: bytes, *, uid: int, gid: int) -> tuple[bytes, int]:
    """Validate an uploaded tar and rewrite it with safe members; return (tar, member count).

    Raises:
        InvalidRequest: not a tar. PathOutsideRoot: a member or link escapes (names the member).
    """
    try:
        src = tarfile.open(fileobj=io.BytesIO(data), mode="r:*")  # noqa: SIM115 - closed below
    except (tarfile.TarError, EOFError) as e:
        raise InvalidRequest(f"body is not a readable tar archive: {e}", field="body") from e
    out = io.BytesIO()
    n = 0
    with src, tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as dst:
        for m in src:
            name = m.name
            while name.startswith("./"):
                name = name[2:]
            if name in ("", "."):
                continue
            parts = name.split("/")
            if name.startswith("/") or ".." in parts:
                raise PathOutsideRoot(
                    f"tar member {m.name!r} escapes the destination", field=f"tar:{m.name}"
                )
            if m.issym():
                target = posixpath.normpath(posixpath.join(posixpath.dirname(name), m.linkname))
                if m.linkname.startswith("/") or target == ".." or target.startswith("../"):
                    raise PathOutsideRoot(
                        f"tar member {m.name!r} links to {m.linkname!r}, outside the destination",
                        field=f"tar:{m.name}",
                    )
            elif m.islnk():
                target = posixpath.normpath(m.linkname)
                if m.linkname.startswith("/") or target == ".." or target.startswith("../"):
                    raise PathOutsideRoot(
                        f"tar member {m.name!r} hard-links to {m.linkname!r}, "
                        "outside the destination",
                        field=f"tar:{m.name}",
                    )
            elif not (m.isfile() or m.isdir()):
                raise InvalidRequest(
                    f"tar member {m.name!r}: only files, directories and links are allowed",
                    field=f"tar:{m.name}",
                )
            m.name = name
            m.uid, m.gid, m.uname, m.gname = uid, gid, "", ""
            m.mode &= 0o1777  # no setuid/setgid
            dst.addfile(m, src.extractfile(m) if m.isfile() else None)
            n += 1
    return out.getvalue(), n


def _one_file_tar(name: str, data: bytes, *, uid: int, gid: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime, info.uid, info.gid = (
            len(data),
            0o644,
            int(time.time()),
            uid,
            gid,
        )
        t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _resolve(
    ctx: ServiceContext, container_id: str, path: str, template: Template, *, create_parents: bool
) -> str:
    resolved = ctx.runtime.resolve_path(container_id, path, create_parents=create_parents)
    if not within(resolved, template.files_root):
        raise PathOutsideRoot(
            f"path {path!r} resolves (through a symlink) to {resolved!r}, "
            f"outside {template.files_root!r}",
            field="path",
        )
    return resolved


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

    Returns (resolved path, bytes written). Audited as ``sandbox.file_put``.
    """
    row = get_live(ctx, principal, sandbox_id)
    tpl = ctx.templates.get(row.template)
    target = confine(path, tpl)
    try:
        if is_tar:
            tar, _ = sanitize_tar(data, uid=tpl.uid, gid=tpl.gid)
            # Resolving a child of ``target`` with create_parents makes ``target`` itself
            # (mkdir -p) and returns its resolved path as the child's parent.
            child = _resolve(
                ctx, row.container_id, posixpath.join(target, "_"), tpl, create_parents=True
            )
            dest = posixpath.dirname(child)
        else:
            if target == "/" or path.endswith("/"):
                raise InvalidRequest(
                    "path names a directory; send a tar with Content-Type: application/x-tar",
                    field="path",
                )
            resolved = _resolve(ctx, row.container_id, target, tpl, create_parents=True)
            dest = posixpath.dirname(resolved)
            tar = _one_file_tar(posixpath.basename(resolved), data, uid=tpl.uid, gid=tpl.gid)
            target = resolved
        ctx.runtime.put_archive(row.container_id, dest, tar)
    except CrucibleError as e:
        if isinstance(e, InvalidRequest):
            raise
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

    Audited as ``sandbox.file_get`` with the byte count.
    """
    row = get_live(ctx, principal, sandbox_id)
    tpl = ctx.templates.get(row.template)
    resolved = _resolve(ctx, row.container_id, confine(path, tpl), tpl, create_parents=False)
    spool = tempfile.SpooledTemporaryFile(max_size=8 << 20)  # noqa: SIM115 - closed by chunks()
    try:
        for chunk in ctx.runtime.get_archive(row.container_id, resolved):
            spool.write(chunk)
    except CrucibleError as e:
        spool.close()
        raise runtime_failure(ctx, principal, sandbox_id, e) from e
    tar_size = spool.tell()
    spool.seek(0)
    with tarfile.open(fileobj=spool, mode="r:") as t:
        first = t.next()
        single = first is not None and first.isfile() and t.next() is None
        size = first.size if single else tar_size
        offset = first.offset_data if single else 0
    spool.seek(offset)
    kind = "file" if single else "tar"
    with ctx.db.session() as s:
        audit.record(
            s,
            "sandbox.file_get",
            tenant_id=principal.tenant_id,
            key_id=principal.key_id,
            sandbox_id=sandbox_id,
            details={"path": resolved, "bytes": size, "kind": kind},
        )

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

    return Download(path=resolved, kind=kind, size=size, chunks=chunks())
