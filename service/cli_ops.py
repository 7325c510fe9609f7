"""Operational commands: ``crucible serve | keys | tenants | audit | db``.

Registered on the root app by ``service.cli`` (kept in their own module so areas stay small).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from service.cli import _errors, _print_json, app, console, err_console
from service.config import get_settings
from service.db.engine import Database

keys_app = typer.Typer(help="Create, list and revoke API keys.", no_args_is_help=True)
audit_app = typer.Typer(help="Inspect and verify the audit log.", no_args_is_help=True)
db_app = typer.Typer(help="Database schema.", no_args_is_help=True)
app.add_typer(keys_app, name="keys")
app.add_typer(audit_app, name="audit")
app.add_typer(db_app, name="db")


def _db() -> Database:
    db = Database(get_settings().sqlalchemy_url)
    db.migrate()
    return db


def _existing_db() -> Database:
    """The configured database as it stands, for checks: never created or migrated.

    Raises:
        NotFound: no SQLite file there, the database does not answer, or it holds no
            Crucible schema (no audit log).
    """
    import sqlite3
    from contextlib import closing

    from sqlalchemy import inspect
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import SQLAlchemyError

    from service.errors import NotFound

    url = get_settings().sqlalchemy_url
    where = url.split("@")[-1]
    if url.startswith("sqlite"):
        path = make_url(url).database
        if not path or path == ":memory:" or not Path(path).is_file():
            raise NotFound(
                f"no database at {path} (set CRUCIBLE_DATA_DIR or CRUCIBLE_DATABASE_URL)"
            )
        try:  # read-only: opening the engine would turn any file into a WAL database
            with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
                found = conn.execute(
                    "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'audit_events'"
                ).fetchone()
        except sqlite3.DatabaseError as e:
            raise NotFound(f"{path} is not a readable SQLite database: {e}") from e
        if found is None:
            raise NotFound(f"the database at {path} holds no Crucible audit log")
    db = Database(url)
    try:
        has_log = inspect(db.engine).has_table("audit_events")
    except SQLAlchemyError as e:
        db.dispose()
        raise NotFound(f"the database at {where} does not answer: {e.__class__.__name__}") from e
    if not has_log:
        db.dispose()
        raise NotFound(f"the database at {where} holds no Crucible audit log")
    return db


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Bind address (default from settings).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default from settings).")] = None,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
    loop: Annotated[
        str, typer.Option(help="Event loop: auto (uvloop when installed), asyncio, uvloop.")
    ] = "auto",
    http: Annotated[
        str, typer.Option(help="HTTP parser: auto (httptools when installed), h11, httptools.")
    ] = "auto",
) -> None:
    """Run the control plane (uvicorn) on the configured database and Docker engine."""
    import uvicorn

    from service import logs, tracing
    from service.app import create_app

    settings = get_settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    logs.configure(settings.log_format, level=log_level)
    tracing.configure_from_env()
    err_console.print(
        f"crucible: serving on http://{host or settings.host}:{port or settings.port} "
        f"(database {settings.sqlalchemy_url.split('@')[-1]}, deployment {settings.deployment})"
    )
    uvicorn.run(
        create_app(settings),
        host=host or settings.host,
        port=port or settings.port,
        log_level=log_level,
        loop=loop,  # type: ignore[arg-type]  # uvicorn checks the name
        http=http,  # type: ignore[arg-type]
        log_config=None,  # logs.configure set the handlers (human or JSON lines)
        access_log=False,  # logs.RequestIdMiddleware writes the access line, with its id
    )


@keys_app.command("create")
def keys_create(
    tenant: Annotated[str, typer.Option(help="Tenant id (created if missing).")],
    admin: Annotated[bool, typer.Option(help="Grant the admin scope.")] = False,
    name: Annotated[str, typer.Option(help="A label for the key.")] = "",
    max_sandboxes: Annotated[int | None, typer.Option(help="Quota: concurrent sandboxes.")] = None,
    max_cpus: Annotated[float | None, typer.Option(help="Quota: total CPUs.")] = None,
    max_memory_mb: Annotated[int | None, typer.Option(help="Quota: total memory, MiB.")] = None,
    max_snapshots: Annotated[int | None, typer.Option(help="Quota: snapshots held.")] = None,
    max_snapshot_bytes: Annotated[
        int | None, typer.Option(help="Quota: total bytes of the snapshots held.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Create an API key (printed once; only its hash is stored)."""
    from service import tenants
    from service.db.models import Tenant

    s_ = get_settings()
    with _errors():
        db = _db()
        with db.session() as s:
            existing = s.get(Tenant, tenant)
            tenants.create_tenant(
                s,
                tenant,
                max_sandboxes=max_sandboxes
                if max_sandboxes is not None
                else (existing.max_sandboxes if existing else s_.default_quota_sandboxes),
                max_cpus=max_cpus
                if max_cpus is not None
                else (existing.max_cpus if existing else s_.default_quota_cpus),
                max_memory_mb=max_memory_mb
                if max_memory_mb is not None
                else (existing.max_memory_mb if existing else s_.default_quota_memory_mb),
                max_snapshots=max_snapshots,
                max_snapshot_bytes=max_snapshot_bytes,
            )
            key = tenants.create_key(s, tenant, scopes={"admin"} if admin else set(), name=name)
    if as_json:
        _print_json({"tenant": tenant, "key": key, "admin": admin})
    else:
        err_console.print(f"created key for tenant [bold]{tenant}[/]{' (admin)' if admin else ''}:")
        print(key)


