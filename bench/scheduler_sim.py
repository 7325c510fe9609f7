"""Discrete-event simulation of a rollout cluster: FIFO against Crucible's scheduler.

The cluster: ``--sandboxes`` sandboxes (default 1,000), ``--domains`` domains (200) whose
task counts follow a Zipf law (a few domains hold most tasks: the long tail is the half of
the domains with the fewest), heavy-tailed sample durations (per-domain lognormal medians,
Pareto-tailed samples), a cold start when a group gets no warm sandbox of its domain, and an
accelerator-side consumer that takes ``--batch`` finished groups per training step of
``--step-s`` seconds (synchronous RL: it idles until a batch is ready).

FIFO: the dataset's groups in a shuffled order, each group finishing when its slowest sample
does. Crucible: the same rules as ``service.scheduler`` (``ordering.pick_domain``'s deficit
rule over tempered domain weights ``w_d ~ tasks_d ** 0.5``, the temperature sampling used
for multilingual mixes, Conneau et al. 2020; shortest expected first within a domain with
aging, ``ordering.sef_score``; warm affinity), plus the straggler policy (a group completes
when ``m`` of ``n`` samples are done after a deadline of 3x its expected duration).

"mix only" is the deficit rule alone (the domain's longest-waiting task, no stragglers): it
separates what the mix buys from what SEF and stragglers buy. Every sample is capped at
``--timeout-s`` under all three (a task's agent timeout). Caveat: SEF and the mix change
*which* tasks a fixed number of groups samples, so makespans compare workloads of the same
size, not the same tasks; aging keeps every task sampled.

Prints idle fraction, long-tail share of groups and makespan, and the ratios against FIFO.
Deterministic for a given ``--seed``. Usage::

    .venv/bin/python bench/scheduler_sim.py [--groups 10000] [--seed 0] [--real]

``--real`` adds a real run on this machine (``bench/scheduler_real.py``: FIFO against
Crucible's scheduler on a real server over the bundled suites, oracle policy), printed in
the same layout below the simulation's ratios.
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
from dataclasses import dataclass, field

from service.scheduler import ordering


@dataclass
class World:
    """The simulated dataset: per task its domain and median duration (seconds)."""

    domain_of: list[int]
    median: list[float]
    tasks_by_domain: dict[int, list[int]]
    long_tail: set[int]
    rng: random.Random

    def sample_s(self, task: int) -> float:
        """One sample's duration: the median x a Pareto(1.5) tail normalised to median 1."""
        alpha = 1.5
        u = 1.0 - self.rng.random()
        return self.median[task] * (u ** (-1 / alpha)) / (2 ** (1 / alpha))


