"""API keys are stored hashed; quota reservations are atomic under concurrency."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import select

from service import tenants
from service.db.engine import Database
from service.db.models import ApiKey, Tenant
from service.errors import AuthError, QuotaExceeded
from service.tenants import Resources


def _tenant(db: Database, *, sandboxes: int = 3, cpus: float = 2.0, mem: int = 2048) -> None:
    with db.session() as s:
        tenants.create_tenant(s, "acme", max_sandboxes=sandboxes, max_cpus=cpus, max_memory_mb=mem)


def test_key_is_stored_hashed_and_authenticates(db: Database) -> None:
    _tenant(db)
    with db.session() as s:
        key = tenants.create_key(s, "acme", scopes={"admin"})
    secret = key.split("_", 2)[2]
    with db.session() as s:
        stored = s.execute(select(ApiKey)).scalar_one()
        assert secret not in stored.secret_sha256 and len(stored.secret_sha256) == 64
        p = tenants.authenticate(s, key)
    assert (p.tenant_id, p.is_admin) == ("acme", True)


@pytest.mark.parametrize("raw", [None, "", "nope", "cr_x_y", "cr_abc"])
def test_bad_keys_are_rejected(db: Database, raw: str | None) -> None:
    _tenant(db)
    with db.session() as s, pytest.raises(AuthError):
        tenants.authenticate(s, raw)


def test_wrong_secret_and_revoked_key_are_rejected(db: Database) -> None:
    _tenant(db)
    with db.session() as s:
        key = tenants.create_key(s, "acme")
    key_id = key.split("_")[1]
    with db.session() as s, pytest.raises(AuthError):
        tenants.authenticate(s, f"cr_{key_id}_wrongsecret")
    with db.session() as s:
        assert tenants.revoke_key(s, key_id) is True
    with db.session() as s, pytest.raises(AuthError):
        tenants.authenticate(s, key)


def test_quota_names_the_exceeded_limit(db: Database) -> None:
    _tenant(db, sandboxes=3, cpus=2.0, mem=2048)
    with db.session() as s:
        tenants.reserve(s, "acme", Resources(2, 2.0, 1024))
    with db.session() as s, pytest.raises(QuotaExceeded) as e:
        tenants.reserve(s, "acme", Resources(1, 0.5, 512))
    assert "cpus 2+0.5 > 2" in e.value.detail
    with db.session() as s:
        tenants.release(s, "acme", Resources(1, 1.0, 512))
        tenants.reserve(s, "acme", Resources(1, 0.5, 512))
        t = s.get(Tenant, "acme")
        s.refresh(t)
        assert (t.used_sandboxes, t.used_cpus, t.used_memory_mb) == (2, 1.5, 1024)


def test_concurrent_reservations_never_exceed_quota(db: Database) -> None:
    _tenant(db, sandboxes=5, cpus=100.0, mem=100_000)
    wins: list[int] = []
    refusals: list[int] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(5):
            try:
                with db.session() as s:
                    tenants.reserve(s, "acme", Resources(1, 1.0, 1))
                outcome = wins
            except QuotaExceeded:
                outcome = refusals
            with lock:
                outcome.append(1)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (len(wins), len(refusals)) == (5, 15)
    with db.session() as s:
        assert s.get(Tenant, "acme").used_sandboxes == 5
