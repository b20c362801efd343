"""The public surface: what `import gmountpy` promises, so it does not drift by accident."""

from __future__ import annotations

import gmountpy

PUBLIC = {
    "Cluster", "ClusterSpec", "ClusterStatus", "CommandTimeout", "Entry", "FileLocations", "GmountError",
    "Holder", "Listing", "Locations", "Node", "Nodes", "Overlay", "Placement", "RunResult", "SpecError",
    "StageError", "StageReport", "StagedFile", "__version__", "load_spec",
}


def test_public_names_are_exactly_these() -> None:
    assert set(gmountpy.__all__) == PUBLIC
    for name in PUBLIC:
        assert hasattr(gmountpy, name), name


def test_errors_a_user_catches_share_one_base() -> None:
    assert issubclass(gmountpy.SpecError, gmountpy.GmountError)
    assert issubclass(gmountpy.StageError, gmountpy.GmountError)
