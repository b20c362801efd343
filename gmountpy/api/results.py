"""What the library API hands back: small frozen dataclasses that show themselves as tables.

Each result has a readable text repr (a table in a terminal or REPL) and
`_repr_html_` (an HTML table in a notebook). Re-exported by gmountpy.api and
gmountpy.
"""

from __future__ import annotations

import html
import posixpath
import stat
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ..errors import GmountError

if TYPE_CHECKING:
    from ..launch import NodeStatus


def _normalize(path: str) -> str:
    """A namespace path: absolute, no '.' or '..' parts, no trailing slash."""
    return posixpath.normpath("/" + path.lstrip("/"))


# --------------------------------------------------------------------------- rendering


def human_size(size: int | None) -> str:
    if size is None:
        return ""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"  # unreachable


def _text_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max([len(c)] + [len(r[i]) for r in rows]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    return "\n".join(lines)


def _html_table(columns: Sequence[str], rows: Sequence[Sequence[str]], caption: str) -> str:
    head = "".join(f"<th style='text-align:left'>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td style='text-align:left'>{html.escape(v)}</td>" for v in row) + "</tr>"
                   for row in rows)
    return (f"<table><caption style='text-align:left'>{html.escape(caption)}</caption>"
            f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


class _Table:
    """Mixin: a result that shows itself as a table (text in a terminal, HTML in a notebook)."""

    def _caption(self) -> str:
        raise NotImplementedError

    def _columns(self) -> Sequence[str]:
        raise NotImplementedError

    def _rows(self) -> list[list[str]]:
        raise NotImplementedError

    def __repr__(self) -> str:
        rows = self._rows()
        if not rows:
            return f"<{self._caption()}: empty>"
        return f"<{self._caption()}>\n{_text_table(self._columns(), rows)}"

    def _repr_html_(self) -> str:
        return _html_table(self._columns(), self._rows(), self._caption())


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Node:
    """One node of the cluster as the cluster file and the launcher describe it."""

    name: str
    site: str
    slots: int
    mountpoint: str
    export: str
    address: str     # host:port of its daemon

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, repr=False)
class Nodes(_Table):
    """The cluster's nodes in cluster-file order; index by position or name."""

    items: tuple[Node, ...]

    def __iter__(self) -> Iterator[Node]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, key: int | str) -> Node:
        if isinstance(key, str):
            for node in self.items:
                if node.name == key:
                    return node
            raise KeyError(f"unknown node {key!r} (nodes: {', '.join(self.names)})")
        return self.items[key]

    def __contains__(self, key: object) -> bool:
        name = key.name if isinstance(key, Node) else key
        return any(node.name == name for node in self.items)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(node.name for node in self.items)

    def _caption(self) -> str:
        return _count(len(self.items), "node")

    def _columns(self) -> Sequence[str]:
        return ("node", "site", "slots", "mountpoint", "export")

    def _rows(self) -> list[list[str]]:
        return [[n.name, n.site, str(n.slots), n.mountpoint, n.export] for n in self.items]


@dataclass(frozen=True)
class Holder:
    """One node holding a path, as seen from the asking node."""

    node: str
    site: str
    size: int
    mtime_ns: int
    mode: int
    export_path: str              # the file's path on that node's disk
    rtt_ms: float                 # estimated RTT from the asking node
    replica_of: str | None = None  # a staged replica of that node's file

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)

    @property
    def mtime(self) -> datetime:
        return datetime.fromtimestamp(self.mtime_ns / 1e9, tz=UTC)

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Holder:
        return cls(node=data["node"], site=data["site"], size=data["size"], mtime_ns=data["mtime_ns"],
                   mode=data["mode"], export_path=data["export_path"], rtt_ms=float(data["rtt_ms"]),
                   replica_of=data.get("replica_of"))


@dataclass(frozen=True, repr=False)
class FileLocations(_Table):
    """Every holder of one path, nearest first from `asked_from`; empty if no node holds it."""

    path: str
    asked_from: str
    holders: tuple[Holder, ...]
    given: str = ""               # the path as the caller wrote it (e.g. inside a mount)

    @property
    def exists(self) -> bool:
        return bool(self.holders)

    @property
    def nearest(self) -> Holder | None:
        return self.holders[0] if self.holders else None

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(h.node for h in self.holders)

    def _caption(self) -> str:
        state = "" if self.holders else " (no node holds it)"
        return f"{self.path} seen from {self.asked_from}{state}"

    def _columns(self) -> Sequence[str]:
        return ("node", "site", "size", "rtt ms", "replica of", "path on node")

    def _rows(self) -> list[list[str]]:
        return [[h.node, h.site, human_size(h.size), f"{h.rtt_ms:g}", h.replica_of or "", h.export_path]
                for h in self.holders]


