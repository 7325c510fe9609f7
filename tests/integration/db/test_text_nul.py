"""Text that holds U+0000, on both databases: PostgreSQL's text refuses NUL (a
``psycopg.DataError``, a 500 on 24 routes' fields in trial 29) while SQLite stored it.
Every statement's bound text is checked before it reaches either (``engine._refuse_nul``),
so both answer alike: an ``InvalidRequest`` naming the column, nothing stored."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from service import tenants
from service.db.engine import Database
from service.db.models import Tenant
from service.errors import InvalidRequest


def test_nul_in_bound_text_is_refused_naming_the_column(db: Database) -> None:
    from service import audit
    from service.db.models import AuditEvent

    with pytest.raises(InvalidRequest) as e, db.session() as s:
        audit.record(s, "sandbox.exec", tenant_id=None, sandbox_id="sb_\x00")
    assert "NUL" in e.value.detail and e.value.field == "sandbox_id"
    with db.read() as s:
        assert s.execute(select(AuditEvent.seq)).all() == [], "nothing stored"
    with pytest.raises(InvalidRequest) as e, db.read() as s:
        s.execute(select(Tenant).where(Tenant.id == "x\x00")).all()
    assert e.value.field == "id"
    with db.read() as s:
        assert s.execute(select(Tenant.id)).scalars().all() == [], "nothing stored"


def test_json_keeps_its_nul_and_text_without_one_is_stored(db: Database) -> None:
    from service import audit

    with db.session() as s:
        tenants.create_tenant(s, "acme", max_sandboxes=1, max_cpus=1, max_memory_mb=64)
        audit.record(s, "test.nul", tenant_id="acme", details={"text": "a\x00b"})
    with db.read() as s:
        assert s.get(Tenant, "acme") is not None
