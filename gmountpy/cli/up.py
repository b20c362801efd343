from __future__ import annotations

import time

import click
from rich.live import Live
from rich.table import Table

from .. import launch
from ._common import console, spec_from

_STYLE = {"starting": "yellow", "listening": "cyan", "ready": "green", "failed": "red"}


@click.command("up")
@click.argument("cluster_file", type=click.Path(exists=True, dir_okay=False))
def command(cluster_file: str) -> None:
    """Start one daemon per node and mount the namespace on every node."""
    spec = spec_from(cluster_file)
    states = {name: "waiting" for name in spec.nodes}

    def table() -> Table:
        t = Table(title=f"gmount up {spec.name}", show_edge=False)
        for column in ("node", "site", "state"):
            t.add_column(column)
        for name, what in states.items():
            t.add_row(name, spec.nodes[name].site, f"[{_STYLE.get(what, 'white')}]{what}[/]")
        return t

    started = time.monotonic()
    with Live(table(), console=console, transient=not console.is_terminal, refresh_per_second=8) as live:
        def progress(node: str, what: str) -> None:
            states[node] = what
            live.update(table())

        state = launch.up(spec, progress=progress)
    console.print(f"cluster [bold]{spec.name}[/] is up: {len(state.nodes)} nodes in "
                  f"{time.monotonic() - started:.1f}s")
    for record in state.nodes.values():
        console.print(f"  {record.name:<10} {record.site:<12} {record.mountpoint}")
    console.print(f"stop it with: gmount down {cluster_file}")
