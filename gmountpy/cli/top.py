"""`gmount top`: every node of a running cluster, live -- up or down, the jobs running there, the bytes
and requests moving -- refreshed every second."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from datetime import datetime
from typing import Any

import click
import trio
from rich.console import Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from ..api.activity import Sample, rates, sample
from ..api.results import human_size
from ..cluster import state as state_store
from ..cluster.state import ClusterState
from ..protocol.client import open_client
from ._common import console, print_whole


@click.command("top")
@click.argument("cluster", required=False)
@click.option("--once", is_flag=True, help="Show one view (rates over one interval) and exit.")
@click.option("--json", "as_json", is_flag=True,
              help="Print JSON for scripts: one object (with --once), else one line per interval.")
@click.option("--interval", type=click.FloatRange(min=0.1), default=1.0, show_default=True,
              help="Seconds between refreshes (and over which rates are measured).")
def command(cluster: str | None, once: bool, as_json: bool, interval: float) -> None:
    """Watch CLUSTER (its name, cluster file or a path in a mount; default: the cluster whose mount holds the
    current directory, else the only one running): each node up or down, its running jobs (rule or target,
    since when) against its slots, bytes read locally and from other nodes, bytes served to peers, and
    requests answered and sent per second. Jobs show when make (with gmount.mk), the Snakemake executor or
    the API started them. Ctrl-C quits."""
    state = state_store.resolve(cluster, paths=[os.getcwd()]).state
    try:
        trio.run(_watch, state, once, as_json, interval)
    except KeyboardInterrupt:
        pass


async def _watch(state: ClusterState, once: bool, as_json: bool, interval: float) -> None:
    live_view = not once and not as_json and console.is_terminal
    async with open_client(state, name="gmount-top", advise=False) as client:
        before = await sample(client, state)
        live = Live(render(before, None, interval), console=console, auto_refresh=False,
                    screen=False) if live_view else None
        if live is not None:
            live.start(refresh=True)
        try:
            while True:
                await trio.sleep(max(0.0, interval - (time.monotonic() - before.taken)))
                after = await sample(client, state)
                per_second = rates(before, after)
                if as_json:
                    text = json.dumps(to_json(after, per_second, interval), indent=2 if once else None)
                    sys.stdout.write(text + "\n")
                    sys.stdout.flush()
                elif live is not None:
                    live.update(render(after, per_second, interval), refresh=True)
                else:
                    print_whole(render(after, per_second, interval, live=not once))
                if once:
                    return
                before = after
        finally:
            if live is not None:
                live.stop()


def to_json(now: Sample, per_second: dict[str, dict[str, float]], interval: float) -> dict[str, Any]:
    """What `--json` prints: the nodes with their rates and counters, and the running jobs."""
    running = now.jobs.per_node()
    return {
        "cluster": now.cluster, "time": round(now.at, 3), "interval": interval,
        "nodes": [{"node": n.name, "site": n.site, "up": n.up, "detail": n.detail, "slots": n.slots,
                   "running": running.get(n.name, 0),
                   "rates": {key: round(value, 1) for key, value in per_second.get(n.name, {}).items()},
                   "counters": n.counters} for n in now.nodes],
        "jobs": [dataclasses.asdict(job) for job in now.jobs],
    }


def render(now: Sample, per_second: dict[str, dict[str, float]] | None, interval: float,
           live: bool = True) -> Group:
    """The nodes' table and the jobs' table (rates are blank until two samples exist)."""
    clock = datetime.fromtimestamp(now.at).strftime("%H:%M:%S")
    when = f"every {interval:g} s (Ctrl-C quits)" if live else f"rates over {interval:g} s"
    nodes = Table(title=f"cluster {escape(now.cluster)} at {clock}, {when}", title_justify="left", show_edge=False)
    for column in ("node", "site", "state", "jobs/slots", "read local", "read remote", "served", "req in",
                   "req out"):
        nodes.add_column(column, justify="right" if column.startswith(("read", "served", "req")) else "left")
    running = now.jobs.per_node()
    for n in now.nodes:
        state = "[green]up[/]" if n.up else f"[red]down[/] {escape(n.detail[:60])}"
        busy = running.get(n.name, 0)
        load = f"{busy}/{n.slots}" if busy <= n.slots else f"[yellow]{busy}/{n.slots}[/]"
        r = (per_second or {}).get(n.name)
        if r is None:
            cells = [""] * 5
        else:
            cells = [_rate(r["read_local"]), _rate(r["read_remote"]), _rate(r["served_read"]),
                     f"{r['requests_served']:.0f}/s", f"{r['messages_sent']:.0f}/s"]
        nodes.add_row(escape(n.name), escape(n.site), state, load, *cells)
    jobs = Table(title=f"{len(now.jobs)} jobs running" if len(now.jobs) != 1 else "1 job running",
                 title_justify="left", show_edge=False)
    for column in ("node", "job", "kind", "started", "for", "directory"):
        jobs.add_column(column, overflow="fold")
    for job in now.jobs:
        jobs.add_row(escape(job.node), escape(job.job), escape(job.kind),
                     datetime.fromtimestamp(job.started).strftime("%H:%M:%S"),
                     _duration(max(0.0, now.at - job.started)), escape(job.directory))
    return Group(nodes, "", jobs)


def _rate(bytes_per_second: float) -> str:
    return f"{human_size(int(bytes_per_second))}/s"


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, seconds = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"
