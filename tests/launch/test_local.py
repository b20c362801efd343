"""The local launcher: up, status, down, crash handling, logs, state -- for real."""

from __future__ import annotations

import os
import signal
import stat
import time
from pathlib import Path

import pytest

from gmountpy import launch
from gmountpy.cluster import state as state_store
from gmountpy.errors import GmountError
from gmountpy.launch.orchestrate import LaunchError, pid_is_daemon

from ..conftest import FOUR_NODE_LINKS, FOUR_NODES, fuse_problem, local_cluster, require


def mounted(path: Path) -> bool:
    with open("/proc/self/mounts") as f:
        return any(line.split(" ")[1] == str(path) for line in f)


@pytest.fixture(autouse=True)
def _needs_fuse() -> None:
    require("FUSE", fuse_problem())


def test_up_status_down_lifecycle(tmp_path: Path) -> None:
    with local_cluster(tmp_path, "life", FOUR_NODES, FOUR_NODE_LINKS) as cluster:
        statuses = launch.status("life")
        assert [s.name for s in statuses] == ["n1", "n2", "n3", "n4"]
        assert all(s.up for s in statuses)
        assert [s.site for s in statuses] == ["tsukuba", "tsukuba", "hongo", "hongo"]
        pids = [s.pid for s in statuses]
        assert all(pid_is_daemon(p) for p in pids)
        # per-node logs, readable by the user only; state file and secret private too
        for record in cluster.state.nodes.values():
            assert stat.S_IMODE(os.stat(record.log).st_mode) == 0o600
        state_file = Path(state_store.state_dir()) / "life.json"
        assert stat.S_IMODE(state_file.stat().st_mode) == 0o600
        secret = state_store.load_secret("life").hex()
        assert secret not in state_file.read_text()
        for record in cluster.state.nodes.values():
            assert secret not in Path(record.log).read_text()
            assert record.host == "127.0.0.1"  # bound to the configured address only, not 0.0.0.0
            # nor in any daemon's argv or environment, which other users of the machine can read
            assert secret not in Path(f"/proc/{record.pid}/cmdline").read_bytes().decode(errors="replace")
            assert secret not in Path(f"/proc/{record.pid}/environ").read_bytes().decode(errors="replace")
        with pytest.raises(GmountError, match="already up"):
            launch.up(cluster.spec)
        (cluster.mount("n2") / "kept.txt").write_text("still here after down")
        launch.down("life")
        assert not any(pid_is_daemon(p) for p in pids)
        assert not any(mounted(cluster.mount(n)) for n in cluster.nodes)
        assert (cluster.export("n2") / "kept.txt").read_text() == "still here after down"
        assert launch.down("life") == {}  # safe to run twice
        with pytest.raises(GmountError, match="not running"):
            launch.status("life")


def test_sigterm_unmounts_and_status_shows_the_node_down(tmp_path: Path) -> None:
    with local_cluster(tmp_path, "term", FOUR_NODES, FOUR_NODE_LINKS) as cluster:
        victim = cluster.state.nodes["n3"]
        os.kill(victim.pid, signal.SIGTERM)
        deadline = time.monotonic() + 30  # a loaded machine: the unmount and exit can take seconds
        while pid_is_daemon(victim.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not pid_is_daemon(victim.pid)
        assert not mounted(cluster.mount("n3"))
        by_name = {s.name: s for s in launch.status("term")}
        assert not by_name["n3"].up and by_name["n1"].up


def test_a_node_that_cannot_start_stops_the_others(tmp_path: Path) -> None:
    busy = tmp_path / "n2" / "mnt"
    busy.mkdir(parents=True)
    (busy / "in-the-way").write_text("x")  # a non-empty mountpoint is refused
    with pytest.raises(LaunchError) as info, local_cluster(tmp_path, "fail", FOUR_NODES, FOUR_NODE_LINKS):
        pass
    assert list(info.value.failures) == ["n2"]
    assert "not empty" in info.value.failures["n2"]
    assert not any(mounted(tmp_path / n / "mnt") for n in ("n1", "n3", "n4"))
    assert state_store.load("fail") is None
