"""The library API: `Cluster`, the one facade for a running cluster, and what its methods return.

`cluster.py` is the facade; the modules beside it are its collaborators (paths, requests to
the daemons, files, staging, placement, execution) and `filesystem.py` the fsspec backend.
"""

from __future__ import annotations

from .cluster import (
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
    PathLike,
    Placement,
    PlacementRow,
    RunResult,
    Spawned,
    StagedFile,
    StageError,
    StageFailure,
    StageReport,
)

__all__ = [
    "Cluster", "ClusterStatus", "CommandTimeout", "Entry", "FileLocations", "Holder", "Listing", "Locations",
    "Node", "Nodes", "PathLike", "Placement", "PlacementRow", "RunResult", "Spawned", "StageError", "StageFailure",
    "StageReport", "StagedFile",
]
