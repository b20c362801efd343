"""Which cluster a CLI command means, for the commands built on the library API."""

from __future__ import annotations

import os
from collections.abc import Iterable

from .. import state as state_store
from ..api import Cluster
from ..errors import GmountError


def open_cluster(cluster: str | None, paths: Iterable[str] = ()) -> Cluster:
    """--cluster (name or file) if given; else the cluster whose mount holds a PATH or the current
    directory; else the only running cluster."""
    if cluster is not None:
        return Cluster.open(cluster)
    for path in [*paths, os.getcwd()]:
        found = state_store.find_by_path(path)
        if found is not None:
            return Cluster(found[0], home=found[1].name)
    running = state_store.all_states()
    if len(running) == 1:
        return Cluster(running[0])
    if not running:
        raise GmountError("no cluster is running: start one with `gmount up CLUSTER.toml`")
    raise GmountError(f"several clusters are running ({', '.join(s.name for s in running)}): "
                      "say which with --cluster NAME, or give paths inside its mount")


def cluster_option_help() -> str:
    return ("Cluster name or cluster file (default: the cluster whose mount holds PATH or the current "
            "directory, or the only one running).")
