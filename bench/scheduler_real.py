"""A real run beside the simulation: FIFO against Crucible's scheduler over the bundled suites.

One ``crucible serve`` (``harness.serve``, empty warm pools), the real rollout runner and
the bundled oracle solutions, one mixed job per policy over the three bundled suites
(``terminal``, ``document``, ``cad``), ``--real-groups`` groups of ``--real-group-size``:

- **fifo**: target shares proportional to each suite's task count (what a shuffled FIFO
  over the dataset gives in expectation), items taken in arrival order, no warm pools
  ahead (``warm_ahead_s`` 0) and no warm affinity (``warm_bonus_s`` 0).
- **crucible**: the simulation's tempered shares (``tasks_d ** 0.5``), shortest expected
  first with aging, warm pools filled ahead of what is queued, warm affinity.

Every task image is built before either run. FIFO runs first;
Crucible's expected durations come from the records measured so far (FIFO's run included),
as they would on a service that has run before. The accelerator is
the simulation's consumer (``--real-batch`` finished groups per ``--real-step-s`` step)
replayed over the groups' measured finish times. The long tail is the half of the domains
with the fewest tasks (with three suites: the smallest). The straggler policy is left out:
the runner waits for every sample of a group, so it would not change wall-clock time here.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import serve  # bench/ is on sys.path: these run as scripts

from policy_client.calls import Call
from policy_client.client import AsyncClient, Client
from policy_client.policies.base import EpisodeContext, PolicyAction, PolicyRequest
from policy_client.policies.scripted import OraclePolicy
from policy_client.rollout import RolloutConfig, RolloutRunner
from policy_client.schemas import JobOut, RewardRecord

TASKS = Path(__file__).resolve().parents[1] / "tasks"
SUITES = ("terminal", "document", "cad")


class SuiteOracle:
    """The oracle of whichever bundled suite an episode's task is in."""

    name, version = "oracle", "1"

    def __init__(self) -> None:
        self.by_suite = {s: OraclePolicy(TASKS / s) for s in SUITES}
        self.suite_of: dict[str, str] = {}

    def prepare(self, episode: EpisodeContext, client: Any) -> None:
        """Upload the episode's solution (its suite's oracle)."""
        self.suite_of[episode.episode_id] = episode.suite
        self.by_suite[episode.suite].prepare(episode, client)

    def act(self, batch: list[PolicyRequest]) -> list[PolicyAction]:
        """Each request answered by its suite's oracle."""
        return [self.by_suite[self.suite_of[r.episode.episode_id]].act([r])[0] for r in batch]

    def end_episode(self, episode_id: str) -> None:
        """Forget the episode."""
        self.suite_of.pop(episode_id, None)


@dataclass
class RealResult:
    """One policy's run: seconds from job creation; shares of groups."""

    makespan_s: float
    idle_fraction: float
    long_tail_share: float
    groups: int
    rewards_ok: int
    samples: int
    by_suite: dict[str, int]


def consume(finish_s: Sequence[float], *, batch: int, step_s: float) -> tuple[float, float]:
    """The simulation's synchronous consumer over groups finishing at ``finish_s`` seconds:
    it takes ``batch`` finished groups per ``step_s`` step and idles until a batch is
    ready (a last partial batch takes its share of a step). Returns (idle fraction,
    consumer makespan in seconds)."""
    ready, busy_until, idle = 0, 0.0, 0.0
    now = 0.0
    for now in sorted(finish_s):
        ready += 1
        while ready >= batch and busy_until <= now:
            idle += now - busy_until
            ready -= batch
            busy_until = now + step_s
    if ready:
        idle += max(0.0, now - busy_until)
        busy_until = max(now, busy_until) + step_s * ready / batch
    makespan = max(now, busy_until)
    return (idle / makespan if makespan else 0.0), makespan


def _schedule(policy: str, counts: dict[str, int], groups: int) -> dict[str, Any]:
    if policy == "fifo":
        weights = {s: float(n) for s, n in counts.items()}
        extra = {"order": "fifo", "warm_ahead_s": 0, "warm_bonus_s": 0}
    else:
        weights = {s: n**0.5 for s, n in counts.items()}
        extra = {"order": "sef"}
    mix = [{"suite": s, "weight": w} for s, w in weights.items()]
    return {"mix": mix, "groups": groups, "tolerance": 0.2, **extra}


