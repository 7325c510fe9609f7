"""``crucible rollout`` (the main job) and ``crucible rewards export``.

The rollout talks to a running control plane (``--url``, ``CRUCIBLE_URL``) with an API key
(``--api-key``, ``CRUCIBLE_API_KEY``): it creates a job over a suite, runs it with a
``RolloutRunner`` and the chosen policy, writes the job's records (JSONL and Parquet) and
prints a summary per task.
"""

from __future__ import annotations

import asyncio
import functools
import statistics
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from service.cli import _print_json, app, console, err_console

rewards_app = typer.Typer(help="Reward records.", no_args_is_help=True)
app.add_typer(rewards_app, name="rewards")


def make_policy(name: str, *, suite_dir: Path, model: Path | None, **options: Any) -> Any:
    """The policy called ``name`` (oracle, noop, torch, openai).

    ``model`` is the torch policy's folder; an openai policy takes its served model name
    from ``options["served_model"]`` (so the two never collide) and its endpoint from
    ``options["base_url"]``.

    Raises:
        typer.BadParameter: an unknown policy, or a model policy without what it needs.
    """
    if name == "oracle":
        from policy_client.policies.scripted import OraclePolicy

        return OraclePolicy(suite_dir)
    if name == "noop":
        from policy_client.policies.scripted import NoopPolicy

        return NoopPolicy()
    if name == "torch":
        if model is None:
            raise typer.BadParameter("--policy torch needs --model PATH", param_hint="--model")
        from policy_client.policies.torch_policy import TorchPolicy

        return TorchPolicy.from_pretrained(model, **options)
    if name == "openai":
        from policy_client.policies.openai_compat import OpenAICompatiblePolicy

        options = dict(options)
        base_url, served = options.pop("base_url", None), options.pop("served_model", None)
        if not base_url or not served:
            raise typer.BadParameter(
                "--policy openai needs --endpoint URL and --served-model NAME",
                param_hint="--endpoint",
            )
        return OpenAICompatiblePolicy(base_url, served, **options)
    raise typer.BadParameter(
        f"unknown policy {name!r} (oracle, noop, torch, openai)", param_hint="--policy"
    )


def policy_options(
    policy: str,
    *,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    seed: int | None,
    endpoint: str | None,
    served_model: str | None,
    token_ids: str = "auto",
) -> dict:
    """The keyword arguments ``make_policy`` passes to a model policy."""
    sampling = {"temperature": temperature, "top_p": top_p, "seed": seed}
    if policy == "torch":
        return {"max_new_tokens": max_new_tokens, **sampling}
    if policy == "openai":
        return {
            "base_url": endpoint,
            "served_model": served_model,
            "max_tokens": max_new_tokens,
            "token_ids": token_ids,
            **sampling,
        }
    return {}