@keys_app.command("list")
def keys_list(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List API keys (ids and scopes, never secrets)."""
    from rich.table import Table
    from sqlalchemy import select

    from service.db.models import ApiKey

    with _errors(), _db().session() as s:
        rows = s.execute(select(ApiKey).order_by(ApiKey.created_at)).scalars().all()
    data = [
        {
            "id": k.id,
            "tenant": k.tenant_id,
            "scopes": k.scopes,
            "name": k.name,
            "created_at": k.created_at.isoformat(),
            "revoked_at": k.revoked_at.isoformat() if k.revoked_at else None,
        }
        for k in rows
    ]
    if as_json:
        _print_json(data)
        return
    table = Table("id", "tenant", "scopes", "name", "created", "revoked")
    for d in data:
        table.add_row(
            d["id"],
            d["tenant"],
            d["scopes"] or "-",
            d["name"] or "-",
            d["created_at"][:19],
            (d["revoked_at"] or "-")[:19],
        )
    console.print(table)


@keys_app.command("revoke")
def keys_revoke(
    key_id: Annotated[str, typer.Argument(help="The key id (the part after cr_).")],
) -> None:
    """Revoke an API key."""
    from service import tenants

    with _errors(), _db().session() as s:
        ok = tenants.revoke_key(s, key_id)
    if not ok:
        err_console.print(f"[red]error:[/] no live key {key_id!r}")
        raise typer.Exit(1)
    err_console.print(f"revoked {key_id}")


@audit_app.command("verify")
def audit_verify(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Recompute the hash chain; exit 1 and name the first broken event if any."""
    from service.audit import verify_chain

    with _errors():
        check = verify_chain(_existing_db())
    if as_json:
        _print_json(
            {
                "events_checked": check.events_checked,
                "first_broken_seq": check.first_broken_seq,
                "reason": check.reason,
            }
        )
    elif check.first_broken_seq is None:
        console.print(f"[green]audit chain intact[/]: {check.events_checked} events verified")
    else:
        console.print(
            f"[red]audit chain broken at event {check.first_broken_seq}[/]: {check.reason}"
        )
    if check.first_broken_seq is not None:
        raise typer.Exit(1)


@db_app.command("upgrade")
def db_upgrade() -> None:
    """Migrate the configured database to the newest schema."""
    with _errors():
        _db()
    err_console.print(f"database at {get_settings().sqlalchemy_url.split('@')[-1]} is up to date")
