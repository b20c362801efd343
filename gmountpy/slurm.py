"""For SLURM users: put each Snakemake job on the node that holds its inputs, via `--nodelist`.

With the SLURM executor, Snakemake passes `resources.slurm_extra` to sbatch.
One line in a profile (or on the command line) fills it from placement:

    default-resources:
      slurm_extra: "__import__('gmountpy.slurm').slurm.slurm_extra(input)"

`slurm_extra(input)` asks the running gmount cluster where the job's inputs
are and answers `--nodelist=<host>`: the chosen node's `host` in the
cluster file (without `user@`), or the node's name when it has no host --
name your gmount nodes as SLURM does. From the shell: `gmount slurm-extra
INPUTS...` prints the same string.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from .api import Cluster, PathLike
from .cluster import state as state_store

__all__ = ["nodelist", "slurm_extra"]


def _cluster(cluster: Cluster | str | None, inputs: list[str]) -> Cluster:
    """The given cluster; else the one whose mount holds an input or the working directory; else the
    only running cluster."""
    if isinstance(cluster, Cluster):
        return cluster
    found = state_store.resolve(cluster or None, paths=[*inputs, os.getcwd()])
    return Cluster(found.state, home=found.node)


def nodelist(inputs: PathLike | Iterable[PathLike], *, cluster: Cluster | str | None = None) -> str:
    """The SLURM host name of the node that holds most of `inputs` (see the module doc)."""
    paths = [os.fspath(inputs)] if isinstance(inputs, (str, os.PathLike)) else [os.fspath(p) for p in inputs]
    chosen = _cluster(cluster, paths)
    node = chosen.place(paths).node
    host = chosen.spec.nodes[node].host
    return host.rpartition("@")[2].strip("[]") if host else node


def slurm_extra(inputs: PathLike | Iterable[PathLike], *, cluster: Cluster | str | None = None,
                extra: str = "") -> str:
    """`--nodelist=<host>` for sbatch (plus `extra`, e.g. other flags the rule needs)."""
    flag = f"--nodelist={nodelist(inputs, cluster=cluster)}"
    return f"{flag} {extra}".strip()
