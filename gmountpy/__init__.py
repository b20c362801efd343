"""gmountpy: one locality-aware namespace over the local disks of machines you can SSH into."""

from ._version import __version__
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
