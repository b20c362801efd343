"""Placing jobs from the daemon's warm state: "which node for a job with these inputs", over a unix socket.

A job wrapper that started a new interpreter per job to ask the mount about
every input paid tens of milliseconds before the job ran. The daemon
already knows who holds what -- its own export, its leased listings, the
homes it can ask in one round trip -- so it answers the whole question on a
socket of its own (`gmountpy.cluster.jobsocket`: where, and the protocol),
and the wrapper (make's C `gmount-job`, the Snakemake executor) only runs
the job where it is told. The rule is Pwrake's (`gmountpy.jobs.placement`,
docs/design.md "Placement"); a job without located inputs stays on the node
asked (make's own node): `gmountpy.jobs.placement.place_job`, which `gmount plan` uses too.

The placer also counts the jobs running on each node and how long each has
run, and remembers how long the jobs that ended took, so that a job whose data
sits on a full node is delay scheduled (`place_job`'s cost model): the request
is answered only when the holder frees a slot, or when the wait would cost more
than reading the inputs remotely on a node with a free slot. A job it placed
for make's `gmount-job` runs as long as that client process lives (it waits for
its recipe), known from the socket's peer credentials the moment it is placed;
other jobs (Snakemake's, the API's) from the registrations on this machine
(`gmountpy.cluster.registry`).
"""

from __future__ import annotations

import logging
import os
import posixpath
import socket
import stat
import statistics
import struct
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import trio

from .._trio import open_nursery
from ..cluster import registry
from ..cluster.config import ClusterSpec
from ..cluster.jobsocket import MAGIC, MAX_MESSAGE
from ..cluster.overlay import Overlay
from ..jobs.placement import DEFAULT_SITE_MBIT, DEFAULT_WAN_MBIT, place_job
from .export import off_loop
from .locator import Location
from .namespace import MergedListing

log = logging.getLogger(__name__)

#: A client that connected but sends nothing for this long is dropped.
REQUEST_TIMEOUT = 30.0
#: Symbolic links followed in a row for one input (as the kernel's limit, smaller).
MAX_LINKS = 8
#: The client program whose process lives exactly as long as the job it asked for (make's wrapper).
JOB_CLIENT = "gmount-job"
#: A job waiting for a slot on the node holding its data looks again this often (s).
WAIT_POLL = 0.05
#: A node's typical job duration is the median of its last this many jobs.
DURATIONS_KEPT = 20

#: The jobs running on this machine for a cluster: registry rows (node, kind, pid, ...).
RunningJobs = Callable[[str], list[dict[str, Any]]]
#: A process as (pid, start time in clock ticks since boot).
Process = tuple[int, int]


class NamespaceView(Protocol):
    """What placing needs from the namespace (`gmountpy.node.namespace.Namespace`)."""

    async def where(self, path: str) -> list[Location]: ...
    async def merged_listing(self, path: str) -> MergedListing: ...
    async def readlink(self, path: str) -> str: ...


