"""What a whole node answers beyond its export (gmountpy.node.control): the namespace as its mount
sees it, its peers, its certificate, its statistics, and stopping it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, TypedDict

from ..attr import Attr
from ..codec import MaxLen, Range
from .base import Message, NodeName, Pathname, Request

#: A PEM certificate or key (a few KiB).
Pem = Annotated[str, MaxLen(65536)]
Port = Annotated[int, Range(0, 65535)]


class HolderRow(TypedDict):
    """One holder in a `where` reply (api.Holder is made from it)."""

    node: str
    site: str
    size: int
    mtime_ns: int
    mode: int
    export_path: str
    rtt_ms: float
    replica_of: str | None


@dataclass(frozen=True)
class LsEntry(Message):
    """One name of a merged listing: the holder a lookup finds, and every holder, nearest first."""

    name: str
    node: str
    attr: Attr
    holders: tuple[str, ...]


@dataclass(frozen=True)
class LsReply(Message):
    """`ls`: the merged listing as the asked node's mount shows it, and the nodes that did not answer."""

    entries: tuple[LsEntry, ...]
    unreachable: tuple[str, ...]


class StageReply(TypedDict):
    """`stage`: what staging one file to the asked node did ("copied", "up-to-date", or "local")."""

    status: str
    source: str
    size: int
    sha256: str | None
    seconds: float


class JobRow(TypedDict):
    """One job in a `jobs` reply: a job started on the node's machine (gmountpy.cluster.registry)."""

    cluster: str
    node: str        # the node it runs on
    job: str         # what it is: a make target, a Snakemake rule, a command
    kind: str        # who started it: "make", "snakemake", "api"
    directory: str   # its working directory in the namespace
    started: float   # seconds since the epoch
    host: str        # the machine that started it
    pid: int         # there, a process that lives as long as the job


@dataclass(frozen=True)
class Where(Request[list[HolderRow]]):
    """Every holder of `path`, nearest to the asked node first."""

    op = "where"
    path: Pathname


@dataclass(frozen=True)
class Ls(Request[LsReply]):
    op = "ls"
    path: Pathname


@dataclass(frozen=True)
class Remove(Request[list[str]]):
    """unlink or rmdir through the asked node's namespace, as its mount would: every holder,
    and its home, before the reply (the library API's `remove`); the nodes it was removed from."""

    op = "remove"
    path: Pathname


@dataclass(frozen=True)
class Created(Request[None]):
    """A peer created `path`: forget "not found" for it."""

    op = "created"
    path: Pathname
    is_dir: bool


@dataclass(frozen=True)
class Stage(Request[StageReply]):
    """Copy `path` to the asked node as a verified replica."""

    op = "stage"
    path: Pathname


@dataclass(frozen=True)
class Stats(Request[dict[str, Any]]):
    """The daemon's counters for `gmount status` and tests (inodes, cache hits, limits in use)."""

    op = "stats"


@dataclass(frozen=True)
class Jobs(Request[list[JobRow]]):
    """The jobs started on the asked node's machine for its cluster and still running, oldest first."""

    op = "jobs"


@dataclass(frozen=True)
class SetPeers(Request[None]):
    """node name -> (host, port): a node was (re)started elsewhere."""

    op = "set_peers"
    table: dict[NodeName, tuple[Annotated[str, MaxLen(255)], Port]]


@dataclass(frozen=True)
class RenewTls(Request[str]):
    """Present this certificate from now on; answers its expiry."""

    op = "renew_tls"
    cert: Pem
    key: Pem


@dataclass(frozen=True)
class Shutdown(Request[None]):
    op = "shutdown"
