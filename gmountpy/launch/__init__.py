"""Bringing clusters up and down: `up`, `down`, `status`.

The launcher named in the cluster file decides how daemons start ("local":
processes on this machine); the sequence is shared (orchestrate.py).
"""

from __future__ import annotations

import asyncio
import os
import secrets
from dataclasses import dataclass

from ..client import ping_all, run_sync
from ..config import ClusterSpec
from ..errors import GmountError
from .. import state as state_store
from .local import spawn_local, stop_local
from .orchestrate import LaunchError, Progress, pid_is_daemon, start_cluster
from ..state import ClusterState, NodeRecord

__all__ = ["ClusterState", "LaunchError", "NodeRecord", "NodeStatus", "down", "status", "up"]


def up(spec: ClusterSpec, *, progress: Progress | None = None) -> ClusterState:
    """Start every node's daemon and wait until every mount is ready."""
    existing = state_store.load(spec.name)
    if existing is not None:
        alive = [n for n, r in existing.nodes.items() if pid_is_daemon(r.pid)]
        if alive:
            raise GmountError(f"cluster {spec.name!r} is already up (nodes {', '.join(alive)}): "
                              f"run `gmount down` first")
        stop_local(existing)  # a crashed cluster: clear stale mounts before reusing them
        state_store.remove(spec.name)
    if spec.launcher != "local":
        raise GmountError(f"launcher {spec.launcher!r} is not available in this version; use launcher = \"local\"")
    secret = secrets.token_bytes(32)
    state = asyncio.run(start_cluster(spec, spawn_local, secret, progress=progress))
    state_store.save(state, secret)
    return state


def down(name: str) -> dict[str, str]:
    """Stop every daemon and unmount; exports are left as they are. Safe to run twice."""
    state = state_store.load(name)
    if state is None:
        return {}
    problems = stop_local(state)
    state_store.remove(name)
    return problems


@dataclass(frozen=True)
class NodeStatus:
    name: str
    site: str
    pid: int
    address: str
    mountpoint: str
    up: bool
    detail: str


def status(name: str) -> list[NodeStatus]:
    state = state_store.load(name)
    if state is None:
        raise GmountError(f"cluster {name!r} is not running (no state in {state_store.state_dir()})")
    answers = run_sync(ping_all, state)
    result = []
    for node, record in state.nodes.items():
        answer = answers[node]
        ok = isinstance(answer, dict) and answer.get("pid") == record.pid
        mounted = os.path.ismount(record.mountpoint) if record.ssh is None else ok
        up_now = ok and mounted
        detail = "ok" if up_now else (answer if isinstance(answer, str) else "not mounted")
        result.append(NodeStatus(node, record.site, record.pid, f"{record.host}:{record.port}",
                                 record.mountpoint, up_now, detail))
    return result
