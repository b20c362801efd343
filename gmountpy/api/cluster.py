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

`Cluster` is a facade: path resolution, the requests to the daemons, file
operations, staging, placement and execution are collaborators in
`gmountpy.api` behind its methods.
"""

from __future__ import annotations

import html
import io
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any

import networkx as nx
import trio

from .._sync import blocking
from ..cluster import state as state_store
from ..cluster.config import ClusterSpec, load_spec
from ..cluster.overlay import Overlay
from ..cluster.state import ClusterState
from ..errors import GmountError
from ..jobs.spawn import Spawned
from ..protocol.client import ClusterClient
from .execution import Execution
from .files import Files
from .paths import PathLike as PathLike  # re-exported: the path type of every method
from .paths import Paths
from .placing import Placer, running_jobs
from .requests import Requests
from .results import (
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
    RunningJob,
    RunningJobs,
    RunResult,
    StagedFile,
    StageError,
    StageFailure,
    StageReport,
)
from .staging import Staging
from .view import ClusterView

if TYPE_CHECKING:
    from distributed import Client

    from .filesystem import GmountFileSystem

__all__ = [
    "Cluster", "ClusterStatus", "CommandTimeout", "Entry", "FileLocations", "Holder", "Listing", "Locations",
    "Node", "Nodes", "Placement", "PlacementRow", "RunResult", "RunningJob", "RunningJobs", "Spawned", "StageError",
    "StageFailure", "StageReport", "StagedFile",
]

#: Jobs this process runs, per node (for tests and tools: `_running(cluster_name)`).
_running = running_jobs


# --------------------------------------------------------------------------- the cluster


class Cluster:
    """A running gmount cluster, seen from this process. Make one with `Cluster.open` or `Cluster.up`."""

    def __init__(self, state: ClusterState, *, home: str | None = None) -> None:
        self._view = ClusterView(state, home)
        self._paths = Paths(self._view)
        self._requests = Requests(self._view)
        self._files = Files(self._view, self._paths, self._requests)
        self._staging = Staging(self._view, self._paths, self._requests)
        self._placer = Placer(self._view, self._paths, self._requests)
        self._execution = Execution(self._view, self._paths, self._placer)

    @property
    def home(self) -> str:
        """The node asked about paths that name none (see the module doc)."""
        return self._view.home

    @property
    def overlay(self) -> Overlay:
        """The cluster's sites, RTTs and lookup order per node."""
        return self._view.overlay

    @property
    def _state(self) -> ClusterState:
        return self._view.state

    def _is_ssh(self, node: str) -> bool:
        return self._view.is_ssh(node)

    # -- making one ------------------------------------------------------------

    @classmethod
    def open(cls, source: PathLike | None = None) -> Cluster:
        """Attach to a running cluster, named by its name, its cluster file, any path inside a mount, or a
        `gmount://NAME/...` URL; None: the cluster whose mount holds the working directory, else the only
        running one (see gmountpy.cluster.state.resolve)."""
        found = state_store.resolve(source, paths=[os.getcwd()])
        return cls(found.state, home=found.node)

    @classmethod
    def up(cls, cluster_file: PathLike, *, progress: Callable[[str, str], None] | None = None) -> Cluster:
        """Start the cluster of `cluster_file` unless it already runs; either way, attach to it."""
        spec = load_spec(os.fspath(cluster_file))
        existing = state_store.load(spec.name)
        if existing is not None and _all_alive(existing):
            return cls(existing)
        from .. import launch  # the launcher (and asyncssh) only when something is started
        return cls(blocking(launch.up, spec, progress=progress))

    def down(self) -> None:
        """Stop every daemon and unmount; every file stays in the export it was written to."""
        from .. import launch
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
        from .filesystem import GmountFileSystem
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
        from .. import launch
        return ClusterStatus(self.name, tuple(blocking(launch.status, self.name)))

    def answering(self, nodes: Iterable[str | Node] | None = None, *, timeout: float = 3.0) -> tuple[str, ...]:
        """The nodes (of `nodes`, default all) whose daemons answer a ping within `timeout` seconds now,
        in the order given. Cheap (one round trip each, all at once): for callers that must place
        work on nodes that are up, such as the Pegasus site selector."""
        return self._files.answering(nodes, timeout)

    def counters(self) -> dict[str, dict[str, int]]:
        """Bytes each node moved since its daemon started, local vs remote, per node.

        `read_local`/`read_remote`: bytes the node's mount read from its own
        export / from other nodes; `write_local`/`write_remote` likewise;
        `served_read`/`served_write`: bytes peers read from / wrote to its
        export. Page-cache hits never reach the daemon and are not counted.
        Take two snapshots and subtract to measure one workflow.
        """
        return self._files.counters()

    def jobs(self) -> RunningJobs:
        """The jobs running on the cluster's nodes now, oldest first: those make (through gmount.mk), the
        Snakemake executor, `run` and `spawn` started, on any machine whose daemon answers."""
        return self._requests.run(self._jobs)

    async def _jobs(self, client: ClusterClient) -> RunningJobs:
        from .activity import sample
        return (await sample(client, self._state)).jobs

    def rescan(self, nodes: Iterable[str | Node] | None = None) -> dict[str, int]:
        """Have `nodes` (default: all) look for files written straight into their exports now.

        Under `lookup = "index"` a file put into an export outside the mount reaches its
        directory's home at the node's next export scan (about a second); call this after
        copying inputs in to make them visible everywhere at once. Returns, per node, how many
        changed directories it sent to their homes (always 0 under `lookup = "flood"`, which
        needs no telling).
        """
        return self._files.rescan(nodes)

    # -- where -------------------------------------------------------------------

    def where(self, paths: PathLike | Iterable[PathLike], from_node: str | Node | None = None) -> Locations:
        """Every holder of each path, nearest first (as seen from `from_node`, see the module doc)."""
        return self._files.where(paths, from_node)

    def ls(self, path: PathLike = "/", from_node: str | Node | None = None) -> Listing:
        """A directory as the mount shows it, with the node each entry comes from."""
        return self._files.ls(path, from_node)

    def read_bytes(self, path: PathLike, *, start: int = 0, end: int | None = None,
                   from_node: str | Node | None = None) -> bytes:
        """The file's bytes [start, end) read from its nearest holder (directly, no mount needed)."""
        return self._files.read_bytes(path, start=start, end=end, from_node=from_node)

    def read_range(self, path: PathLike, start: int, end: int | None, *, holder: str | Node) -> bytes:
        """Bytes [start, end) of `path` read from node `holder` itself, without a lookup.

        For readers that bind a file to its holder when they open it, as the
        mount does (close-to-open; the fsspec backend): every range then comes
        from the same copy. FileNotFoundError if `holder` no longer has it.
        """
        return self._files.read_range(path, start, end, holder=holder)

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
        return self._staging.stage(paths, to, concurrency=concurrency, progress=progress)

    # -- place and run -------------------------------------------------------------

    def place(self, inputs: PathLike | Iterable[PathLike]) -> Placement:
        """The node to run a job reading `inputs` on (Pwrake's rule, see gmountpy.jobs.placement).

        Slots in use are the jobs this process started with `run` that are
        still running; jobs started elsewhere are not counted.
        """
        return self._placer.place(inputs)

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
        return self._execution.run(command, on=on, near=near, timeout=timeout, cwd=cwd, capture=capture)

    def spawn(self, command: str, *, on: str | Node, cwd: PathLike = "/", env: Mapping[str, str] | None = None,
              stdout: Any = None, stderr: Any = None, job: str | None = None, kind: str = "api") -> Spawned:
        """Start a shell command on node `on`, in its mount, and return at once (see gmountpy.jobs.spawn).

        For executors running many jobs: poll the result, `stop()` it (its
        whole process group, also over SSH). The command sees `env` on top
        of this process's environment, plus GMOUNT_NODE, GMOUNT_SITE and
        GMOUNT_CLUSTER. `stdout`/`stderr` are as for subprocess.Popen.
        While it runs, `jobs()` and `gmount top` show it as `job` (default:
        the command), started by `kind` (e.g. "snakemake").
        """
        return self._execution.spawn(command, on=on, cwd=cwd, env=env, stdout=stdout, stderr=stderr, job=job,
                                     kind=kind)

    # -- Dask --------------------------------------------------------------------------

    def dask(self, *, threads: int | None = None, placement: bool = True, timeout: float = 60.0) -> Client:
        """A `distributed.Client` on Dask workers in every node's mount; starts them unless they run.

        One worker per node (named after it, `threads` threads, default the
        node's slots) and a scheduler that places each task on the node
        holding most of its `gmount://` input (`placement=False`: Dask's own
        placement). They stay up for other clients until `dask_down()`,
        `gmount dask down` or `down()`. Needs the `dask` extra; see docs/dask.md.
        """
        from . import dask
        return dask.client(self, threads=threads, placement=placement, timeout=timeout)

    def dask_down(self) -> None:
        """Stop this cluster's Dask scheduler and workers; the cluster itself stays up."""
        from . import dask
        problems = dask.down(self)
        if problems:
            raise GmountError("; ".join(f"{node}: {what}" for node, what in problems.items()))

    # -- write ---------------------------------------------------------------------

    def write_bytes(self, path: PathLike, data: bytes, *, on: str | Node | None = None, mode: int = 0o644,
                    from_node: str | Node | None = None) -> str:
        """Write a whole file into the namespace; returns the node whose export now holds it.

        Where it lands: node `on` if given; else the node holding the file
        now (it is replaced there, as a write through the mount would);
        else near the data of its directory: the node holding the directory
        (of several, the one with the most bytes of files in it, then the
        nearest), or its parent's when it does not exist yet, and so on up;
        the asking node (`from_node`, default as in the module doc) when only
        the namespace root is found. The bytes go to a temporary file on that node, checked
        by size and SHA-256, then renamed into place: readers see the old
        file or the whole new one. Copies of the path on other nodes are
        removed afterwards, so the new file is the only one.
        """
        return self._files.write_from(path, io.BytesIO(bytes(data)), on, mode, from_node)

    def put(self, local: PathLike, path: PathLike, *, on: str | Node | None = None, mode: int | None = None,
            from_node: str | Node | None = None) -> str:
        """Copy a local file into the namespace (like `write_bytes`, streamed); the node that holds it."""
        return self._files.put(local, path, on=on, mode=mode, from_node=from_node)

    def write_from(self, path: PathLike, source: IO[bytes], *, on: str | Node | None = None, mode: int = 0o644,
                   from_node: str | Node | None = None) -> str:
        """Like `write_bytes`, with the bytes read from an open binary file until its end (streamed)."""
        return self._files.write_from(path, source, on, mode, from_node)

    def mkdir(self, path: PathLike, *, on: str | Node | None = None, from_node: str | Node | None = None) -> str:
        """Make a directory (and missing parents) in one node's export: `on`, else the node holding its
        parent directory (chosen as for a new file by `write_bytes`).

        FileExistsError if the name exists on any node.
        """
        return self._files.mkdir(path, on=on, from_node=from_node)

    def remove(self, path: PathLike, from_node: str | Node | None = None) -> tuple[str, ...]:
        """Remove a file from every node holding it, or an empty directory from every node having it.

        Returns the nodes it was removed from; FileNotFoundError if none
        holds it, OSError(ENOTEMPTY) naming the node for a non-empty directory.
        """
        return self._files.remove(path, from_node)

    def checksum(self, path: PathLike, from_node: str | Node | None = None) -> tuple[int, str]:
        """(size, SHA-256 hex) of a file, computed on its nearest holder (no bytes cross the network)."""
        return self._files.checksum(path, from_node)

    def get(self, path: PathLike, local: PathLike, from_node: str | Node | None = None) -> tuple[int, str]:
        """Copy a file from its nearest holder to a local file, verified; returns (size, SHA-256 hex).

        The bytes go to a temporary file beside `local`, are checked against
        the holder's own size and SHA-256, and renamed into place; a file
        that changed while it was copied raises OSError(EAGAIN).
        """
        return self._files.get(path, local, from_node)


def _all_alive(state: ClusterState) -> bool:
    """Every daemon of a recorded cluster still runs (by pid locally, by ping over SSH)."""
    from ..launch.orchestrate import pid_is_daemon
    if all(r.ssh is None for r in state.nodes.values()):
        return all(pid_is_daemon(r.pid) for r in state.nodes.values())
    from ..protocol.client import ping_all
    answers = blocking(trio.run, ping_all, state)
    return all(isinstance(a, dict) and a.get("pid") == state.nodes[n].pid for n, a in answers.items())