class JobPlacer:
    """Answers placement requests for the daemon of node `me`."""

    def __init__(self, me: str, spec: ClusterSpec, overlay: Overlay, namespace: NamespaceView,
                 mountpoint_real: str | None = None, running_jobs: RunningJobs = registry.running,
                 alive: Callable[[Process], bool] = lambda p: registry.process_start(p[0]) == p[1]) -> None:
        self.me = me
        self.running_jobs = running_jobs
        self.alive = alive
        #: jobs placed for a gmount-job client still running: its process -> (the node, when placed)
        self._held: dict[Process, tuple[str, float]] = {}
        #: other starters' registered jobs seen running: (pid, started) -> the node
        self._registered: dict[tuple[int, float], str] = {}
        #: how long the last jobs that ended on each node ran (s)
        self._durations: dict[str, deque[float]] = {}
        self.spec = spec
        self.overlay = overlay
        self.namespace = namespace
        self.nodes = list(spec.nodes)
        self.slots = {name: node.slots for name, node in spec.nodes.items()}
        # This node's mount as the kernel names it (the working directory a client sends) and as
        # the cluster file does; other nodes' mounts are on this machine only with the local launcher.
        mine = spec.node(me).mountpoint
        self._mounts: list[tuple[str, str]] = [(_strip(mountpoint_real or mine), me), (_strip(mine), me)]
        if spec.launcher != "ssh":
            self._mounts += [(_strip(node.mountpoint), name) for name, node in spec.nodes.items() if name != me]
        self.requests = 0

    def _namespace_path(self, path: str) -> str | None:
        """The namespace path of an absolute path inside a mount of this cluster on this machine."""
        for mount, _ in self._mounts:
            if path == mount:
                return "/"
            if path.startswith(mount + "/"):
                return path[len(mount):]
        return None

    def is_remote(self, node: str) -> bool:
        """Whether `node`'s mount is on another machine (jobs reach it over SSH)."""
        return node != self.me and self.spec.launcher == "ssh"

    async def place(self, cwd: str, inputs: list[str], pin: str = "", planned: str = "",
                    client: Process | None = None) -> dict[str, str]:
        """The reply to one request (`gmountpy.cluster.jobsocket.REPLY_KEYS`); `planned`: the node DAG-aware
        staging planned the job on (`gmountpy.jobs.prestage`), taken if the rule counts it a candidate;
        `client`: the gmount-job process that asked, which runs the job until it ends."""
        self.requests += 1
        directory = self._namespace_path(posixpath.normpath(cwd)) if cwd.startswith("/") else None
        if directory is None:
            raise ValueError(f"{cwd} is not inside node {self.me}'s mount ({self.spec.node(self.me).mountpoint})")
        if pin and pin not in self.spec.nodes:
            raise ValueError(f"{pin!r} is not a node of cluster {self.spec.name!r} "
                             f"(nodes: {', '.join(self.nodes)})")
        if planned and planned not in self.spec.nodes:
            raise ValueError(f"the job was planned on {planned!r}, which is not a node of cluster "
                             f"{self.spec.name!r} (nodes: {', '.join(self.nodes)})")
        paths: list[str] = []
        for item in inputs:
            found = self._namespace_path(posixpath.normpath(posixpath.join(cwd, item)))
            if found is not None and found not in paths:
                paths.append(found)
        holdings = await self.holdings(paths)
        asked_at, waited = time.monotonic(), 0.0
        while True:
            rows = await off_loop(self.running_jobs, self.spec.name)
            # from here to holding the job, no await: requests answered together see each other's jobs
            counts, ages = self.load(rows)
            placed = place_job(holdings, self.nodes, asked=self.me, slots=self.slots, rtt=self.overlay.rtt, pin=pin,
                               planned=planned, running=counts, ages=ages, typical=self.typical(),
                               waited=waited, bandwidth=self.bandwidth)
            if placed.wait <= 0:
                break
            await trio.sleep(min(placed.wait, WAIT_POLL))
            waited = time.monotonic() - asked_at
        node = placed.node
        if client is not None:
            self._held[client] = (node, time.monotonic())
        remote_node = self.is_remote(node)
        return {"node": node, "site": self.spec.node(node).site, "cluster": self.spec.name, "make_node": self.me,
                "cwd": directory, "remote": "1" if remote_node else "0",
                "dir": "" if remote_node else posixpath.join(self.spec.node(node).mountpoint, directory.lstrip("/")),
                "reason": placed.reason, "inputs": str(len(holdings)), "bytes_local": str(placed.bytes_local),
                "bytes_remote": str(placed.bytes_remote)}

    def load(self, rows: list[dict[str, Any]]) -> tuple[dict[str, int], dict[str, list[float]]]:
        """(jobs running per node, seconds each has run per node): those placed for gmount-job clients
        that still run, and the registrations `rows` (registry.running) of other starters (make's are
        the clients counted). A job seen before and gone now adds its duration to its node's record."""
        now, wall = time.monotonic(), time.time()
        held: dict[Process, tuple[str, float]] = {}
        for client, (node, since) in self._held.items():
            if self.alive(client):
                held[client] = (node, since)
            else:
                self._ended(node, now - since)
        self._held = held
        ages: dict[str, list[float]] = {}
        for node, since in held.values():
            ages.setdefault(node, []).append(now - since)
        registered: dict[tuple[int, float], str] = {}
        for row in rows:
            if row.get("kind") != "make":
                node, started = str(row["node"]), float(row.get("started", wall))
                registered[(int(row.get("pid", 0)), started)] = node
                ages.setdefault(node, []).append(max(0.0, wall - started))
        for key, node in self._registered.items():
            if key not in registered:
                self._ended(node, wall - key[1])
        self._registered = registered
        return {node: len(running) for node, running in ages.items()}, ages

    def _ended(self, node: str, seconds: float) -> None:
        self._durations.setdefault(node, deque(maxlen=DURATIONS_KEPT)).append(seconds)

    def typical(self) -> dict[str, float]:
        """Each node's typical job duration (s): the median of its last jobs; nodes with none ended are absent."""
        return {node: statistics.median(seconds) for node, seconds in self._durations.items() if seconds}

    def bandwidth(self, a: str, b: str) -> float:
        """Bytes/s between nodes `a` and `b`: the cluster file gives RTTs only, so the stated defaults
        (`gmountpy.jobs.placement.DEFAULT_WAN_MBIT` between sites, DEFAULT_SITE_MBIT within one)."""
        same_site = self.overlay.site_of(a) == self.overlay.site_of(b)
        return (DEFAULT_SITE_MBIT if same_site else DEFAULT_WAN_MBIT) * 1e6 / 8

    async def holdings(self, paths: list[str]) -> dict[str, dict[str, int]]:
        """holdings[namespace path][node] = bytes, as `place_job` takes them, asked all at once.

        A directory stands for every file below it (in name order); a path no node holds maps
        to {}; each holder is credited with the size the mount shows (a replica: its source's)."""
        found: dict[str, list[tuple[str, dict[str, int]]]] = {}

        async def one(path: str) -> None:
            found[path] = await self._files(path, MAX_LINKS)

        async with open_nursery() as nursery:
            for path in paths:
                nursery.start_soon(one, path)
        holdings: dict[str, dict[str, int]] = {}
        for path in paths:
            for name, held in found[path]:
                holdings.setdefault(name, held)
        return holdings

    async def _files(self, path: str, links: int) -> list[tuple[str, dict[str, int]]]:
        try:
            locations = await self.namespace.where(path)
        except OSError:
            return [(path, {})]  # not reachable now: as a missing input, placement goes on without it
        if not locations:
            return [(path, {})]
        nearest = locations[0].attr
        if stat.S_ISLNK(nearest.mode) and links > 0:
            try:
                target = await self.namespace.readlink(path)
            except OSError:
                return [(path, {})]
            # a relative target stays in the namespace; an absolute one is a path on this machine
            resolved = self._namespace_path(posixpath.normpath(target)) if target.startswith("/") else \
                posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
            if resolved is None:
                return [(path, {})]  # points out of the namespace: not data any node serves
            return await self._files(resolved, links - 1)
        if stat.S_ISDIR(nearest.mode):
            return await self._directory(path)
        return [(path, {loc.node: nearest.size for loc in locations})]

    async def _directory(self, path: str) -> list[tuple[str, dict[str, int]]]:
        try:
            listing = await self.namespace.merged_listing(path)
        except OSError:
            return []
        files: list[tuple[str, dict[str, int]]] = []
        for entry in sorted(listing.entries, key=lambda e: e.name):
            child = posixpath.join(path, entry.name)
            mode = entry.location.attr.mode
            if stat.S_ISDIR(mode):
                files += await self._directory(child)
            elif stat.S_ISLNK(mode):
                files += await self._files(child, MAX_LINKS)
            else:
                files.append((child, {node: entry.location.attr.size for node in entry.holders}))
        return files


