"""Dask on a running gmount cluster: a scheduler and one worker per node, started and stopped like the daemons.

`up` starts `python -m gmountpy.api.dask_node` once as the scheduler (on this
machine for a local cluster; over SSH on the first node for an SSH cluster,
since the nodes can reach each other but not necessarily this machine) and
once per node as that node's worker, running in the node's mount with
GMOUNT_NODE set. Local processes start as the daemons do (a child in its own
session); SSH ones through asyncssh with the launcher's own connection
options (keys, known_hosts, ssh config).

Each process gets its configuration as one JSON line on stdin -- never argv
or the environment, which other users can read: it carries the Dask cluster's
TLS key and, over SSH, the gmount cluster's secret, so that code on the node
can open the cluster too. It forks into a session of its own, answers
`GMOUNT DASK {...}` once it serves (a worker: once registered with the
scheduler) and from then on logs to its file only.

Scheduler, workers and clients speak TLS with a key made for this Dask
cluster (mutual: whoever lacks the key cannot connect), kept beside the
record in the user's state directory. The record (`<state>/gmountpy/dask/
NAME.json`) lets `down`, `gmount down` and later sessions find the processes;
each is identified by pid and start time, so a reused pid is never signalled.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar

from .._sync import blocking
from ..cluster import state as state_store
from ..cluster.state import ClusterState
from ..errors import GmountError
from ..protocol.client import CLIENT_NAME
from ..protocol.tls import CA_VALIDITY, ClusterCA
from .local import LocalProcess
from .orchestrate import _expect

if TYPE_CHECKING:
    from distributed import Security

__all__ = ["DaskProcess", "DaskState", "down", "load", "running_workers", "up"]

#: the module every Dask process runs, on its node
NODE_MODULE = "gmountpy.api.dask_node"
READY = "DASK"
T = TypeVar("T")
Progress = Callable[[str, str], None]


def _run(coro: Coroutine[Any, Any, T]) -> T:
    return blocking(functools.partial(asyncio.run, coro))


# --------------------------------------------------------------------------- the record


@dataclass(frozen=True)
class DaskProcess:
    """A scheduler or worker as started: where it runs and how to recognise it."""

    role: str            # "scheduler" or "worker"
    node: str            # the gmount node it runs on ("" for a local scheduler: this machine)
    pid: int
    start: int           # start time in clock ticks after boot (/proc/PID/stat): a reused pid has another
    address: str         # tls://host:port
    log: str             # its log file, on the machine it runs on
    ssh: str | None = None  # the SSH destination it was started through (None: this machine)
    daemon_pid: int | None = None  # a worker: its node's gmount daemon then (another one now: a dead mount)


@dataclass(frozen=True)
class DaskState:
    """A running Dask cluster on gmount cluster `cluster`."""

    cluster: str
    scheduler: DaskProcess
    workers: dict[str, DaskProcess]
    dashboard: str | None
    placement: bool
    started: float = field(default_factory=time.time)

    @property
    def address(self) -> str:
        return self.scheduler.address

    def to_dict(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "scheduler": asdict(self.scheduler),
                "workers": {n: asdict(w) for n, w in self.workers.items()}, "dashboard": self.dashboard,
                "placement": self.placement, "started": self.started}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DaskState:
        return cls(data["cluster"], DaskProcess(**data["scheduler"]),
                   {n: DaskProcess(**w) for n, w in data["workers"].items()}, data["dashboard"],
                   bool(data["placement"]), float(data["started"]))


def dask_dir() -> str:
    """Where Dask clusters are recorded: beside (not in) the clusters' own state directory."""
    return os.path.join(os.path.dirname(state_store.state_dir()), "dask")


def _paths(name: str) -> tuple[str, str]:
    base = os.path.join(dask_dir(), name)
    return base + ".json", base + ".pem"