@app.command()
def rollout(
    suite: Annotated[
        Path, typer.Option(help="Suite folder, e.g. tasks/terminal.", exists=True, file_okay=False)
    ],
    policy: Annotated[str, typer.Option(help="oracle | noop | torch | openai")] = "oracle",
    model: Annotated[Path | None, typer.Option(help="Model folder for --policy torch.")] = None,
    tasks: Annotated[
        str | None, typer.Option(help="Comma-separated task ids (default all).")
    ] = None,
    group_size: Annotated[int, typer.Option(min=1, help="Samples per task (GRPO group).")] = 1,
    concurrency: Annotated[int, typer.Option(min=1, help="Groups in flight.")] = 4,
    max_turns: Annotated[int, typer.Option(min=1)] = 30,
    max_new_tokens: Annotated[
        int, typer.Option(min=1, help="Model policies: tokens per turn.")
    ] = 256,
    temperature: Annotated[float, typer.Option(min=0.0, help="Sampling temperature.")] = 1.0,
    top_p: Annotated[float, typer.Option(min=0.0, max=1.0, help="Nucleus sampling.")] = 1.0,
    seed: Annotated[int | None, typer.Option(help="Sampling seed.")] = None,
    endpoint: Annotated[
        str | None,
        typer.Option(help="openai: the server's base URL (http://host:8000, with or without /v1)."),
    ] = None,
    served_model: Annotated[str | None, typer.Option(help="openai: the model name.")] = None,
    token_ids: Annotated[
        str,
        typer.Option(
            help="openai: ask for vLLM's token ids: auto (detect once per endpoint) | on | off."
        ),
    ] = "auto",
    url: Annotated[
        str | None, typer.Option(envvar="CRUCIBLE_URL", help="Control plane URL.")
    ] = None,
    api_key: Annotated[str | None, typer.Option(envvar="CRUCIBLE_API_KEY")] = None,
    out: Annotated[Path, typer.Option(help="Folder for the records.")] = Path("records"),
    expect_reward: Annotated[
        float | None,
        typer.Option(help="Exit 1 unless every record has this reward (task validation)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable summary.")] = False,
    ray: Annotated[
        int,
        typer.Option(
            "--ray",
            min=0,
            help="Run N runners as Ray actors (one per GPU when the cluster has GPUs); "
            "0: one runner in this process.",
        ),
    ] = 0,
    ray_address: Annotated[
        str | None, typer.Option(help="--ray: an existing Ray cluster (default: start one).")
    ] = None,
    job_id: Annotated[
        str | None,
        typer.Option(
            "--job",
            help="Resume this job (its queued and lapsed items) instead of creating one; "
            "the summary and --expect-reward cover all of its records.",
        ),
    ] = None,
) -> None:
    """Run a suite through the service with a policy; write reward records; summarize.

    The run survives control-plane restarts (the SDK retries through them); a run that
    died can be resumed with ``--job JOB``: samples already recorded are not run again."""
    from policy_client import calls
    from policy_client.client import AsyncClient, Client
    from policy_client.errors import ClientError
    from policy_client.rollout import RolloutConfig, RolloutRunner

    suite_dir = suite.resolve()
    if token_ids not in ("auto", "on", "off"):
        raise typer.BadParameter(f"{token_ids!r}: choose auto, on or off", param_hint="--token-ids")
    options = policy_options(
        policy,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
        endpoint=endpoint,
        served_model=served_model,
        token_ids=token_ids,
    )
    if ray:  # the actors load the policy; the driver only names it
        pol = _policy_identity(policy, suite_dir=suite_dir, model=model, **options)
    else:
        pol = make_policy(policy, suite_dir=suite_dir, model=model, **options)
    task_ids = [t.strip() for t in tasks.split(",") if t.strip()] if tasks else None
    try:
        with Client(url, api_key) as client:
            if job_id is not None:
                job = client.run(calls.get_job(job_id))
                group_size = job.group_size
            else:
                job = client.run(
                    calls.create_job(
                        suite=suite_dir.name,
                        task_ids=task_ids,
                        group_size=group_size,
                        policy={"name": pol.name, "version": pol.version},
                    )
                )
            total = len(job.task_ids) * group_size
            err_console.print(
                f"job {job.id}: {len(job.task_ids)} tasks x {group_size} "
                f"of suite {job.suite}, policy {pol.name}"
                + (
                    f" (resumed: {sum(job.progress['records'].values())} recorded)"
                    if job_id
                    else ""
                )
            )
            with Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.fields[last]}"),
                console=err_console,
                disable=as_json,
            ) as progress:
                bar = progress.add_task("episodes", total=total, last="")

                def on_record(rec: Any) -> None:
                    shown = "error" if rec.reward is None else f"{rec.reward:g}"
                    progress.update(bar, advance=1, last=f"{rec.task_id}: {shown}")

                warnings: list[str] = []

                async def go() -> list[Any]:
                    async with AsyncClient(url, api_key) as aclient:
                        runner = RolloutRunner(
                            aclient,
                            pol,
                            sync_client=client,
                            on_record=on_record,
                            config=RolloutConfig(concurrency=concurrency, max_turns=max_turns),
                        )
                        try:
                            return await runner.run_job(job.id)
                        finally:
                            warnings.extend(runner.warnings)

                if ray:
                    _run_on_ray(
                        job.id,
                        n=ray,
                        address=ray_address,
                        client=client,
                        config=RolloutConfig(concurrency=concurrency, max_turns=max_turns),
                        factory=functools.partial(
                            make_policy, policy, suite_dir=suite_dir, model=model, **options
                        ),
                        on_progress=lambda j: progress.update(
                            bar, completed=sum(j.progress["records"].values())
                        ),
                    )
                else:
                    asyncio.run(go())
            # every record of the job, once each (a resumed job's earlier ones included)
            records = _job_records(client, job.id)
            final = client.run(calls.get_job(job.id))
            paths = _write_records(client, job.id, out)
    except ClientError as e:
        err_console.print(f"[red]error:[/] {e}")
        raise typer.Exit(1) from e
    summary = _summary(records, final, paths, warnings=warnings)
    if as_json:
        _print_json(summary)
    else:
        _print_table(records)
        for w in warnings:
            err_console.print(f"[yellow]warning:[/] {w}", highlight=False)
        console.print(_summary_line(summary, n_tasks=len(job.task_ids)), highlight=False)
        if summary["missing"]:
            console.print(f"tokens: {summary['missing']}", highlight=False)
        console.print(f"records: {paths['jsonl']} and {paths['parquet']}", highlight=False)
    if records and summary["failed_episodes"] == len(records):
        err_console.print(
            f"[red]every episode failed[/] ({len(records)}): {summary['first_error']}",
            highlight=False,
        )
        raise typer.Exit(1)
    if expect_reward is not None:
        wrong = [r for r in records if r.reward != expect_reward]
        missing = total - len(records)
        if wrong or missing:
            err_console.print(
                f"[red]{len(wrong)} records without reward {expect_reward:g}, "
                f"{missing} episodes missing[/]: " + ", ".join(sorted({r.task_id for r in wrong}))
            )
            raise typer.Exit(1)


