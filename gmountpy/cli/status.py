from __future__ import annotations

import json

import click
from rich.table import Table

from .. import launch
from ._common import console, spec_from


@click.command("status")
@click.argument("cluster_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
def command(cluster_file: str, as_json: bool) -> None:
    """Show each node: site, pid, address, mountpoint, up or down."""
    spec = spec_from(cluster_file)
    nodes = launch.status(spec.name)
    if as_json:
        click.echo(json.dumps([vars(n) for n in nodes], indent=2))
        return
    table = Table(title=f"cluster {spec.name}", show_edge=False)
    for column in ("node", "site", "pid", "address", "mountpoint", "state"):
        table.add_column(column)
    for n in nodes:
        state = "[green]up[/]" if n.up else f"[red]down[/] ({n.detail})"
        table.add_row(n.name, n.site, str(n.pid), n.address, n.mountpoint, state)
    console.print(table)
    if not all(n.up for n in nodes):
        raise SystemExit(3)
