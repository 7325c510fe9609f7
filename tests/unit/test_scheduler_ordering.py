"""The scheduler's pure rules: the deficit mix, adaptive weights, SEF with aging, parking."""

from __future__ import annotations

import random

import pytest
from pydantic import ValidationError

from service.scheduler import ordering
from service.scheduler.difficulty import TaskStats
from service.scheduler.ordering import Candidate
from service.scheduler.spec import Schedule


@pytest.mark.parametrize("seed", range(20))
def test_deficit_rule_keeps_every_prefix_within_one_group(seed: int) -> None:
    rng = random.Random(seed)
    raw = [rng.random() + 0.01 for _ in range(rng.randint(2, 9))]
    weights = {f"d{i}": w / sum(raw) for i, w in enumerate(raw)}
    claimed = dict.fromkeys(weights, 0)
    for n in range(1, 400):
        d = ordering.pick_domain(weights, claimed, weights)
        claimed[d] += 1
        assert max(abs(claimed[k] - w * n) for k, w in weights.items()) < 1.0


def test_deficit_rule_skips_ineligible_domains() -> None:
    w = {"a": 0.9, "b": 0.1}
    assert ordering.pick_domain(w, {}, {"b"}) == "b"
    assert ordering.pick_domain(w, {}, set()) is None
    assert ordering.pick_domain(w, {}, {"zzz"}) is None


def test_adaptive_weights_equalise_useful_shares() -> None:
    w = {"a": 0.5, "b": 0.5}
    # a: 90 of 98 groups useful; b: 8 of 98
    adapted = ordering.adaptive_weights(w, {"a": (90, 98), "b": (8, 98)})
    ua, ub = ordering.useful_rate(90, 98), ordering.useful_rate(8, 98)
    assert adapted["b"] > adapted["a"]
    assert adapted["a"] * ua == pytest.approx(adapted["b"] * ub)  # equal useful shares
    # no data: the targets stand; a useless domain is boosted at most 1 / U_FLOOR
    assert ordering.adaptive_weights(w, {}) == pytest.approx(w)
    capped = ordering.adaptive_weights({"a": 0.5, "b": 0.5}, {"a": (0, 10**6), "b": (10**6, 10**6)})
    assert capped["a"] / capped["b"] == pytest.approx(1 / ordering.U_FLOOR, rel=1e-3)


def _c(task: str, expected: float, waited: float = 0.0, **kw: object) -> Candidate:
    return Candidate(None, "s", task, kw.pop("priority", 0), waited, expected, **kw)  # type: ignore[arg-type]


def test_pick_item_priority_then_sef_with_aging_and_warmth() -> None:
    kw = {"aging": 1.0, "warm_bonus_s": 5.0}
    assert ordering.pick_item([_c("long", 100), _c("short", 10)], order="sef", **kw).task_id == (
        "short"
    )
    # 95 s of waiting makes up for 90 s of extra expected time
    got = ordering.pick_item([_c("long", 100, 95), _c("short", 10)], order="sef", **kw)
    assert got.task_id == "long"
    got = ordering.pick_item([_c("cold", 10), _c("hot", 12, warm=True)], order="sef", **kw)
    assert got.task_id == "hot"
    got = ordering.pick_item([_c("short", 1), _c("urgent", 999, priority=5)], order="sef", **kw)
    assert got.task_id == "urgent"
    got = ordering.pick_item([_c("new", 1, 0), _c("old", 500, 10)], order="fifo", **kw)
    assert got.task_id == "old"
    assert ordering.pick_item([], order="sef", **kw) is None


def test_expected_duration_and_quantiles() -> None:
    by_task = {("s", "a"): [10.0, 30.0, 20.0], ("s", "b"): [100.0]}
    assert ordering.expected_duration(by_task, "s", "a") == 20.0
    assert ordering.expected_duration(by_task, "s", "new") == 25.0  # the domain's median
    assert ordering.expected_duration(by_task, "t", "x") == ordering.DEFAULT_DURATION_S
    assert ordering.quantile([float(i) for i in range(1, 101)], 0.95) == 95.0
    assert ordering.quantile([], 0.95) is None


def test_task_stats_park_only_a_window_of_uniform_outcomes() -> None:
    st = TaskStats(outcomes=["mixed", "solved", "solved"], useful=[True, False, False])
    assert st.parked(2) and not st.parked(3)
    assert not TaskStats(outcomes=["solved", "failed"]).parked(2)
    assert TaskStats(rewards=[1.0, 0.0]).uncertain()
    assert not TaskStats(rewards=[1.0, 1.0]).uncertain() and not TaskStats().uncertain()


def test_schedule_validation() -> None:
    with pytest.raises(ValidationError, match="needs groups"):
        Schedule.model_validate({"mix": [{"suite": "a", "weight": 1}]})
    with pytest.raises(ValidationError, match="twice"):
        Schedule.model_validate(
            {"mix": [{"suite": "a", "weight": 1}, {"suite": "a", "weight": 2}], "groups": 3}
        )
    with pytest.raises(ValidationError):
        Schedule.model_validate({"mix": [{"suite": "a", "weight": 0}], "groups": 3})
    s = Schedule.model_validate(
        {"mix": [{"suite": "a", "weight": 3}, {"suite": "b", "weight": 1}], "groups": 4}
    )
    assert s.weights() == {"a": 0.75, "b": 0.25}
