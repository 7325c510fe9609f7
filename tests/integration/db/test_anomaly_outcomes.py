"""The anomaly monitor's dodge, tamper and error rates per task (issue 9: a policy that
learns to dodge its zeros shows as a rising dodge rate), on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

from service import anomaly, rewards
from service.db.engine import Database
from service.metrics import REGISTRY
from tests.integration.db.test_rewards_store import T0, _tenants, make


def _store(db: Database, task: str, outcomes: list[tuple[str, str | None]], start: int = 0) -> None:
    with db.session() as s:
        for i, (status, dodge) in enumerate(outcomes, start):
            details = {"dodge": dodge} if dodge else {}
            rec = make(
                task_id=task,
                status=status,
                created_at=T0 + timedelta(minutes=i),
                verifier={"name": "terminal", "version": "2", "status": status, "details": details},
            )
            if status == "ok":
                rec = rec.model_copy(update={"reward": 0.0 if dodge else 1.0})
            rewards.store(s, rec, tenant_id="acme")


def test_rates_count_the_newest_window_per_task(db: Database) -> None:
    _tenants(db)
    # old history: clean; the newest 10: 3 timeouts, 2 tampered, 1 error, 4 clean
    _store(db, "dodgy", [("ok", None)] * 20)
    newest = [("ok", "timeout")] * 3 + [("ok", "tampered")] * 2 + [("error", None)]
    _store(db, "dodgy", newest + [("ok", None)] * 4, start=100)
    _store(db, "clean", [("ok", None)] * 5)
    found = {r.task_id: r for r in anomaly.outcome_rates(db, window=10)}
    d = found["dodgy"]
    assert (d.n, d.dodge_rate, d.tamper_rate, d.error_rate) == (10, 0.5, 0.2, 0.1)
    assert d.dodges == {"timeout": 3, "tampered": 2}
    c = found["clean"]
    assert (c.n, c.dodge_rate, c.error_rate, c.dodges) == (5, 0.0, 0.0, {})
    assert anomaly.outcome_rates(db, tenant_id="nobody") == []
    anomaly.update_rate_gauges(found.values())
    assert REGISTRY.get_sample_value("crucible_verifier_dodge_rate", {"task": "dodgy"}) == 0.5