@dataclass(frozen=True, repr=False)
class Locations(_Table):
    """The result of `where` for several paths; index by position or by path."""

    files: tuple[FileLocations, ...]

    def __iter__(self) -> Iterator[FileLocations]:
        return iter(self.files)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, key: int | str) -> FileLocations:
        if isinstance(key, str):
            for item in self.files:
                if key == item.given or _normalize(key) == item.path:
                    return item
            raise KeyError(key)
        return self.files[key]

    @property
    def missing(self) -> tuple[str, ...]:
        return tuple(f.path for f in self.files if not f.holders)

    def _caption(self) -> str:
        asked = sorted({f.asked_from for f in self.files})
        return f"where: {_count(len(self.files), 'path')}, asked from {', '.join(asked)}"

    def _columns(self) -> Sequence[str]:
        return ("path", "nearest", "all holders, nearest first", "size")

    def _rows(self) -> list[list[str]]:
        return [[f.path, f.nearest.node if f.nearest else "-", ", ".join(f.nodes) or "no node holds it",
                 human_size(f.nearest.size) if f.nearest else ""] for f in self.files]


@dataclass(frozen=True)
class Entry:
    """One entry of a merged directory listing."""

    name: str
    path: str
    kind: str                    # "file", "directory", "symlink" or "other"
    size: int
    mtime_ns: int
    node: str                    # the holder a lookup from the asking node finds
    holders: tuple[str, ...]     # every node whose export has the entry, nearest first

    @property
    def mtime(self) -> datetime:
        return datetime.fromtimestamp(self.mtime_ns / 1e9, tz=UTC)


@dataclass(frozen=True, repr=False)
class Listing(_Table):
    """A directory as the mount shows it (the merge of every node's), with each entry's holder."""

    path: str
    asked_from: str
    entries: tuple[Entry, ...]
    unreachable: tuple[str, ...] = ()   # nodes that did not answer: their entries are missing

    def __iter__(self) -> Iterator[Entry]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, name: str) -> Entry:
        for entry in self.entries:
            if entry.name == name:
                return entry
        raise KeyError(name)

    def _caption(self) -> str:
        note = f"; unreachable: {', '.join(self.unreachable)}" if self.unreachable else ""
        return f"{self.path} seen from {self.asked_from}{note}"

    def _columns(self) -> Sequence[str]:
        return ("name", "size", "holder", "also on")

    def _rows(self) -> list[list[str]]:
        return [[e.name + ("/" if e.kind == "directory" else ""), "" if e.kind == "directory" else human_size(e.size),
                 e.node, ", ".join(h for h in e.holders if h != e.node)] for e in self.entries]


@dataclass(frozen=True)
class StagedFile:
    """One file staged: `status` is "copied", "up-to-date" or "local" (the target holds the original)."""

    path: str
    status: str
    source: str
    size: int
    sha256: str | None
    seconds: float


@dataclass(frozen=True)
class StageFailure:
    path: str
    error: str


@dataclass(frozen=True, repr=False)
class StageReport(_Table):
    target: str
    files: tuple[StagedFile, ...]
    failures: tuple[StageFailure, ...] = ()

    @property
    def copied_bytes(self) -> int:
        return sum(f.size for f in self.files if f.status == "copied")

    def _caption(self) -> str:
        copied = sum(1 for f in self.files if f.status == "copied")
        failed = f", {len(self.failures)} failed" if self.failures else ""
        return (f"staged to {self.target}: {copied} copied ({human_size(self.copied_bytes)}), "
                f"{len(self.files) - copied} already there{failed}")

    def _columns(self) -> Sequence[str]:
        return ("path", "status", "from", "size", "seconds", "sha256")

    def _rows(self) -> list[list[str]]:
        rows = [[f.path, f.status, f.source, human_size(f.size), f"{f.seconds:.3f}", (f.sha256 or "")[:16]]
                for f in self.files]
        rows += [[f.path, "FAILED", "", "", "", f.error] for f in self.failures]
        return rows


class StageError(GmountError):
    """Some files could not be staged; `report` has what was staged and why the rest failed."""

    def __init__(self, report: StageReport) -> None:
        shown = "; ".join(f"{f.path}: {f.error}" for f in report.failures[:5])
        more = f" (and {len(report.failures) - 5} more)" if len(report.failures) > 5 else ""
        super().__init__(f"could not stage {len(report.failures)} of "
                         f"{len(report.failures) + len(report.files)} files to {report.target}: {shown}{more}")
        self.report = report


@dataclass(frozen=True)
class PlacementRow:
    node: str
    site: str
    input_bytes: int
    candidate: bool
    running: int
    slots: int
    remote_cost: float


