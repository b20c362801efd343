"""gmountpy: one locality-aware namespace over the local disks of machines you can SSH into.

The names below are loaded on first use (PEP 562), so that `import
gmountpy.jobs.placement` or `gmountpy.cluster.mounts` costs milliseconds: make's
`gmount-sh` imports them once per recipe and must not pay for trio,
networkx and the launcher each time.
"""

from __future__ import annotations

import importlib

from ._version import __version__

TYPE_CHECKING = False  # not `from typing import ...`: typing alone costs more than the rest of this file
if TYPE_CHECKING:
    from typing import Any

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
    from .cluster.config import ClusterSpec, SpecError, load_spec
    from .cluster.overlay import Overlay
    from .errors import GmountError

#: public name -> the submodule that defines it
_HOMES = {
    **dict.fromkeys(("Cluster", "ClusterStatus", "CommandTimeout", "Entry", "FileLocations", "Holder", "Listing",
                     "Locations", "Node", "Nodes", "Placement", "RunResult", "StagedFile", "StageError",
                     "StageReport"), "api"),
    **dict.fromkeys(("ClusterSpec", "SpecError", "load_spec"), "cluster.config"),
    "GmountError": "errors",
    "Overlay": "cluster.overlay",
}

__all__ = [
    "Cluster", "ClusterSpec", "ClusterStatus", "CommandTimeout", "Entry", "FileLocations", "GmountError", "Holder",
    "Listing", "Locations", "Node", "Nodes", "Overlay", "Placement", "RunResult", "SpecError", "StageError",
    "StageReport", "StagedFile", "__version__", "load_spec",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is not None:
        value = getattr(importlib.import_module(f".{home}", __name__), name)
    else:
        try:  # `import gmountpy; gmountpy.api.Cluster` keeps working
            value = importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError:
            raise AttributeError(f"module 'gmountpy' has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])
