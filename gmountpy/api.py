"""The library API: where files are, staging them, placing and running jobs.

    import gmountpy
    cluster = gmountpy.Cluster.open("cluster.toml")     # or a cluster name, or a path in a mount
    cluster.where("/data/a.csv")                        # holders, nearest first
    cluster.stage(["/data/a.csv"], to="n1")             # copy into n1's export, verified
    cluster.place(["/data/a.csv", "/data/b.csv"])       # the node for a job reading them
    cluster.run("wc -l a.csv", near=["/data/a.csv"])     # ... and run it there

Paths are namespace paths ("/data/a.csv", also without the leading slash) or
paths inside any node's mount ("/mnt/n3/data/a.csv"); a path inside a mount
is asked about from that node. Everything else is asked from the cluster's
*home* node: the node whose mount the cluster was opened from, else the
first node of the cluster file.

Every call is synchronous and talks to the daemons over the same
authenticated RPC their peers use (no mount needed on this machine); it works
in scripts, inside a running Jupyter kernel and inside trio or asyncio code
(see `_sync.py`). One call opens at most one connection per node and reuses
it for all its requests.

Results are small frozen dataclasses with a readable repr and an HTML table
for notebooks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import hashlib
import html
import io
import os
import posixpath
import shlex
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any, TypeVar, Union

import networkx as nx
import trio

from . import messages as msg
from . import state as state_store
from ._results import (
    ClusterStatus,
    CommandTimeout,
    Entry,
    FileLocations,
    Holder,
    Listing,
    Locations,
    Node,
    Nodes,
    Placement,
    PlacementRow,
    RunResult,
    StagedFile,
    StageError,
    StageFailure,
    StageReport,
    _normalize,
)
from ._sync import blocking
from ._trio import open_nursery
from .client import ClusterClient, open_client
from .config import ClusterSpec, load_spec
from .errors import GmountError, PeerUnavailable
from .overlay import Overlay
from .placement import choose_node
from .spawn import Spawned
from .state import ClusterState, load_secret

if TYPE_CHECKING:
    from .fsspec import GmountFileSystem

__all__ = [
    "Cluster", "ClusterStatus", "CommandTimeout", "Entry", "FileLocations", "Holder", "Listing", "Locations",
    "Node", "Nodes", "Placement", "PlacementRow", "RunResult", "Spawned", "StageError", "StageFailure",
    "StageReport", "StagedFile",
]

T = TypeVar("T")
PathLike = Union[str, "os.PathLike[str]"]

#: Largest piece asked for in one read RPC (the daemon's limit).
_READ_PIECE = 4 * 1024 * 1024
_READS_IN_FLIGHT = 4
#: `where` requests in flight at once in one call (the daemon serves 64 per connection).
_LOOKUPS_IN_FLIGHT = 32
#: Staging shows a progress bar on its own from this many bytes on.
_PROGRESS_FROM_BYTES = 64 * 1024 * 1024


# --------------------------------------------------------------------------- jobs in flight

# Jobs started through `Cluster.run` in this process and still running, per
# (cluster, node). Placement counts them against the node's slots. Jobs
# started elsewhere (other processes, other users) are not seen.
_running_lock = threading.Lock()
_running_jobs: dict[tuple[str, str], int] = {}


def _running(cluster: str) -> dict[str, int]:
    with _running_lock:
        return {node: count for (name, node), count in _running_jobs.items() if name == cluster}


class _Job:
    def __init__(self, cluster: str, node: str) -> None:
        self.key = (cluster, node)

    def __enter__(self) -> None:
        with _running_lock:
            _running_jobs[self.key] = _running_jobs.get(self.key, 0) + 1

    def __exit__(self, *exc: object) -> None:
        with _running_lock:
            _running_jobs[self.key] -= 1
            if not _running_jobs[self.key]:
                del _running_jobs[self.key]


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


def _as_list(paths: PathLike | Iterable[PathLike]) -> list[PathLike]:
    if isinstance(paths, (str, os.PathLike)):
        return [paths]
    result = list(paths)
    for p in result:
        if not isinstance(p, (str, os.PathLike)):
            raise TypeError(f"paths must be strings or path objects, got {p!r}")
    return result


# --------------------------------------------------------------------------- the cluster


class Cluster:
    """A running gmount cluster, seen from this process. Make one with `Cluster.open` or `Cluster.up`."""

    def __init__(self, state: ClusterState, *, home: str | None = None) -> None:
        self._state = state
        self.overlay = Overlay(state.spec)
        first = next(iter(state.spec.nodes))
        self.home = home if home is not None else first
        if self.home not in state.spec.nodes:
            raise GmountError(f"unknown node {self.home!r} in cluster {state.name!r} "
                              f"(nodes: {', '.join(state.spec.nodes)})")

    # -- making one ------------------------------------------------------------

    @classmethod
    def open(cls, source: PathLike | None = None) -> Cluster:
        """Attach to a running cluster, named by its name, its cluster file, any path inside a mount, or a
        `gmount://NAME/...` URL; None: the cluster whose mount holds the working directory, else the only
        running one (see gmountpy.state.resolve)."""
        found = state_store.resolve(source, paths=[os.getcwd()])
        return cls(found.state, home=found.node)

    @classmethod
    def up(cls, cluster_file: PathLike, *, progress: Callable[[str, str], None] | None = None) -> Cluster:
        """Start the cluster of `cluster_file` unless it already runs; either way, attach to it."""
        spec = load_spec(os.fspath(cluster_file))
        existing = state_store.load(spec.name)
        if existing is not None and _all_alive(existing):
            return cls(existing)
        from . import launch  # the launcher (and asyncssh) only when something is started
        return cls(blocking(launch.up, spec, progress=progress))

    def down(self) -> None:
        """Stop every daemon and unmount; every file stays in the export it was written to."""
        from . import launch
        problems = blocking(launch.down, self.name)
        if problems:
            raise GmountError("; ".join(f"{node}: {what}" for node, what in problems.items()))

    # -- what it is -----------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._state.name

    @property
    def spec(self) -> ClusterSpec:
        return self._state.spec

    @property
    def nodes(self) -> Nodes:
        spec, records = self._state.spec, self._state.nodes
        return Nodes(tuple(
            Node(name, node.site, node.slots, node.mountpoint, node.export,
                 f"{records[name].host}:{records[name].port}" if name in records else "")
            for name, node in spec.nodes.items()))

    @property
    def sites(self) -> dict[str, tuple[str, ...]]:
        return dict(self._state.spec.sites)

    @property
    def graph(self) -> nx.Graph[str]:
        """The overlay's site graph (edges carry `rtt_ms`, sites their `nodes`); a copy, change it freely."""
        return self.overlay.graph.copy()

    @property
    def fs(self) -> GmountFileSystem:
        """An fsspec file system on this cluster (needs the `fsspec` extra)."""
        from .fsspec import GmountFileSystem
        return GmountFileSystem(cluster=self.name, node=self.home)

    def __repr__(self) -> str:
        sites = "; ".join(f"{site}: {' '.join(names)}" for site, names in self.sites.items())
        return f"<Cluster {self.name!r}: {len(self._state.nodes)} nodes ({sites}); home node {self.home}>"

    def _repr_html_(self) -> str:
        return self.nodes._repr_html_().replace(
            "<caption style='text-align:left'>",
            f"<caption style='text-align:left'>cluster {html.escape(self.name)}: ", 1)

    def status(self) -> ClusterStatus:
        """Each node: up (daemon answers and is mounted) or down, and why."""
        from . import launch
        return ClusterStatus(self.name, tuple(blocking(launch.status, self.name)))

    def counters(self) -> dict[str, dict[str, int]]:
        """Bytes each node moved since its daemon started, local vs remote, per node.

        `read_local`/`read_remote`: bytes the node's mount read from its own
        export / from other nodes; `write_local`/`write_remote` likewise;
        `served_read`/`served_write`: bytes peers read from / wrote to its
        export. Page-cache hits never reach the daemon and are not counted.
        Take two snapshots and subtract to measure one workflow.
        """
        names = list(self._state.spec.nodes)

        async def main(conns: ClusterClient) -> dict[str, dict[str, int]]:
            result: dict[str, dict[str, int]] = {}

            async def one(node: str) -> None:
                result[node] = await conns.ask(node, msg.Counters())

            async with open_nursery() as nursery:
                for node in names:
                    nursery.start_soon(one, node)
            return {node: result[node] for node in names}

        return self._run(main)

    # -- where -------------------------------------------------------------------

    def where(self, paths: PathLike | Iterable[PathLike], from_node: str | Node | None = None) -> Locations:
        """Every holder of each path, nearest first (as seen from `from_node`, see the module doc)."""
        given = _as_list(paths)
        asks = [self._ask(p, from_node) for p in given]

        async def main(conns: ClusterClient) -> Locations:
            results: list[FileLocations | None] = [None] * len(asks)
            limiter = trio.CapacityLimiter(_LOOKUPS_IN_FLIGHT)

            async def one(i: int, path: str, node: str) -> None:
                async with limiter:
                    found = await self._where(conns, node, path)
                results[i] = dataclasses.replace(found, given=os.fspath(given[i]))

            async with open_nursery() as nursery:
                for i, (path, node) in enumerate(asks):
                    nursery.start_soon(one, i, path, node)
            return Locations(tuple(r for r in results if r is not None))

        return self._run(main)

    def ls(self, path: PathLike = "/", from_node: str | Node | None = None) -> Listing:
        """A directory as the mount shows it, with the node each entry comes from."""
        ns_path, asking = self._ask(path, from_node)
        return self._run(self._listing, asking, ns_path)

    def read_bytes(self, path: PathLike, *, start: int = 0, end: int | None = None,
                   from_node: str | Node | None = None) -> bytes:
        """The file's bytes [start, end) read from its nearest holder (directly, no mount needed)."""
        ns_path, asking = self._ask(path, from_node)

        async def main(conns: ClusterClient) -> bytes:
            found = await self._where(conns, asking, ns_path)
            holder = _readable_holder(found)
            return await self._read(conns, holder.node, ns_path, start, end)

        return self._run(main)

    def read_range(self, path: PathLike, start: int, end: int | None, *, holder: str | Node) -> bytes:
        """Bytes [start, end) of `path` read from node `holder` itself, without a lookup.

        For readers that bind a file to its holder when they open it, as the
        mount does (close-to-open; the fsspec backend): every range then comes
        from the same copy. FileNotFoundError if `holder` no longer has it.
        """
        ns_path, node = self._ask(path, holder)

        async def main(conns: ClusterClient) -> bytes:
            return await self._read(conns, node, ns_path, start, end)

        try:
            return self._run(main)
        except FileNotFoundError:
            raise FileNotFoundError(errno.ENOENT, f"{ns_path} is gone from node {node}", ns_path) from None

    # -- stage -------------------------------------------------------------------

    def stage(self, paths: PathLike | Iterable[PathLike], to: str | Node, *, concurrency: int = 4,
              progress: bool | None = None) -> StageReport:
        """Copy files (directories: every file below) into `to`'s export, verified by size and SHA-256.

        The copy is a replica: lookups on `to` find it first while its source
        is unchanged. A file already up to date there is not copied again.
        Files are staged `concurrency` at a time; `progress` shows a bar
        (None: only when 64 MiB or more are to be staged). Raises StageError,
        carrying the report, if any file failed.
        """
        target = self._node_name(to)
        if concurrency < 1:
            raise ValueError(f"`concurrency` must be at least 1, got {concurrency}")
        ns_paths = [self._ask(p, None)[0] for p in _as_list(paths)]

        async def main(conns: ClusterClient) -> StageReport:
            files, missing = await self._expand(conns, target, ns_paths)
            failures = [StageFailure(p, "no node holds it") for p in missing]
            staged: list[StagedFile] = []
            total = sum(size for _, size in files)
            show = progress if progress is not None else total >= _PROGRESS_FROM_BYTES
            bar = _StageProgress(target, len(files), total) if show and files else None
            limiter = trio.CapacityLimiter(concurrency)
            fatal: list[BaseException] = []

            async def one(path: str, size: int, scope: trio.CancelScope) -> None:
                async with limiter:
                    try:
                        reply = await conns.ask(target, msg.Stage(path), timeout=60.0 + size / 20e6)
                    except PeerUnavailable as exc:
                        fatal.append(GmountError(f"cannot stage to node {target}: {exc.strerror or exc}"))
                        scope.cancel()
                        return
                    except OSError as exc:
                        if exc.errno == errno.ENOSYS:
                            fatal.append(GmountError(f"node {target} cannot stage files: its daemon has no "
                                                     "'stage' operation (restart the cluster with this gmountpy)"))
                            scope.cancel()
                            return
                        failures.append(StageFailure(path, exc.strerror or str(exc)))
                    else:
                        staged.append(StagedFile(path, reply["status"], reply["source"], int(reply["size"]),
                                                 reply.get("sha256"), float(reply["seconds"])))
                    if bar is not None:
                        bar.advance(size)

            try:
                async with open_nursery() as nursery:
                    for path, size in files:
                        nursery.start_soon(one, path, size, nursery.cancel_scope)
            finally:
                if bar is not None:
                    bar.close()
            if fatal:
                raise fatal[0]
            order = {p: i for i, (p, _) in enumerate(files)}
            report = StageReport(target, tuple(sorted(staged, key=lambda f: order[f.path])),
                                 tuple(sorted(failures, key=lambda f: f.path)))
            return report

        report = self._run(main)
        if report.failures:
            raise StageError(report)
        return report

    # -- place and run -------------------------------------------------------------

    def place(self, inputs: PathLike | Iterable[PathLike]) -> Placement:
        """The node to run a job reading `inputs` on (Pwrake's rule, see gmountpy.placement).

        Slots in use are the jobs this process started with `run` that are
        still running; jobs started elsewhere are not counted.
        """
        ns_paths = [self._ask(p, None)[0] for p in _as_list(inputs)]

        async def main(conns: ClusterClient) -> tuple[list[FileLocations], list[str]]:
            return await self._expand_holders(conns, self.home, ns_paths)

        located, missing = self._run(main)
        holdings: dict[str, dict[str, int]] = {p: {} for p in missing}
        for found in located:
            held = holdings.setdefault(found.path, {})
            for holder in found.holders:
                held[holder.node] = max(held.get(holder.node, 0), holder.size)
        spec = self._state.spec
        running = _running(self.name)
        slots = {name: node.slots for name, node in spec.nodes.items()}
        decision = choose_node(holdings, list(spec.nodes), slots=slots, running=running, rtt=self.overlay.rtt)
        rows = tuple(PlacementRow(name, spec.nodes[name].site, decision.scores[name], name in decision.candidates,
                                  running.get(name, 0), slots[name], decision.remote_cost[name])
                     for name in spec.nodes)
        return Placement(decision.node, decision.reason, tuple(holdings), rows, decision.unlocated)

    def run(self, command: str | Sequence[str], *, on: str | Node | None = None,
            near: PathLike | Iterable[PathLike] | None = None, timeout: float | None = None,
            cwd: PathLike = "/", capture: bool = True) -> RunResult:
        """Run a shell command on a node, in that node's mount (`cwd` is a namespace directory).

        `on` names the node; `near` gives input paths and the node is chosen
        by `place`; with neither, the least loaded node runs it. The command
        sees GMOUNT_NODE, GMOUNT_SITE and GMOUNT_CLUSTER. Local clusters run
        it as a local process; SSH clusters over SSH to the node's host.
        With `capture=False` output goes to this process's stdout/stderr.
        A non-zero exit is returned, not raised (use `.check()`).
        """
        if on is not None and near is not None:
            raise ValueError("give `on` or `near`, not both")
        if timeout is not None and timeout <= 0:
            raise ValueError(f"`timeout` must be positive, got {timeout}")
        text = command if isinstance(command, str) else shlex.join(command)
        if not text.strip():
            raise ValueError("`command` must not be empty")
        node = self._node_name(on) if on is not None else self.place(near if near is not None else []).node
        directory = self._ask(cwd, None)[0]
        with _Job(self.name, node):
            if self._is_ssh(node):
                over_ssh: RunResult = blocking(asyncio.run, self._run_ssh(node, text, directory, timeout, capture))
                return over_ssh
            return self._run_local(node, text, directory, timeout, capture)

    def spawn(self, command: str, *, on: str | Node, cwd: PathLike = "/", env: Mapping[str, str] | None = None,
              stdout: Any = None, stderr: Any = None) -> Spawned:
        """Start a shell command on node `on`, in its mount, and return at once (see gmountpy.spawn).

        For executors running many jobs: poll the result, `stop()` it (its
        whole process group, also over SSH). The command sees `env` on top
        of this process's environment, plus GMOUNT_NODE, GMOUNT_SITE and
        GMOUNT_CLUSTER. `stdout`/`stderr` are as for subprocess.Popen.
        """
        from . import spawn as spawning

        if not command.strip():
            raise ValueError("`command` must not be empty")
        node = self._node_name(on)
        directory = self._ask(cwd, None)[0]
        node_spec = self._state.spec.nodes[node]
        extra = {**(env or {}), **self._command_env(node)}
        if self._is_ssh(node):
            where = posixpath.join(node_spec.mountpoint, directory.lstrip("/"))
            argv = spawning.ssh_argv(node_spec, self._state.spec.ssh, command, where, extra)
            return spawning.start(node, command, where, argv, os.environ, over_ssh=True, stdout=stdout,
                                  stderr=stderr)
        where = os.path.join(node_spec.mountpoint, directory.lstrip("/"))
        if not os.path.isdir(where):
            raise GmountError(f"cannot run on node {node}: {directory} is not a directory in its mount ({where})")
        return spawning.start(node, command, where, spawning.local_argv(command), {**os.environ, **extra},
                              over_ssh=False, stdout=stdout, stderr=stderr)

    # -- write ---------------------------------------------------------------------

    def write_bytes(self, path: PathLike, data: bytes, *, on: str | Node | None = None, mode: int = 0o644,
                    from_node: str | Node | None = None) -> str:
        """Write a whole file into the namespace; returns the node whose export now holds it.

        Where it lands: node `on` if given; else the node holding the file
        now (it is replaced there, as a write through the mount would);
        else the asking node (`from_node`, default as in the module doc), as
        a create through its mount would. The bytes go to a temporary file on that node, checked
        by size and SHA-256, then renamed into place: readers see the old
        file or the whole new one. Copies of the path on other nodes are
        removed afterwards, so the new file is the only one.
        """
        return self._put_from(path, io.BytesIO(bytes(data)), on, mode, from_node)

    def put(self, local: PathLike, path: PathLike, *, on: str | Node | None = None, mode: int | None = None,
            from_node: str | Node | None = None) -> str:
        """Copy a local file into the namespace (like `write_bytes`, streamed); the node that holds it."""
        with open(local, "rb") as source:
            if mode is None:
                mode = os.fstat(source.fileno()).st_mode & 0o7777
            return self._put_from(path, source, on, mode, from_node)

    def write_from(self, path: PathLike, source: IO[bytes], *, on: str | Node | None = None, mode: int = 0o644,
                   from_node: str | Node | None = None) -> str:
        """Like `write_bytes`, with the bytes read from an open binary file until its end (streamed)."""
        return self._put_from(path, source, on, mode, from_node)

    def mkdir(self, path: PathLike, *, on: str | Node | None = None, from_node: str | Node | None = None) -> str:
        """Make a directory (and missing parents) in one node's export (`on`, default the asking node).

        FileExistsError if the name exists on any node.
        """
        ns_path, asking = self._ask(path, from_node)
        target = self._node_name(on) if on is not None else asking

        async def main(conns: ClusterClient) -> str:
            found = await self._where(conns, asking, ns_path)
            if found.nearest is not None:
                raise FileExistsError(errno.EEXIST, f"{ns_path} exists (on node {found.nearest.node})")
            await conns.ask(target, msg.Mkdir(ns_path, 0o755))
            return target

        return self._run(main)

    def remove(self, path: PathLike, from_node: str | Node | None = None) -> tuple[str, ...]:
        """Remove a file from every node holding it, or an empty directory from every node having it.

        Returns the nodes it was removed from; FileNotFoundError if none
        holds it, OSError(ENOTEMPTY) naming the node for a non-empty directory.
        """
        ns_path, asking = self._ask(path, from_node)

        async def main(conns: ClusterClient) -> tuple[str, ...]:
            found = await self._where(conns, asking, ns_path)
            if found.nearest is None:
                raise FileNotFoundError(errno.ENOENT, f"no node holds {ns_path}")
            is_dir = found.nearest.is_dir
            removed = []
            for holder in found.holders:
                if holder.is_dir != is_dir:
                    continue
                try:
                    await conns.ask(holder.node, msg.Rmdir(ns_path) if is_dir else msg.Unlink(ns_path))
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    raise OSError(exc.errno, f"cannot remove {ns_path} on node {holder.node}: "
                                             f"{exc.strerror or exc}") from None
                removed.append(holder.node)
            return tuple(removed)

        return self._run(main)

    def checksum(self, path: PathLike, from_node: str | Node | None = None) -> tuple[int, str]:
        """(size, SHA-256 hex) of a file, computed on its nearest holder (no bytes cross the network)."""
        ns_path, asking = self._ask(path, from_node)

        async def main(conns: ClusterClient) -> tuple[int, str]:
            holder = _readable_holder(await self._where(conns, asking, ns_path))
            reply = await conns.ask(holder.node, msg.Checksum(ns_path), timeout=60.0 + holder.size / 50e6)
            return reply.size, reply.sha256

        return self._run(main)

    def get(self, path: PathLike, local: PathLike, from_node: str | Node | None = None) -> tuple[int, str]:
        """Copy a file from its nearest holder to a local file, verified; returns (size, SHA-256 hex).

        The bytes go to a temporary file beside `local`, are checked against
        the holder's own size and SHA-256, and renamed into place; a file
        that changed while it was copied raises OSError(EAGAIN).
        """
        ns_path, asking = self._ask(path, from_node)
        target = os.fspath(local)
        temporary = f"{target}.gmount-get-{os.getpid()}-{threading.get_ident()}"

        async def main(conns: ClusterClient) -> tuple[int, str]:
            holder = _readable_holder(await self._where(conns, asking, ns_path))
            opened = await conns.ask(holder.node, msg.Open(ns_path, os.O_RDONLY))
            digest = hashlib.sha256()
            size = 0
            try:
                with open(temporary, "wb") as out:
                    while piece := await conns.ask(holder.node, msg.Read(opened.handle, size, _READ_PIECE),
                                                   timeout=60.0):
                        out.write(piece)
                        digest.update(piece)
                        size += len(piece)
            finally:
                with trio.CancelScope(shield=True):
                    try:
                        await conns.ask(holder.node, msg.Close(opened.handle))
                    except OSError:
                        pass
            source = await conns.ask(holder.node, msg.Checksum(ns_path), timeout=60.0 + size / 50e6)
            if (source.size, source.sha256) != (size, digest.hexdigest()):
                raise OSError(errno.EAGAIN, f"{ns_path} changed on node {holder.node} while it was copied "
                                            f"({size} bytes read, {source.size} there now); copy it again")
            os.utime(temporary, ns=(opened.attr.atime_ns, opened.attr.mtime_ns))
            return size, digest.hexdigest()

        try:
            result = self._run(main)
        except BaseException:
            try:
                os.unlink(temporary)
            except OSError:
                pass
            raise
        os.replace(temporary, target)
        return result

    def _put_from(self, path: PathLike, source: IO[bytes], on: str | Node | None, mode: int,
                  from_node: str | Node | None) -> str:
        ns_path, asking = self._ask(path, from_node)
        if ns_path == "/":
            raise IsADirectoryError(errno.EISDIR, "/ is the namespace root, not a file")
        chosen = self._node_name(on) if on is not None else None

        async def main(conns: ClusterClient) -> str:
            found = await self._where(conns, asking, ns_path)
            if found.nearest is not None and found.nearest.is_dir:
                raise IsADirectoryError(errno.EISDIR, f"{ns_path} is a directory (on node {found.nearest.node})")
            originals = [h.node for h in found.holders if h.replica_of is None]
            target = chosen or (originals[0] if originals else asking)
            try:
                handle = await conns.ask(target, msg.PutOpen(ns_path, mode & 0o7777))
            except OSError as exc:
                if exc.errno == errno.ENOSYS:
                    raise GmountError(f"node {target} cannot take writes from outside its mount: its daemon "
                                      "has no 'put' operation (restart the cluster with this gmountpy)") from None
                raise
            digest = hashlib.sha256()
            size = 0
            try:
                in_flight = trio.Semaphore(_READS_IN_FLIGHT)

                async def send(offset: int, piece: bytes) -> None:
                    try:
                        await conns.ask(target, msg.Write(handle, offset, piece), timeout=60.0)
                    finally:
                        in_flight.release()

                async with open_nursery() as nursery:
                    while piece := source.read(_READ_PIECE):
                        digest.update(piece)
                        await in_flight.acquire()
                        nursery.start_soon(send, size, piece)
                        size += len(piece)
                await conns.ask(target, msg.PutClose(handle, size, digest.hexdigest()), timeout=60.0 + size / 20e6)
            except BaseException:
                with trio.CancelScope(shield=True):
                    try:
                        await conns.ask(target, msg.PutAbort(handle))
                    except OSError:
                        pass  # the handle's temporary file goes with the connection anyway
                raise
            for holder in found.holders:  # the new file is the only one of that name
                if holder.node != target and not holder.is_dir:
                    try:
                        await conns.ask(holder.node, msg.Unlink(ns_path))
                    except FileNotFoundError:
                        pass
            return target

        return self._run(main)

    # -- internals: paths and nodes --------------------------------------------------

    def _node_name(self, node: str | Node) -> str:
        name = node.name if isinstance(node, Node) else node
        if name not in self._state.spec.nodes:
            raise GmountError(f"unknown node {name!r} in cluster {self.name!r} "
                              f"(nodes: {', '.join(self._state.spec.nodes)})")
        return name

    def _ask(self, path: PathLike, from_node: str | Node | None) -> tuple[str, str]:
        """(namespace path, node to ask from) for a path given by the user."""
        text = os.fspath(path)
        if not text:
            raise ValueError("empty path: give a namespace path like /data/a.csv or a path inside a mount")
        mount_node: str | None = None
        absolute = text if os.path.isabs(text) else None
        if absolute is None and self._state.node_for_path(os.getcwd()) is not None:
            absolute = os.path.join(os.getcwd(), text)
        ns_path = _normalize(text)
        if absolute is not None:
            found = self._state.node_for_path(absolute)
            if found is not None:
                mount_node, ns_path = found[0].name, _normalize(found[1])
        if from_node is not None:
            return ns_path, self._node_name(from_node)
        return ns_path, mount_node or self.home

    def _is_ssh(self, node: str) -> bool:
        record = self._state.nodes.get(node)
        return self._state.spec.launcher == "ssh" or (record is not None and record.ssh is not None)

    def _run(self, func: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run `func(connections, *args)` in one trio run, from any thread."""
        state = state_store.load(self.name)
        if state is None:
            raise GmountError(f"cluster {self.name!r} is no longer running: start it with `gmount up`")
        self._state = state  # a restarted cluster has new ports
        secret = load_secret(state.name)

        async def main() -> T:
            async with open_client(state, name="gmount-api", secret=secret) as client:
                return await func(client, *args)

        try:
            result: T = blocking(trio.run, main)
            return result
        except BaseExceptionGroup as group:  # several concurrent requests failed: the first says why
            raise _first_leaf(group) from None

    # -- internals: async operations -------------------------------------------------

    async def _where(self, conns: ClusterClient, asking: str, path: str) -> FileLocations:
        rows = await conns.ask(asking, msg.Where(path))
        return FileLocations(path, asking, tuple(Holder.from_wire(r) for r in rows))

    async def _listing(self, conns: ClusterClient, asking: str, path: str) -> Listing:
        """The asking node merges the listing exactly as its mount does (daemon op `ls`)."""
        try:
            reply = await conns.ask(asking, msg.Ls(path))
        except (FileNotFoundError, NotADirectoryError):
            found = await self._where(conns, asking, path)
            if found.nearest is None:
                raise FileNotFoundError(errno.ENOENT, f"no node holds {path}") from None
            h = found.nearest
            entry = Entry(posixpath.basename(path), path, _kind(h.mode), h.size, h.mtime_ns, h.node, found.nodes)
            return Listing(path, asking, (entry,), ())
        entries = []
        for e in sorted(reply.entries, key=lambda e: e.name):
            entries.append(Entry(e.name, posixpath.join(path, e.name), _kind(e.attr.mode), e.attr.size,
                                 e.attr.mtime_ns, e.node, e.holders))
        return Listing(path, asking, tuple(entries), reply.unreachable)

    async def _expand_holders(self, conns: ClusterClient, asking: str,
                              paths: list[str]) -> tuple[list[FileLocations], list[str]]:
        """Files named by `paths` with their holders, directories replaced by the files below them.

        Files come back in the order given (directories: sorted by path), several lookups in flight.
        """
        found: dict[str, FileLocations] = {}
        missing: list[str] = []
        seen: set[str] = set()
        limiter = trio.CapacityLimiter(_LOOKUPS_IN_FLIGHT)

        async def visit(path: str, nursery: trio.Nursery) -> None:
            if path in seen:
                return
            seen.add(path)
            async with limiter:
                where = await self._where(conns, asking, path)
            found[path] = where
            if where.nearest is None:
                missing.append(path)
            elif where.nearest.is_dir:
                async with limiter:
                    listing = await self._listing(conns, asking, path)
                for entry in listing.entries:
                    if entry.kind in ("file", "directory"):
                        nursery.start_soon(visit, entry.path, nursery)

        async with open_nursery() as nursery:
            for path in dict.fromkeys(paths):
                nursery.start_soon(visit, path, nursery)
        files: list[FileLocations] = []
        taken: set[str] = set()
        ordered = sorted(found)
        for path in paths:  # given order; what a directory expanded to, sorted, in its place
            prefix = path.rstrip("/") + "/"
            for p in ordered:
                item = found[p]
                if (p == path or p.startswith(prefix)) and p not in taken and item.nearest is not None \
                        and not item.nearest.is_dir:
                    taken.add(p)
                    files.append(item)
        return files, sorted(missing)

    async def _expand(self, conns: ClusterClient, asking: str,
                      paths: list[str]) -> tuple[list[tuple[str, int]], list[str]]:
        found, missing = await self._expand_holders(conns, asking, paths)
        return [(f.path, f.nearest.size) for f in found if f.nearest is not None], missing

    async def _read(self, conns: ClusterClient, node: str, path: str, start: int, end: int | None) -> bytes:
        """Bytes [start, end) of `path` from `node`, several 4 MiB reads in flight."""
        if start < 0 or (end is not None and end < start):
            raise ValueError(f"bad byte range [{start}, {end})")
        opened = await conns.ask(node, msg.Open(path, os.O_RDONLY))
        handle = opened.handle
        try:
            size = opened.attr.size
            stop = size if end is None else min(end, size)
            offsets = list(range(start, stop, _READ_PIECE))
            pieces: dict[int, bytes] = {}
            limiter = trio.CapacityLimiter(_READS_IN_FLIGHT)

            async def piece(offset: int) -> None:
                async with limiter:
                    pieces[offset] = await conns.ask(node, msg.Read(handle, offset, min(_READ_PIECE, stop - offset)),
                                                     timeout=60.0)

            async with open_nursery() as nursery:
                for offset in offsets:
                    nursery.start_soon(piece, offset)
            return b"".join(pieces[o] for o in offsets)
        finally:
            with trio.CancelScope(shield=True):
                try:
                    await conns.ask(node, msg.Close(handle))
                except OSError:
                    pass  # the handle dies with the connection anyway

    # -- internals: running commands ----------------------------------------------------

    def _command_env(self, node: str) -> dict[str, str]:
        return {"GMOUNT_NODE": node, "GMOUNT_SITE": self._state.spec.nodes[node].site,
                "GMOUNT_CLUSTER": self.name}

    def _run_local(self, node: str, command: str, directory: str, timeout: float | None,
                   capture: bool) -> RunResult:
        mountpoint = self._state.spec.nodes[node].mountpoint
        cwd = os.path.join(mountpoint, directory.lstrip("/"))
        if not os.path.isdir(cwd):
            raise GmountError(f"cannot run on node {node}: {directory} is not a directory in its mount ({cwd})")
        started = time.monotonic()
        pipe = subprocess.PIPE if capture else None
        process = subprocess.Popen(command, shell=True, cwd=cwd, env={**os.environ, **self._command_env(node)},
                                   stdin=subprocess.DEVNULL if capture else None, stdout=pipe, stderr=pipe,
                                   start_new_session=capture)
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill(process, group=capture)
            out, err = process.communicate()
            raise CommandTimeout(node, command, timeout or 0, _text(out), _text(err)) from None
        except BaseException:
            _kill(process, group=capture)
            process.wait()
            raise
        code = process.returncode
        return RunResult(node, command, cwd, 128 - code if code < 0 else code, _text(out), _text(err),
                         time.monotonic() - started)

    async def _run_ssh(self, node: str, command: str, directory: str, timeout: float | None,
                       capture: bool) -> RunResult:
        import asyncssh

        # Reach the node exactly as the launcher does (user@host, port, keys, known_hosts, ssh config).
        from .launch.ssh import _connect_options, _connect_problem, destination

        spec = self._state.spec
        node_spec = spec.nodes[node]
        dest = destination(node_spec)
        cwd = posixpath.join(node_spec.mountpoint, directory.lstrip("/"))
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in self._command_env(node).items())
        inner = f"cd {shlex.quote(cwd)} && {exports} exec /bin/sh -c {shlex.quote(command)}"
        remote = f"exec /bin/sh -c {shlex.quote(inner)}"  # any login shell, even csh, can exec sh
        started = time.monotonic()
        try:
            async with asyncssh.connect(dest.hostname, **_connect_options(spec.ssh, dest)) as conn:
                streams: dict[str, Any] = {} if capture else {"stdout": sys.stdout, "stderr": sys.stderr}
                result = await conn.run(remote, check=False, timeout=timeout, **streams)
        except asyncssh.TimeoutError as exc:
            raise CommandTimeout(node, command, timeout or 0, _text(exc.stdout), _text(exc.stderr)) from None
        except (OSError, asyncssh.Error) as exc:
            raise GmountError(f"cannot run on node {node}: {_connect_problem(exc, dest, spec.ssh)}") from None
        if result.exit_status is not None:
            code = result.exit_status
        else:
            signame = result.exit_signal[0] if result.exit_signal else ""
            number = getattr(signal, f"SIG{signame}", None)
            code = 128 + int(number) if number is not None else 255
        return RunResult(node, command, cwd, code, _text(result.stdout), _text(result.stderr),
                         time.monotonic() - started)


class _StageProgress:
    """A rich progress bar by bytes, with the file count in its description."""

    def __init__(self, target: str, files: int, total: int) -> None:
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )
        self._files = files
        self._done = 0
        self._target = target
        self._progress = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(binary_units=True),
                                  TransferSpeedColumn(), TimeRemainingColumn())
        self._task = self._progress.add_task(self._describe(), total=total)
        self._progress.start()

    def _describe(self) -> str:
        return f"staging to {self._target}: {self._done}/{self._files} files"

    def advance(self, size: int) -> None:
        self._done += 1
        self._progress.update(self._task, advance=size, description=self._describe())

    def close(self) -> None:
        self._progress.stop()


def _first_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first


def _readable_holder(found: FileLocations) -> Holder:
    holder = found.nearest
    if holder is None:
        raise FileNotFoundError(errno.ENOENT, f"no node holds {found.path}")
    if holder.is_dir:
        raise IsADirectoryError(errno.EISDIR, f"{found.path} is a directory (on node {holder.node})")
    return holder


def _all_alive(state: ClusterState) -> bool:
    """Every daemon of a recorded cluster still runs (by pid locally, by ping over SSH)."""
    from .launch.orchestrate import pid_is_daemon
    if all(r.ssh is None for r in state.nodes.values()):
        return all(pid_is_daemon(r.pid) for r in state.nodes.values())
    from .client import ping_all
    answers = blocking(trio.run, ping_all, state)
    return all(isinstance(a, dict) and a.get("pid") == state.nodes[n].pid for n, a in answers.items())


def _kill(process: subprocess.Popen[bytes], group: bool) -> None:
    try:
        if group:
            os.killpg(process.pid, signal.SIGKILL)
        else:
            process.kill()
    except ProcessLookupError:
        pass


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data if isinstance(data, str) else data.decode(errors="replace")
