from __future__ import annotations

import dataclasses
import json

import click
from rich.table import Table

from ..api.results import human_size
from ._cluster import cluster_option_help, open_cluster
from ._common import console, shown


@click.command("place")
@click.argument("paths", nargs=-1)
@click.option("--cluster", help=cluster_option_help())
@click.option("--explain", is_flag=True, help="Show every node's numbers and why this node.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
def command(paths: tuple[str, ...], cluster: str | None, explain: bool, as_json: bool) -> None:
    """Print the node a job reading PATHS should run on.

    The node holding the most input bytes wins; among nodes within half of
    the best, one with a free slot, then the lowest RTT to the other inputs.
    Without PATHS (or none found): the least loaded node.
    """
    placement = open_cluster(cluster, paths).place(list(paths))
    if as_json:
        click.echo(json.dumps({"node": placement.node, "reason": placement.reason,
                               "unlocated": list(placement.unlocated),
                               "nodes": [dataclasses.asdict(r) for r in placement.rows]}, indent=2))
        return
    click.echo(placement.node)
    if explain:
        table = Table(title=placement.reason, show_edge=False, title_justify="left")
        for column in ("node", "site", "input bytes", "candidate", "running/slots", "remote cost (B*ms)"):
            table.add_column(column)
        for r in placement.rows:
            mark = "[bold]" if r.node == placement.node else ""
            table.add_row(f"{mark}{r.node}", r.site, human_size(r.input_bytes), "yes" if r.candidate else "",
                          f"{r.running}/{r.slots}", f"{r.remote_cost:g}")
        console.print(table)
    if placement.unlocated:
        click.echo(f"gmount: no node holds: {', '.join(shown(p) for p in placement.unlocated)}", err=True)
