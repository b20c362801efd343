"""The node a prestager planned for a job, read by make's per-recipe wrapper (standard library only).

A prestager (gmountpy.jobs.prestage) following a make run writes its plan next to the
plugin's placement log: `<GMOUNT_PLACEMENT_LOG>.plan`, one "target<TAB>node" line per job
not run yet. This module only reads it: gmount-sh imports it once per recipe.
"""

from __future__ import annotations


def plan_path(log_path: str) -> str:
    return log_path + ".plan"


def planned_node(target: str, log_path: str | None) -> str | None:
    """The planned node of `target`, or None (no prestager, no plan for it, or the plan unreadable)."""
    if not log_path or not target:
        return None
    try:
        with open(plan_path(log_path), encoding="utf-8", errors="surrogateescape") as f:
            for line in f:
                name, sep, node = line.rstrip("\n").rpartition("\t")
                if sep and name == target:
                    return node or None
    except OSError:
        return None
    return None
