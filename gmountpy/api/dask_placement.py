"""Dask tasks on the nodes that hold their input: a scheduler plugin and a work-stealing rule.

Both run inside the Dask scheduler started by `gmount dask up` (see
gmountpy.api.dask_node).

`Placement` looks at every task a client submits before the scheduler
assigns it. The gmount files a task reads are found in its spec: `gmount://`
URLs anywhere in its arguments (`client.submit(f, "gmount://c/x.csv")`,
`client.map`), fsspec `OpenFile`s of a gmount file system (what
`dask.dataframe.read_csv` and `dask.bag.read_text` build), and the paths
handed to a function that carries a gmount file system (`read_parquet`'s
pieces). One `where` per graph finds their holders; each task then gets
the node gmountpy's placement rule picks for its inputs (`Cluster.place`,
gmountpy.jobs.placement: most input bytes, then free slots, then the
lowest cost to read the rest) as a *loose* worker restriction: it runs on
that node's worker while the worker is there, and anywhere else once it is
gone (a node whose worker died: the task is retried on another worker,
which reads the input remotely through its own mount). Tasks the client
restricted itself, and tasks reading no gmount file, keep Dask's placement.

`LocalityStealing` is Dask's work stealing with one more rule: a placed
task moves only off an overloaded node -- one that was given more than
OVERLOAD_SHARE times its threads' share of its graph's input bytes, and
still has more than twice as many tasks as threads queued -- and only when
the thief would finish it sooner even after reading its input remotely (at
the scheduler's bandwidth estimate). Without it Dask would treat a task with
no dependencies as free to move and undo the placement whenever a worker
runs idle; with it, data spread evenly stays read where it is even when one
node runs slower, and a node holding most of the data gets help.
"""

from __future__ import annotations

import functools
import logging
import posixpath
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from dask._task_spec import Alias, DataNode, Task, TaskRef
from distributed.diagnostics.plugin import SchedulerPlugin
from distributed.stealing import WorkStealing

from ..jobs.placement import choose_node
from .dask import PLUGIN_NAME

if TYPE_CHECKING:
    from distributed.scheduler import Scheduler, SchedulerState, TaskState, WorkerState

    from .cluster import Cluster

__all__ = ["PLUGIN_NAME", "LocalityStealing", "Placement", "input_paths"]

log = logging.getLogger("gmountpy.dask")

URL_PREFIX = "gmount://"
#: how deep into nested arguments a task spec is searched for gmount files
MAX_DEPTH = 16
#: a placed task may leave a node only if its graph gave that node more than this times its threads' share
#: of the input bytes ...
OVERLOAD_SHARE = 1.5
#: ... and only while the node's worker has more than this many tasks per thread
OVERLOAD = 2


# --------------------------------------------------------------------------- what a task reads


def input_paths(spec: object, cluster: str) -> list[str]:
    """The namespace paths of the gmount files of cluster `cluster` that a task spec names, in order."""
    found: dict[str, None] = {}
    _walk(spec, cluster, found, 0, False)
    return list(found)


def _gmount_fs_of(value: object, cluster: str) -> bool:
    """Whether `value` (or the function a partial wraps) carries a file system of gmount cluster `cluster`."""
    while isinstance(value, functools.partial):
        value = value.func
    fs = getattr(value, "fs", None)
    if fs is None or getattr(fs, "protocol", None) != "gmount":
        return False
    return getattr(fs, "cluster", None) == cluster  # GmountFileSystem.cluster: the cluster's name


def _walk(value: object, cluster: str, found: dict[str, None], depth: int, paths_are_gmount: bool) -> None:
    if depth > MAX_DEPTH or value is None or isinstance(value, (bool, int, float, bytes, TaskRef, Alias)):
        return
    if isinstance(value, str):
        if value.startswith(URL_PREFIX):
            host, _, rest = value[len(URL_PREFIX):].partition("/")
            if host in ("", cluster):
                found[posixpath.normpath("/" + rest.lstrip("/"))] = None
        elif paths_are_gmount and value.startswith("/"):
            found[posixpath.normpath("/" + value.lstrip("/"))] = None
        return
    deeper = depth + 1
    if isinstance(value, Task):
        gmount_func = paths_are_gmount or _gmount_fs_of(value.func, cluster)
        _walk(value.func, cluster, found, deeper, paths_are_gmount)
        for item in (*value.args, *value.kwargs.values()):
            _walk(item, cluster, found, deeper, gmount_func)
    elif isinstance(value, DataNode):
        _walk(value.value, cluster, found, deeper, paths_are_gmount)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            _walk(item, cluster, found, deeper, paths_are_gmount)
    elif isinstance(value, Mapping):
        for item in value.values():
            _walk(item, cluster, found, deeper, paths_are_gmount)
    elif isinstance(value, functools.partial):
        gmount_func = paths_are_gmount or _gmount_fs_of(value.func, cluster)
        _walk(value.func, cluster, found, deeper, paths_are_gmount)
        for item in (*value.args, *value.keywords.values()):
            _walk(item, cluster, found, deeper, gmount_func)
    elif _gmount_fs_of(value, cluster) and isinstance(path := getattr(value, "path", None), str):
        found[posixpath.normpath("/" + path.lstrip("/"))] = None  # an fsspec OpenFile


# --------------------------------------------------------------------------- the plugin


