"""Programs the SSH launcher runs on a node, shipped as files so they are linted and tested on their own.

`preflight.py` (any Python 3) checks a node before anything starts, `rtt.py` times TCP
connects for `gmount probe`, and `daemons.sh` (POSIX sh) holds the functions that stop and
inspect daemons without needing Python. The launcher sends each on the stdin of an SSH
exec channel: nothing is installed on the node beyond gmountpy itself.
"""

from __future__ import annotations

from importlib.resources import files

__all__ = ["text"]


def text(name: str) -> str:
    """The source of one of the programs above (e.g. "preflight.py")."""
    return files(__name__).joinpath(name).read_text(encoding="utf-8")
