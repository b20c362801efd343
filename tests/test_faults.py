"""Faults: a node killed or hung never hangs anyone else; the rest keeps working."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from gmountpy import Cluster, GmountError, launch

from .conftest import FOUR_NODE_LINKS, FOUR_NODES, fuse_problem, local_cluster, require, wait_for

TUNING = "attr_ttl = 0.5\nnegative_ttl = 0.5\nrpc_timeout = 1.5\nconnect_timeout = 1.0"


@pytest.fixture(autouse=True)
def _needs_fuse() -> None:
    require("FUSE", fuse_problem())


def stat_errno(path: Path) -> int:
    """0 if `path` can be stat'ed through the mount, else the errno."""
    try:
        path.stat()
        return 0
    except OSError as exc:
        return exc.errno or -1


def test_killed_node_fails_fast_and_the_rest_keeps_working(tmp_path: Path) -> None:
    with local_cluster(tmp_path, "kill9", FOUR_NODES, FOUR_NODE_LINKS, TUNING) as cluster:
        for node in cluster.nodes:
            (cluster.export(node) / "shared").mkdir()
            (cluster.export(node) / "shared" / f"from-{node}.txt").write_text(node * 4_000_000)
        through = cluster.mount("n1") / "shared"
        assert sorted(os.listdir(through)) == [f"from-{n}.txt" for n in cluster.nodes]
        fd = os.open(through / "from-n3.txt", os.O_RDONLY)
        try:
            assert os.pread(fd, 4, 0) == b"n3n3"
            os.kill(cluster.state.nodes["n3"].pid, signal.SIGKILL)
            started = time.monotonic()
            with pytest.raises(OSError) as info:
                os.pread(fd, 4, 6_000_000)  # an open file on the dead node (not in the page cache)
            assert info.value.errno == errno.EIO
            assert time.monotonic() - started < 5
        finally:
            os.close(fd)
        # lookups of what only n3 held: EIO, not "no such file" (the holder is down), quickly
        assert wait_for(lambda: stat_errno(through / "from-n3.txt") == errno.EIO, timeout=5)
        # everything else still works, and listings show what is reachable
        assert (through / "from-n4.txt").read_text() == "n4" * 4_000_000
        assert sorted(os.listdir(through)) == ["from-n1.txt", "from-n2.txt", "from-n4.txt"]
        (through / "new-after-crash.txt").write_text("fine")
        status = {s.name: s.up for s in launch.status("kill9")}
        assert status == {"n1": True, "n2": True, "n3": False, "n4": True}
        # a job for the dead node says why it cannot run (before: "/ is not a directory in its mount")
        with pytest.raises(GmountError, match="n3: / in its mount .*: Transport endpoint is not connected"):
            Cluster.open("kill9").run("true", on="n3")
        # exports are never harmed by a crash
        assert (cluster.export("n3") / "shared" / "from-n3.txt").read_text() == "n3" * 4_000_000


def test_hung_node_gives_eio_within_the_rpc_timeout(tmp_path: Path) -> None:
    with local_cluster(tmp_path, "hang", FOUR_NODES, FOUR_NODE_LINKS, TUNING) as cluster:
        (cluster.export("n4") / "slow.txt").write_text("held by n4" * 1_000_000)
        (cluster.export("n2") / "fine.txt").write_text("held by n2")
        through = cluster.mount("n1")
        fd = os.open(through / "slow.txt", os.O_RDONLY)
        pid = cluster.state.nodes["n4"].pid
        os.kill(pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(OSError) as info:
                os.pread(fd, 4, 8_000_000)
            assert info.value.errno == errno.EIO
            assert time.monotonic() - started < 1.5 + 2.0
            time.sleep(0.6)  # let cached locations expire
            started = time.monotonic()
            assert (through / "fine.txt").read_text() == "held by n2"
            assert sorted(os.listdir(through)) == ["fine.txt"]  # n4 is skipped, not waited for
            assert time.monotonic() - started < 5
        finally:
            os.kill(pid, signal.SIGCONT)
            os.close(fd)
        # once it answers again it comes back (after the retry interval)
        assert wait_for(lambda: stat_errno(through / "slow.txt") == 0, timeout=8)


def test_up_again_restarts_a_crashed_node_and_its_files_reappear(tmp_path: Path) -> None:
    with local_cluster(tmp_path, "heal", FOUR_NODES, FOUR_NODE_LINKS, TUNING) as cluster:
        (cluster.export("n3") / "on-n3.txt").write_text("back again")
        through = cluster.mount("n1") / "on-n3.txt"
        assert through.read_text() == "back again"
        old_pid = cluster.state.nodes["n3"].pid
        os.kill(old_pid, signal.SIGKILL)
        assert wait_for(lambda: stat_errno(through) == errno.EIO, timeout=5)  # its holder is down
        healed = launch.up(cluster.spec)  # restarts only the dead node
        assert healed.nodes["n3"].pid != old_pid
        assert healed.nodes["n1"].pid == cluster.state.nodes["n1"].pid
        assert all(s.up for s in launch.status("heal"))
        assert wait_for(lambda: through.exists() and through.read_text() == "back again", timeout=5)
        (cluster.mount("n3") / "written-after.txt").write_text("n3 serves again")
        assert wait_for(lambda: (cluster.mount("n2") / "written-after.txt").exists(), timeout=5)


def test_an_open_file_whose_connection_broke_fails_with_eio_and_never_reaches_another_file(tmp_path: Path) -> None:
    """A holder lets go of the handles of a connection that closes: an open file through that connection
    is dead (as on a node that died) and says so with EIO. Its handle number is given again on the next
    connection, to the next file opened: a read or write on the dead file must never reach that one."""
    if shutil.which("ss") is None:
        pytest.fail("ss (iproute2) is needed to close the daemons' connections")
    with local_cluster(tmp_path, "connkill", FOUR_NODES, FOUR_NODE_LINKS, TUNING) as cluster:
        (cluster.export("n2") / "first.bin").write_bytes(b"x" * 4_000_000)
        (cluster.export("n2") / "second.bin").write_bytes(b"s" * 4_000_000)
        cluster.rescan("n2")
        first = os.open(cluster.mount("n1") / "first.bin", os.O_RDWR)  # handle 1 of n1's connection to n2
        try:
            assert os.pread(first, 4, 0) == b"xxxx"
            record = cluster.state.nodes["n2"]
            killed = subprocess.run(["ss", "-K", "-t", "dst", record.host, "dport", "=", f":{record.port}"],
                                    capture_output=True, text=True)
            assert killed.returncode == 0 and "ESTAB" in killed.stdout, killed.stdout + killed.stderr
            time.sleep(2.5)  # past the 2 s the broken connection marks n2 down: the next request reconnects
            second = os.open(cluster.mount("n1") / "second.bin", os.O_RDWR)  # handle 1 of the new connection
            try:
                for attempt in (lambda: os.pread(first, 4, 3_000_000), lambda: os.pwrite(first, b"OOPS", 0)):
                    with pytest.raises(OSError) as info:  # before: second.bin's bytes, and a write into it
                        attempt()
                    assert info.value.errno == errno.EIO, info.value
                assert os.pread(second, 4, 0) == b"ssss"
            finally:
                os.close(second)
        finally:
            os.close(first)
        assert (cluster.export("n2") / "second.bin").read_bytes() == b"s" * 4_000_000
        assert (cluster.mount("n1") / "first.bin").read_bytes() == b"x" * 4_000_000
