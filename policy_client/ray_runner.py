"""Run one rollout job with N ``RolloutRunner``s as Ray actors (``crucible rollout --ray N``).

Each actor builds its own policy from ``policy_factory`` (a picklable zero-argument callable,
e.g. ``functools.partial(make_policy, "torch", model=...)``) and runs a ``RolloutRunner`` on
the same job; the job's work queue hands each work item to one of them, so the records are
the same as from one runner (the server stores them; ``run_job_on_ray`` also returns them).

Placement: with GPUs in the Ray cluster each actor reserves one (``num_gpus=1``), so N may
not exceed the GPU count; without GPUs the actors reserve no CPU slot and split the machine's
cores between their torch thread pools (``cpu_count // N`` threads each).

Ray is optional: ``pip install ray`` (or the ``torch`` extra). Without it ``run_job_on_ray``
raises ``RayUnavailable`` with that instruction.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import os
from collections.abc import Callable
from typing import Any

from policy_client.client import AsyncClient, Client
from policy_client.policies.base import Policy
from policy_client.rollout import RolloutConfig, RolloutRunner
from policy_client.schemas import JobOut, RewardRecord


class RayUnavailable(RuntimeError):
    """Ray is not installed (``pip install ray``)."""


def _ray() -> Any:
    try:
        import ray
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise RayUnavailable(
            "--ray needs Ray: pip install 'ray>=2.9' (or the project's 'torch' extra)"
        ) from e
    return ray


class RolloutActor:
    """One runner in a Ray worker process: builds its policy once, then runs jobs."""

    def __init__(
        self,
        policy_factory: Callable[[], Policy],
        url: str,
        api_key: str,
        config: RolloutConfig,
        cpu_threads: int | None = None,
    ) -> None:
        if cpu_threads and importlib.util.find_spec("torch") is not None:
            import torch  # only model policies need it; scripted ones run without

            torch.set_num_threads(cpu_threads)
        self.url, self.api_key, self.config = url, api_key, config
        self.policy = policy_factory()

    def run(self, job_id: str) -> list[dict[str, Any]]:
        """Work on ``job_id`` until it has nothing left; the records this actor produced
        (JSON-ready dicts)."""

        async def go() -> list[dict[str, Any]]:
            with Client(self.url, self.api_key) as sync_client:
                async with AsyncClient(self.url, self.api_key) as client:
                    runner = RolloutRunner(
                        client, self.policy, sync_client=sync_client, config=self.config
                    )
                    outcomes = await runner.run_job(job_id)
            return [o.record.model_dump(mode="json") for o in outcomes]

        return asyncio.run(go())


def run_job_on_ray(
    job_id: str,
    *,
    policy_factory: Callable[[], Policy],
    n: int,
    url: str,
    api_key: str,
    config: RolloutConfig | None = None,
    address: str | None = None,
    on_progress: Callable[[JobOut], None] | None = None,
    poll_s: float = 1.0,
) -> list[RewardRecord]:
    """Run ``job_id`` with ``n`` actors on a Ray cluster; return every record they made.

    ``address``: an existing cluster (``ray://...`` or ``auto``); default: start a local
    one for this call (shut down afterwards). ``on_progress`` gets the job every ``poll_s``
    seconds while the actors work.

    Raises:
        RayUnavailable: ray is not installed.
        ValueError: ``n`` < 1, or more actors than the cluster has GPUs.
    """
    if n < 1:
        raise ValueError("n must be >= 1")
    ray = _ray()
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    actors: list[Any] = []
    try:
        gpus = int(ray.cluster_resources().get("GPU", 0))
        if gpus and n > gpus:
            raise ValueError(f"--ray {n}: one runner per GPU, and the cluster has {gpus} GPUs")
        options: dict[str, Any] = {"num_gpus": 1} if gpus else {"num_cpus": 0}
        threads = None if gpus else max(1, (os.cpu_count() or 1) // n)
        base = config or RolloutConfig()
        actor_cls = ray.remote(RolloutActor).options(**options)
        actors += [
            actor_cls.remote(
                policy_factory,
                url,
                api_key,
                dataclasses.replace(base, worker=f"{base.worker}-ray{i}"),
                threads,
            )
            for i in range(n)
        ]
        pending = [a.run.remote(job_id) for a in actors]
        refs = list(pending)
        with Client(url, api_key) as client:
            while pending:
                _, pending = ray.wait(pending, num_returns=len(pending), timeout=poll_s)
                if on_progress:
                    on_progress(client.get_job(job_id))
            results = ray.get(refs)
        return [RewardRecord.model_validate(d) for part in results for d in part]
    finally:
        for actor in actors:
            ray.kill(actor)  # frees its GPU on a cluster that outlives this call
        if started:
            ray.shutdown()
