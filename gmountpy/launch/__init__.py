"""Bringing clusters up and down: `up`, `down`, `status`.

The launcher named in the cluster file decides how daemons start ("local":
processes on this machine; "ssh": over SSH, see ssh.py); the sequence is
shared (orchestrate.py).
"""

from __future__ import annotations

import asyncio
import functools
import os
import secrets
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .._sync import blocking
from .._trio import open_nursery
from ..cluster import state as state_store
from ..cluster.config import ClusterSpec
from ..cluster.state import ClusterState, NodeRecord
from ..errors import GmountError
from ..node.directories import directory_problems
from ..protocol.client import ask, ping_all, run_sync
from ..protocol.messages import RenewTls, SetPeers
from ..protocol.tls import ClusterCA, NodeCredentials, expiring
from .local import spawn_local, stop_local
from .orchestrate import LaunchError, Progress, pid_is_daemon, start_cluster

__all__ = ["ClusterState", "LaunchError", "NodeRecord", "NodeStatus", "down", "status", "up"]

T = TypeVar("T")


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """asyncio.run, also when called inside a running event loop (Jupyter): see _sync.blocking."""
    return blocking(functools.partial(asyncio.run, coro))


def up(spec: ClusterSpec, *, progress: Progress | None = None, keep_going: bool = False) -> ClusterState:
    """Start every node's daemon and wait until every mount is ready.

    If a node fails, the daemons already started are stopped and LaunchError
    lists one line per failed node. With keep_going the others stay up, are
    recorded (so `down` stops them), and LaunchError.running is that cluster.
    """
    existing = state_store.load(spec.name)
    if existing is not None:
        if existing.spec.tls and _renew_certificates(existing, progress):
            return existing  # it was up: its expiring certificates were renewed in place
        restarted = _restart_crashed_nodes(existing, spec, progress)
        if restarted is not None:
            return restarted
        _clear_previous(existing)
    if spec.launcher == "local":
        _check_local_directories(spec)
    secret = secrets.token_bytes(32)
    credentials = None
    if spec.tls:
        ca = ClusterCA.create(spec.name)
        credentials = {node: ca.issue(node, secret=secret) for node in spec.nodes}
        state_store.save_tls(spec.name, ca.cert, {n: c.to_dict() for n, c in credentials.items()}, ca_key=ca.key)
    if spec.launcher == "ssh":
        from .ssh import start_ssh_cluster  # asyncssh is only imported when it is used

        launching = start_ssh_cluster(spec, secret, progress=progress, keep_going=keep_going,
                                      credentials=credentials)
    else:
        launching = start_cluster(spec, spawn_local, secret, progress=progress, keep_going=keep_going,
                                  credentials=credentials)
    try:
        state = _run(launching)
    except LaunchError as exc:
        if exc.running is not None:
            state_store.save(exc.running, secret)
        else:
            state_store.remove(spec.name)
        raise
    state_store.save(state, secret)
    return state


def _check_local_directories(spec: ClusterSpec) -> None:
    """Refuse before starting anything when an export is missing or a mountpoint is not empty."""
    failures = {node.name: "; ".join(problems) for node in spec.nodes.values()
                if (problems := directory_problems(node))}
    if failures:
        raise LaunchError(failures)


