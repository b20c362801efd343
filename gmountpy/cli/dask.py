"""`gmount dask up|down [CLUSTER]`: Dask workers on the nodes, tasks placed on their data (docs/dask.md)."""

from __future__ import annotations

import os
import time

import click
from rich.markup import escape

from ..cluster import state as state_store
from ..launch import dask as dask_launch
from ._common import console, live_node_table

_STYLE = {"starting": "yellow", "ready": "green", "failed": "red"}


def _resolve(cluster: str | None) -> state_store.ClusterState:
    return state_store.resolve(cluster, paths=[os.getcwd()]).state


@click.group("dask")
def command() -> None:
    """Dask on a running cluster: a scheduler and one worker per node, in the node's mount."""


@command.command("up")
@click.argument("cluster", required=False)
@click.option("--threads", type=click.IntRange(min=1), help="Threads per worker (default: each node's slots).")
@click.option("--no-placement", is_flag=True,
              help="Leave task placement to Dask (default: each task runs on the node holding most of its input).")
@click.option("--timeout", type=click.FloatRange(min=1), default=60.0, show_default=True,
              help="Seconds to wait for each process to start.")
def up_command(cluster: str | None, threads: int | None, no_placement: bool, timeout: float) -> None:
    """Start Dask on CLUSTER unless it runs (restarting missing workers); print how to connect.

    CLUSTER is a running cluster's name or file, or a path in its mount (default: the cluster
    whose mount holds the current directory, or the only one running).
    """
    state = _resolve(cluster)
    rows = {"scheduler": ("",), **{name: (node.site,) for name, node in state.spec.nodes.items()}}
    started = time.monotonic()
    with live_node_table(f"gmount dask up {state.name}", ("site",), rows, _STYLE) as progress:
        running = dask_launch.up(state, threads=threads, placement=not no_placement, timeout=timeout,
                                 progress=progress)
    console.print(f"Dask on cluster [bold]{escape(state.name)}[/]: {len(running.workers)} workers "
                  f"({time.monotonic() - started:.1f}s), placement {'on' if running.placement else 'off'}")
    for what, line in dask_launch.describe(running).items():
        console.print(f"  {what:<10} {line}", markup=False, soft_wrap=True, highlight=False)
    if running.dashboard:
        console.print(f"  dashboard  {running.dashboard}", markup=False, soft_wrap=True)
    console.print(f"connect from Python: gmountpy.Cluster.open({state.name!r}).dask()", markup=False,
                  soft_wrap=True, highlight=False)
    console.print(f"stop it with: gmount dask down {state.name}", markup=False, soft_wrap=True, highlight=False)


@command.command("down")
@click.argument("cluster", required=False, metavar="CLUSTER")
def down_command(cluster: str | None) -> None:
    """Stop CLUSTER's Dask scheduler and workers; the cluster itself stays up (`gmount down` stops both)."""
    name = cluster
    if cluster is None or "/" in cluster or cluster.endswith(".toml"):
        name = _resolve(cluster).name
    assert name is not None
    if dask_launch.load(name) is None:
        console.print(f"no Dask cluster runs on cluster {name}", markup=False, soft_wrap=True)
        return
    problems = dask_launch.down(name)
    for node, problem in problems.items():
        console.print(f"[yellow]{escape(node)}[/]: {escape(problem)}", highlight=False, soft_wrap=True)
    console.print(f"Dask on cluster [bold]{escape(name)}[/] is down.")