def make_world(domains: int, tasks: int, seed: int) -> World:
    """Zipf(1.1) task counts over ``domains`` (at least one each); lognormal medians."""
    rng = random.Random(seed)
    raw = [1 / (r + 1) ** 1.1 for r in range(domains)]
    counts = [max(1, round(tasks * x / sum(raw))) for x in raw]
    domain_of, median = [], []
    by_domain: dict[int, list[int]] = {}
    for d, n in enumerate(counts):
        dom_median = math.exp(rng.gauss(math.log(30.0), 1.0))
        for _ in range(n):
            by_domain.setdefault(d, []).append(len(domain_of))
            domain_of.append(d)
            median.append(dom_median * math.exp(rng.gauss(0.0, 0.5)))
    tail = set(sorted(range(domains), key=lambda d: counts[d])[: domains // 2])
    return World(domain_of, median, by_domain, tail, rng)


@dataclass
class Result:
    """What one policy achieved."""

    makespan_s: float
    idle_fraction: float
    long_tail_share: float
    stragglers: int = 0


@dataclass(order=True)
class _Ev:
    t: float
    seq: int
    group: tuple[int, int] = field(compare=False)  # (task, domain)


def simulate(
    world: World,
    policy: str,
    *,
    groups: int,
    sandboxes: int,
    n: int,
    m: int,
    batch: int,
    step_s: float,
    cold_s: float,
    warm_s: float,
    timeout_s: float,
) -> Result:
    """Run ``groups`` groups of ``n`` samples under ``policy`` (``fifo`` or ``crucible``)."""
    rng = random.Random(world.rng.random())
    world.rng = random.Random(rng.random())
    ntasks = len(world.domain_of)
    fifo_order = [t for _ in range(math.ceil(groups / ntasks)) for t in range(ntasks)]
    rng.shuffle(fifo_order)
    fifo_order = fifo_order[:groups]
    counts = {d: len(ts) for d, ts in world.tasks_by_domain.items()}
    raw = {d: c**0.5 for d, c in counts.items()}
    weights = {d: v / sum(raw.values()) for d, v in raw.items()}
    claimed: dict[int, int] = {}
    last_start: dict[int, float] = {}
    warm: dict[int, int] = {}  # domain -> warm sandboxes
    free = sandboxes  # free sandboxes (warm for some domain or blank)
    blank = sandboxes
    events: list[_Ev] = []
    seq = 0
    started = done = tail_done = 0
    strag_count = [0]  # samples cut by the straggler policy
    ready = 0  # finished groups not yet consumed
    busy_until = 0.0
    idle = 0.0
    consumed = 0
    now = 0.0
    shortest = {
        d: sorted(ts, key=lambda t: world.median[t]) for d, ts in world.tasks_by_domain.items()
    }

    def next_group() -> tuple[int, int]:
        nonlocal started
        if policy == "fifo":
            task = fifo_order[started]
            return task, world.domain_of[task]
        d = ordering.pick_domain(weights, claimed, weights)
        claimed[d] = claimed.get(d, 0) + 1
        # shortest expected first with aging over the domain's tasks (the 8 shortest and
        # the longest-waiting, so aging is seen without scanning every task)
        pool = shortest[d][:8] + sorted(shortest[d], key=lambda t: last_start.get(t, -1.0))[:8]

        def key(t: int) -> float:
            c = ordering.Candidate(
                None,
                str(d),
                str(t),
                0,
                now - last_start.get(t, 0.0),
                world.median[t],
                warm.get(d, 0) >= n,
            )
            return ordering.sef_score(c, aging=1.0, warm_bonus_s=cold_s)

        if policy == "mix":  # the mix alone: the domain's longest-waiting task
            task = min(world.tasks_by_domain[d], key=lambda t: last_start.get(t, -1.0))
        else:
            task = min(pool, key=key)
        last_start[task] = now
        return task, d

    def dispatch() -> None:
        nonlocal free, blank, seq, started
        while started < groups and free >= n:
            task, d = next_group()
            started += 1
            use_warm = min(warm.get(d, 0), n)
            warm[d] = warm.get(d, 0) - use_warm
            take = n - use_warm
            # cold sandboxes: blank ones first, then recycle other domains' warm ones
            from_blank = min(blank, take)
            blank -= from_blank
            take -= from_blank
            for od in sorted(warm, key=lambda k: -warm[k]):
                if take == 0:
                    break
                g = min(warm[od], take)
                warm[od] -= g
                take -= g
            free -= n
            start = warm_s if use_warm == n else cold_s
            samples = sorted(min(world.sample_s(task), timeout_s) for _ in range(n))
            end = samples[-1]
            if policy == "crucible":
                deadline = 3 * world.median[task]
                if end > deadline and samples[m - 1] <= deadline:
                    end = deadline  # m of n done by the deadline: the rest are stragglers
                elif end > deadline:
                    end = samples[m - 1]
                strag_count[0] += sum(1 for x in samples if x > end)
            seq += 1
            heapq.heappush(events, _Ev(now + start + end, seq, (task, d)))

    def consume() -> None:
        nonlocal ready, busy_until, idle, consumed
        while ready >= batch and busy_until <= now:
            idle += now - busy_until
            ready -= batch
            consumed += batch
            busy_until = now + step_s

    dispatch()
    while events:
        ev = heapq.heappop(events)
        # the consumer may have finished a step before this event: it waits from then
        now = ev.t
        task, d = ev.group
        done += 1
        tail_done += d in world.long_tail
        free += n
        warm[d] = warm.get(d, 0) + n
        ready += 1
        consume()
        dispatch()
        if not events and ready:  # the last partial batch
            idle += max(0.0, now - busy_until)
            busy_until = max(now, busy_until) + step_s * ready / batch
            consumed += ready
            ready = 0
    makespan = max(now, busy_until)
    # the consumer idles until the first batch and between batches
    return Result(makespan, idle / makespan, tail_done / done, strag_count[0])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sandboxes", type=int, default=1000)
    p.add_argument("--domains", type=int, default=200)
    p.add_argument("--tasks", type=int, default=5000)
    p.add_argument("--groups", type=int, default=10000)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--min-samples", type=int, default=6)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--step-s", type=float, default=60.0)
    p.add_argument("--cold-s", type=float, default=8.0)
    p.add_argument("--warm-s", type=float, default=0.5)
    p.add_argument("--timeout-s", type=float, default=1800.0, help="every sample's cap (both)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--real", action="store_true", help="also a real run (bench/scheduler_real)")
    p.add_argument("--real-groups", type=int, default=12)
    p.add_argument("--real-group-size", type=int, default=2)
    p.add_argument("--real-concurrency", type=int, default=2)
    p.add_argument("--real-batch", type=int, default=2, help="groups per consumer step")
    p.add_argument("--real-step-s", type=float, default=10.0)
    p.add_argument("--real-repeats", type=int, default=2, help="runs per policy, alternating")
    a = p.parse_args()
    kw = dict(
        groups=a.groups,
        sandboxes=a.sandboxes,
        n=a.group_size,
        m=a.min_samples,
        batch=a.batch,
        step_s=a.step_s,
        cold_s=a.cold_s,
        warm_s=a.warm_s,
        timeout_s=a.timeout_s,
    )
    res = {
        pol: simulate(make_world(a.domains, a.tasks, a.seed), pol, **kw)
        for pol in ("fifo", "mix", "crucible")
    }
    f, x, c = res["fifo"], res["mix"], res["crucible"]
    print(f"{a.sandboxes} sandboxes, {a.domains} domains, {a.groups} groups of {a.group_size}")
    print(f"{'':20}{'fifo':>11}{'mix only':>11}{'crucible':>11}{'mix/fifo':>10}{'cru/fifo':>10}")
    for name, get in (
        ("accelerator idle", lambda r: r.idle_fraction),
        ("long-tail share", lambda r: r.long_tail_share),
        ("makespan (s)", lambda r: r.makespan_s),
    ):
        fv, xv, cv = get(f), get(x), get(c)
        print(f"{name:20}{fv:11.4g}{xv:11.4g}{cv:11.4g}{xv / fv:10.3f}{cv / fv:10.3f}")
    print(f"crucible's straggler policy cut {c.stragglers} of {a.groups * a.group_size} samples")
    if a.real:
        import scheduler_real  # noqa: PLC0415 - needs Docker and the server (bench/ on sys.path)

        real = scheduler_real.run_real(
            groups=a.real_groups,
            group_size=a.real_group_size,
            concurrency=a.real_concurrency,
            batch=a.real_batch,
            step_s=a.real_step_s,
            repeats=a.real_repeats,
        )
        print()
        scheduler_real.print_real(real, group_size=a.real_group_size)


if __name__ == "__main__":
    main()