def _summary_line(summary: dict[str, Any], *, n_tasks: int) -> str:
    mean = summary["mean_reward"]
    return (
        f"{summary['episodes']} episodes over {n_tasks} tasks; mean reward "
        f"{float('nan') if mean is None else mean:.3f}; "
        f"{summary['failed_episodes']} failed episodes (policy or endpoint errors); "
        f"{summary['errors']} verifier errors; job {summary['state']}"
    )


def _policy_identity(name: str, *, suite_dir: Path, model: Path | None, **options: Any) -> Any:
    """``name``/``version`` of the policy ``make_policy`` would build, without loading it."""
    from types import SimpleNamespace

    if name == "torch":
        if model is None:
            raise typer.BadParameter("--policy torch needs --model PATH", param_hint="--model")
        from policy_client.policies.torch_policy import policy_version

        return SimpleNamespace(name=model.resolve().name, version=policy_version(**options))
    return make_policy(name, suite_dir=suite_dir, model=model, **options)


def _run_on_ray(
    job_id: str,
    *,
    n: int,
    address: str | None,
    client: Any,
    config: Any,
    factory: Any,
    on_progress: Any,
) -> list[Any]:
    """``--ray N``: the job's records from N Ray actors (``policy_client.ray_runner``)."""
    from policy_client.ray_runner import RayUnavailable, run_job_on_ray

    try:
        return run_job_on_ray(
            job_id,
            policy_factory=factory,
            n=n,
            url=client.base_url,
            api_key=client.api_key,
            config=config,
            address=address,
            on_progress=on_progress,
        )
    except (RayUnavailable, ValueError) as e:
        err_console.print(f"[red]error:[/] {e}")
        raise typer.Exit(2) from e


def _job_records(client: Any, job_id: str) -> list[Any]:
    """Every stored record of the job (paged)."""
    out: list[Any] = []
    after = None
    while True:
        page = client.list_records(job_id=job_id, after=after, limit=500)
        out.extend(page.records)
        if page.next_after is None:
            return out
        after = page.next_after


def _write_records(client: Any, job_id: str, out: Path) -> dict[str, str]:
    from policy_client import calls

    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for fmt in ("jsonl", "parquet"):
        path = out / f"{job_id}.{fmt}"
        path.write_bytes(client.run(calls.export_records(fmt=fmt, job_id=job_id)))
        paths[fmt] = str(path)
    return paths


def _missing_summary(records: list[Any]) -> str | None:
    """One line on the tokens the records lack (``None`` when every record has them all)."""
    counts: dict[str, int] = {}
    reasons: list[str] = []
    for r in records:
        for m in r.missing:
            counts[m] = counts.get(m, 0) + 1
        if r.missing_reason and r.missing_reason not in reasons:
            reasons.append(r.missing_reason)
    if not counts:
        return None
    parts = ", ".join(f"{m} missing in {n} of {len(records)} records" for m, n in counts.items())
    return parts + (f" ({'; '.join(reasons[:3])})" if reasons else "")


def _summary(
    records: list[Any], job: Any, paths: dict[str, str], *, warnings: list[str] | None = None
) -> dict[str, Any]:
    failed = [r for r in records if r.stop_reason == "error"]
    return {
        "job_id": job.id,
        "state": job.state,
        "episodes": len(records),
        "failed_episodes": len(failed),
        "first_error": failed[0].error if failed else None,
        "errors": sum(1 for r in records if r.verifier.status != "ok"),
        "mean_reward": statistics.fmean([r.reward for r in records if r.reward is not None])
        if any(r.reward is not None for r in records)
        else None,
        "missing": _missing_summary(records),
        "warnings": list(warnings or []),
        "records": paths,
        "tasks": [
            {
                "task_id": r.task_id,
                "sample_idx": r.sample_idx,
                "reward": r.reward,
                "status": r.verifier.status,
                "stop_reason": r.stop_reason,
                "error": r.error,
                "missing": r.missing,
                "timing": r.timing.model_dump(),
            }
            for r in records
        ],
    }


