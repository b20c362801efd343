"""The SSH launcher: one node daemon per node, on machines the user can SSH into.

asyncssh lives here and only here (asyncio); the node daemon is trio and never
imports it. `gmount up` with `launcher = "ssh"`:

1. connects to every host in parallel, at most `[ssh] concurrency` handshakes
   at a time, honouring ~/.ssh/config, the user's keys and agent, and
   known_hosts (host-key checking is only relaxed by `known_hosts = false`);
2. checks every node before anything starts: the interpreter runs and imports
   the same gmountpy version as the launcher, /dev/fuse opens and fusermount3
   is installed, export and mountpoint are usable, the listen address and a
   fixed port can be bound;
3. starts `<python> -m gmountpy.node` on an exec channel, hands it its
   configuration and the cluster secret through stdin (never argv or the
   environment, which other users can read) and runs the shared sequence of
   orchestrate.start_cluster.

Nodes on one host share an SSH connection, at most _SESSIONS_PER_CONNECTION
of them: sshd allows 10 sessions per connection by default (MaxSessions), a
daemon's session stays open until it is READY, and one handshake per host
instead of one per node keeps big launches fast.

Stopping runs a small POSIX sh script on each host: SIGTERM each daemon after
checking /proc/<pid>/cmdline names gmountpy.node (pids get reused), wait, then
SIGKILL, then `fusermount3 -u -z` on a mountpoint that is still mounted.
Exports are never touched.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import shlex
import socket
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncssh

from .._version import __version__
from ..cluster.config import ClusterSpec, NodeSpec, SshOptions
from ..cluster.state import ClusterState
from ..errors import GmountError
from ..protocol.tls import NodeCredentials
from . import remote
from .orchestrate import LaunchError, Progress, start_cluster
from .remote import preflight, rtt

__all__ = [
    "NodeCheck", "SiteRtt", "SshDaemonProcess", "SshPool", "inspect_ssh_cluster", "measure_site_rtts",
    "start_ssh_cluster", "stop_ssh_cluster",
]

_SESSIONS_PER_CONNECTION = 8
_DAEMON_REQUIRES = ("pyfuse3", "trio", "msgpack", "networkx")  # what `python -m gmountpy.node` imports
_SPAWNED = "GMOUNT SPAWNED "


def _quiet(node: str, what: str) -> None:
    pass


# --- where a node is -------------------------------------------------------------


@dataclass(frozen=True)
class Destination:
    """An SSH destination as the cluster file names it (`user@host`, port)."""

    target: str
    port: int

    @property
    def username(self) -> str | None:
        user, at, _ = self.target.rpartition("@")
        return user if at else None

    @property
    def hostname(self) -> str:
        return self.target.rpartition("@")[2].strip("[]")

    @property
    def label(self) -> str:
        return self.target if self.port == 22 else f"{self.target} port {self.port}"

    @property
    def ssh_command(self) -> str:
        """What the user can type to check the same connection by hand."""
        return f"ssh {self.target}" if self.port == 22 else f"ssh -p {self.port} {self.target}"


def destination(node: NodeSpec) -> Destination:
    if node.host is None:
        raise GmountError(f'node {node.name!r} has no host: set host = "user@machine" for it '
                          f"(or in [defaults]) to launch it over SSH")
    return Destination(node.host, node.ssh_port)


def _shell_word(path: str) -> str:
    """Quote a command for the remote shell, keeping a leading ~/ meaning the remote home."""
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def _mounts_escape(path: str) -> str:
    """A path as /proc/self/mounts spells it (octal escapes for blanks and backslashes)."""
    return (path.replace("\\", "\\134").replace(" ", "\\040").replace("\t", "\\011").replace("\n", "\\012"))


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


def _is_unspecified(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_unspecified
    except ValueError:
        return address == ""


# --- connections -------------------------------------------------------------------


def _connect_options(options: SshOptions, dest: Destination) -> dict[str, Any]:
    """asyncssh.connect arguments; anything unset is left to ~/.ssh/config and OpenSSH defaults."""
    kwargs: dict[str, Any] = {"connect_timeout": options.connect_timeout, "keepalive_interval": 30}
    if dest.username:
        kwargs["username"] = dest.username
    if dest.port != 22:  # 22 is also the spec default: let a Port line in ~/.ssh/config win then
        kwargs["port"] = dest.port
    if not options.verify_host_keys:
        kwargs["known_hosts"] = None
    elif options.known_hosts is not None:
        kwargs["known_hosts"] = options.known_hosts
    if options.identity:
        kwargs["client_keys"] = list(options.identity)
    if options.config is None:
        kwargs["config"] = None
    elif options.config:
        kwargs["config"] = list(options.config)
    return kwargs


def _connect_problem(exc: BaseException, dest: Destination, options: SshOptions) -> str:
    """One line: what failed connecting to `dest`, and what to do about it."""
    where = dest.label
    if isinstance(exc, asyncssh.HostKeyNotVerifiable):
        known = options.known_hosts or "~/.ssh/known_hosts"
        return (f"host key of {where} is not trusted ({exc.reason}): check it with `{dest.ssh_command}` "
                f"and add it to {known}; `known_hosts = false` in [ssh] skips the check (unsafe)")
    if isinstance(exc, asyncssh.PermissionDenied):
        tried = ("keys " + ", ".join(options.identity)) if options.identity else "your default keys and agent"
        return (f"authentication refused by {where} (tried {tried}): add your public key to "
                f"~/.ssh/authorized_keys there, or name the right key with identity in [ssh]")
    if isinstance(exc, asyncssh.KeyImportError):
        return f"cannot load an SSH key for {where}: {exc}: check identity in [ssh] (encrypted keys need an agent)"
    if isinstance(exc, asyncssh.Error):
        return f"SSH to {where} failed: {exc.reason}"
    if isinstance(exc, OSError) and exc.filename:  # a key, known_hosts or config file of ours
        return (f"cannot read {exc.filename} to connect to {where}: {exc.strerror}: "
                f"fix identity, known_hosts or config in [ssh]")
    if isinstance(exc, TimeoutError):  # asyncio.TimeoutError is TimeoutError since Python 3.11
        return (f"cannot reach {where}: no answer within {options.connect_timeout:g}s (host down or "
                f"firewalled?): check host and ssh_port, or raise connect_timeout in [ssh]")
    if isinstance(exc, socket.gaierror):
        return f"cannot reach {where}: unknown host name {dest.hostname!r} ({exc.strerror}): check host"
    if isinstance(exc, ConnectionRefusedError) or "Connect call failed" in str(exc):
        return (f"cannot reach {where}: connection refused (no sshd listening there): "
                f"check host and ssh_port")
    if isinstance(exc, OSError):
        return f"cannot reach {where}: {exc.strerror or exc}: check host and ssh_port"
    return f"SSH to {where} failed: {type(exc).__name__}: {exc}"


@dataclass
class _Link:
    """One SSH connection and the nodes whose sessions it carries."""

    dest: Destination
    nodes: list[NodeSpec]
    conn: asyncssh.SSHClientConnection | None = None
    problem: str | None = None
    peer_ip: str = ""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Short commands (checks, stops) one at a time, beside at most _SESSIONS_PER_CONNECTION
    # daemon sessions: together they stay under sshd's default MaxSessions of 10.
    commands: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(1))
    _stop_queue: list[tuple[NodeSpec, list[int]]] = field(default_factory=list)
    _stop_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def stop_soon(self, node: NodeSpec, pids: list[int], timeout: float) -> None:
        """Stop daemons in batches: the aborts of a failed launch arrive together, one script stops them all."""
        self._stop_queue.append((node, pids))
        await asyncio.sleep(0.01)  # let the other aborts of the same failure queue up too
        async with self._stop_lock:
            batch, self._stop_queue = self._stop_queue, []
            if batch:  # else an earlier holder of the lock already stopped ours
                await _stop_on_link(self, batch, timeout)

    async def run(self, command: str, script: str, timeout: float) -> asyncssh.SSHCompletedProcess:
        """Run a command with `script` on its stdin; SSH trouble becomes GmountError naming the host."""
        if self.conn is None:
            raise GmountError(f"no SSH connection to {self.dest.label}")
        try:
            async with self.commands:
                return await self.conn.run(command, input=script, timeout=timeout)
        except asyncssh.TimeoutError:
            raise GmountError(f"{self.dest.label}: `{command}` did not finish within {timeout:g}s") from None
        except (asyncssh.Error, OSError) as exc:
            raise GmountError(f"SSH session to {self.dest.label} failed: "
                              f"{getattr(exc, 'reason', None) or exc}") from None


class SshPool:
    """SSH connections to the hosts of some nodes, opened in parallel with a bound."""

    def __init__(self, spec: ClusterSpec, nodes: Iterable[str] | None = None) -> None:
        self.spec = spec
        self.options = spec.ssh
        self.problems: dict[str, str] = {}
        self._link_of: dict[str, _Link] = {}
        self.links: list[_Link] = []
        by_dest: dict[Destination, list[NodeSpec]] = {}
        for name in (nodes if nodes is not None else spec.nodes):
            node = spec.node(name)
            try:
                by_dest.setdefault(destination(node), []).append(node)
            except GmountError as exc:
                self.problems[name] = str(exc)
        for dest, members in by_dest.items():
            for i in range(0, len(members), _SESSIONS_PER_CONNECTION):
                link = _Link(dest, members[i:i + _SESSIONS_PER_CONNECTION])
                self.links.append(link)
                for node in link.nodes:
                    self._link_of[node.name] = link
        self._limit = asyncio.Semaphore(self.options.concurrency)

    async def __aenter__(self) -> SshPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        async def close_one(conn: asyncssh.SSHClientConnection) -> None:
            conn.close()
            try:
                await asyncio.wait_for(conn.wait_closed(), 5)
            except (TimeoutError, asyncssh.Error, OSError):
                pass
        await asyncio.gather(*(close_one(link.conn) for link in self.links if link.conn is not None))
        for link in self.links:
            link.conn = None

    def link(self, node: str) -> _Link:
        return self._link_of[node]

    async def connect(self, link: _Link) -> bool:
        """Open the link's connection once; on failure every node on it gets the same one line."""
        async with link.lock:
            if link.conn is not None or link.problem is not None:
                return link.conn is not None
            async with self._limit:
                try:
                    link.conn = await asyncssh.connect(link.dest.hostname,
                                                       **_connect_options(self.options, link.dest))
                except (OSError, asyncssh.Error, ValueError) as exc:
                    link.problem = _connect_problem(exc, link.dest, self.options)
                    for node in link.nodes:
                        self.problems[node.name] = link.problem
                    return False
            peer = link.conn.get_extra_info("peername")
            link.peer_ip = str(peer[0]) if peer else link.dest.hostname
            return True

    # --- preflight --------------------------------------------------------------

    async def prepare(self, say: Progress) -> dict[str, str]:
        """Connect and check every node; node -> one line for each node that cannot start."""

        async def one(link: _Link) -> None:
            for node in link.nodes:
                say(node.name, "connecting")
            if await self.connect(link):
                for node in link.nodes:
                    say(node.name, "checking")
                async with self._limit:
                    await self._preflight(link)
            for node in link.nodes:
                say(node.name, "failed" if node.name in self.problems else "checked")

        await asyncio.gather(*(one(link) for link in self.links))
        self._check_listen_addresses(say)
        return {name: self.problems[name] for name in self.spec.nodes if name in self.problems}

    async def _preflight(self, link: _Link) -> None:
        by_python: dict[str, list[NodeSpec]] = {}
        for node in link.nodes:
            by_python.setdefault(node.python, []).append(node)
        for python, nodes in by_python.items():
            try:
                problems = await _preflight_python(link, python, nodes)
            except GmountError as exc:
                problems = {node.name: str(exc) for node in nodes}
            for name, problem in problems.items():
                if problem:
                    self.problems[name] = problem

    def _check_listen_addresses(self, say: Progress) -> None:
        """Peers must reach each other: loopback addresses only work when all nodes share a machine."""
        machines = {("loopback" if _is_loopback(link.peer_ip) else link.peer_ip)
                    for link in self.links if link.conn is not None}
        if len(machines) <= 1:
            return
        for link in self.links:
            for node in link.nodes:
                if link.conn is None or node.name in self.problems:
                    continue
                if _is_loopback(node.listen):
                    problem = (f"listens on {node.listen} (loopback) but the cluster spans several machines: "
                               f'set listen = "0.0.0.0" or an address of {link.dest.hostname} the other nodes reach')
                elif _is_unspecified(node.listen) and _is_loopback(link.peer_ip):
                    problem = (f"{link.dest.label} is reached over loopback from here, so the other machines "
                               f"cannot be told its address: set listen to an address of it they can reach")
                else:
                    continue
                self.problems[node.name] = problem
                say(node.name, "failed")

    # --- starting -----------------------------------------------------------------

    async def spawn(self, node: NodeSpec) -> SshDaemonProcess:
        """Start `<python> -m gmountpy.node` on the node's host (the orchestrator's Spawn)."""
        if node.name in self.problems:
            raise GmountError(self.problems[node.name])
        link = self.link(node.name)
        if not await self.connect(link):
            raise GmountError(link.problem or f"cannot reach {link.dest.label}")
        assert link.conn is not None
        # The daemon forks away at once; sshd stops feeding stdin when its own child exits,
        # so `| cat` keeps that child alive until the daemon closes stdout after READY.
        inner = f'echo "{_SPAWNED}$$"; exec {_shell_word(node.python)} -m gmountpy.node'
        command = f"sh -c {shlex.quote(inner)} | cat"
        try:
            process = await link.conn.create_process(command, encoding="utf-8", errors="replace")
        except (asyncssh.Error, OSError) as exc:
            raise GmountError(f"cannot start the daemon over SSH on {link.dest.label}: "
                              f"{getattr(exc, 'reason', None) or exc}") from None
        return SshDaemonProcess(node, link, process)

    def peer_host(self, node: NodeSpec, listening: str) -> str:
        """The address peers dial: the listen address, or the SSH address when it listens on all."""
        if _is_unspecified(listening):
            return self.link(node.name).peer_ip or self.link(node.name).dest.hostname
        return listening


