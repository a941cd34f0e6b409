"""`tether query --tracker HOST:PORT`: the devices a tracker pools and the queues waiting for them."""
from __future__ import annotations

import json
import time
from typing import Any, Dict, List, Optional

import click


def _parse_hostport(text: str) -> "tuple[str, int]":
    from tether_rpc.config import parse_hostport

    try:
        return parse_hostport(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--tracker") from exc


def _age(since: Optional[float]) -> str:
    if not since:
        return "-"
    seconds = max(0.0, time.time() - since)
    if seconds < 120:
        return "%.0fs" % seconds
    if seconds < 7200:
        return "%.0fm" % (seconds / 60)
    return "%.1fh" % (seconds / 3600)


def _device_rows(summary: Dict[str, Any]) -> List[List[str]]:
    rows = []
    for d in sorted(summary.get("devices", []), key=lambda d: (d["key"], d["id"])):
        info = d.get("info") or {}
        where = "reverse (relayed)" if d.get("reverse") else "%s:%s" % (d.get("host"), d.get("port"))
        what = " ".join(str(x) for x in (info.get("arch"), info.get("cpu_model"), info.get("suggested_target"))
                        if x)
        rows.append([d["key"], str(d["id"]), where, d["state"], d.get("holder") or "-", _age(d.get("since")),
                     what or "-"])
    return rows


def _queue_rows(summary: Dict[str, Any]) -> List[List[str]]:
    return [[key, str(q["total"]), str(q["free"]), str(q["pending"])]
            for key, q in sorted(summary.get("queues", {}).items())]


@click.command("query")
@click.option("--tracker", "tracker", required=True, metavar="HOST:PORT", help="The tracker to ask.")
@click.option("--token", default=None, envvar="TETHER_TRACKER_TOKEN", help="The tracker's token, if it has one.")
@click.option("--json", "as_json", is_flag=True, help="Print the raw summary as JSON.")
@click.option("--timeout", default=10.0, show_default=True, type=float, help="Seconds to wait for the tracker.")
def command(tracker: str, token: Optional[str], as_json: bool, timeout: float) -> None:
    """Show a tracker's devices (who holds each, since when) and its queues."""
    from tether.errors import TetherError
    from tether.rpc.tracker_client import connect_tracker

    host, port = _parse_hostport(tracker)
    try:
        with connect_tracker(host, port, token=token, timeout=timeout, name="tether-query") as client:
            summary = client.summary()
    except TetherError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(summary, indent=2, sort_keys=True, default=str))
        return
    devices, queues = _device_rows(summary), _queue_rows(summary)
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        for row in devices:
            click.echo("\t".join(row))
        for row in queues:
            click.echo("\t".join(row))
        return
    console = Console()
    table = Table(title="devices at %s:%d" % (host, port))
    for col in ("key", "id", "address", "state", "held by", "since", "device"):
        table.add_column(col)
    for row in devices:
        table.add_row(*row)
    console.print(table)
    qtable = Table(title="queues")
    for col in ("key", "total", "free", "pending"):
        qtable.add_column(col, justify="left" if col == "key" else "right")
    for row in queues:
        qtable.add_row(*row)
    console.print(qtable)