def _renew_certificates(existing: ClusterState, progress: Progress | None = None) -> bool:
    """Reissue node certificates with less than RENEW_WITHIN left and hand them to the running daemons.

    True if there were some and every daemon took its new one; False if none
    needed it, or a daemon did not answer (it gets the new one when restarted),
    or they cannot be reissued from this CA (then a fresh start, after
    `gmount down`, makes a new CA; `gmount audit` says so).
    """
    name = existing.name
    try:
        ca_pem, stored = state_store.load_tls(name)
    except GmountError:
        return False
    due = [node for node, creds in stored.items() if expiring(creds["cert"])]
    ca_key = state_store.load_tls_ca_key(name)
    if not due or expiring(ca_pem) or ca_key is None:
        return False
    ca = ClusterCA(ca_pem, ca_key)
    renewed = {node: ca.issue(node, secret=state_store.load_secret(name)) for node in due}
    state_store.save_tls(name, ca_pem, {**stored, **{n: c.to_dict() for n, c in renewed.items()}}, ca_key=ca_key)
    answers: dict[str, str | None] = {}

    async def hand_over(node: str) -> None:
        try:
            await ask(existing, node, RenewTls(renewed[node].cert, renewed[node].key))
            answers[node] = None
            if progress is not None:
                progress(node, "certificate renewed")
        except OSError as exc:
            answers[node] = str(exc)

    async def hand_over_all() -> None:
        async with open_nursery() as nursery:
            for node in due:
                if node in existing.nodes:
                    nursery.start_soon(hand_over, node)

    run_sync(hand_over_all)
    return all(answers.get(node, "not running") is None for node in due)


def _restart_crashed_nodes(existing: ClusterState, spec: ClusterSpec,
                           progress: Progress | None) -> ClusterState | None:
    """`gmount up` on a cluster some of whose local daemons died: restart just those.

    Returns None when there is nothing to keep (no daemon alive), so a fresh
    start follows. The restarted nodes join with the cluster's secret (and
    TLS certificates), and the running nodes are told their new addresses.
    """
    if existing.spec.launcher != "local":
        return None
    alive = {n: r for n, r in existing.nodes.items() if pid_is_daemon(r.pid)}
    if not alive:
        return None
    dead = [n for n in spec.nodes if n not in alive]
    if not dead:
        raise GmountError(f"cluster {spec.name!r} is already up (nodes {', '.join(alive)}): "
                          f"run `gmount down` first")
    if {**existing.spec.to_dict(), "source": None} != {**spec.to_dict(), "source": None}:
        raise GmountError(f"cluster {spec.name!r} runs with a different cluster file; "
                          "run `gmount down` first to start it with this one")
    # The dead nodes' stale mounts are cleared; their directories stay sealed (unwritable) until
    # the new daemons mount over them, so nothing is written into the disk under a mountpoint.
    stop_local(ClusterState(existing.spec, {n: r for n, r in existing.nodes.items() if n in dead},
                            existing.started), unseal=False)
    secret = state_store.load_secret(spec.name)
    credentials = None
    if spec.tls:
        _, stored = state_store.load_tls(spec.name)
        credentials = {n: NodeCredentials(**c) for n, c in stored.items()}  # renewed above if expiring
    known = {n: [r.host, r.port] for n, r in alive.items()}
    try:
        started = _run(start_cluster(spec, spawn_local, secret, progress=progress, credentials=credentials,
                                     only=dead, known_peers=known))
    except LaunchError as exc:
        # The nodes that were running still run, as recorded: say so (and keep them recorded,
        # with the failed ones, so `gmount up` retries and `gmount down` stops them all).
        raise LaunchError(exc.failures, running=ClusterState(spec, dict(alive), existing.started),
                          restarting=True) from None
    records = {n: started.nodes[n] if n in started.nodes else alive[n] for n in spec.nodes}
    state = ClusterState(spec, records, existing.started)
    state_store.save(state, secret)
    table = {n: (r.host, r.port) for n, r in records.items()}

    async def tell_everyone() -> None:
        async with open_nursery() as nursery:
            for node in alive:
                nursery.start_soon(ask, state, node, SetPeers(table))

    run_sync(tell_everyone)
    return state