class SshDaemonProcess:
    """A daemon being started over an SSH exec channel (the orchestrator's DaemonProcess)."""

    def __init__(self, node: NodeSpec, link: _Link, process: asyncssh.SSHClientProcess[str]) -> None:
        self.node = node.name
        self._spec = node
        self._link = link
        self._process = process
        self.spawned_pid: int | None = None  # the process sshd started, before the daemon forked

    def _lost(self, exc: BaseException) -> GmountError:
        return GmountError(f"SSH session to {self._link.dest.label} lost: {getattr(exc, 'reason', None) or exc}")

    async def write_line(self, text: str) -> None:
        try:
            self._process.stdin.write(text + "\n")
            await self._process.stdin.drain()
        except (asyncssh.Error, OSError) as exc:
            raise self._lost(exc) from None

    async def read_line(self) -> str:
        try:
            while True:
                line = await self._process.stdout.readline()
                if line.startswith(_SPAWNED):
                    try:
                        self.spawned_pid = int(line[len(_SPAWNED):].strip())
                    except ValueError:
                        pass
                    continue
                return line
        except (asyncssh.Error, OSError) as exc:
            raise self._lost(exc) from None

    async def error_output(self) -> str:
        try:
            return await asyncio.wait_for(self._process.stderr.read(), 2.0)
        except (TimeoutError, asyncssh.Error, OSError):
            return ""

    async def abort(self, pid: int | None) -> None:
        """Stop a daemon that did not finish starting: close its session, then stop it by pid."""
        self._process.close()  # a daemon still waiting for input sees EOF and exits by itself
        pids = [p for p in (pid, self.spawned_pid) if p]
        if pids and self._link.conn is not None:
            try:
                await self._link.stop_soon(self._spec, pids, timeout=10.0)
            except GmountError:
                pass  # best effort: the caller reports the start failure itself

    async def release(self) -> None:
        """Let the session end; the daemon runs on in its own session on the host."""
        try:
            self._process.stdin.write_eof()
        except (asyncssh.Error, OSError):
            pass
        try:
            await asyncio.wait_for(self._process.wait_closed(), 5.0)
        except (TimeoutError, asyncssh.Error, OSError):
            pass
        self._process.close()


