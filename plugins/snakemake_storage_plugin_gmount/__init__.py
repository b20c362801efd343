"""Snakemake storage plugin: `gmount://` files for workflows that run outside a mount.

    rule count:
        input: storage.gmount("gmount://demo/inputs/survey/tile-001.txt")
        output: storage.gmount("gmount://demo/results/tile-001.count")
        shell: "wc -c < {input} > {output}"

or with `--default-storage-provider gmount --default-storage-prefix gmount://demo`
and plain paths. A query is a URL as in fsspec: `gmount://CLUSTER/path`
(`gmount:///path` uses --storage-gmount-cluster, else the cluster whose mount holds the working
directory, else the only running cluster).

Existence, mtime and size come from the cluster (the holders' attributes,
asked from --storage-gmount-node, default the cluster's first node); an
input is retrieved by a verified copy (size and SHA-256 against the
holder's own checksum); an output is stored by writing it into the
namespace through a temporary file renamed into place -- on the node
holding that name already; else on --storage-gmount-node if given; else
on the node holding most of the job's gmount:// input bytes (as the
executor places jobs); else, for a job without such inputs, near its
directory's data (`Cluster.write_bytes`). Snakemake tells a storage plugin
nothing of the job whose outputs it stores: the job is the one Snakemake's
DAG.handle_storage is storing, found on the call stack; with a Snakemake
that stores otherwise, outputs go near their directory's data.
glob_wildcards lists the namespace below the query's constant prefix.

Inside a mount you need none of this: run there with plain paths and the
gmount executor (snakemake_executor_plugin_gmount).
"""

# No `from __future__ import annotations`: Snakemake reads the settings' field types at run time.
import errno
import inspect
import posixpath
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, List, Optional
from urllib.parse import urlparse

from snakemake_interface_common.exceptions import WorkflowError
from snakemake_interface_storage_plugins.io import IOCacheStorageInterface, Mtime, get_constant_prefix
from snakemake_interface_storage_plugins.settings import StorageProviderSettingsBase
from snakemake_interface_storage_plugins.storage_object import (
    StorageObjectGlob,
    StorageObjectRead,
    StorageObjectWrite,
)
from snakemake_interface_storage_plugins.storage_provider import (
    ExampleQuery,
    Operation,
    QueryType,
    StorageProviderBase,
    StorageQueryValidationResult,
)

from gmountpy import GmountError
from gmountpy.api import Cluster, FileLocations, Holder

SCHEME = "gmount"


@dataclass
class StorageProviderSettings(StorageProviderSettingsBase):
    """Command-line flags --storage-gmount-cluster and --storage-gmount-node."""

    cluster: Optional[str] = field(default=None, metadata={
        "help": "Cluster for gmount:///path queries (name, cluster file, or a path in a mount). Default: the "
                "cluster whose mount holds the working directory, else the only running one.", "env_var": False,
        "required": False})
    node: Optional[str] = field(default=None, metadata={
        "help": "Node that lookups are asked from and new outputs are written to. Default: lookups from the "
                "cluster's first node, outputs on the node holding most of their job's inputs.",
        "env_var": False, "required": False})


def _split(query: str) -> tuple[str, str]:
    """(cluster name or "", namespace path) of a gmount:// query."""
    parsed = urlparse(query)
    if parsed.scheme != SCHEME:
        raise ValueError(f"{query!r} is not a gmount:// URL")
    path = posixpath.normpath("/" + parsed.path.lstrip("/")) if parsed.path else "/"
    return parsed.netloc, path


class StorageProvider(StorageProviderBase):
    def __post_init__(self) -> None:
        self._clusters: dict[str, Cluster] = {}
        self._lock = threading.Lock()

    def cluster(self, name: str) -> Cluster:
        """The cluster of a query (its host part, else --storage-gmount-cluster, else as `Cluster.open(None)`)."""
        settings: Optional[StorageProviderSettings] = self.settings
        key = name or (settings.cluster if settings and settings.cluster else "")
        with self._lock:
            found = self._clusters.get(key)
            if found is None:
                try:
                    found = self._clusters[key] = Cluster.open(key or None)
                except GmountError as exc:
                    raise WorkflowError(f"gmount storage: {exc}") from None
            return found

    def node(self, cluster: Cluster) -> Optional[str]:
        settings: Optional[StorageProviderSettings] = self.settings
        return settings.node if settings and settings.node else None

    @classmethod
    def example_queries(cls) -> List[ExampleQuery]:
        return [
            ExampleQuery("gmount://demo/inputs/survey/tile-001.txt",
                         "file /inputs/survey/tile-001.txt of the running gmount cluster 'demo'", QueryType.ANY),
            ExampleQuery("gmount:///results/summary.txt",
                         "file /results/summary.txt of the cluster given by --storage-gmount-cluster "
                         "(or the only running one)", QueryType.ANY),
        ]

    def rate_limiter_key(self, query: str, operation: Operation) -> Any:
        return _split(query)[0]

    def default_max_requests_per_second(self) -> float:
        return 1000.0

    def use_rate_limiter(self) -> bool:
        return False  # the daemons are ours: no quota to respect

    @classmethod
    def is_valid_query(cls, query: str) -> StorageQueryValidationResult:
        try:
            _, path = _split(query)
        except ValueError as exc:
            return StorageQueryValidationResult(query, False, str(exc))
        if path == "/":
            return StorageQueryValidationResult(query, False, "names the namespace root; give a file path after "
                                                              "the cluster, e.g. gmount://demo/data/a.csv")
        return StorageQueryValidationResult(query, True)


