"""Small helpers shared by subcommands."""

from __future__ import annotations

from rich.console import Console

from .. import state as state_store
from ..config import ClusterSpec, load_spec
from ..errors import GmountError
from ..state import ClusterState

console = Console()
err_console = Console(stderr=True)


def spec_from(path: str) -> ClusterSpec:
    return load_spec(path)


def running_state(name: str) -> ClusterState:
    state = state_store.load(name)
    if state is None:
        raise GmountError(f"cluster {name!r} is not running: start it with `gmount up CLUSTER.toml`")
    return state