# --- the preflight check (remote/preflight.py, run on the node) -------------------------------


async def _preflight_python(link: _Link, python: str, nodes: Sequence[NodeSpec]) -> dict[str, str | None]:
    """Run the check with one interpreter for some nodes of a link; node -> problem or None."""
    params = {"requires": list(_DAEMON_REQUIRES),
              "nodes": [{"name": n.name, "export": n.export, "create_export": n.create_export,
                         "mountpoint": n.mountpoint,
                         "listen": n.listen, "port": n.port} for n in nodes]}
    where = link.dest.label
    result = await link.run(f"{_shell_word(python)} - {shlex.quote(json.dumps(params))}", remote.text("preflight.py"),
                            timeout=30.0)
    stdout = str(result.stdout or "")
    stderr_lines = str(result.stderr or "").strip().splitlines()
    last_err = stderr_lines[-1] if stderr_lines else ""
    report: dict[str, Any] | None = None
    for line in stdout.splitlines():
        if line.startswith(preflight.MARKER):
            report = json.loads(line[len(preflight.MARKER):])
    if report is None:
        if result.exit_status == 127:
            common = (f"python {python!r} not found on {where}: install Python 3.11+ with gmountpy there, "
                      f'or set python = "/path/to/python" for this node')
        elif result.exit_status == 126:
            common = f"python {python!r} on {where} is not executable: fix python for this node"
        else:
            common = (f"python {python!r} on {where} could not run the check (exit {result.exit_status}"
                      f"{': ' + last_err if last_err else ''}): set python to a Python 3.11+ interpreter")
        return {n.name: common for n in nodes}
    if "import_error" in report:
        common = (f"gmountpy is not importable by {python} (Python {report['python']}) on {where} "
                  f"({report['import_error']}): run `{python} -m pip install gmountpy=={__version__}` there, "
                  f"or set python to an interpreter that has it")
        return {n.name: common for n in nodes}
    if report.get("version") != __version__:
        common = (f"version mismatch: gmountpy {report.get('version')} on {where} ({python}) but {__version__} "
                  f"here: install the same version on both (pip install gmountpy=={__version__})")
        return {n.name: common for n in nodes}
    answer: dict[str, str | None] = {}
    for node in nodes:
        problems = list(report["nodes"].get(node.name, []))
        if report.get("fuse"):
            problems.insert(0, f"FUSE is not usable on {where}: {report['fuse']}")
        answer[node.name] = "; ".join(problems) or None
    return answer


