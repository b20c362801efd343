from __future__ import annotations

import click

from .. import launch
from ._common import console, spec_from


@click.command("down")
@click.argument("cluster_file", type=click.Path(exists=True, dir_okay=False))
def command(cluster_file: str) -> None:
    """Stop every daemon and unmount. Export directories are left untouched."""
    spec = spec_from(cluster_file)
    problems = launch.down(spec.name)
    for node, problem in problems.items():
        console.print(f"[yellow]{node}[/]: {problem}")
    console.print(f"cluster [bold]{spec.name}[/] is down; exports are untouched.")