class Placement(SchedulerPlugin):
    """Loose worker restrictions from gmountpy's placement rule (see the module doc)."""

    name = PLUGIN_NAME

    def __init__(self, cluster: str, *, enabled: bool = True) -> None:
        self.cluster_name = cluster
        self.enabled = enabled
        self._cluster: Cluster | None = None
        #: key -> (located input bytes, {worker address: bytes of them it holds}), for the placed tasks that
        #: may be stolen (their node is overloaded), while they may
        self.inputs: dict[Any, tuple[int, dict[str, int]]] = {}
        #: tasks placed and how many of them ran where they were placed (for tests and benchmarks)
        self.placed: dict[Any, str] = {}

    def cluster(self) -> Cluster:
        if self._cluster is None:
            from .cluster import Cluster
            self._cluster = Cluster.open(self.cluster_name)
        return self._cluster

    def update_graph(self, scheduler: Scheduler, *, tasks: list[Any], **kwargs: Any) -> None:
        if not self.enabled:
            return
        wanted: dict[Any, list[str]] = {}
        for key in tasks:
            ts = scheduler.tasks.get(key)
            if ts is None or ts.state != "released" or ts.run_spec is None:
                continue
            if ts.worker_restrictions or ts.host_restrictions or ts.resource_restrictions:
                continue  # the client chose itself
            paths = input_paths(ts.run_spec, self.cluster_name)
            if paths:
                wanted[key] = paths
        if not wanted:
            return
        workers = {ws.name: ws for ws in scheduler.workers.values() if isinstance(ws.name, str)}
        try:
            holdings = self._holdings({p for paths in wanted.values() for p in paths})
        except Exception as exc:  # noqa: BLE001 -- placement is an optimisation: never fail a graph for it
            log.warning("no locality placement for %d task(s): finding their input on cluster %s failed: %s",
                        len(wanted), self.cluster_name, exc)
            return
        self._restrict(scheduler, wanted, holdings, workers)

    def _holdings(self, paths: Iterable[str]) -> dict[str, dict[str, int]]:
        """holdings[path][node] = bytes, from one `where` over all the paths."""
        held: dict[str, dict[str, int]] = {}
        for found in self.cluster().where(sorted(paths)):
            held[found.path] = {h.node: h.size for h in found.holders if not h.is_dir}
        return held

    def _restrict(self, scheduler: Scheduler, wanted: dict[Any, list[str]], holdings: dict[str, dict[str, int]],
                  workers: dict[str, WorkerState]) -> None:
        cluster = self.cluster()
        nodes = [n for n in cluster.spec.nodes if n in workers]
        if not nodes:
            return
        slots = {n: workers[n].nthreads for n in nodes}
        running = {n: len(workers[n].processing) for n in nodes}
        chosen: dict[Any, tuple[str, int, dict[str, int]]] = {}
        given = dict.fromkeys(nodes, 0)  # input bytes of this graph placed on each node
        for key, paths in wanted.items():
            task_holdings = {p: {n: size for n, size in holdings.get(p, {}).items() if n in slots} for p in paths}
            if not any(task_holdings.values()):
                continue  # no input held by a node with a worker: Dask decides
            decision = choose_node(task_holdings, nodes, slots=slots, running=running, rtt=cluster.overlay.rtt)
            running[decision.node] += 1  # the next tasks of this graph see it busier (spreads replicas)
            total = sum(max(held.values()) for held in task_holdings.values() if held)
            chosen[key] = (decision.node, total, dict(decision.scores))
            given[decision.node] += total
        all_bytes, all_threads = sum(given.values()), sum(slots.values())
        overloaded = {n for n in nodes if given[n] > OVERLOAD_SHARE * all_bytes * slots[n] / all_threads}
        for key, (node, total, scores) in chosen.items():
            ts = scheduler.tasks[key]
            ts.worker_restrictions = {workers[node].address}
            ts.loose_restrictions = True
            self.placed[key] = node
            if node in overloaded:
                self.inputs[key] = (total, {workers[n].address: scores[n] for n in nodes})

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        if finish in ("memory", "erred", "forgotten"):
            self.inputs.pop(key, None)
        if finish == "forgotten":
            self.placed.pop(key, None)

    def remote_bytes(self, ts: TaskState, ws: WorkerState) -> int | None:
        """The input bytes `ts` would read from other nodes on worker `ws`; None if it must stay.

        None for a task placed on a node that is not overloaded (and for one
        placed before its worker died, which Dask has moved already).
        """
        entry = self.inputs.get(ts.key)
        if entry is None:
            return None
        total, held = entry
        return max(0, total - held.get(ws.address, 0))


class LocalityStealing(WorkStealing):
    """Dask's work stealing, keeping placed tasks where they are unless their worker is overloaded."""

    def _get_thief(self, scheduler: SchedulerState, ts: TaskState, potential_thieves: set[WorkerState], *,
                   occupancies: dict[WorkerState, float]) -> WorkerState | None:
        thief = super()._get_thief(scheduler, ts, potential_thieves, occupancies=occupancies)
        placement = self.scheduler.plugins.get(PLUGIN_NAME)
        victim = ts.processing_on
        if thief is None or victim is None or not isinstance(placement, Placement):
            return thief
        if ts.key not in placement.placed:
            return thief  # not placed by us: Dask's rule alone
        remote = placement.remote_bytes(ts, thief)
        if remote is None or len(victim.processing) <= OVERLOAD * victim.nthreads:
            return None  # its node is not overloaded: it stays
        compute = self.scheduler._get_prefix_duration(ts.prefix)
        occ_thief = occupancies.get(thief, thief.occupancy) + self.in_flight_occupancy[thief]
        occ_victim = occupancies.get(victim, victim.occupancy) + self.in_flight_occupancy[victim]
        reading = remote / self.scheduler.bandwidth
        if occ_thief + reading + compute > occ_victim - compute / 2:
            return None
        return thief
