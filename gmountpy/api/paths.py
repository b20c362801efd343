"""Path resolution: from a path a user gives to (namespace path, node to ask)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Union

from .results import Node, _normalize
from .view import ClusterView

PathLike = Union[str, "os.PathLike[str]"]


def as_list(paths: PathLike | Iterable[PathLike]) -> list[PathLike]:
    if isinstance(paths, (str, os.PathLike)):
        return [paths]
    result = list(paths)
    for p in result:
        if not isinstance(p, (str, os.PathLike)):
            raise TypeError(f"paths must be strings or path objects, got {p!r}")
    return result


class Paths:
    """Namespace paths and paths inside a node's mount, seen from the cluster's home node (see the api module doc)."""

    def __init__(self, view: ClusterView) -> None:
        self._view = view

    def resolve(self, path: PathLike, from_node: str | Node | None) -> tuple[str, str]:
        """(namespace path, node to ask from) for a path given by the user."""
        text = os.fspath(path)
        if not text:
            raise ValueError("empty path: give a namespace path like /data/a.csv or a path inside a mount")
        mount_node: str | None = None
        absolute = text if os.path.isabs(text) else None
        if absolute is None and self._view.state.node_for_path(os.getcwd()) is not None:
            absolute = os.path.join(os.getcwd(), text)
        ns_path = _normalize(text)
        if absolute is not None:
            found = self._view.state.node_for_path(absolute)
            if found is not None:
                mount_node, ns_path = found[0].name, _normalize(found[1])
        if from_node is not None:
            return ns_path, self._view.node_name(from_node)
        return ns_path, mount_node or self._view.home
