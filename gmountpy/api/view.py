"""What the collaborators behind `api.Cluster` share: the cluster's state, home node and overlay."""

from __future__ import annotations

from ..cluster.config import ClusterSpec
from ..cluster.overlay import Overlay
from ..cluster.state import ClusterState
from ..errors import GmountError
from .results import Node


class ClusterView:
    """One Cluster object's view of its cluster.

    `state` is refreshed by every call (a restarted cluster has new ports);
    `home` is the node asked when a path names none (see the api module doc).
    """

    def __init__(self, state: ClusterState, home: str | None = None) -> None:
        self.state = state
        self.overlay = Overlay(state.spec)
        self.home = home if home is not None else next(iter(state.spec.nodes))
        if self.home not in state.spec.nodes:
            raise GmountError(f"unknown node {self.home!r} in cluster {state.name!r} "
                              f"(nodes: {', '.join(state.spec.nodes)})")

    @property
    def name(self) -> str:
        return self.state.name

    @property
    def spec(self) -> ClusterSpec:
        return self.state.spec

    def node_name(self, node: str | Node) -> str:
        name = node.name if isinstance(node, Node) else node
        if name not in self.state.spec.nodes:
            raise GmountError(f"unknown node {name!r} in cluster {self.name!r} "
                              f"(nodes: {', '.join(self.state.spec.nodes)})")
        return name

    def is_ssh(self, node: str) -> bool:
        record = self.state.nodes.get(node)
        return self.state.spec.launcher == "ssh" or (record is not None and record.ssh is not None)
