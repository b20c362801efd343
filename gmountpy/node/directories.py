"""The front door for a node's directories: refuse a missing export or a busy mountpoint.

Used by the daemon before it mounts, and by the local launcher before it
starts anything (no FUSE import here, so the launcher stays light).
"""

from __future__ import annotations

import errno
import os

from ..cluster.config import NodeSpec


def directory_problems(node: NodeSpec) -> list[str]:
    """What is wrong with a node's export and mountpoint on this machine, one line each.

    A missing export is refused unless `create_export` is set: a typo in the
    cluster file must not quietly export a new, empty directory while the
    user's data sits elsewhere. A mountpoint must be an empty directory (or
    not exist yet: it is made).
    """
    problems = []
    export, mountpoint = node.export, node.mountpoint
    if not os.path.lexists(export):
        if not node.create_export:
            problems.append(f"export {export} does not exist: create it, fix `export` in the "
                            "cluster file, or set create_export = true to have it made")
    elif not os.path.isdir(export):
        problems.append(f"export {export} is not a directory")
    elif not os.access(export, os.R_OK | os.X_OK):
        problems.append(f"export {export} is not readable by this user")
    try:
        if os.path.lexists(mountpoint) and not os.path.ismount(mountpoint):
            if not os.path.isdir(mountpoint):
                problems.append(f"mountpoint {mountpoint} exists and is not a directory: "
                                "choose an empty directory")
            elif os.listdir(mountpoint):
                problems.append(f"mountpoint {mountpoint} is not empty: choose an empty "
                                "directory")
    except OSError as exc:
        if exc.errno != errno.ENOTCONN:  # a stale mount is reported (with its remedy) by _prepare_dirs
            problems.append(f"mountpoint {mountpoint} is not usable ({exc.strerror})")
    return problems