def _strip(path: str) -> str:
    return posixpath.normpath(path).rstrip("/") or "/"


# -- the socket -------------------------------------------------------------------------------------


def prepare_directory(directory: str) -> str | None:
    """Make the socket directory (mode 0700); None if usable, else why not (then nothing is served)."""
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        return f"cannot create {directory}: {exc.strerror}"
    info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        return f"{directory} is not a directory of this user's (uid {os.geteuid()})"
    if info.st_mode & 0o077:
        try:
            os.chmod(directory, 0o700)
        except OSError as exc:
            return f"{directory} is open to other users and cannot be made private: {exc.strerror}"
    return None


def peer_uid(sock: trio.socket.SocketType) -> int:
    return peer_credentials(sock)[1]


def peer_credentials(sock: trio.socket.SocketType) -> tuple[int, int]:
    """(pid, uid) of the process at the other end of a unix socket."""
    pid_uid_gid = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _ = struct.unpack("3i", pid_uid_gid)
    return int(pid), int(uid)


def job_client(pid: int) -> Process | None:
    """The process `pid` as a key while it runs, if it is make's gmount-job (which lives as long as the
    job it asks for); None for any other client (the Snakemake executor asks for many jobs)."""
    try:
        with open(f"/proc/{pid}/comm", "rb") as f:
            name = f.read().strip()
    except OSError:
        return None
    started = registry.process_start(pid)
    return (pid, started) if name == os.fsencode(JOB_CLIENT) and started is not None else None


