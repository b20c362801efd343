"""`gmount up` after a node's daemon died: it restarts just that node, never lets a writer put
files into the bare directory under its mountpoint, and says exactly what runs when it fails."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from gmountpy import launch
from gmountpy.launch.orchestrate import LaunchError, pid_is_daemon

from ..conftest import LocalCluster, fuse_problem, local_cluster, require, wait_for

NODES = {"a": ["n1", "n2"], "b": ["n3"]}
LINKS = [("a", "b", 5.0)]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    require("FUSE", fuse_problem())
    with local_cluster(tmp_path, f"restart-{os.getpid()}", NODES, LINKS) as running:
        yield running


class Writer:
    """Creates files in a directory as fast as it can, in a thread; counts what it was told."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.written: list[str] = []
        self.errors: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Writer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            name = f"w{n}"
            try:
                with open(self.directory / name, "w") as f:
                    f.write(name)
            except OSError as exc:
                self.errors[errno.errorcode.get(exc.errno or 0, str(exc.errno))] += 1
                self._stop.wait(0.001)
                continue
            self.written.append(name)


def under_the_mount(mountpoint: Path) -> list[str]:
    """What the bare directory under `mountpoint` holds (looked at once nothing is mounted there)."""
    assert not os.path.ismount(mountpoint)
    return sorted(os.listdir(mountpoint))


def test_up_after_a_crash_never_exposes_a_writable_mountpoint(cluster: LocalCluster) -> None:
    mountpoint = cluster.mount("n3")
    old = cluster.state.nodes["n3"].pid
    os.kill(old, signal.SIGKILL)
    assert wait_for(lambda: not pid_is_daemon(old))
    with Writer(mountpoint) as writer:
        assert wait_for(lambda: writer.errors.total() > 20)  # the dead mount refuses (ENOTCONN)
        healed = launch.up(cluster.spec)  # clears the dead mount, starts n3 again
        assert wait_for(lambda: len(writer.written) > 20, timeout=10)  # through the new mount
    assert healed.nodes["n3"].pid != old and healed.nodes["n1"].pid == cluster.state.nodes["n1"].pid
    # ECONNABORTED: a write in flight when the kernel dropped the dead connection (docs/failures.md)
    assert set(writer.errors) <= {"ENOTCONN", "ECONNABORTED", "EACCES", "EPERM", "EIO"}, writer.errors
    # every write that succeeded went through the new mount into n3's export
    assert [name for name in writer.written if not (cluster.export("n3") / name).is_file()] == []
    launch.down(cluster.spec.name)
    assert under_the_mount(mountpoint) == []  # nothing landed on the disk under the mountpoint
    (mountpoint / "after-down").write_text("an ordinary directory again")  # unsealed by `down`
    (mountpoint / "after-down").unlink()


def test_a_dead_nodes_bare_mountpoint_takes_no_files_until_its_node_is_back(cluster: LocalCluster) -> None:
    mountpoint = cluster.mount("n3")
    os.kill(cluster.state.nodes["n3"].pid, signal.SIGKILL)
    assert wait_for(lambda: not pid_is_daemon(cluster.state.nodes["n3"].pid))
    subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], check=True)  # the dead mount, cleared by hand
    with pytest.raises(OSError) as info:
        (mountpoint / "lost").write_text("would be hidden by the next mount")
    assert info.value.errno in (errno.EACCES, errno.EPERM)
    if os.geteuid() != 0:  # a user's own process: the write bits are off
        assert os.stat(mountpoint).st_mode & 0o222 == 0
    launch.up(cluster.spec)
    (mountpoint / "back").write_text("through the mount")
    assert (cluster.export("n3") / "back").read_text() == "through the mount"


def test_a_failed_restart_says_which_nodes_still_run(cluster: LocalCluster, tmp_path: Path) -> None:
    os.kill(cluster.state.nodes["n3"].pid, signal.SIGKILL)
    assert wait_for(lambda: not pid_is_daemon(cluster.state.nodes["n3"].pid))
    export = cluster.export("n3")
    export.rename(tmp_path / "n3-export-elsewhere")  # n3 cannot start again: its export is missing
    try:
        with pytest.raises(LaunchError) as info:
            launch.up(cluster.spec)
        assert info.value.restarting and list(info.value.failures) == ["n3"]
        assert info.value.running is not None and list(info.value.running.nodes) == ["n1", "n2"]
        assert "failed to restart" in str(info.value) and "still running, as before: n1, n2" in str(info.value)
        assert all(pid_is_daemon(cluster.state.nodes[n].pid) for n in ("n1", "n2"))
        with pytest.raises(OSError):  # n3's mountpoint stays unwritable meanwhile
            (cluster.mount("n3") / "lost").write_text("x")

        cli = subprocess.run([sys.executable, "-m", "gmountpy", "up", str(cluster.base / "cluster.toml")],
                             capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
        assert cli.returncode == 1
        assert "n3 failed to restart; n1, n2 still run, as before" in cli.stderr, cli.stderr
        assert "nothing was left running" not in cli.stderr
        assert "does not exist" in cli.stderr  # why n3 failed
        assert {s.name: s.up for s in launch.status(cluster.spec.name)} == {"n1": True, "n2": True, "n3": False}
    finally:
        (tmp_path / "n3-export-elsewhere").rename(export)
    healed = launch.up(cluster.spec)  # the retry the message offers
    assert all(s.up for s in launch.status(cluster.spec.name)) and set(healed.nodes) == {"n1", "n2", "n3"}
