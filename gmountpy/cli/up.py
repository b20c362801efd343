from __future__ import annotations

import time

import click
from rich.markup import escape

from .. import launch
from ..launch.orchestrate import LaunchError
from ._common import console, err_console, live_node_table, spec_from

_STYLE = {"connecting": "yellow", "checking": "yellow", "checked": "cyan", "starting": "yellow",
          "listening": "cyan", "ready": "green", "failed": "red"}


@click.command("up")
@click.argument("cluster_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--keep-going", is_flag=True,
              help="If some nodes fail, keep the others up (default: stop them, leaving nothing half up).")
def command(cluster_file: str, keep_going: bool) -> None:
    """Start one daemon per node and mount the namespace on every node."""
    spec = spec_from(cluster_file)
    rows = {name: (node.site, node.host or "this machine") for name, node in spec.nodes.items()}
    started = time.monotonic()
    try:
        with live_node_table(f"gmount up {spec.name}", ("site", "host"), rows, _STYLE) as progress:
            state = launch.up(spec, progress=progress, keep_going=keep_going)
    except LaunchError as exc:
        for node, why in exc.failures.items():
            err_console.print(f"[red]{node}[/]: {escape(why)}", highlight=False, soft_wrap=True)
        if exc.running is None:
            err_console.print(f"cluster {spec.name} is not up: {len(exc.failures)} of {len(spec.nodes)} node(s) "
                              f"failed and nothing was left running", markup=False, soft_wrap=True)
        elif exc.restarting:
            err_console.print(f"cluster {spec.name} is not fully up: {', '.join(exc.failures)} failed to restart; "
                              f"{', '.join(exc.running.nodes)} still run, as before. Run `gmount up {cluster_file}` "
                              f"again to retry, or `gmount down {cluster_file}` to stop them all",
                              markup=False, soft_wrap=True)
        else:
            err_console.print(f"cluster {spec.name} is up with {len(exc.running.nodes)} of {len(spec.nodes)} nodes "
                              f"(--keep-going); stop it with: gmount down {cluster_file}",
                              markup=False, soft_wrap=True)
        raise SystemExit(1) from None
    console.print(f"cluster [bold]{spec.name}[/] is up: {len(state.nodes)} nodes in "
                  f"{time.monotonic() - started:.1f}s")
    for record in state.nodes.values():
        console.print(f"  {record.name:<10} {record.site:<12} {record.mountpoint}",
                      markup=False, soft_wrap=True)
    console.print(f"stop it with: gmount down {cluster_file}", markup=False, soft_wrap=True)
