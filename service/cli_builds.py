"""``crucible builds list | show | log``: task image builds of a running control plane.

Talks to the server (``--url``, ``CRUCIBLE_URL``; ``--api-key``, ``CRUCIBLE_API_KEY``) through
``GET /v1/builds``, ``GET /v1/builds/{id}`` and ``GET /v1/builds/{id}/attempts/{n}/log``;
``log --follow`` keeps reading from the last offset until the attempt has ended.
"""

from __future__ import annotations

import codecs
import sys
import time
from typing import Annotated, Any

import typer
from rich.table import Table

from service.cli import JsonOption, _print_json, app, console, err_console

builds_app = typer.Typer(help="Task image builds: attempts and logs.", no_args_is_help=True)
app.add_typer(builds_app, name="builds")

UrlOption = Annotated[str | None, typer.Option(envvar="CRUCIBLE_URL", help="Control plane URL.")]
KeyOption = Annotated[str | None, typer.Option(envvar="CRUCIBLE_API_KEY", help="API key.")]
FOLLOW_POLL_S = 0.5


def _get(url: str | None, api_key: str | None, path: str, **params: Any) -> Any:
    """One GET through the SDK (retried as it retries reads); errors exit 1 with one line."""
    from policy_client.calls import Call
    from policy_client.client import Client
    from policy_client.errors import ClientError

    try:
        with Client(url, api_key) as client:
            return client.run(Call("GET", path, params=params, idempotent=True))
    except ClientError as e:
        err_console.print(f"[red]error:[/] {e}", highlight=False)
        raise typer.Exit(1) from e


def _get_json(url: str | None, api_key: str | None, path: str) -> Any:
    import json

    return json.loads(_get(url, api_key, path))


@builds_app.command("list")
def builds_list(
    url: UrlOption = None, api_key: KeyOption = None, as_json: JsonOption = False
) -> None:
    """The server's task builds you may see (admins: all), newest first."""
    data = _get_json(url, api_key, "/v1/builds")["builds"]
    if as_json:
        _print_json(data)
        return
    table = Table("id", "task", "state", "attempts", "started", "ended")
    colour = {"built": "green", "running": "yellow", "failed": "red", "cancelled": "red"}
    for b in data:
        last = b["attempts"][-1] if b["attempts"] else None
        tries = str(len(b["attempts"]))
        if last is not None and last["failure"]:
            tries += f" ({last['failure']})"
        table.add_row(
            b["id"],
            b["task"],
            f"[{colour.get(b['state'], 'white')}]{b['state']}[/]",
            tries,
            b["started_at"][:19].replace("T", " "),
            (b["ended_at"] or "-")[:19].replace("T", " "),
        )
    console.print(table)


@builds_app.command("show")
def builds_show(
    build_id: Annotated[str, typer.Argument(help="The build id (bld_...).")],
    url: UrlOption = None,
    api_key: KeyOption = None,
    as_json: JsonOption = False,
) -> None:
    """One build: its attempts, their failure classes and reasons."""
    b = _get_json(url, api_key, f"/v1/builds/{build_id}")
    if as_json:
        _print_json(b)
        return
    console.print(f"{b['id']}  {b['task']}  {b['state']}  {b['tag'] or ''}", highlight=False)
    table = Table("attempt", "outcome", "failure", "started", "ended")
    for a in b["attempts"]:
        table.add_row(
            str(a["n"]),
            a["outcome"],
            a["failure"] or "-",
            a["started_at"][:19].replace("T", " "),
            (a["ended_at"] or "-")[:19].replace("T", " "),
        )
    console.print(table)
    if b["error"]:
        console.print(b["error"], highlight=False, markup=False)


@builds_app.command("log")
def builds_log(
    build_id: Annotated[str, typer.Argument(help="The build id (bld_...).")],
    attempt: Annotated[
        int | None, typer.Option(min=1, help="The attempt (default: the latest).")
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing until the attempt ends.")
    ] = False,
    url: UrlOption = None,
    api_key: KeyOption = None,
) -> None:
    """Print one attempt's build log (raw text on stdout); ``--follow`` reads on while the
    attempt runs, like ``tail -f``."""
    build = _get_json(url, api_key, f"/v1/builds/{build_id}")
    n = attempt or len(build["attempts"]) or 1
    decoder = codecs.getincrementaldecoder("utf-8")("replace")  # chunks may split a character
    offset = 0
    while True:
        chunk = _get(url, api_key, f"/v1/builds/{build_id}/attempts/{n}/log", offset=offset)
        offset += len(chunk)
        if chunk:
            sys.stdout.write(decoder.decode(chunk))
            sys.stdout.flush()
            continue  # more may be there already
        if not follow:
            break
        attempts = _get_json(url, api_key, f"/v1/builds/{build_id}")["attempts"]
        if n > len(attempts) or attempts[n - 1]["outcome"] != "running":
            # read once more: lines written between the last read and the end
            rest = _get(url, api_key, f"/v1/builds/{build_id}/attempts/{n}/log", offset=offset)
            sys.stdout.write(decoder.decode(rest))
            break
        time.sleep(FOLLOW_POLL_S)
    sys.stdout.write(decoder.decode(b"", final=True))
    sys.stdout.flush()
