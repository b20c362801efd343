"""What the launcher remembers about running clusters, per user.

`gmount status` and `gmount down` must work from another shell or a later
login, so `up` writes one JSON file per cluster (nodes, addresses, pids).
The cluster secret lives in a separate file beside it, mode 0600, so the
state file itself never holds it.

`resolve` is the one way from what a user types (a cluster's name, its
cluster file, a path inside a mount, a `gmount://` URL, or nothing) to a
running cluster; the API, the CLI, fsspec and the plugins all go through it.
"""

from __future__ import annotations

import json
import os
import posixpath
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from ..errors import GmountError
from . import mounts
from .config import ClusterSpec, load_spec


def state_dir() -> str:
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return os.path.join(base, "gmountpy", "clusters")


@dataclass(frozen=True)
class NodeRecord:
    """A running daemon as the launcher started it."""

    name: str
    site: str
    pid: int
    host: str          # address peers and clients connect to
    port: int
    mountpoint: str
    export: str
    log: str
    ssh: str | None = None


@dataclass(frozen=True)
class ClusterState:
    spec: ClusterSpec
    nodes: dict[str, NodeRecord]
    started: float

    @property
    def name(self) -> str:
        return self.spec.name

    def to_dict(self) -> dict[str, Any]:
        return {"spec": self.spec.to_dict(), "started": self.started,
                "nodes": {name: asdict(record) for name, record in self.nodes.items()}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ClusterState:
        return cls(ClusterSpec.from_dict(data["spec"]),
                   {name: NodeRecord(**record) for name, record in data["nodes"].items()},
                   float(data["started"]))

    def node_for_path(self, path: str) -> tuple[NodeRecord, str] | None:
        """The node whose mount contains `path`, and the path inside the namespace."""
        real = os.path.abspath(path)
        for record in self.nodes.values():
            if record.ssh is not None and not os.path.ismount(record.mountpoint):
                continue  # a remote node's mountpoint: that path is not on this machine
            mount = record.mountpoint.rstrip("/")
            if real == mount:
                return record, "/"
            if real.startswith(mount + "/"):
                return record, real[len(mount):]
        return None


def _write_private(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def save(state: ClusterState, secret: bytes) -> None:
    base = os.path.join(state_dir(), state.name)
    _write_private(base + ".secret", secret.hex().encode())
    _write_private(base + ".json", json.dumps(state.to_dict(), indent=2).encode())


def load(name: str) -> ClusterState | None:
    try:
        with open(os.path.join(state_dir(), name + ".json")) as f:
            return ClusterState.from_dict(json.load(f))
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as exc:
        raise GmountError(f"state file of cluster {name!r} is damaged ({exc}); "
                          f"remove {os.path.join(state_dir(), name + '.json')} after checking no daemon runs") from None


def load_secret(name: str) -> bytes:
    path = os.path.join(state_dir(), name + ".secret")
    try:
        with open(path) as f:
            return bytes.fromhex(f.read().strip())
    except FileNotFoundError:
        raise GmountError(f"no secret for cluster {name!r} at {path}: was it started by this user?") from None


def save_tls(name: str, ca_pem: str, nodes: dict[str, dict[str, str]], ca_key: str | None = None,
             client: dict[str, str] | None = None) -> None:
    """The cluster CA (public) and each node's key and certificate (private: reused when a node restarts).

    With `ca_key` the CA's key is kept too, so `gmount up` can reissue expiring node certificates
    and clients can make their own. Where the CA key must not go (a remote node running code of
    the user's, e.g. Dask), `client` keeps one client certificate instead ({"name", "cert", "key"}).
    """
    data: dict[str, Any] = {"ca": ca_pem, "nodes": nodes}
    if ca_key is not None:
        data["ca_key"] = ca_key
    if client is not None:
        data["client"] = client
    _write_private(os.path.join(state_dir(), name + ".tls.json"), json.dumps(data).encode())


def load_tls_client(name: str) -> tuple[str, str, str] | None:
    """The client certificate kept by save_tls: (the name it was made for, certificate, key), or None."""
    try:
        with open(os.path.join(state_dir(), name + ".tls.json")) as f:
            client = json.load(f).get("client")
        return (client["name"], client["cert"], client["key"]) if isinstance(client, dict) else None
    except (FileNotFoundError, ValueError, AttributeError, KeyError):
        return None


def load_tls_ca_key(name: str) -> str | None:
    """The CA key kept by save_tls, or None (a cluster started before keys were kept)."""
    try:
        with open(os.path.join(state_dir(), name + ".tls.json")) as f:
            key = json.load(f).get("ca_key")
        return key if isinstance(key, str) else None
    except (FileNotFoundError, ValueError, AttributeError):
        return None


def load_tls(name: str) -> tuple[str, dict[str, dict[str, str]]]:
    path = os.path.join(state_dir(), name + ".tls.json")
    try:
        with open(path) as f:
            data = json.load(f)
        return data["ca"], data["nodes"]
    except (FileNotFoundError, ValueError, KeyError) as exc:
        raise GmountError(f"cluster {name!r} uses TLS but {path} is missing or damaged ({exc}): "
                          "run `gmount down` and `gmount up` again") from None


def remove(name: str) -> None:
    paths = [os.path.join(state_dir(), name + suffix) for suffix in (".json", ".secret", ".tls.json")]
    for path in [*paths, mounts.state_cache(paths[0])]:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def all_states() -> list[ClusterState]:
    try:
        names = sorted(f[:-5] for f in os.listdir(state_dir()) if f.endswith(".json"))
    except FileNotFoundError:
        return []
    states = []
    for name in names:
        state = load(name)
        if state is not None:
            states.append(state)
    return states


# --------------------------------------------------------------------------- which cluster a user means

URL_PREFIX = "gmount://"


@dataclass(frozen=True)
class Resolved:
    """A running cluster as a user named it.

    `node` is the node whose mount the given path is in (None when the name
    did not point into a mount); `path` is the place in the namespace ("/"
    for a cluster name or file).
    """

    state: ClusterState
    node: str | None
    path: str


def find_by_path(path: str) -> Resolved | None:
    """The running cluster, node and namespace path of a path inside a mount on this machine, or None."""
    for state in all_states():
        found = state.node_for_path(path)
        if found is not None:
            return Resolved(state, found[0].name, found[1])
    return None


def resolve(target: str | os.PathLike[str] | None = None, *, paths: Iterable[str] = ()) -> Resolved:
    """The running cluster `target` names: the one resolver from what a user types to a cluster.

    `target` may be
    - a running cluster's name (`demo`);
    - a path inside a node's mount on this machine (that node, and the path in the namespace);
    - a cluster file (`cluster.toml`), whose cluster must be running;
    - a URL `gmount://demo/data/a.csv` (cluster `demo`, path `/data/a.csv`);
      `gmount:///data/a.csv` names no cluster: as None;
    - None or "": the cluster whose mount holds the first of `paths` that is
      in one (pass `os.getcwd()` among them to count the working directory),
      else the only running cluster.
    A GmountError says what would work when it names none.
    """
    text = os.fspath(target) if target is not None else ""
    path = "/"
    if text.startswith(URL_PREFIX):
        host, _, rest = text[len(URL_PREFIX):].partition("/")
        path = posixpath.normpath("/" + rest)
        if host:
            return Resolved(_named(host, text), None, path)
        text = ""
    if not text:
        for candidate in paths:
            found = find_by_path(os.path.abspath(candidate))
            if found is not None:
                return found
        running = all_states()
        if len(running) == 1:
            return Resolved(running[0], None, path)
        if not running:
            raise GmountError("no cluster is running: start one with `gmount up CLUSTER.toml`")
        raise GmountError(f"several clusters are running ({', '.join(s.name for s in running)}): say which, by "
                          "its name, its cluster file or a path inside its mount")
    if "/" not in text:
        named = load(text)
        if named is not None:
            return Resolved(named, None, path)
    found = find_by_path(text)
    if found is not None:
        return found
    if os.path.isfile(text):
        return Resolved(_running_from_file(text), None, path)
    raise GmountError(_unknown(text))


def _named(name: str, given: str) -> ClusterState:
    state = load(name)
    if state is None:
        raise GmountError(_unknown(name if name == given else f"{name} (in {given})"))
    return state


def _running_from_file(path: str) -> ClusterState:
    spec = load_spec(path)
    state = load(spec.name)
    if state is None:
        raise GmountError(f"cluster {spec.name!r} ({path}) is not running: start it with `gmount up {path}`")
    return state


def _unknown(text: str) -> str:
    running = [s.name for s in all_states()]
    hint = f"running clusters: {', '.join(running)}" if running else "no cluster is running"
    return f"{text!r} is neither a running cluster's name, a cluster file, nor a path inside a mount ({hint})"