def _clear_previous(existing: ClusterState) -> None:
    """Refuse if a recorded cluster of that name still runs; otherwise clear what a crash left behind."""
    name = existing.name
    if existing.spec.launcher == "ssh":
        from .ssh import NodeCheck, inspect_ssh_cluster, stop_ssh_cluster

        checks = _run(inspect_ssh_cluster(existing))
        alive = [n for n, c in checks.items() if isinstance(c, NodeCheck) and c.alive]
        if alive:
            raise GmountError(f"cluster {name!r} is already up (nodes {', '.join(alive)}): run `gmount down` first")
        unknown = {n: c for n, c in checks.items() if isinstance(c, str)}
        if unknown:
            node, why = next(iter(unknown.items()))
            raise GmountError(f"cluster {name!r} may still be up on {', '.join(unknown)} ({node}: {why}): "
                              f"run `gmount down` once they are reachable, or `gmount down --forget`")
        _run(stop_ssh_cluster(existing, unseal=False))  # a crashed cluster: clear stale mounts before reusing them
    else:
        alive = [n for n, r in existing.nodes.items() if pid_is_daemon(r.pid)]
        if alive:
            raise GmountError(f"cluster {name!r} is already up (nodes {', '.join(alive)}): "
                              f"run `gmount down` first")
        stop_local(existing, unseal=False)  # a crashed cluster: clear stale mounts before reusing them
    state_store.remove(name)


def down(name: str, *, progress: Progress | None = None, forget: bool = False) -> dict[str, str]:
    """Stop every daemon and unmount; exports are left as they are. Safe to run twice.

    Returns node -> problem. Over SSH, nodes that could not be reached stay
    recorded so that running `down` again finishes the job; `forget` drops
    them from the record anyway.
    """
    from .dask import down as dask_down  # its workers run in the mounts: stop them first

    dask_problems = {node: f"Dask: {what}" for node, what in dask_down(name).items()}
    state = state_store.load(name)
    if state is None:
        return dask_problems
    if state.spec.launcher != "ssh":
        problems = stop_local(state)
        state_store.remove(name)
        return {**dask_problems, **problems}
    from .ssh import stop_ssh_cluster

    problems, unreachable = _run(stop_ssh_cluster(state, progress=progress))
    if unreachable and not forget:
        left = {n: r for n, r in state.nodes.items() if n in unreachable}
        state_store.save(ClusterState(state.spec, left, state.started), state_store.load_secret(name))
        for node in unreachable:
            problems[node] += "; still recorded: run `gmount down` again when it is reachable (or --forget)"
    else:
        state_store.remove(name)
    return {**dask_problems, **problems}


@dataclass(frozen=True)
class NodeStatus:
    name: str
    site: str
    pid: int
    address: str
    mountpoint: str
    up: bool
    detail: str
    counters: dict[str, int] = field(default_factory=dict)  # IOCounters of the node; empty when down


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
        counters = answer.get("counters", {}) if isinstance(answer, dict) else {}
        result.append(NodeStatus(node, record.site, record.pid, f"{record.host}:{record.port}",
                                 record.mountpoint, up_now, detail, dict(counters)))
    if state.spec.launcher == "ssh" and not all(n.up for n in result):
        result = _explain_over_ssh(state, result)
    return result


def _explain_over_ssh(state: ClusterState, result: list[NodeStatus]) -> list[NodeStatus]:
    """A daemon that does not answer here may still run: ask its host over SSH, say which it is."""
    from .ssh import inspect_ssh_cluster

    down_nodes = [n.name for n in result if not n.up]
    checks = _run(inspect_ssh_cluster(state, down_nodes))
    explained = []
    for n in result:
        check = checks.get(n.name)
        if n.up or check is None:
            explained.append(n)
            continue
        record = state.nodes[n.name]
        if isinstance(check, str):
            detail = f"no answer at {n.address} ({n.detail}); over SSH: {check}"
        elif check.alive and check.mounted:
            detail = (f"daemon pid {n.pid} runs and {record.mountpoint} is mounted, but it does not answer "
                      f"at {n.address} from here ({n.detail}): a firewall between here and the node?")
        elif check.alive:
            detail = f"daemon pid {n.pid} runs but {record.mountpoint} is not mounted: see its log {record.log}"
        elif check.mounted:
            detail = f"daemon pid {n.pid} is gone and {record.mountpoint} is a stale mount: run `gmount down`"
        else:
            detail = f"daemon pid {n.pid} is gone: see its log {record.log}, then `gmount down` and `gmount up`"
        explained.append(NodeStatus(n.name, n.site, n.pid, n.address, n.mountpoint, False, detail))
    return explained