class StorageObject(StorageObjectRead, StorageObjectWrite, StorageObjectGlob):
    provider: StorageProvider

    def __post_init__(self) -> None:
        self.cluster_name, self.path = _split(self.query)

    # -- where it is ---------------------------------------------------------------

    @property
    def cluster(self) -> Cluster:
        return self.provider.cluster(self.cluster_name)

    def _found(self) -> FileLocations:
        try:
            return self.cluster.where(self.path, from_node=self.provider.node(self.cluster))[0]
        except GmountError as exc:
            raise WorkflowError(f"gmount storage: cannot look up {self.query}: {exc}") from None

    async def inventory(self, cache: IOCacheStorageInterface) -> None:
        key = self.cache_key()
        if key in cache.exists_in_storage:
            return
        found = self._found()
        cache.exists_in_storage[key] = bool(found.holders)
        if found.holders:
            nearest = found.holders[0]
            cache.mtime[key] = Mtime(storage=nearest.mtime_ns / 1e9)
            cache.size[key] = 0 if nearest.is_dir else nearest.size

    def get_inventory_parent(self) -> Optional[str]:
        return None

    def local_suffix(self) -> str:
        return f"{self.cluster_name or self.cluster.name}{self.path}"

    def cleanup(self) -> None:
        pass  # nothing is kept besides the local copy Snakemake manages

    def exists(self) -> bool:
        return bool(self._found().holders)

    def mtime(self) -> float:
        return self._nearest().mtime_ns / 1e9

    def size(self) -> int:
        nearest = self._nearest()
        return 0 if nearest.is_dir else nearest.size

    def _nearest(self) -> Holder:
        found = self._found()
        if not found.holders:
            raise FileNotFoundError(errno.ENOENT, f"no node of cluster {self.cluster.name!r} holds {self.path}")
        return found.holders[0]

    # -- moving data ------------------------------------------------------------------

    def retrieve_object(self) -> None:
        """Copy to local_path(), checked against the holder's size and SHA-256."""
        self.cluster.get(self.path, self.local_path(), from_node=self.provider.node(self.cluster))

    def store_object(self) -> None:
        local = self.local_path()
        if local.is_dir():
            raise WorkflowError(f"gmount storage: {self.query} is a directory output; store files one by one "
                                "(directory outputs are not supported yet)")
        self.cluster.put(local, self.path, on=self._write_node())

    def _write_node(self) -> Optional[str]:
        """An existing file is replaced on its own holder (None); a new one goes to --storage-gmount-node,
        else to the node holding most of its job's inputs, else (None) near its directory's data."""
        if self._found().holders:
            return None
        told = self.provider.node(self.cluster)
        if told is not None:
            return told
        inputs = self._job_inputs()
        if not inputs:
            return None
        placement = self.cluster.place(inputs)
        return None if len(placement.unlocated) == len(inputs) else placement.node

    def _job_inputs(self) -> List[str]:
        """The namespace paths of this cluster's gmount:// inputs of the job whose output this is.

        No interface tells a storage plugin which job an output belongs to; Snakemake stores a
        job's outputs from DAG.handle_storage(job), so the job is taken from that call's frame.
        """
        frame = inspect.currentframe()
        while frame is not None:
            if frame.f_code.co_name == "handle_storage" and "job" in frame.f_locals:
                paths = []
                for item in getattr(frame.f_locals["job"], "input", ()):
                    found = getattr(item, "storage_object", None) if getattr(item, "is_storage", False) else None
                    if isinstance(found, StorageObject) and found.cluster.name == self.cluster.name:
                        paths.append(found.path)
                return paths
            frame = frame.f_back
        return []

    def remove(self) -> None:
        try:
            self.cluster.remove(self.path)
        except FileNotFoundError:
            pass

    # -- glob_wildcards ------------------------------------------------------------------

    def list_candidate_matches(self) -> Iterable[str]:
        prefix = get_constant_prefix(self.query, strip_incomplete_parts=True)
        _, start = _split(prefix if prefix.startswith(SCHEME + "://") else self.query)
        host = self.cluster_name
        for path in self._walk(start):
            yield f"{SCHEME}://{host}{path}"

    def _walk(self, directory: str) -> Iterable[str]:
        try:
            listing = self.cluster.ls(directory, from_node=self.provider.node(self.cluster))
        except FileNotFoundError:
            return
        for entry in listing.entries:
            if entry.kind == "directory":
                yield from self._walk(entry.path)
            else:
                yield entry.path  # (a prefix naming a file lists as that file)


__all__ = ["StorageObject", "StorageProvider", "StorageProviderSettings"]
