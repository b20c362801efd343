"""`gmount up` after a node's daemon died: it restarts just that node, never lets a writer put
files into the bare directory under its mountpoint, and says exactly what runs when it fails."""

from __future__ import annotations

import contextlib
import ctypes
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
from gmountpy.cluster import state as cluster_state
from gmountpy.launch import local, remote
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


@contextlib.contextmanager
def fusectl() -> Iterator[None]:
    """The FUSE control file system mounted (as systemd mounts it at boot), for the block."""
    mounted = subprocess.run(["mountpoint", "-q", local.FUSECTL]).returncode == 0
    if not mounted:
        subprocess.run(["mount", "-t", "fusectl", "fusectl", local.FUSECTL], check=True)
    try:
        yield
    finally:
        if not mounted:
            subprocess.run(["umount", local.FUSECTL], check=True)


def _hold_fuse_fd(pid: int) -> int:
    """A copy, in this process, of daemon `pid`'s /dev/fuse descriptor (pidfd_getfd; needs root)."""
    fd_dir = f"/proc/{pid}/fd"
    target = next(int(fd) for fd in os.listdir(fd_dir) if os.readlink(f"{fd_dir}/{fd}") == "/dev/fuse")
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    try:
        held = libc.syscall(438, pidfd, target, 0)  # SYS_pidfd_getfd on x86_64
    finally:
        os.close(pidfd)
    if held < 0:
        raise OSError(ctypes.get_errno(), "pidfd_getfd")
    return int(held)


@pytest.mark.parametrize("how", ["gmount up", "daemons.sh"])
def test_up_after_a_crash_frees_the_processes_stuck_in_the_dead_mount(cluster: LocalCluster, how: str) -> None:
    """A daemon killed while one of its threads waited in the kernel never finishes exiting: its
    /dev/fuse stays open and every process in its mount waits forever (seen in the soak). Held open
    here by a copy of the descriptor: `gmount up` (local nodes) and the shell functions SSH nodes
    stop daemons with must abort that connection, not only detach it."""
    require("root (pidfd_getfd of the daemon's /dev/fuse)", None if os.geteuid() == 0 else "needs root")
    daemon = cluster.state.nodes["n2"].pid
    held = _hold_fuse_fd(daemon)
    stuck: subprocess.Popen[bytes] | None = None
    try:
        os.kill(daemon, signal.SIGKILL)
        assert wait_for(lambda: not pid_is_daemon(daemon), timeout=10)
        stuck = subprocess.Popen(["ls", str(cluster.mount("n2"))], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE)
        with pytest.raises(subprocess.TimeoutExpired):
            stuck.wait(1.0)  # nobody answers the connection, and nobody will
        if how == "daemons.sh":
            mountpoint = str(cluster.mount("n2"))
            with fusectl():
                subprocess.run(["sh", "-c", remote.text("daemons.sh") + f"\nunmount n2 {mountpoint} {mountpoint}\n"],
                               check=True, timeout=30)
        launch.up(cluster.spec)
        assert stuck.wait(10) != 0  # its request ended (ENOTCONN) instead of waiting forever
        restarted = cluster_state.load(cluster.spec.name)
        assert restarted is not None and pid_is_daemon(restarted.nodes["n2"].pid)
        (cluster.mount("n1") / "after.txt").write_text("back\n")
        assert wait_for(lambda: (cluster.mount("n2") / "after.txt").exists(), timeout=10)
    finally:
        if stuck is not None and stuck.poll() is None:
            stuck.kill()
            stuck.wait()
        if stuck is not None and stuck.stderr is not None:
            stuck.stderr.close()
        os.close(held)
