"""Which cluster a CLI command means, for the commands built on the library API."""

from __future__ import annotations

import os
from collections.abc import Iterable

from ..api import Cluster
from ..cluster import state as state_store


def open_cluster(cluster: str | None, paths: Iterable[str] = ()) -> Cluster:
    """--cluster (name or file) if given; else the cluster whose mount holds a PATH or the current
    directory; else the only running cluster (gmountpy.cluster.state.resolve)."""
    found = state_store.resolve(cluster, paths=[*paths, os.getcwd()])
    return Cluster(found.state, home=found.node)


def cluster_option_help() -> str:
    return ("Cluster name or cluster file (default: the cluster whose mount holds PATH or the current "
            "directory, or the only one running).")
