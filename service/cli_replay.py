"""``crucible replay EPISODE``: re-run a verified episode's actions and report divergences.

Talks to the server (``--url``, ``CRUCIBLE_URL``; ``--api-key``, ``CRUCIBLE_API_KEY``) through
``POST /v1/episodes/{id}/replay``. Exit status: 0 without divergence, 1 on an error, 2 when
the replay diverged.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table

from service.cli import JsonOption, _print_json, app, console, err_console

UrlOption = Annotated[str | None, typer.Option(envvar="CRUCIBLE_URL", help="Control plane URL.")]
KeyOption = Annotated[str | None, typer.Option(envvar="CRUCIBLE_API_KEY", help="API key.")]


@app.command("replay")
def replay(
    episode: Annotated[str, typer.Argument(help="The verified episode to replay.")],
    url: UrlOption = None,
    api_key: KeyOption = None,
    as_json: JsonOption = False,
) -> None:
    """Replay EPISODE on the same image digest and task version; exit 2 on a divergence."""
    from policy_client.calls import Call
    from policy_client.client import Client
    from policy_client.errors import ClientError

    try:
        with Client(url, api_key) as client:
            raw = client.run(Call("POST", f"/v1/episodes/{episode}/replay"))
    except ClientError as e:
        err_console.print(f"[red]error:[/] {e}", highlight=False)
        raise typer.Exit(1) from e
    report = json.loads(raw)
    if as_json:
        _print_json(report)
    else:
        table = Table("turn", "exit (recorded)", "exit (replayed)", "output")
        for t in report["turns"]:
            same = t["recorded_output"] == t["replayed_output"] or not t["recorded_output"]
            table.add_row(
                str(t["turn"]),
                str(t["recorded_exit"]),
                str(t["replayed_exit"]),
                "same" if same else "[red]differs[/]",
            )
        console.print(table)
        console.print(
            f"reward: recorded {report['recorded_reward']}, replayed {report['replayed_reward']}"
        )
        for d in report["divergences"]:
            where = f"turn {d['turn']}" if d["turn"] is not None else "episode"
            line = f"{d['kind']} at {where}: {d['recorded']} -> {d['replayed']}"
            console.print(f"[red]divergence[/] {line}", highlight=False)
        if report["nondeterministic"]:
            console.print("[yellow]the task is nondeterministic[/] (same version and digest)")
        if not report["divergences"]:
            console.print("[green]no divergence[/]")
    if report["divergences"]:
        raise typer.Exit(2)
