"""gmountpy: one locality-aware namespace over the local disks of machines you can SSH into.

The public names load on first use (PEP 562), so a small tool that needs one
module -- a make recipe wrapper, a Pegasus callout run once per job -- does
not pay for importing the whole API (trio, networkx, ...) at startup.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__

_LAZY: dict[str, str] = {
    "Cluster": "api", "ClusterStatus": "api", "CommandTimeout": "api", "Entry": "api",
    "FileLocations": "api", "Holder": "api", "Listing": "api", "Locations": "api", "Node": "api",
    "Nodes": "api", "Placement": "api", "RunResult": "api", "StagedFile": "api", "StageError": "api",
    "StageReport": "api",
    "ClusterSpec": "config", "SpecError": "config", "load_spec": "config",
    "GmountError": "errors",
    "Overlay": "overlay",
}

if TYPE_CHECKING:
    from .api import (
        Cluster,
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
        RunResult,
        StagedFile,
        StageError,
        StageReport,
    )
    from .config import ClusterSpec, SpecError, load_spec
    from .errors import GmountError
    from .overlay import Overlay


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'gmountpy' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))

__all__ = [
    "Cluster",
    "ClusterSpec",
    "ClusterStatus",
    "CommandTimeout",
    "Entry",
    "FileLocations",
    "GmountError",
    "Holder",
    "Listing",
    "Locations",
    "Node",
    "Nodes",
    "Overlay",
    "Placement",
    "RunResult",
    "SpecError",
    "StageError",
    "StageReport",
    "StagedFile",
    "__version__",
    "load_spec",
]