def encode_reply(reply: dict[str, str] | None, error: str = "") -> bytes:
    if reply is None:
        return b"error\0" + os.fsencode(error.replace("\0", " ")) + b"\0"
    return b"ok\0" + b"".join(os.fsencode(f"{key}={value}") + b"\0" for key, value in reply.items())


def decode_request(data: bytes) -> tuple[str, str, str, list[str]]:
    """(cwd, pinned node, planned node, inputs) of a request; ValueError if it is not one."""
    if not data.endswith(b"\0"):
        raise ValueError("truncated request")
    fields = [os.fsdecode(field) for field in data[:-1].split(b"\0")]
    if len(fields) >= 5 and fields[0] == MAGIC and fields[1] == "place-planned":
        return fields[2], fields[3], fields[4], fields[5:]
    if len(fields) < 4 or fields[0] != MAGIC or fields[1] != "place":
        raise ValueError(f"not a {MAGIC} placement request")
    return fields[2], fields[3], "", fields[4:]


async def serve_jobs(placer: JobPlacer, path: str, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Answer placement requests on the unix socket `path` until cancelled; the socket is removed then.

    If the socket cannot be made, the daemon runs on without it (job wrappers fall back to asking
    the mount) and says why in its log.
    """
    problem = prepare_directory(os.path.dirname(path))
    listener = None
    if problem is None:
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            try:
                os.unlink(path)  # a daemon before us on this mountpoint was killed: its socket is stale
            except FileNotFoundError:
                pass
            await sock.bind(path)
            sock.listen(128)
            listener = trio.SocketListener(sock)
        except OSError as exc:
            sock.close()
            problem = f"cannot listen on {path}: {exc.strerror}"
    if listener is None:
        log.warning("node %s places no jobs from its own state: %s (make's gmount-job and the Snakemake "
                    "executor fall back to asking the mount)", placer.me, problem)
        task_status.started()
        return
    log.info("node %s answers job placement on %s", placer.me, path)
    try:
        card = write_card(placer, path)
    except OSError as exc:  # recipes without prerequisites then ask too
        card = ""
        log.warning("node %s could not write %s: %s", placer.me, card_path(path), exc.strerror)

    async def handle(stream: trio.SocketStream) -> None:
        async with stream:
            try:
                await _answer(placer, stream)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass  # the client went away (make interrupted)

    try:
        await trio.serve_listeners(handle, [listener], task_status=task_status)
    finally:
        for made in (path, card):
            try:
                if made:
                    os.unlink(made)
            except OSError:
                pass


def card_path(socket_file: str) -> str:
    return socket_file[:-len(".sock")] + ".node" if socket_file.endswith(".sock") else socket_file + ".node"


def write_card(placer: JobPlacer, socket_file: str) -> str:
    """Beside the socket, what the node would answer for a job without inputs: node, site, cluster and
    mountpoint (NUL-terminated fields). make's gmount-job reads it for recipes without prerequisites
    instead of asking: the answer is always this node."""
    path = card_path(socket_file)
    node = placer.spec.node(placer.me)
    fields = (placer.me, node.site, placer.spec.name, node.mountpoint)
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
        f.write(b"".join(os.fsencode(field) + b"\0" for field in fields))
    os.replace(temporary, path)
    return path


async def _answer(placer: JobPlacer, stream: trio.SocketStream) -> None:
    pid, uid = peer_credentials(stream.socket)
    if uid != os.geteuid():
        await stream.send_all(encode_reply(None, f"node {placer.me} places jobs for uid {os.geteuid()} only"))
        return
    chunks: list[bytes] = []
    size = 0
    with trio.move_on_after(REQUEST_TIMEOUT) as waited:
        while True:
            chunk = await stream.receive_some(65536)
            if not chunk:
                break
            size += len(chunk)
            if size > MAX_MESSAGE:
                await stream.send_all(encode_reply(None, f"request larger than {MAX_MESSAGE} bytes"))
                return
            chunks.append(chunk)
    if waited.cancelled_caught:
        return
    try:
        cwd, pin, planned, inputs = decode_request(b"".join(chunks))
        client = await off_loop(job_client, pid) if pid > 0 else None
        reply = encode_reply(await placer.place(cwd, inputs, pin, planned, client))
    except ValueError as exc:
        reply = encode_reply(None, f"node {placer.me}: {exc}")
    except Exception as exc:  # never take the daemon down for one request: say what happened
        log.exception("placing a job failed on node %s", placer.me)
        reply = encode_reply(None, f"node {placer.me} could not place the job: {exc}")
    await stream.send_all(reply)
