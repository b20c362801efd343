"""Dask on a gmount cluster, from Python: `Cluster.dask()` (needs the `dask` extra).

    client = gmountpy.Cluster.open("demo").dask()     # starts Dask on the cluster unless it runs
    client.submit(count_rows, "gmount://demo/data/a.csv").result()    # runs on a node holding a.csv
    dask.dataframe.read_csv("gmount://demo/data/*.csv").sum().compute()  # partitions on their holders

The processes (a scheduler, one worker per node, in the node's mount) are
started and stopped by gmountpy.launch.dask, as `gmount dask up` does; the
scheduler places tasks on the nodes holding their input
(gmountpy.api.dask_placement); a task reading a `gmount://` URL on a worker
reads it through that node's mount (gmountpy.api.filesystem). The Dask
cluster stays up after the client closes -- other notebooks and scripts can
attach to it -- until `Cluster.dask_down()`, `gmount dask down` or
`gmount down`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from .._sync import blocking
from ..cluster.state import ClusterState
from ..errors import GmountError
from ..launch import dask as dask_launch
from ..launch.dask import DaskState

if TYPE_CHECKING:
    from distributed import Client

__all__ = ["PLUGIN_NAME", "DaskState", "client", "down", "placements", "running", "set_placement", "up"]

#: The name of the scheduler plugin that places tasks on their data (gmountpy.api.dask_placement).
PLUGIN_NAME = "gmount-placement"


class Cluster(Protocol):
    """What the Dask integration needs of a `gmountpy.Cluster`: its name and running state."""

    @property
    def name(self) -> str: ...

    @property
    def _state(self) -> ClusterState: ...


def up(cluster: Cluster, *, threads: int | None = None, placement: bool = True,
       timeout: float = 60.0) -> DaskState:
    """Start Dask on `cluster` unless it runs (see gmountpy.launch.dask.up); the running Dask cluster."""
    return blocking(dask_launch.up, cluster._state, threads=threads, placement=placement, timeout=timeout)


def client(cluster: Cluster, *, threads: int | None = None, placement: bool = True,
           timeout: float = 60.0) -> Client:
    """A `distributed.Client` connected to the Dask cluster of `cluster`, started first if need be."""
    from distributed import Client

    running = up(cluster, threads=threads, placement=placement, timeout=timeout)
    connected = Client(running.address, security=dask_launch.security(cluster.name), timeout=timeout)
    connected.wait_for_workers(len(running.workers), timeout=timeout)
    return connected


def running(cluster: Cluster) -> DaskState | None:
    """The Dask cluster recorded for `cluster` (scheduler, workers, dashboard), or None."""
    return dask_launch.load(cluster.name)


def down(cluster: Cluster) -> dict[str, str]:
    """Stop the Dask cluster of `cluster` (the gmount cluster stays up); node -> problem."""
    return blocking(dask_launch.down, cluster.name)


def placements(connected: Client) -> dict[str, str]:
    """Task key (as a string) -> the node the scheduler placed it on, for tasks it still knows."""

    def read(dask_scheduler: object) -> dict[str, str]:
        plugin = getattr(dask_scheduler, "plugins", {}).get(PLUGIN_NAME)
        return {str(key): node for key, node in getattr(plugin, "placed", {}).items()}

    placed: dict[str, str] = connected.run_on_scheduler(read)
    return placed


def set_placement(connected: Client, enabled: bool) -> None:
    """Turn the scheduler's locality placement on or off for graphs submitted from now on.

    Off, Dask places tasks by its own rules: what `gmount dask up --no-placement`
    starts with, and what benchmarks compare against with the same workers.
    """

    def switch(dask_scheduler: object, enabled: bool) -> bool:
        plugin = getattr(dask_scheduler, "plugins", {}).get(PLUGIN_NAME)
        if plugin is None:
            return False
        plugin.enabled = enabled
        return True

    if not connected.run_on_scheduler(switch, enabled=enabled):
        raise GmountError("this Dask scheduler has no gmount placement: was it started by `gmount dask up`?")
