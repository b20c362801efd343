from __future__ import annotations

import click
from rich.markup import escape

from .. import launch
from ..cluster import state as state_store
from ._common import console, live_node_table, spec_from

_STYLE = {"stopping": "yellow", "stopped": "green", "unreachable": "red"}


@click.command("down")
@click.argument("cluster_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--forget", is_flag=True,
              help="Over SSH: drop nodes that cannot be reached from the record anyway.")
def command(cluster_file: str, forget: bool) -> None:
    """Stop every daemon and unmount. Export directories are left untouched."""
    spec = spec_from(cluster_file)
    recorded = state_store.load(spec.name)
    if recorded is not None and recorded.spec.launcher == "ssh":
        rows = {name: (record.ssh or "",) for name, record in recorded.nodes.items()}
        with live_node_table(f"gmount down {spec.name}", ("host",), rows, _STYLE) as progress:
            problems = launch.down(spec.name, progress=progress, forget=forget)
    else:
        problems = launch.down(spec.name)
    for node, problem in problems.items():
        console.print(f"[yellow]{node}[/]: {escape(problem)}", highlight=False, soft_wrap=True)
    if state_store.load(spec.name) is not None:
        console.print(f"cluster {spec.name} is not completely down: run `gmount down` again when the nodes "
                      f"above are reachable, or `gmount down --forget`", markup=False, soft_wrap=True)
        raise SystemExit(1)
    console.print(f"cluster [bold]{spec.name}[/] is down; exports are untouched.")