_COLUMNS = (
    "task",
    "#",
    "reward",
    "status",
    "stop",
    "turns",
    "lease ms",
    "policy ms",
    "env ms",
    "verify ms",
)


def _rows(records: list[Any]) -> list[tuple[str, ...]]:
    rows = []
    for r in sorted(records, key=lambda r: (r.task_id, r.sample_idx)):
        t = r.timing
        rows.append(
            (
                r.task_id,
                str(r.sample_idx),
                "-" if r.reward is None else f"{r.reward:g}",
                r.verifier.status,
                r.stop_reason,
                str(len(r.turns)),
                f"{t.lease_ms:.0f}",
                f"{t.policy_ms:.0f}",
                f"{t.env_ms:.0f}",
                f"{t.verify_ms:.0f}",
            )
        )
    return rows


def _print_table(records: list[Any]) -> None:
    """The per-episode table: a rich table on a terminal; elsewhere (CI logs, pipes) plain
    aligned columns at full width (rich would cut them to 80 columns), and each failed
    episode's error on its own line."""
    rows = _rows(records)
    if not console.is_terminal:
        widths = [max([len(c)] + [len(row[i]) for row in rows]) for i, c in enumerate(_COLUMNS)]
        for row in [_COLUMNS, *rows]:
            cells = (
                cell.ljust(w) if i in (0, 3, 4) else cell.rjust(w)
                for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            )
            print("  ".join(cells).rstrip())
        for r in records:
            if r.error:
                print(f"error {r.task_id}#{r.sample_idx}: {r.error}")
        return
    table = Table(title="rollout")
    for col in _COLUMNS:
        table.add_column(col, justify="left" if col in ("task", "status", "stop") else "right")
    for row, r in zip(rows, sorted(records, key=lambda r: (r.task_id, r.sample_idx)), strict=True):
        colour = "green" if r.reward == 1 else "red" if r.verifier.status != "ok" else "yellow"
        table.add_row(row[0], row[1], f"[{colour}]{row[2]}[/]", *row[3:])
    console.print(table)
    for r in records:
        if r.error:
            console.print(f"[red]error[/] {r.task_id}#{r.sample_idx}: {r.error}", highlight=False)


@rewards_app.command("export")
def rewards_export(
    out: Annotated[Path, typer.Argument(help="Output file (.jsonl or .parquet).")],
    job_id: Annotated[str | None, typer.Option(help="Only this job's records.")] = None,
    suite: Annotated[str | None, typer.Option(help="Only this suite's records.")] = None,
    task_id: Annotated[str | None, typer.Option(help="Only this task's records.")] = None,
    domain: Annotated[
        str | None, typer.Option(help="Only this domain's (terminal, document, cad).")
    ] = None,
    normalize: Annotated[str, typer.Option(help="none | grpo | mean | domain_z")] = "none",
    url: Annotated[str | None, typer.Option(envvar="CRUCIBLE_URL")] = None,
    api_key: Annotated[str | None, typer.Option(envvar="CRUCIBLE_API_KEY")] = None,
) -> None:
    """Export reward records (format from the file suffix) with optional advantages."""
    from policy_client import calls
    from policy_client.client import Client
    from policy_client.errors import ClientError

    formats = {".jsonl": "jsonl", ".parquet": "parquet"}
    fmt = formats.get(out.suffix.lower())
    if fmt is None:
        err_console.print(
            f"[red]error:[/] cannot tell the format from {out.name!r}: name the file "
            "*.jsonl or *.parquet",
            highlight=False,
        )
        raise typer.Exit(2)
    try:
        with Client(url, api_key) as client:
            data = client.run(
                calls.export_records(
                    fmt=fmt,
                    normalize=normalize,
                    job_id=job_id,
                    suite=suite,
                    task_id=task_id,
                    domain=domain,
                )
            )
    except ClientError as e:
        err_console.print(f"[red]error:[/] {e}")
        raise typer.Exit(1) from e
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(data)
    err_console.print(f"wrote {len(data)} bytes to {out}")
