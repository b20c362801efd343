"""One Dask process on a gmount node: `python -m gmountpy.api.dask_node`, started by gmountpy.launch.dask.

The line protocol is the node daemon's (docs/design.md), so the secrets never
appear in argv or the environment:

    launcher -> process   {"role": "scheduler" | "worker", "cluster": .., "node": .., "host": ..,
                           "tls": {"cert": .., "key": ..}, "scheduler": .. (a worker), "threads": ..,
                           "placement": .. (the scheduler), "cluster_state": {..} (over SSH)}
    process -> launcher   GMOUNT DASK {"pid": .., "start": .., "address": .., "dashboard": .., "log": ..}
    (any time)            GMOUNT ERROR <what went wrong and what to do>

The process forks into a session of its own first (it outlives the launcher
and the SSH session). A worker runs in its node's mount with GMOUNT_NODE,
GMOUNT_SITE and GMOUNT_CLUSTER set, named after the node, and answers once it
is registered with the scheduler. Over SSH the gmount cluster's record,
secret and CA come along and are written to a private directory used as the
process's XDG_STATE_HOME, so code on the node can open the cluster (for
`gmount://` URLs); that directory is removed when the process ends. Logging
goes to `<state>/gmountpy/logs/CLUSTER-dask-ROLE-NODE.log` on the node.
SIGTERM or SIGINT closes the process.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import shutil
import signal
import sys
import tempfile
from typing import IO, Any

from ..cluster import state as state_store
from ..cluster.state import ClusterState
from ..errors import GmountError
from ..node.startup import LINE_PREFIX, default_log_path


def _say(out: IO[str], kind: str, payload: Any) -> None:
    out.write(f"{LINE_PREFIX} {kind} {payload if isinstance(payload, str) else json.dumps(payload)}\n")
    out.flush()


def start_time() -> int:
    """This process's start time in clock ticks after boot: with the pid, what identifies it."""
    with open("/proc/self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def _daemonize() -> None:
    """A session of our own: the launcher's child exits at once (as the node daemon does)."""
    if os.fork() > 0:
        os._exit(0)
    os.setsid()


def _log_to(path: str) -> None:
    """stdout and stderr (where distributed logs) to the log file; stdin from /dev/null."""
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)


def _install_cluster_state(shipped: dict[str, Any], private: str) -> None:
    """Make the gmount cluster known to this process from what the launcher sent (over SSH)."""
    os.environ["XDG_STATE_HOME"] = private
    state = ClusterState.from_dict(shipped["state"])
    state_store.save(state, bytes.fromhex(shipped["secret"]))
    if shipped.get("tls_ca"):
        state_store.save_tls(state.name, shipped["tls_ca"], {}, client=shipped.get("tls_client"))


def _security(config: dict[str, Any]) -> Any:
    from distributed import Security

    cert, key = config["tls"]["cert"], config["tls"]["key"]
    return Security(require_encryption=True, tls_ca_file=cert, tls_client_cert=cert, tls_client_key=key,
                    tls_scheduler_cert=cert, tls_scheduler_key=key, tls_worker_cert=cert, tls_worker_key=key)


async def _serve(config: dict[str, Any], out: IO[str], log: str, scratch: str) -> None:
    """Run the scheduler or worker until it closes; tell the launcher once it serves."""
    host = str(config["host"])
    if config["role"] == "scheduler":
        from distributed import Scheduler
        from distributed.scheduler import DEFAULT_EXTENSIONS

        from .dask_placement import LocalityStealing, Placement

        dashboard = importlib.util.find_spec("bokeh") is not None
        server: Any = Scheduler(host=host, port=0, protocol="tls", security=_security(config),
                                dashboard=dashboard, dashboard_address=f"{host}:0",
                                extensions={**DEFAULT_EXTENSIONS, "stealing": LocalityStealing})
        server.add_plugin(Placement(str(config["cluster"]), enabled=bool(config.get("placement", True))))
    else:
        from distributed import Worker

        server = Worker(str(config["scheduler"]), name=str(config["node"]), nthreads=int(config["threads"]),
                        host=host, protocol="tls", security=_security(config), local_directory=scratch,
                        dashboard=False)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, lambda: asyncio.ensure_future(server.close()))
    await server
    link = None
    if config["role"] == "scheduler" and "dashboard" in server.services:
        link = f"http://{host}:{server.services['dashboard'].port}/status"
    _say(out, "DASK", {"pid": os.getpid(), "start": start_time(), "address": server.address,
                       "dashboard": link, "log": log})
    out.close()  # the launcher (or SSH session) may go away now
    await server.finished()


def main() -> int:
    out = os.fdopen(os.dup(1), "w")  # the launcher's pipe: for the DASK or ERROR line only
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # outlive the SSH session or terminal
    scratch = ""
    try:
        config = json.loads(sys.stdin.readline() or "null")
        if not isinstance(config, dict) or config.get("role") not in ("scheduler", "worker"):
            raise GmountError("no configuration line on stdin: Dask on gmount is started by `gmount dask up`")
        node = str(config.get("node") or "")
        log = default_log_path(str(config["cluster"]), f"dask-{config['role']}-{node or 'local'}")
        _log_to(log)
        _daemonize()
        scratch = tempfile.mkdtemp(prefix=f"gmount-dask-{config['cluster']}-{node or 'scheduler'}-")
        if config.get("cluster_state"):
            _install_cluster_state(config["cluster_state"], os.path.join(scratch, "state"))
        if node:
            mountpoint = str(config["mountpoint"])
            if not os.path.ismount(mountpoint):
                raise GmountError(f"node {node}'s mount {mountpoint} is not mounted: is cluster "
                                  f"{config['cluster']!r} up? (`gmount status`)")
            os.environ.update(GMOUNT_NODE=node, GMOUNT_SITE=str(config["site"]),
                              GMOUNT_CLUSTER=str(config["cluster"]))
        if config["role"] == "worker":
            os.chdir(str(config["mountpoint"]))  # relative paths in tasks are paths in the node's mount
        else:
            os.chdir("/")
        try:
            asyncio.run(_serve(config, out, log, scratch))
        except ImportError as exc:
            raise GmountError(f"Dask is not installed for {sys.executable} ({exc}): "
                              f'install "gmountpy[dask]" there') from None
    except (GmountError, OSError, ValueError, KeyError, TypeError) as exc:
        try:
            _say(out, "ERROR", f"{type(exc).__name__}: {exc}" if not isinstance(exc, GmountError) else str(exc))
        except (OSError, ValueError):
            pass  # the launcher is gone; the log says it
        print(f"gmount dask: {exc}", file=sys.stderr)
        return 1
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