# --- stopping and inspecting (remote/daemons.sh: POSIX sh on the node, no Python needed) ----

def _stop_script(entries: Sequence[tuple[NodeSpec, Sequence[int]]], timeout: float, unseal: bool = False) -> str:
    """Stop the daemons, unmount what stays mounted; with `unseal`, make the mountpoints writable
    again (a daemon that stops unseals its own; one that died cannot)."""
    pairs = " ".join(f"{node.name}:{pid}" for node, pids in entries for pid in pids if pid > 0)
    lines = [remote.text("daemons.sh"), f"term {pairs}", f"settle {max(1, int(timeout * 10))} {pairs}"]
    for node, _ in entries:
        mountpoint, escaped = shlex.quote(node.mountpoint), shlex.quote(_mounts_escape(node.mountpoint))
        lines.append(f"unmount {node.name} {mountpoint} {escaped}")
        if unseal:
            lines.append(f"unseal {mountpoint} {escaped}")
    return "\n".join(lines) + "\n"


async def _stop_on_link(link: _Link, entries: Sequence[tuple[NodeSpec, Sequence[int]]],
                        timeout: float, unseal: bool = False) -> dict[str, str | None]:
    """Stop daemons on one host; node -> problem (None when it is stopped and unmounted)."""
    result = await link.run("sh", _stop_script(entries, timeout, unseal), timeout=timeout + 30.0)
    answer: dict[str, str | None] = {node.name: None for node, _ in entries}
    for line in str(result.stdout or "").splitlines():
        parts = line.split(" ", 3)
        if len(parts) >= 3 and parts[0] == "GMOUNT":
            kind, subject = parts[1], parts[2]
            name, _, pid = subject.partition(":")
            if kind == "KILLED" and name in answer:
                answer[name] = f"daemon pid {pid} ignored SIGTERM for {timeout:g}s on {link.dest.label}; killed"
            elif kind == "UNMOUNT-FAILED" and name in answer:
                mountpoint = next(n.mountpoint for n, _ in entries if n.name == name)
                detail = parts[3].strip() if len(parts) > 3 else ""
                answer[name] = (f"could not unmount {mountpoint} on {link.dest.label}: {detail}; "
                                f"run `fusermount3 -u -z {mountpoint}` there")
    return answer


