"""What a launcher shares with the daemons it starts, without importing the daemon (FUSE, trio).

The prefix of the daemon's startup lines on stdout (see daemon.py for the
line protocol), and where a node keeps its log, its replica table and the notes
of its puts in progress on the machine it runs on.
"""

from __future__ import annotations

import os

#: Every startup line the daemon writes begins with it: `GMOUNT <KIND> <json or message>`.
LINE_PREFIX = "GMOUNT"


def _state_base() -> str:
    return os.path.join(os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state"), "gmountpy")


def default_log_path(cluster: str, node: str) -> str:
    return os.path.join(_state_base(), "logs", f"{cluster}-{node}.log")


def replica_table_path(cluster: str, node: str) -> str:
    return os.path.join(_state_base(), "replicas", f"{cluster}-{node}.json")


def put_journal_path(cluster: str, node: str) -> str:
    """The directory of the notes of a node's puts in progress (node/puts.py)."""
    return os.path.join(_state_base(), "puts", f"{cluster}-{node}")
