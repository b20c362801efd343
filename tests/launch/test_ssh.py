"""The SSH launcher against a real OpenSSH sshd on loopback: up, the mounts, status, down, failures.

Every node is reached through the test sshd (tests/launch/conftest.py) and
runs on this machine, so the tests can look at exports, mounts and pids
directly. Whatever a test starts is stopped by pid at its end, also when it
fails.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from click.testing import CliRunner

from gmountpy import launch
from gmountpy import state as state_store
from gmountpy.cli import main as cli_main
from gmountpy.config import ClusterSpec, load_spec
from gmountpy.launch.orchestrate import LaunchError, pid_is_daemon
from gmountpy.state import ClusterState

from ..conftest import FOUR_NODE_LINKS, FOUR_NODES, force_cleanup, wait_for
from .conftest import Sshd, marked_pids, mounts_under


def daemon_pids(sshd: Sshd) -> list[int]:
    """Node daemons started through the test sshd that are still running."""
    return [pid for pid in marked_pids(sshd.marker) if pid_is_daemon(pid)]


def assert_nothing_left(sshd: Sshd, base: Path) -> None:
    """No daemon (nor any other process) started through sshd still runs, nothing is mounted under base."""
    assert wait_for(lambda: not daemon_pids(sshd), timeout=10), f"daemons left: {daemon_pids(sshd)}"
    assert wait_for(lambda: not marked_pids(sshd.marker), timeout=10), \
        f"processes left: {[(p, _cmdline(p)) for p in marked_pids(sshd.marker)]}"
    assert mounts_under(base) == []


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "?"


@contextmanager
def cleanup(sshd: Sshd, spec: ClusterSpec) -> Iterator[None]:
    """Whatever happens in the block, leave no daemon, mount or state behind."""
    try:
        yield
    finally:
        state: ClusterState | None = state_store.load(spec.name)
        try:
            launch.down(spec.name, forget=True)
        except Exception:
            pass
        force_cleanup(spec, state)
        for pid in daemon_pids(sshd):
            os.kill(pid, 9)
        for node in spec.nodes.values():
            if node.mountpoint in mounts_under(Path(node.mountpoint).parent.parent):
                subprocess.run(["fusermount3", "-u", "-z", node.mountpoint], capture_output=True)
        state_store.remove(spec.name)


# --- the happy path ---------------------------------------------------------------------


def test_four_nodes_two_sites_up_mounts_status_down(sshd: Sshd, tmp_path: Path) -> None:
    path = sshd.cluster_file(tmp_path, "ssh4", FOUR_NODES, FOUR_NODE_LINKS, distinct_addresses=True,
                             tuning={"attr_ttl": 0.5, "negative_ttl": 0.5})
    spec = load_spec(path)
    seen: dict[str, list[str]] = {}
    with cleanup(sshd, spec):
        started = time.monotonic()
        state = launch.up(spec, progress=lambda node, what: seen.setdefault(node, []).append(what))
        up_seconds = time.monotonic() - started
        assert set(state.nodes) == {"n1", "n2", "n3", "n4"}
        for name, record in state.nodes.items():
            assert seen[name][-1] == "ready", seen[name]
            assert "checking" in seen[name]
            assert record.ssh == spec.node(name).host
            assert record.host == spec.node(name).listen  # each node its own loopback address
            assert pid_is_daemon(record.pid)
            assert os.path.ismount(record.mountpoint)
        assert sorted(daemon_pids(sshd)) == sorted(r.pid for r in state.nodes.values())

        data = os.urandom(200_000)
        (tmp_path / "n3" / "export" / "from-n3").mkdir()
        (tmp_path / "n3" / "export" / "from-n3" / "data.bin").write_bytes(data)
        assert (tmp_path / "n1" / "mnt" / "from-n3" / "data.bin").read_bytes() == data
        (tmp_path / "n1" / "mnt" / "made-on-n1.txt").write_text("hello from n1")
        assert (tmp_path / "n1" / "export" / "made-on-n1.txt").read_text() == "hello from n1"
        assert not (tmp_path / "n3" / "export" / "made-on-n1.txt").exists()
        assert wait_for(lambda: (tmp_path / "n4" / "mnt" / "made-on-n1.txt").exists())

        statuses = launch.status("ssh4")
        assert [s.name for s in statuses] == ["n1", "n2", "n3", "n4"]
        assert all(s.up for s in statuses), statuses
        # from another process, as from another shell: the per-user state file is enough
        other = subprocess.run([sys.executable, "-m", "gmountpy", "status", str(path)],
                               capture_output=True, text=True, env=os.environ.copy(), timeout=60)
        assert other.returncode == 0, other.stdout + other.stderr
        assert other.stdout.count(" up") >= 4

        started = time.monotonic()
        assert launch.down("ssh4") == {}
        down_seconds = time.monotonic() - started
        assert_nothing_left(sshd, tmp_path)
        assert state_store.load("ssh4") is None
        assert launch.down("ssh4") == {}  # twice is fine
        # exports untouched
        assert (tmp_path / "n1" / "export" / "made-on-n1.txt").read_text() == "hello from n1"
        assert (tmp_path / "n3" / "export" / "from-n3" / "data.bin").read_bytes() == data
        print(f"\nssh launch, 4 nodes: up {up_seconds:.2f}s, down {down_seconds:.2f}s")