async def stop_ssh_cluster(state: ClusterState, *, progress: Progress | None = None,
                           timeout: float = 15.0, unseal: bool = True) -> tuple[dict[str, str], set[str]]:
    """Stop every daemon of a cluster over SSH and unmount; never touches exports.

    `unseal` makes a dead daemon's mountpoint writable again: not when the cluster is about to
    start again (its directory stays unwritable until the new daemon mounts, node.directories).

    Returns (node -> problem, unreachable nodes). Safe to run twice: a daemon
    that is gone and a mountpoint that is not mounted are simply skipped.
    """
    say = progress or _quiet
    problems: dict[str, str] = {}
    unreachable: set[str] = set()
    async with SshPool(state.spec, state.nodes) as pool:
        for name, problem in pool.problems.items():
            problems[name] = problem
            unreachable.add(name)

        async def stop(link: _Link) -> None:
            for node in link.nodes:
                say(node.name, "stopping")
            if not await pool.connect(link):
                for node in link.nodes:
                    record = state.nodes[node.name]
                    problems[node.name] = (f"{link.problem}; its daemon (pid {record.pid}) may still run "
                                           f"and {record.mountpoint} stay mounted")
                    unreachable.add(node.name)
                    say(node.name, "unreachable")
                return
            entries = [(node, [state.nodes[node.name].pid]) for node in link.nodes]
            try:
                answers = await _stop_on_link(link, entries, timeout, unseal)
            except GmountError as exc:
                answers = {node.name: str(exc) for node in link.nodes}
                unreachable.update(answers)
            for name, problem in answers.items():
                if problem:
                    problems[name] = problem
                say(name, "stopped" if name not in unreachable else "unreachable")

        await asyncio.gather(*(stop(link) for link in pool.links))
    return {name: problems[name] for name in state.nodes if name in problems}, unreachable