def _run_one(
    url: str,
    key: str,
    policy: str,
    counts: dict[str, int],
    *,
    groups: int,
    group_size: int,
    concurrency: int,
    batch: int,
    step_s: float,
) -> RealResult:
    finished: dict[str, float] = {}  # group id -> when its last record was stored
    suites: dict[str, str] = {}
    oks = [0, 0]
    t0 = time.monotonic()

    def on_record(rec: RewardRecord) -> None:
        finished[rec.group_id] = time.monotonic() - t0
        suites[rec.group_id] = rec.suite
        oks[0] += rec.verifier.status == "ok" and rec.reward == 1.0
        oks[1] += 1

    with Client(url, key) as client:
        body = {
            "policy": {"name": "oracle", "version": "1"},
            "group_size": group_size,
            "schedule": _schedule(policy, counts, groups),
        }  # a mixed job: calls.create_job has no schedule argument
        job = client.run(Call("POST", "/v1/jobs", json=body, keyed=True, model=JobOut))

        async def go() -> None:
            async with AsyncClient(url, key) as aclient:
                runner = RolloutRunner(
                    aclient,
                    SuiteOracle(),  # type: ignore[arg-type]
                    sync_client=client,
                    config=RolloutConfig(concurrency=concurrency, max_turns=3),
                    on_record=on_record,
                )
                await runner.run_job(job.id)

        asyncio.run(go())
    tail = set(sorted(counts, key=lambda s: counts[s])[: max(1, len(counts) // 2)])
    by_suite: dict[str, int] = {}
    for g in finished:
        by_suite[suites[g]] = by_suite.get(suites[g], 0) + 1
    idle, makespan = consume(list(finished.values()), batch=batch, step_s=step_s)
    return RealResult(
        makespan_s=makespan,
        idle_fraction=idle,
        long_tail_share=sum(n for s, n in by_suite.items() if s in tail) / max(1, len(finished)),
        groups=len(finished),
        rewards_ok=oks[0],
        samples=oks[1],
        by_suite=by_suite,
    )


def _build_all(url: str, key: str, counts: dict[str, int]) -> None:
    """Build every task image before the measured runs (a job prepares all its tasks'
    images: the first run would otherwise pay for builds the second reuses)."""
    with Client(url, key) as client:
        body = {"policy": {"name": "warmup"}, "schedule": _schedule("fifo", counts, 1)}
        job = client.run(Call("POST", "/v1/jobs", json=body, keyed=True, model=JobOut))
        deadline = time.monotonic() + 1800
        while time.monotonic() < deadline:
            time.sleep(2.0)
            builds = json.loads(client.run(Call("GET", "/v1/builds")))["builds"]
            if builds and all(b["state"] != "running" for b in builds):
                break
        client.run(Call("POST", f"/v1/jobs/{job.id}/cancel"))


def run_real(
    *, groups: int, group_size: int, concurrency: int, batch: int, step_s: float, repeats: int = 1
) -> dict[str, list[RealResult]]:
    """Run FIFO and Crucible ``repeats`` times each on one real server, alternating which
    goes first (see the module docstring); both are deterministic in which groups they
    generate (the deficit rule), not in durations."""
    from service.tasks.loader import load_suite  # noqa: PLC0415 - the server's loader

    counts = {s: len(load_suite(TASKS / s).ids) for s in SUITES}
    out: dict[str, list[RealResult]] = {"fifo": [], "crucible": []}
    with serve(pool_targets="{}") as srv:
        _build_all(srv.url, srv.key, counts)
        for r in range(repeats):
            for pol in ("fifo", "crucible") if r % 2 == 0 else ("crucible", "fifo"):
                out[pol].append(
                    _run_one(
                        srv.url,
                        srv.key,
                        pol,
                        counts,
                        groups=groups,
                        group_size=group_size,
                        concurrency=concurrency,
                        batch=batch,
                        step_s=step_s,
                    )
                )
    return out


METRICS = (
    ("accelerator idle", lambda r: r.idle_fraction),
    ("long-tail share", lambda r: r.long_tail_share),
    ("makespan (s)", lambda r: r.makespan_s),
)


def print_real(res: dict[str, list[RealResult]], *, group_size: int) -> None:
    """The real run's table in the simulation's layout: means over the repeats and the
    ratio crucible / fifo of the means, then each repeat's ratios."""
    fs, cs = res["fifo"], res["crucible"]
    print(
        f"real run on this machine: {fs[0].groups} groups of {group_size} over "
        f"{', '.join(SUITES)} (oracle policy), {len(fs)} run(s) each, means"
    )
    print(f"{'':20}{'fifo':>11}{'crucible':>11}{'cru/fifo':>10}  per run")
    for name, get in METRICS:
        fv = sum(get(r) for r in fs) / len(fs)
        cv = sum(get(r) for r in cs) / len(cs)
        each = " ".join(
            f"{get(c) / get(f):.3f}" if get(f) else "nan" for f, c in zip(fs, cs, strict=True)
        )
        print(f"{name:20}{fv:11.4g}{cv:11.4g}{(cv / fv if fv else float('nan')):10.3f}  {each}")
    for pol, runs in res.items():
        for i, r in enumerate(runs):
            print(
                f"{pol} run {i + 1}: groups by suite {r.by_suite}; "
                f"{r.rewards_ok}/{r.samples} records scored 1.0"
            )
