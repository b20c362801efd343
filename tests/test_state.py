"""The one resolver from what a user types to a running cluster (gmountpy.cluster.state.resolve)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gmountpy.api import Cluster
from gmountpy.cluster import state as state_store
from gmountpy.cluster.config import load_spec
from gmountpy.cluster.state import ClusterState, NodeRecord, resolve
from gmountpy.errors import GmountError


def cluster_file(base: Path, name: str) -> Path:
    base.mkdir(parents=True, exist_ok=True)
    lines = [f'name = "{name}"', 'launcher = "local"', "[defaults]", f'export = "{base}/{{node}}/export"',
             f'mountpoint = "{base}/{{node}}/mnt"', "[sites.s]", 'nodes = ["a", "b"]']
    path = base / "cluster.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def record_running(base: Path, name: str) -> ClusterState:
    """What `gmount up` leaves in the state directory for a local cluster (no daemon is needed to resolve)."""
    spec = load_spec(str(cluster_file(base, name)))
    nodes = {n: NodeRecord(n, "s", 0, "127.0.0.1", 1, s.mountpoint, s.export, "") for n, s in spec.nodes.items()}
    state = ClusterState(spec, nodes, 0.0)
    state_store.save(state, b"k" * 32)
    return state


@pytest.fixture(autouse=True)
def empty_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


def test_each_way_of_naming_a_running_cluster(tmp_path: Path) -> None:
    record_running(tmp_path / "one", "one")
    two = record_running(tmp_path / "two", "two")
    mount_b = two.nodes["b"].mountpoint

    assert resolve("two") == resolve(tmp_path / "two" / "cluster.toml")
    found = resolve("two")
    assert (found.state.name, found.node, found.path) == ("two", None, "/")

    inside = resolve(f"{mount_b}/data/a.csv")
    assert (inside.state.name, inside.node, inside.path) == ("two", "b", "/data/a.csv")
    assert resolve(mount_b).path == "/"

    url = resolve("gmount://one/data//x/")
    assert (url.state.name, url.node, url.path) == ("one", None, "/data/x")

    by_paths = resolve(None, paths=["/not/a/mount", f"{mount_b}/in"])
    assert (by_paths.state.name, by_paths.node, by_paths.path) == ("two", "b", "/in")


def test_nothing_named_means_the_only_running_cluster(tmp_path: Path) -> None:
    record_running(tmp_path / "only", "only")
    assert resolve().state.name == "only"
    assert resolve("").state.name == "only"
    url = resolve("gmount:///data/a.csv")
    assert (url.state.name, url.path) == ("only", "/data/a.csv")


def test_nothing_named_and_not_one_running_cluster_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(GmountError, match=r"no cluster is running: start one with `gmount up CLUSTER.toml`"):
        resolve()
    record_running(tmp_path / "x", "x")
    record_running(tmp_path / "y", "y")
    with pytest.raises(GmountError, match=r"several clusters are running \(x, y\): say which"):
        resolve(None, paths=["/elsewhere"])


def test_a_cluster_file_of_a_cluster_that_is_not_running(tmp_path: Path) -> None:
    path = cluster_file(tmp_path / "stopped", "stopped")
    with pytest.raises(GmountError, match=rf"cluster 'stopped' \({path}\) is not running: start it with "
                                          rf"`gmount up {path}`"):
        resolve(path)


def test_unknown_names_list_the_running_clusters(tmp_path: Path) -> None:
    record_running(tmp_path / "live", "live")
    with pytest.raises(GmountError, match=r"'nope' is neither a running cluster's name, a cluster file, nor a path "
                                          r"inside a mount \(running clusters: live\)"):
        resolve("nope")
    with pytest.raises(GmountError, match=r"'gone \(in gmount://gone/x\)' is neither"):
        resolve("gmount://gone/x")
    with pytest.raises(GmountError, match="no cluster is running"):
        state_store.remove("live")
        resolve(tmp_path / "elsewhere")


def test_cluster_open_goes_through_the_resolver(tmp_path: Path) -> None:
    state = record_running(tmp_path / "api", "api")
    assert Cluster.open(f"{state.nodes['b'].mountpoint}/x").home == "b"
    assert Cluster.open("gmount://api/x").home == "a"
    assert Cluster.open().name == "api"


def test_remove_takes_the_mounts_copy_of_the_state_with_it(tmp_path: Path) -> None:
    from gmountpy.cluster import mounts

    record_running(tmp_path / "c", "gone")
    path = str(Path(state_store.state_dir()) / "gone.json")
    mounts.load_state(path)  # what gmount-sh does per recipe: leaves a private copy behind
    assert Path(mounts.state_cache(path)).exists()
    state_store.remove("gone")
    assert not Path(path).exists() and not Path(mounts.state_cache(path)).exists()