@dataclass(frozen=True)
class NodeCheck:
    """What SSH shows about a recorded daemon: is the pid still ours, is its mountpoint mounted."""

    alive: bool
    mounted: bool


async def inspect_ssh_cluster(state: ClusterState, nodes: Iterable[str] | None = None,
                              ) -> dict[str, NodeCheck | str]:
    """Look at recorded daemons over SSH; node -> NodeCheck, or why the host could not be asked."""
    names = list(nodes if nodes is not None else state.nodes)
    answer: dict[str, NodeCheck | str] = {}
    async with SshPool(state.spec, names) as pool:
        answer.update(pool.problems)

        async def look(link: _Link) -> None:
            if not await pool.connect(link):
                answer.update({node.name: link.problem or "unreachable" for node in link.nodes})
                return
            script = remote.text("daemons.sh") + "".join(
                f"check {node.name} {state.nodes[node.name].pid} "
                f"{shlex.quote(_mounts_escape(node.mountpoint))}\n" for node in link.nodes)
            try:
                result = await link.run("sh", script, timeout=30.0)
            except GmountError as exc:
                answer.update({node.name: str(exc) for node in link.nodes})
                return
            for line in str(result.stdout or "").splitlines():
                parts = line.split()
                if len(parts) == 5 and parts[:2] == ["GMOUNT", "CHECK"]:
                    answer[parts[2]] = NodeCheck(alive=parts[3] == "1", mounted=parts[4] == "1")
            for node in link.nodes:
                answer.setdefault(node.name, f"no answer from the check on {link.dest.label}")

        await asyncio.gather(*(look(link) for link in pool.links))
    return {name: answer[name] for name in names}


