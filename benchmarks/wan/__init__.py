"""Emulated WAN sites for gmount clusters and peers (network namespaces + NFQUEUE delays).

    from benchmarks.wan import emulate, gmount_cluster
    with emulate("cluster.toml") as emu, gmount_cluster(emu) as spec:
        ...  # daemons run in their sites' namespaces; mounts are visible here
"""

from .sites import (
    Emulation,
    WanError,
    down,
    emulate,
    gmount_cluster,
    load_cluster,
    problem,
    up,
)

__all__ = ["Emulation", "WanError", "down", "emulate", "gmount_cluster", "load_cluster", "problem", "up"]