@dataclass(frozen=True, repr=False)
class Placement(_Table):
    """The node chosen for a job, why, and every node's numbers."""

    node: str
    reason: str
    inputs: tuple[str, ...]
    rows: tuple[PlacementRow, ...]
    unlocated: tuple[str, ...] = ()

    def __str__(self) -> str:
        return self.node

    def _caption(self) -> str:
        missing = f"; not found: {', '.join(self.unlocated)}" if self.unlocated else ""
        return f"place on {self.node}: {self.reason}{missing}"

    def _columns(self) -> Sequence[str]:
        return ("node", "site", "input bytes", "candidate", "running/slots", "remote cost (B*ms)", "")

    def _rows(self) -> list[list[str]]:
        return [[r.node, r.site, human_size(r.input_bytes), "yes" if r.candidate else "", f"{r.running}/{r.slots}",
                 f"{r.remote_cost:g}", "<- chosen" if r.node == self.node else ""] for r in self.rows]


@dataclass(frozen=True)
class RunResult:
    """A command that ran on a node: exit status and (when captured) its output."""

    node: str
    command: str
    cwd: str
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def check(self) -> RunResult:
        """Raise GmountError if the command failed; return self otherwise (for chaining)."""
        if self.returncode != 0:
            tail = self.stderr.strip().splitlines()[-5:]
            detail = (": " + " | ".join(tail)) if tail else ""
            raise GmountError(f"command {self.command!r} failed on node {self.node} "
                              f"with exit status {self.returncode}{detail}")
        return self

    def __repr__(self) -> str:
        text = f"<RunResult on {self.node}: exit {self.returncode} after {self.seconds:.2f}s: {self.command!r}>"
        for label, output in (("stdout", self.stdout), ("stderr", self.stderr)):
            if output:
                text += f"\n--- {label}\n{output.rstrip()}"
        return text

    def _repr_html_(self) -> str:
        parts = [f"<p>on <b>{html.escape(self.node)}</b> in <code>{html.escape(self.cwd)}</code>: "
                 f"<code>{html.escape(self.command)}</code> &rarr; exit {self.returncode} "
                 f"({self.seconds:.2f} s)</p>"]
        for label, output in (("stdout", self.stdout), ("stderr", self.stderr)):
            if output:
                parts.append(f"<pre title='{label}'>{html.escape(output)}</pre>")
        return "".join(parts)


class CommandTimeout(GmountError):
    """A command run on a node did not finish in time (it was killed)."""

    def __init__(self, node: str, command: str, timeout: float, stdout: str, stderr: str) -> None:
        super().__init__(f"command {command!r} on node {node} did not finish within {timeout:g}s and was killed; "
                         "give a larger timeout")
        self.node, self.command, self.timeout, self.stdout, self.stderr = node, command, timeout, stdout, stderr


@dataclass(frozen=True, repr=False)
class ClusterStatus(_Table):
    name: str
    nodes: tuple[NodeStatus, ...]

    @property
    def up(self) -> bool:
        return all(n.up for n in self.nodes)

    def _caption(self) -> str:
        return f"cluster {self.name}: {'up' if self.up else 'NOT all up'}"

    def _columns(self) -> Sequence[str]:
        return ("node", "site", "pid", "address", "mountpoint", "state")

    def _rows(self) -> list[list[str]]:
        return [[n.name, n.site, str(n.pid), n.address, n.mountpoint, "up" if n.up else f"down ({n.detail})"]
                for n in self.nodes]


@dataclass(frozen=True)
class RunningJob:
    """A job running on a node, as whoever started it registered it (gmountpy.cluster.registry)."""

    node: str        # where it runs
    job: str         # a make target, a Snakemake rule, a command
    kind: str        # who started it: "make", "snakemake", "api"
    directory: str   # its working directory in the namespace
    started: float   # seconds since the epoch
    host: str        # the machine that started it
    pid: int         # there, a process that lives as long as the job


@dataclass(frozen=True, repr=False)
class RunningJobs(_Table):
    """The jobs running on a cluster's nodes, oldest first."""

    items: tuple[RunningJob, ...]

    def __iter__(self) -> Iterator[RunningJob]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> RunningJob:
        return self.items[index]

    def per_node(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for job in self.items:
            counts[job.node] = counts.get(job.node, 0) + 1
        return counts

    def _caption(self) -> str:
        return _count(len(self.items), "job") + " running"

    def _columns(self) -> Sequence[str]:
        return ("node", "job", "kind", "started", "directory")

    def _rows(self) -> list[list[str]]:
        return [[j.node, j.job, j.kind, datetime.fromtimestamp(j.started).strftime("%H:%M:%S"), j.directory]
                for j in self.items]