def _write_private(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    temporary = f"{path}.{os.getpid()}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with open(fd, "wb") as f:
        f.write(data)
    os.replace(temporary, path)


def load(name: str) -> DaskState | None:
    """The recorded Dask cluster of gmount cluster `name`, or None."""
    record, _ = _paths(name)
    try:
        with open(record) as f:
            return DaskState.from_dict(json.load(f))
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as exc:
        raise GmountError(f"the Dask record of cluster {name!r} is damaged ({exc}): stop its processes by hand "
                          f"if any run, then remove {record}") from None


def _save(state: DaskState) -> None:
    _write_private(_paths(state.cluster)[0], json.dumps(state.to_dict(), indent=2).encode())


def _remove(name: str) -> None:
    for path in _paths(name):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def credentials(name: str) -> tuple[str, str]:
    """(certificate PEM, key PEM) of the Dask cluster of `name`; GmountError when there is none."""
    path = _paths(name)[1]
    try:
        with open(path) as f:
            data = json.load(f)
        return str(data["cert"]), str(data["key"])
    except (FileNotFoundError, ValueError, KeyError) as exc:
        raise GmountError(f"no Dask key for cluster {name!r} at {path} ({exc}): run `gmount dask down` and "
                          f"`gmount dask up` again") from None


def security(name: str) -> Security:
    """The TLS settings a client of the Dask cluster of `name` connects with (mutual TLS, one key)."""
    cert, key = credentials(name)
    return _security(cert, key)


def _security(cert: str, key: str) -> Security:
    from distributed import Security

    return Security(require_encryption=True, tls_ca_file=cert, tls_client_cert=cert, tls_client_key=key,
                    tls_scheduler_cert=cert, tls_scheduler_key=key, tls_worker_cert=cert, tls_worker_key=key)


def _new_credentials(name: str) -> tuple[str, str]:
    """A self-signed certificate and key for one Dask cluster: its CA and every member's identity."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"gmount dask {name}")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=365))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return (cert.public_bytes(serialization.Encoding.PEM).decode(),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()).decode())


# --------------------------------------------------------------------------- starting


def up(state: ClusterState, *, threads: int | None = None, placement: bool = True, timeout: float = 60.0,
       progress: Progress | None = None) -> DaskState:
    """Start Dask on cluster `state` unless it runs; start the workers of nodes that lack one.

    `threads` per worker (default: each node's `slots`); `placement` turns the
    scheduler's locality placement on (off: Dask's own placement, for
    comparison). A running Dask cluster keeps the settings it was started with.
    """
    if threads is not None and threads < 1:
        raise ValueError(f"`threads` must be at least 1, got {threads}")
    if importlib.util.find_spec("distributed") is None:
        raise GmountError('Dask is not installed here: pip install "gmountpy[dask]" (on every node too)')
    say = progress or (lambda node, what: None)
    name = state.name
    state = state_store.load(name) or state  # as recorded now: a node restarted since `state` was read
    existing = load(name)
    if existing is not None:
        alive = running_workers(existing)
        if alive is not None:
            stale = in_dead_mounts(state, existing, alive)
            if stale:  # their node's daemon was restarted: their working directory is the old, dead mount
                stopping = [existing.workers[n] for n in stale]
                for node in stale:
                    say(node, "restarting: its node's daemon was restarted")
                _stop([p for p in stopping if p.ssh is None], 15.0)
                if any(p.ssh for p in stopping):
                    _run(_stop_ssh(state, [p for p in stopping if p.ssh], 15.0))
                alive -= set(stale)
            missing = [n for n in state.spec.nodes if n not in alive]
            if not missing:
                return existing
            cert, key = credentials(name)
            started = _run(_start_workers(state, existing.address, missing, cert, key, threads, timeout, say))
            grown = DaskState(name, existing.scheduler, {**{n: w for n, w in existing.workers.items()
                                                           if n in alive}, **started},
                              existing.dashboard, existing.placement, existing.started)
            _save(grown)
            return grown
        down(name)  # the scheduler is gone: clear what is left before starting afresh
    cert, key = _new_credentials(name)
    _write_private(_paths(name)[1], json.dumps({"cert": cert, "key": key}).encode())
    try:
        scheduler, dashboard = _run(_start_scheduler(state, cert, key, placement, timeout, say))
    except BaseException:
        _remove(name)
        raise
    first = DaskState(name, scheduler, {}, dashboard, placement)
    _save(first)  # from here on `down` can stop what was started, whatever happens next
    try:
        workers = _run(_start_workers(state, scheduler.address, list(state.spec.nodes), cert, key, threads,
                                      timeout, say))
    except BaseException:
        down(name)
        raise
    running = DaskState(name, scheduler, workers, dashboard, placement, first.started)
    _save(running)
    return running


def running_workers(state: DaskState, timeout: float = 10.0) -> set[str] | None:
    """Names of the workers the scheduler has now; None when the scheduler does not answer."""
    from distributed import Client

    scheduler = state.scheduler
    if scheduler.ssh is None and _start_time(scheduler.pid) != scheduler.start:
        return None  # a local scheduler that is gone: no need to wait for a connection to time out
    try:
        with Client(state.address, security=security(state.cluster), timeout=timeout,
                    set_as_default=False) as client:
            info = client.scheduler_info(n_workers=-1)
    except (OSError, TimeoutError, GmountError):
        return None
    return {str(w.get("name")) for w in info.get("workers", {}).values()}


def in_dead_mounts(state: ClusterState, dask: DaskState, alive: set[str]) -> list[str]:
    """Running workers whose node's daemon is not the one they started under (it was restarted):
    they work in the old mount, which answers nothing, so they are started again."""
    stale = []
    for node in sorted(alive):
        worker, record = dask.workers.get(node), state.nodes.get(node)
        if worker is not None and record is not None and worker.daemon_pid not in (None, record.pid):
            stale.append(node)
    return stale


def _node_config(state: ClusterState, role: str, node: str, cert: str, key: str) -> dict[str, Any]:
    """What one Dask process is told (see gmountpy.api.dask_node)."""
    spec = state.spec
    record = state.nodes.get(node)
    config: dict[str, Any] = {"role": role, "cluster": state.name, "node": node, "tls": {"cert": cert, "key": key}}
    if node:
        config.update(site=spec.nodes[node].site, mountpoint=spec.nodes[node].mountpoint)
    over_ssh = bool(node) and _over_ssh(state, node)
    config["host"] = record.host if over_ssh and record is not None else "127.0.0.1"
    if over_ssh:
        config["cluster_state"] = _shipped_state(state)
    return config


def _over_ssh(state: ClusterState, node: str) -> bool:
    record = state.nodes.get(node)
    return state.spec.launcher == "ssh" or (record is not None and record.ssh is not None)


def _shipped_state(state: ClusterState) -> dict[str, Any]:
    """What code on a remote node needs to open the cluster: its record, secret, CA and a client
    certificate of its own (never the CA's key)."""
    secret = state_store.load_secret(state.name)
    shipped: dict[str, Any] = {"state": state.to_dict(), "secret": secret.hex()}
    if state.spec.tls:
        ca_pem = state_store.load_tls(state.name)[0]
        ca_key = state_store.load_tls_ca_key(state.name)
        if ca_key is None:
            raise GmountError(f"cluster {state.name!r} uses TLS, but the key of its CA is not kept in this user's "
                              "state: Dask's remote workers cannot get a client certificate; run `gmount down` "
                              "and `gmount up` again")
        client = ClusterCA(ca_pem, ca_key).issue_client(CLIENT_NAME, secret=secret, validity=CA_VALIDITY)
        shipped["tls_ca"] = ca_pem
        shipped["tls_client"] = {"name": CLIENT_NAME, "cert": client.cert, "key": client.key}
    return shipped


async def _start_scheduler(state: ClusterState, cert: str, key: str, placement: bool, timeout: float,
                           say: Progress) -> tuple[DaskProcess, str | None]:
    node = next(iter(state.spec.nodes)) if state.spec.launcher == "ssh" else ""
    config = _node_config(state, "scheduler", node, cert, key)
    config["placement"] = placement
    say("scheduler", "starting")
    try:
        answer, process = await _start(state, node, config, timeout)
    except GmountError as exc:
        say("scheduler", "failed")
        where = f"on node {node}" if node else "on this machine"
        raise GmountError(f"the Dask scheduler did not start {where}: {exc}") from None
    say("scheduler", "ready")
    dashboard = answer.get("dashboard")
    return process, str(dashboard) if dashboard else None


async def _start_workers(state: ClusterState, scheduler: str, nodes: list[str], cert: str, key: str,
                         threads: int | None, timeout: float, say: Progress) -> dict[str, DaskProcess]:
    started: dict[str, DaskProcess] = {}
    failures: dict[str, str] = {}

    async def one(node: str) -> None:
        config = _node_config(state, "worker", node, cert, key)
        config.update(scheduler=scheduler, threads=threads or state.spec.nodes[node].slots)
        say(node, "starting")
        try:
            process = (await _start(state, node, config, timeout))[1]
            record = state.nodes.get(node)
            started[node] = replace(process, daemon_pid=record.pid if record is not None else None)
            say(node, "ready")
        except GmountError as exc:
            failures[node] = str(exc)
            say(node, "failed")

    await asyncio.gather(*(one(node) for node in nodes))
    if failures:
        leftover = list(started.values())
        await asyncio.to_thread(_stop, leftover, 10.0)
        if any(p.ssh for p in leftover):
            await _stop_ssh(state, [p for p in leftover if p.ssh], 10.0)
        lines = "; ".join(f"{node}: {why}" for node, why in failures.items())
        raise GmountError(f"{len(failures)} Dask worker(s) did not start: {lines}")
    return {node: started[node] for node in nodes}


async def _start(state: ClusterState, node: str, config: dict[str, Any],
                 timeout: float) -> tuple[dict[str, object], DaskProcess]:
    """Start one Dask process on `node` ("" = this machine), wait for its DASK line."""
    if node and _over_ssh(state, node):
        from .ssh import destination

        process: Any = await _SshDaskProcess.start(state, node)
        ssh: str | None = destination(state.spec.nodes[node]).label
    else:
        process = _start_local(node)
        ssh = None
    try:
        await process.write_line(json.dumps(config))
        answer = await _expect(process, READY, timeout)
    finally:
        await process.release()
    try:
        described = DaskProcess(str(config["role"]), node, int(str(answer["pid"])), int(str(answer["start"])),
                                str(answer["address"]), str(answer.get("log", "")), ssh)
    except (KeyError, ValueError) as exc:
        raise GmountError(f"the Dask {config['role']} sent a malformed {READY} line ({exc})") from None
    return answer, described


def _start_local(node: str) -> LocalProcess:
    try:
        process = subprocess.Popen([sys.executable, "-m", NODE_MODULE], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                   close_fds=True, cwd="/")  # not the caller's directory (see launch.local)
    except OSError as exc:
        raise GmountError(f"cannot start {sys.executable}: {exc}") from None
    return LocalProcess(node or "scheduler", process)


class _SshDaskProcess:
    """A Dask process being started over an asyncssh exec channel, until its DASK line."""

    def __init__(self, label: str, conn: Any, process: Any) -> None:
        self.node = label
        self._conn = conn
        self._process = process

    @classmethod
    async def start(cls, state: ClusterState, node: str) -> _SshDaskProcess:
        import asyncssh

        from .ssh import _connect_options, _connect_problem, _shell_word, destination

        spec = state.spec
        dest = destination(spec.nodes[node])
        try:
            conn = await asyncssh.connect(dest.hostname, **_connect_options(spec.ssh, dest))
        except (OSError, asyncssh.Error) as exc:
            raise GmountError(_connect_problem(exc, dest, spec.ssh)) from None
        command = f"exec {_shell_word(spec.nodes[node].python)} -m {NODE_MODULE}"
        try:
            process = await conn.create_process(f"exec /bin/sh -c {shlex.quote(command)}")
        except (OSError, asyncssh.Error) as exc:
            conn.close()
            raise GmountError(f"SSH session to {dest.label} failed: {getattr(exc, 'reason', None) or exc}") from None
        return cls(dest.label, conn, process)

    async def write_line(self, text: str) -> None:
        import asyncssh

        try:
            self._process.stdin.write(text + "\n")
            await self._process.stdin.drain()
        except (asyncssh.Error, OSError) as exc:
            raise GmountError(f"SSH session to {self.node} lost: {exc}") from None

    async def read_line(self) -> str:
        import asyncssh

        try:
            line: str = await self._process.stdout.readline()
            return line
        except (asyncssh.Error, OSError) as exc:
            raise GmountError(f"SSH session to {self.node} lost: {exc}") from None

    async def error_output(self) -> str:
        try:
            text: str = await asyncio.wait_for(self._process.stderr.read(), 2.0)
            return text
        except Exception:  # noqa: BLE001 -- only for the message of a failure already being reported
            return ""

    async def release(self) -> None:
        """Let the session end; the process runs on in a session of its own on the host."""
        try:
            self._process.stdin.write_eof()
        except Exception:  # noqa: BLE001 -- the channel may be gone already
            pass
        self._process.close()
        self._conn.close()
        try:
            await asyncio.wait_for(self._conn.wait_closed(), 5.0)
        except Exception:  # noqa: BLE001
            pass


# --------------------------------------------------------------------------- stopping


def down(name: str, timeout: float = 15.0) -> dict[str, str]:
    """Stop the Dask cluster of gmount cluster `name` (workers, then the scheduler); node -> problem.

    Safe to run twice, and when nothing runs. The gmount cluster's state is
    needed only to reach SSH nodes; without it their processes are reported.
    """
    recorded = load(name)
    if recorded is None:
        return {}
    processes = [*recorded.workers.values(), recorded.scheduler]
    cluster = state_store.load(name)
    remote = [p for p in processes if p.ssh is not None]
    problems: dict[str, str] = {}
    if remote and cluster is None:
        for p in remote:
            problems[p.node] = (f"Dask {p.role} pid {p.pid} on {p.ssh} not stopped: cluster {name!r} is no longer "
                                f"recorded, so it cannot be reached; stop it there by hand")
    elif remote:
        assert cluster is not None
        problems.update(_run(_stop_ssh(cluster, remote, timeout)))
    problems.update(_stop([p for p in processes if p.ssh is None], timeout))
    _remove(name)
    return problems


def _stop(processes: Iterable[DaskProcess], timeout: float) -> dict[str, str]:
    """SIGTERM local Dask processes (if still the ones started), wait, SIGKILL what lingers."""
    waiting = [p for p in processes if p.ssh is None and _start_time(p.pid) == p.start]
    for p in waiting:
        try:
            os.kill(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while waiting and time.monotonic() < deadline:
        waiting = [p for p in waiting if _start_time(p.pid) == p.start]
        time.sleep(0.05)
    problems = {}
    for p in waiting:
        problems[p.node or "scheduler"] = f"Dask {p.role} pid {p.pid} ignored SIGTERM for {timeout:g}s; killed"
        try:
            os.kill(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return problems


def _start_time(pid: int) -> int | None:
    """A live process's start time (clock ticks after boot), None if there is none (or a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


#: Stops Dask processes on one host: each only while /proc says it is still the one started
#: (pid and start time), SIGTERM, wait, then SIGKILL. Any POSIX sh.
_STOP_SCRIPT = r"""
started() { [ -r /proc/$1/stat ] && [ "$(sed 's/^.*) //' /proc/$1/stat | cut -d' ' -f1)" != Z ] &&
  [ "$(sed 's/^.*) //' /proc/$1/stat | cut -d' ' -f20)" = "$2" ]; }
set -- @PAIRS@
left=""
while [ $# -ge 2 ]; do
  if started "$1" "$2"; then kill -TERM "$1" 2>/dev/null; left="$left $1:$2"; fi
  shift 2
done
i=0
while [ -n "$left" ] && [ $i -lt @TICKS@ ]; do
  sleep 0.1; i=$((i + 1)); still=""
  for entry in $left; do started "${entry%%:*}" "${entry##*:}" && still="$still $entry"; done
  left="$still"
done
for entry in $left; do kill -KILL "${entry%%:*}" 2>/dev/null; echo "killed ${entry%%:*}"; done
exit 0
"""


async def _stop_ssh(cluster: ClusterState, processes: list[DaskProcess], timeout: float) -> dict[str, str]:
    import asyncssh

    from .ssh import _connect_options, _connect_problem, destination

    spec = cluster.spec
    by_host: dict[str, list[DaskProcess]] = {}
    for p in processes:
        by_host.setdefault(p.ssh or "", []).append(p)
    problems: dict[str, str] = {}

    async def stop_on(members: list[DaskProcess]) -> None:
        node = members[0].node
        dest = destination(spec.nodes[node])
        pairs = " ".join(f"{p.pid} {p.start}" for p in members)
        script = _STOP_SCRIPT.replace("@PAIRS@", pairs).replace("@TICKS@", str(int(timeout * 10)))
        try:
            async with asyncssh.connect(dest.hostname, **_connect_options(spec.ssh, dest)) as conn:
                result = await conn.run("exec /bin/sh -s", input=script, timeout=timeout + 30, check=False)
        except (OSError, asyncssh.Error) as exc:
            for p in members:
                problems[p.node] = (f"Dask {p.role} pid {p.pid} not stopped: "
                                    f"{_connect_problem(exc, dest, spec.ssh)}")
            return
        killed = {line.split()[1] for line in str(result.stdout or "").splitlines() if line.startswith("killed ")}
        for p in members:
            if str(p.pid) in killed:
                problems[p.node] = f"Dask {p.role} pid {p.pid} on {dest.label} ignored SIGTERM; killed"

    await asyncio.gather(*(stop_on(members) for members in by_host.values()))
    return problems


def describe(state: DaskState) -> Mapping[str, str]:
    """One line per process, for the CLI: where it runs and its address."""
    lines = {"scheduler": f"{state.address}" + (f" on {state.scheduler.node}" if state.scheduler.node else "")}
    for node, worker in state.workers.items():
        lines[node] = f"{worker.address} pid {worker.pid}" + (f" via {worker.ssh}" if worker.ssh else "")
    return lines