# --- the whole launch ----------------------------------------------------------------


async def start_ssh_cluster(spec: ClusterSpec, secret: bytes, *, progress: Progress | None = None,
                            keep_going: bool = False,
                            credentials: dict[str, NodeCredentials] | None = None) -> ClusterState:
    """Check every node, then start them all; see orchestrate.start_cluster for failures."""
    say = progress or _quiet
    async with SshPool(spec) as pool:
        problems = await pool.prepare(say)
        if problems and (not keep_going or len(problems) == len(spec.nodes)):
            raise LaunchError(problems)  # nothing was started
        return await start_cluster(spec, pool.spawn, secret, progress=say, peer_host=pool.peer_host,
                                   concurrency=spec.ssh.concurrency, keep_going=keep_going,
                                   credentials=credentials)


# --- probing RTTs between sites before launch ----------------------------------------------

@dataclass(frozen=True)
class SiteRtt:
    """A measured round trip between two nodes (of two sites, or of one site for intra-site)."""

    sites: tuple[str, str]
    nodes: tuple[str, str]
    samples_ms: tuple[float, ...] = ()
    problem: str | None = None

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples_ms) if self.samples_ms else float("nan")


async def measure_site_rtts(spec: ClusterSpec, count: int = 7,
                            progress: Callable[[str], None] | None = None) -> list[SiteRtt]:
    """Before launch: from the first node of each site, time TCP connects to the SSH port of the first
    node of every other site (one SYN/SYN-ACK round trip each), and to a second node of its own site.

    The target address is the one the launcher's SSH connection reached, so a node behind a jump host
    or with a different internal address is measured at the wrong address: give its listen address then.
    """
    say = progress or (lambda text: None)
    firsts = {site: names[0] for site, names in spec.sites.items()}
    seconds = {site: names[1] for site, names in spec.sites.items() if len(names) > 1}
    wanted = list(dict.fromkeys([*firsts.values(), *seconds.values()]))
    async with SshPool(spec, wanted) as pool:
        await asyncio.gather(*(pool.connect(link) for link in pool.links))
        pairs: list[tuple[str, str, str, str]] = []
        site_names = list(spec.sites)
        for i, a in enumerate(site_names):
            for b in site_names[i + 1:]:
                pairs.append((a, b, firsts[a], firsts[b]))
        for site, second in seconds.items():
            pairs.append((site, site, firsts[site], second))

        async def one(a: str, b: str, src: str, dst: str) -> SiteRtt:
            for node in (src, dst):
                if node in pool.problems:
                    return SiteRtt((a, b), (src, dst), problem=f"{node}: {pool.problems[node]}")
            link, target = pool.link(src), pool.link(dst)
            say(f"{src} ({a}) -> {dst} ({b})")
            command = (f"{_shell_word(spec.node(src).python)} - {shlex.quote(target.peer_ip)} "
                       f"{target.dest.port} {count}")
            try:
                result = await link.run(command, remote.text("rtt.py"), timeout=30.0 + 5 * count)
            except GmountError as exc:
                return SiteRtt((a, b), (src, dst), problem=str(exc))
            for line in str(result.stdout or "").splitlines():
                if line.startswith(rtt.MARKER):
                    data = json.loads(line[len(rtt.MARKER):])
                    if data["error"]:
                        return SiteRtt((a, b), (src, dst), problem=f"from {src}: cannot connect to "
                                       f"{dst} at {data['error']}")
                    return SiteRtt((a, b), (src, dst), tuple(data["ms"]))
            err = str(result.stderr or "").strip().splitlines()
            return SiteRtt((a, b), (src, dst), problem=f"the probe did not run on {link.dest.label} with "
                           f"python {spec.node(src).python!r}{': ' + err[-1] if err else ''}")

        # One pair at a time: concurrent probes would time each other's load, not the network.
        return [await one(*pair) for pair in pairs]
