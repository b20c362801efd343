"""Placement: the node for a job, by Pwrake's rule (gmountpy.jobs.placement) over the holders of its
inputs, counting the jobs this process runs."""

from __future__ import annotations

import threading
from collections.abc import Iterable

from ..jobs.placement import choose_node
from ..protocol.client import ClusterClient
from .paths import PathLike, Paths, as_list
from .requests import Requests
from .results import FileLocations, Placement, PlacementRow
from .view import ClusterView

# Jobs started through `Cluster.run` in this process and still running, per
# (cluster, node). Placement counts them against the node's slots. Jobs
# started elsewhere (other processes, other users) are not seen.
_lock = threading.Lock()
_jobs: dict[tuple[str, str], int] = {}


def running_jobs(cluster: str) -> dict[str, int]:
    with _lock:
        return {node: count for (name, node), count in _jobs.items() if name == cluster}


class Job:
    """Counts a job started by `Cluster.run` as running on its node while the block runs."""

    def __init__(self, cluster: str, node: str) -> None:
        self.key = (cluster, node)

    def __enter__(self) -> None:
        with _lock:
            _jobs[self.key] = _jobs.get(self.key, 0) + 1

    def __exit__(self, *exc: object) -> None:
        with _lock:
            _jobs[self.key] -= 1
            if not _jobs[self.key]:
                del _jobs[self.key]


class Placer:
    """`api.Cluster.place` (documented there)."""

    def __init__(self, view: ClusterView, paths: Paths, requests: Requests) -> None:
        self._view = view
        self._paths = paths
        self._requests = requests

    def place(self, inputs: PathLike | Iterable[PathLike]) -> Placement:
        ns_paths = [self._paths.resolve(p, None)[0] for p in as_list(inputs)]

        async def main(client: ClusterClient) -> tuple[list[FileLocations], list[str]]:
            return await self._requests.expand_holders(client, self._view.home, ns_paths)

        located, missing = self._requests.run(main)
        holdings: dict[str, dict[str, int]] = {p: {} for p in missing}
        for found in located:
            held = holdings.setdefault(found.path, {})
            for holder in found.holders:
                held[holder.node] = max(held.get(holder.node, 0), holder.size)
        spec = self._view.state.spec
        running = running_jobs(self._view.name)
        slots = {name: node.slots for name, node in spec.nodes.items()}
        decision = choose_node(holdings, list(spec.nodes), slots=slots, running=running, rtt=self._view.overlay.rtt)
        rows = tuple(PlacementRow(name, spec.nodes[name].site, decision.scores[name], name in decision.candidates,
                                  running.get(name, 0), slots[name], decision.remote_cost[name])
                     for name in spec.nodes)
        return Placement(decision.node, decision.reason, tuple(holdings), rows, decision.unlocated)
