"""What a cluster is doing now: each node up or down with its counters, and the jobs running on it.

`sample` takes one snapshot over an open ClusterClient (`gmount top` keeps
one open and samples every second); `rates` turns two snapshots into
bytes and requests per second. Jobs come from the daemons' `jobs` op
(each reports the jobs started on its machine: gmountpy.cluster.registry)
and from this machine's own registrations, merged.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import cast

import trio

from .._trio import open_nursery
from ..cluster import registry
from ..cluster.state import ClusterState
from ..protocol import messages as msg
from ..protocol.client import ClusterClient
from .results import RunningJob, RunningJobs

#: counters `rates` turns into per-second rates (service.IOCounters)
RATE_COUNTERS = ("read_local", "read_remote", "served_read", "write_local", "write_remote", "requests_served",
                 "messages_sent")


@dataclass(frozen=True)
class NodeSample:
    """One node at one moment: up (its daemon answered) or down (and why), its counters since it started."""

    name: str
    site: str
    slots: int
    up: bool
    detail: str
    counters: dict[str, int]


@dataclass(frozen=True)
class Sample:
    """The whole cluster at one moment (`taken`: time.monotonic(), `at`: time.time())."""

    cluster: str
    taken: float
    at: float
    nodes: tuple[NodeSample, ...]
    jobs: RunningJobs

    def jobs_on(self, node: str) -> tuple[RunningJob, ...]:
        return tuple(job for job in self.jobs if job.node == node)


async def sample(client: ClusterClient, state: ClusterState, timeout: float = 2.0) -> Sample:
    """Ping every node (its counters come with the answer) and ask the ones that answer for their jobs."""
    answers: dict[str, msg.PingReply | str] = {}
    rows: list[msg.JobRow] = []

    async def one(node: str) -> None:
        try:
            answers[node] = await client.ask(node, msg.Ping(), timeout=timeout)
        except OSError as exc:
            answers[node] = str(exc) or type(exc).__name__
            return
        try:
            rows.extend(await client.ask(node, msg.Jobs(), timeout=timeout))
        except OSError:
            pass  # a daemon of an older gmountpy (ENOSYS), or slow this once: its jobs are missing from this sample

    async def here() -> None:
        rows.extend(cast("list[msg.JobRow]", await trio.to_thread.run_sync(registry.running, state.name)))

    async with open_nursery() as nursery:
        for node in state.spec.nodes:
            nursery.start_soon(one, node)
        nursery.start_soon(here)
    nodes = []
    for name, spec in state.spec.nodes.items():
        answer = answers.get(name, "not asked")
        if isinstance(answer, str):
            nodes.append(NodeSample(name, spec.site, spec.slots, False, answer, {}))
        else:
            nodes.append(NodeSample(name, spec.site, spec.slots, True, "", dict(answer["counters"])))
    return Sample(state.name, time.monotonic(), time.time(), tuple(nodes), merge_jobs(rows))


def merge_jobs(rows: list[msg.JobRow]) -> RunningJobs:
    """One entry per job (the daemons of one machine each report its jobs), oldest first."""
    seen: dict[tuple[str, int, float], RunningJob] = {}
    for row in rows:
        key = (row["host"], row["pid"], row["started"])
        seen.setdefault(key, RunningJob(row["node"], row["job"], row["kind"], row["directory"], row["started"],
                                        row["host"], row["pid"]))
    return RunningJobs(tuple(sorted(seen.values(), key=lambda job: (job.started, job.host, job.pid))))


def rates(before: Sample, after: Sample) -> dict[str, dict[str, float]]:
    """Per node, RATE_COUNTERS per second between two samples; a node down in either has none.

    A counter that went down (its daemon restarted in between) counts from zero.
    """
    seconds = max(after.taken - before.taken, 1e-6)
    earlier = {n.name: n for n in before.nodes}
    result: dict[str, dict[str, float]] = {}
    for node in after.nodes:
        old = earlier.get(node.name)
        if old is None or not (old.up and node.up):
            continue
        result[node.name] = {}
        for key in RATE_COUNTERS:
            now, then = node.counters.get(key, 0), old.counters.get(key, 0)
            result[node.name][key] = (now - then if now >= then else now) / seconds
    return result
