"""Bringing a cluster up and down, independent of how daemons are started.

A launcher backend only knows how to start one daemon process and talk to
its stdin/stdout (a local subprocess, or an SSH channel). The sequence is
the same for all: start every daemon, hand each its configuration, collect
the addresses they listen on, send everyone the peer table, wait until
every mount is ready. If any node fails, the ones already started are
stopped again, so no half-up cluster is left behind.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from ..cluster.config import ClusterSpec, NodeSpec
from ..cluster.state import ClusterState, NodeRecord
from ..errors import GmountError
from ..node.startup import LINE_PREFIX, default_log_path
from ..protocol.tls import NodeCredentials


class DaemonProcess(Protocol):
    """A daemon being started: its pipes until READY, and a way to stop it."""

    node: str

    async def write_line(self, text: str) -> None: ...
    async def read_line(self) -> str: ...
    async def error_output(self) -> str: ...
    async def abort(self, pid: int | None) -> None: ...
    async def release(self) -> None: ...


Spawn = Callable[[NodeSpec], Awaitable[DaemonProcess]]
Progress = Callable[[str, str], None]


class LaunchError(GmountError):
    """Some nodes failed to start; `failures` maps node -> one line saying what and what to do.

    `running` is None when nothing was left running (the default); with
    keep_going it is the cluster formed by the nodes that did come up; when
    `restarting` crashed nodes, it is the nodes that were running before and
    still run.
    """

    def __init__(self, failures: dict[str, str], running: ClusterState | None = None, *,
                 restarting: bool = False) -> None:
        self.failures = failures
        self.running = running
        self.restarting = restarting
        lines = "\n".join(f"  {node}: {why}" for node, why in failures.items())
        tail = ""
        if running is not None and restarting:
            tail = (f"\nstill running, as before: {', '.join(running.nodes)} "
                    f"(`gmount up` again retries {', '.join(failures)}; `gmount down` stops them all)")
        elif running is not None:
            tail = (f"\nthe other {len(running.nodes)} node(s) are up (--keep-going): "
                    f"{', '.join(running.nodes)}")
        what = "restart" if restarting else "start"
        super().__init__(f"{len(failures)} node(s) failed to {what}:\n{lines}{tail}")


@dataclass
class _Started:
    spec: NodeSpec
    process: DaemonProcess
    pid: int = 0
    host: str = ""
    port: int = 0


async def _expect(process: DaemonProcess, kind: str, timeout: float, log: str = "") -> dict[str, object]:
    """Wait for `GMOUNT <kind> {json}` from a daemon; its ERROR line or silence becomes GmountError."""
    deadline = time.monotonic() + timeout
    silent = (f"no {kind} line within {timeout:g}s: see the node's log{f' ({log})' if log else ''}, "
              "or raise tuning.ready_timeout")
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise GmountError(silent)
        try:
            line = await asyncio.wait_for(process.read_line(), remaining)
        except TimeoutError:
            raise GmountError(silent) from None
        if not line:
            detail = (await process.error_output()).strip().splitlines()
            raise GmountError("daemon exited before " + kind + (f": {detail[-1]}" if detail else ""))
        if not line.startswith(LINE_PREFIX + " "):
            continue  # e.g. a login banner or warning printed by the shell
        _, got, payload = (line.rstrip("\n").split(" ", 2) + [""])[:3]
        if got == "ERROR":
            raise GmountError(payload)
        if got == kind:
            try:
                fields = json.loads(payload)
            except ValueError:
                fields = None
            if not isinstance(fields, dict):
                raise GmountError(f"daemon sent a malformed {kind} line: {payload[:200]!r}")
            return fields


async def start_cluster(
    spec: ClusterSpec,
    spawn: Spawn,
    secret: bytes,
    *,
    progress: Progress | None = None,
    peer_host: Callable[[NodeSpec, str], str] | None = None,
    concurrency: int = 32,
    keep_going: bool = False,
    credentials: dict[str, NodeCredentials] | None = None,
    only: Collection[str] | None = None,
    known_peers: dict[str, list[Any]] | None = None,
) -> ClusterState:
    """Start one daemon per node and return the running cluster's state.

    On any failure every daemon already started is stopped and LaunchError
    raised; with keep_going only the failed ones are, the rest form the
    cluster, and LaunchError carries it as `running`. An interrupted launch
    (Ctrl-C) also stops what it started, so nothing is left unrecorded.

    `only` starts a subset (restarting crashed nodes); `known_peers` are the
    addresses of nodes already running, added to the peer table.
    """
    known_peers = known_peers or {}
    say = progress or (lambda node, what: None)
    nodes = [node for node in spec.nodes.values() if only is None or node.name in only]
    timeout = spec.tuning.ready_timeout
    limit = asyncio.Semaphore(concurrency)
    started: dict[str, _Started] = {}
    failures: dict[str, str] = {}

    async def bring_up(node: NodeSpec) -> None:
        async with limit:
            say(node.name, "starting")
            try:
                process = await spawn(node)
            except GmountError as exc:
                failures[node.name] = str(exc)
                say(node.name, "failed")
                return
            entry = started[node.name] = _Started(node, process)
            try:
                config: dict[str, Any] = {
                    "node": node.name, "spec": spec.to_dict(), "secret": secret.hex(),
                    "log": default_log_path(spec.name, node.name) if node.host is None else None,
                }
                if credentials is not None:
                    config["tls"] = credentials[node.name].to_dict()
                await process.write_line(json.dumps(config))
                log = _log_hint(spec.name, node)
                entry.pid = int(str((await _expect(process, "STARTED", timeout, log))["pid"]))
                listening = await _expect(process, "LISTENING", timeout, log)
                entry.host, entry.port = str(listening["host"]), int(str(listening["port"]))
                say(node.name, "listening")
            except (GmountError, OSError, ValueError, KeyError) as exc:
                failures[node.name] = str(exc)
                say(node.name, "failed")

    async def drop_failed() -> None:
        if not keep_going or len(failures) >= len(nodes):
            await _abort_all(started.values())
            raise LaunchError(failures)
        await _abort_all(started.pop(name) for name in list(started) if name in failures)

    try:
        await asyncio.gather(*(bring_up(node) for node in nodes))
        if failures:
            await drop_failed()

        hosts = {name: peer_host(e.spec, e.host) if peer_host else e.host for name, e in started.items()}
        addresses = {**known_peers, **{name: [hosts[name], e.port] for name, e in started.items()}}
        peers_line = json.dumps({"peers": addresses})

        async def finish(entry: _Started) -> None:
            try:
                await entry.process.write_line(peers_line)
                await _expect(entry.process, "READY", timeout, _log_hint(spec.name, entry.spec))
                say(entry.spec.name, "ready")
            except (GmountError, OSError, ValueError) as exc:
                failures[entry.spec.name] = str(exc)
                say(entry.spec.name, "failed")

        await asyncio.gather(*(finish(e) for e in started.values()))
        if failures:
            await drop_failed()
        for entry in started.values():
            await entry.process.release()

        order = {name: i for i, name in enumerate(spec.nodes)}
        records = {
            name: NodeRecord(name=name, site=e.spec.site, pid=e.pid, host=hosts[name], port=e.port,
                             mountpoint=e.spec.mountpoint, export=e.spec.export,
                             log=_log_path(spec.name, e.spec), ssh=e.spec.host)
            for name, e in sorted(started.items(), key=lambda item: order[item[0]])  # spec order, not finish order
        }
        state = ClusterState(spec, records, time.time())
        if failures:
            raise LaunchError(failures, running=state)
        return state

    except (asyncio.CancelledError, KeyboardInterrupt):
        await asyncio.shield(_abort_all(started.values()))  # interrupted: leave nothing unrecorded behind
        raise


def _log_hint(cluster: str, node: NodeSpec) -> str:
    """Where to look when a daemon stays silent; on a remote node that is a file over there."""
    if node.host is None:
        return ""  # the local default; tests and messages have always said just "the node's log"
    return f"{_log_path(cluster, node)} on {node.host}"


def _log_path(cluster: str, node: NodeSpec) -> str:
    """Where the node logs; a remote node uses its own home (the daemon picks the default there)."""
    if node.host is None:
        return default_log_path(cluster, node.name)
    return f"~/.local/state/gmountpy/logs/{cluster}-{node.name}.log"


async def _abort_all(entries: Iterable[_Started]) -> None:
    await asyncio.gather(*(e.process.abort(e.pid or None) for e in entries), return_exceptions=True)


def pid_is_daemon(pid: int) -> bool:
    """True if `pid` is a gmount node daemon of this user (guards against reused pids)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().split(b"\0")
        return b"gmountpy.node" in cmdline and os.stat(f"/proc/{pid}").st_uid == os.getuid()
    except OSError:
        return False
