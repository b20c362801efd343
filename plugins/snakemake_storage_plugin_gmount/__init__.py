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
namespace -- on the node holding that name already, else on
--storage-gmount-node -- through a temporary file renamed into place.
glob_wildcards lists the namespace below the query's constant prefix.

Inside a mount you need none of this: run there with plain paths and the
gmount executor (snakemake_executor_plugin_gmount).
"""

# No `from __future__ import annotations`: Snakemake reads the settings' field types at run time.
import errno
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
        "help": "Node that lookups are asked from and new outputs are written to. Default: the cluster's "
                "first node.", "env_var": False, "required": False})


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
        """--storage-gmount-node for a new file; an existing file is replaced on its own holder."""
        found = self._found()
        return None if found.holders else self.provider.node(self.cluster)

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
