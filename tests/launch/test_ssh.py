"""The SSH launcher against a real OpenSSH sshd on loopback: up, the mounts, status, down, failures.

Every node is reached through the test sshd (tests/launch/conftest.py) and
runs on this machine, so the tests can look at exports, mounts and pids
directly. Whatever a test starts is stopped by pid at its end, also when it
fails.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from gmountpy import launch
from gmountpy.cli import main as cli_main
from gmountpy.cluster import state as state_store
from gmountpy.cluster.config import ClusterSpec, load_spec
from gmountpy.cluster.state import ClusterState
from gmountpy.errors import GmountError
from gmountpy.launch.orchestrate import LaunchError, pid_is_daemon

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


# --- failures: one clear line per node, nothing left running or mounted -----------------------


def expect_launch_error(spec: ClusterSpec, **kwargs: object) -> LaunchError:
    with pytest.raises(LaunchError) as info:
        launch.up(spec, **kwargs)  # type: ignore[arg-type]
    return info.value


def test_unreachable_host_fails_before_anything_starts(sshd: Sshd, tmp_path: Path) -> None:
    closed = free_closed_port()
    spec = load_spec(sshd.cluster_file(tmp_path, "ssh-unreach", FOUR_NODES, FOUR_NODE_LINKS,
                                       nodes={"n3": {"ssh_port": closed}}))
    with cleanup(sshd, spec):
        error = expect_launch_error(spec)
        assert list(error.failures) == ["n3"]
        assert error.failures["n3"] == (f"cannot reach {sshd.user}@127.0.0.1 port {closed}: connection refused "
                                        f"(no sshd listening there): check host and ssh_port")
        assert error.running is None
        assert "1 node(s) failed to start:\n  n3: cannot reach" in str(error)
        assert state_store.load(spec.name) is None
        assert_nothing_left(sshd, tmp_path)
        assert not (tmp_path / "n1" / "mnt").exists()  # not even the mountpoints were made


def test_wrong_key_is_refused_with_a_hint(sshd: Sshd, tmp_path: Path) -> None:
    spec = load_spec(sshd.cluster_file(tmp_path, "ssh-key", {"s": ["n1", "n2"]}, [],
                                       ssh={"identity": [str(sshd.other_key)]}))
    with cleanup(sshd, spec):
        error = expect_launch_error(spec)
        assert set(error.failures) == {"n1", "n2"}
        assert error.failures["n1"] == (
            f"authentication refused by {sshd.user}@127.0.0.1 port {sshd.port} (tried keys {sshd.other_key}): "
            f"add your public key to ~/.ssh/authorized_keys there, or name the right key with identity in [ssh]")
        assert_nothing_left(sshd, tmp_path)


def test_unknown_host_key_is_refused_unless_checking_is_switched_off(sshd: Sshd, tmp_path: Path) -> None:
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    spec = load_spec(sshd.cluster_file(tmp_path / "a", "ssh-hostkey", {"s": ["n1"]}, [],
                                       ssh={"known_hosts": str(empty)}))
    with cleanup(sshd, spec):
        error = expect_launch_error(spec)
        assert error.failures["n1"].startswith(f"host key of {sshd.user}@127.0.0.1 port {sshd.port} is not trusted")
        assert f"check it with `ssh -p {sshd.port} {sshd.user}@127.0.0.1` and add it to {empty}" in error.failures["n1"]
        assert "`known_hosts = false` in [ssh] skips the check (unsafe)" in error.failures["n1"]
    spec = load_spec(sshd.cluster_file(tmp_path / "b", "ssh-nocheck", {"s": ["n1"]}, [],
                                       ssh={"known_hosts": False}))
    assert not spec.ssh.verify_host_keys
    with cleanup(sshd, spec):
        launch.up(spec)
        assert launch.down(spec.name) == {}
    assert_nothing_left(sshd, tmp_path)


def test_missing_interpreter_and_missing_package(sshd: Sshd, tmp_path: Path) -> None:
    bare = tmp_path / "bare-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, capture_output=True)
    bare_python = str(bare / "bin" / "python")
    spec = load_spec(sshd.cluster_file(tmp_path, "ssh-python", FOUR_NODES, FOUR_NODE_LINKS, nodes={
        "n2": {"python": bare_python}, "n4": {"python": "/nonexistent/python3"}}))
    with cleanup(sshd, spec):
        error = expect_launch_error(spec)
        assert list(error.failures) == ["n2", "n4"]
        where = f"{sshd.user}@127.0.0.1 port {sshd.port}"
        assert error.failures["n2"].startswith(
            f"gmountpy is not importable by {bare_python} (Python {sys.version.split()[0]}) on {where} "
            f"(ModuleNotFoundError: No module named 'gmountpy'): run `{bare_python} -m pip install gmountpy==")
        assert error.failures["n4"] == (
            f"python '/nonexistent/python3' not found on {where}: install Python 3.11+ with gmountpy there, "
            f'or set python = "/path/to/python" for this node')
        assert_nothing_left(sshd, tmp_path)


def test_port_in_use_and_unusable_mountpoint(sshd: Sshd, tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        (tmp_path / "n3" / "mnt").mkdir(parents=True)
        (tmp_path / "n3" / "mnt" / "stray.txt").write_text("not empty")
        spec = load_spec(sshd.cluster_file(tmp_path, "ssh-port", FOUR_NODES, FOUR_NODE_LINKS,
                                           nodes={"n1": {"port": port}}))
        with cleanup(sshd, spec):
            error = expect_launch_error(spec)
            assert list(error.failures) == ["n1", "n3"]
            assert error.failures["n1"] == (f"port {port} on 127.0.0.1 is in use by another program: choose "
                                            f"another port, or port = 0 for any free one")
            assert error.failures["n3"] == (f"mountpoint {tmp_path}/n3/mnt is not empty: choose an empty directory")
            assert_nothing_left(sshd, tmp_path)


def test_a_missing_export_is_refused_over_ssh_unless_create_export(sshd: Sshd, tmp_path: Path) -> None:
    spec = load_spec(sshd.cluster_file(tmp_path, "ssh-typo", {"s": ["n1", "n2"]}, []))
    (tmp_path / "n2" / "export").rmdir()  # a typo in the cluster file, as far as n2's host can tell
    with cleanup(sshd, spec):
        error = expect_launch_error(spec)
        assert error.failures == {"n2": (f"export {tmp_path}/n2/export does not exist: create it, fix `export` "
                                         "in the cluster file, or set create_export = true to have it made")}
        assert not (tmp_path / "n2" / "export").exists()
        assert_nothing_left(sshd, tmp_path)
    spec = load_spec(sshd.cluster_file(tmp_path, "ssh-typo", {"s": ["n1", "n2"]}, [],
                                       nodes={"n2": {"create_export": True}}))
    (tmp_path / "n2" / "export").rmdir()
    with cleanup(sshd, spec):
        state = launch.up(spec)
        assert spec.tls  # between hosts TLS is the default
        assert (tmp_path / "n2" / "export").is_dir() and os.path.ismount(state.nodes["n2"].mountpoint)
        (tmp_path / "n2" / "export" / "made.txt").write_text("over TLS")
        assert (tmp_path / "n1" / "mnt" / "made.txt").read_text() == "over TLS"
        assert launch.down("ssh-typo") == {}
        assert_nothing_left(sshd, tmp_path)


def write_silent_python(path: Path) -> Path:
    """An interpreter that passes the preflight but, started as the daemon, never says a word."""
    path.write_text(f"""#!/bin/sh
if [ "$1" = "-m" ]; then exec {sys.executable} -c 'import time; time.sleep(300)' -m gmountpy.node; fi
exec {sys.executable} "$@"
""")
    path.chmod(0o755)
    return path


def test_never_ready_stops_the_daemons_already_started(sshd: Sshd, tmp_path: Path) -> None:
    # nine nodes on one host: two SSH connections, one of them carrying the most sessions sshd allows us
    silent = write_silent_python(tmp_path / "silent-python")
    names = [f"n{i}" for i in range(1, 10)]
    spec = load_spec(sshd.cluster_file(tmp_path, "ssh-silent", {"a": names[:5], "b": names[5:]}, [("a", "b", 5.0)],
                                       nodes={"n4": {"python": str(silent)}}, tuning={"ready_timeout": 6.0}))
    seen: dict[str, str] = {}
    with cleanup(sshd, spec):
        error = expect_launch_error(spec, progress=lambda node, what: seen.__setitem__(node, what))
        assert list(error.failures) == ["n4"]
        assert error.failures["n4"] == (f"no STARTED line within 6s: see the node's log "
                                        f"(~/.local/state/gmountpy/logs/ssh-silent-n4.log on {sshd.user}@127.0.0.1), "
                                        f"or raise tuning.ready_timeout")
        assert all(seen[n] == "listening" for n in names if n != "n4"), seen  # these had started
        assert error.running is None
        assert state_store.load(spec.name) is None
        assert_nothing_left(sshd, tmp_path)  # including the silent one


def test_keep_going_keeps_the_nodes_that_came_up(sshd: Sshd, tmp_path: Path) -> None:
    spec = load_spec(sshd.cluster_file(tmp_path, "ssh-keep", FOUR_NODES, FOUR_NODE_LINKS,
                                       nodes={"n4": {"python": "/nonexistent/python3"}}))
    path = str(tmp_path / "cluster.toml")
    with cleanup(sshd, spec):
        result = CliRunner().invoke(cli_main, ["up", "--keep-going", path])
        assert result.exit_code == 1, result.output
        assert "n4: python '/nonexistent/python3' not found on" in result.output
        assert "is up with 3 of 4 nodes (--keep-going)" in result.output
        statuses = launch.status(spec.name)
        assert [(s.name, s.up) for s in statuses] == [("n1", True), ("n2", True), ("n3", True)]
        (tmp_path / "n3" / "export" / "kept.txt").write_text("n3")
        assert (tmp_path / "n1" / "mnt" / "kept.txt").read_text() == "n3"
        result = CliRunner().invoke(cli_main, ["down", path])
        assert result.exit_code == 0, result.output
        assert "is down; exports are untouched" in result.output
        assert_nothing_left(sshd, tmp_path)


def test_down_reports_unreachable_nodes_keeps_them_and_finishes_later(sshd: Sshd, tmp_path: Path) -> None:
    spec = load_spec(sshd.cluster_file(tmp_path, "ssh-later", {"s": ["n1", "n2"]}, []))
    with cleanup(sshd, spec):
        state = launch.up(spec)
        secret = state_store.load_secret(spec.name)
        # n2's host "goes away": point the record at a closed port
        closed = free_closed_port()
        nodes = dict(state.spec.nodes)
        nodes["n2"] = replace(nodes["n2"], ssh_port=closed)
        state_store.save(ClusterState(replace(state.spec, nodes=nodes), state.nodes, state.started), secret)
        problems = launch.down(spec.name)
        assert list(problems) == ["n2"]
        assert problems["n2"].startswith(f"cannot reach {sshd.user}@127.0.0.1 port {closed}: connection refused")
        assert f"its daemon (pid {state.nodes['n2'].pid}) may still run" in problems["n2"]
        assert problems["n2"].endswith("still recorded: run `gmount down` again when it is reachable (or --forget)")
        assert not pid_is_daemon(state.nodes["n1"].pid)
        assert pid_is_daemon(state.nodes["n2"].pid)
        left = state_store.load(spec.name)
        assert left is not None and list(left.nodes) == ["n2"]
        with pytest.raises(GmountError, match=r"may still be up on n2 .*`gmount down --forget`"):
            launch.up(spec)
        # the host is back
        state_store.save(ClusterState(spec, left.nodes, left.started), secret)
        assert launch.down(spec.name) == {}
        assert state_store.load(spec.name) is None
        assert_nothing_left(sshd, tmp_path)


def free_closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- probe -------------------------------------------------------------------------------------


def test_probe_measures_over_ssh_before_launch_and_writes_links(sshd: Sshd, tmp_path: Path) -> None:
    path = sshd.cluster_file(tmp_path, "ssh-probe", FOUR_NODES, FOUR_NODE_LINKS, distinct_addresses=True)
    result = CliRunner().invoke(cli_main, ["probe", "--count", "3", str(path)])
    assert result.exit_code == 0, result.output
    assert '[[links]]\nsites = ["tsukuba", "hongo"]\nrtt_ms = ' in result.output
    assert "median of 3 TCP connects" in result.output
    assert "within a site" in result.output  # n1 -> n2 and n3 -> n4 too
    assert load_spec(path).links[0].rtt_ms == 14.0  # printing only changes nothing

    result = CliRunner().invoke(cli_main, ["probe", "--count", "3", "--write", str(path)])
    assert result.exit_code == 0, result.output
    text = path.read_text()
    assert text.count("\n[[links]]\n") == 1 and "rtt_ms = 14.0" not in text
    measured = load_spec(path).links[0]
    assert measured.sites == ("tsukuba", "hongo") and 0 < measured.rtt_ms < 50
    assert load_spec(path).nodes == load_spec(path).nodes  # the rest of the file still loads the same
    assert not list(tmp_path.glob(".cluster.toml.probe*"))
    assert_nothing_left(sshd, tmp_path)


def test_probe_names_a_site_it_cannot_reach(sshd: Sshd, tmp_path: Path) -> None:
    path = sshd.cluster_file(tmp_path, "ssh-probe-bad", FOUR_NODES, FOUR_NODE_LINKS,
                             nodes={"n3": {"ssh_port": free_closed_port()}})
    result = CliRunner().invoke(cli_main, ["probe", "--count", "2", "--write", str(path)])
    assert result.exit_code == 1
    assert "not writing" in str(result.exception) or "not writing" in result.output
    assert "rtt_ms = 14.0" in path.read_text()


# --- scale ---------------------------------------------------------------------------------------


def test_sixteen_nodes_over_one_sshd(sshd: Sshd, tmp_path: Path) -> None:
    names = [f"n{i:02d}" for i in range(1, 17)]
    sites = {"east": names[:8], "west": names[8:]}
    spec = load_spec(sshd.cluster_file(tmp_path, "ssh16", sites, [("east", "west", 20.0)]))
    with cleanup(sshd, spec):
        started = time.monotonic()
        state = launch.up(spec)
        up_seconds = time.monotonic() - started
        assert len(state.nodes) == 16
        assert all(os.path.ismount(r.mountpoint) for r in state.nodes.values())
        (tmp_path / "n16" / "export" / "far.txt").write_text("from the last node")
        assert (tmp_path / "n01" / "mnt" / "far.txt").read_text() == "from the last node"
        started = time.monotonic()
        assert launch.down(spec.name) == {}
        down_seconds = time.monotonic() - started
        assert_nothing_left(sshd, tmp_path)
    print(f"\nssh launch, 16 nodes: up {up_seconds:.2f}s, down {down_seconds:.2f}s")


def test_a_crashed_daemon_is_explained_by_status_and_cleared_by_down(sshd: Sshd, tmp_path: Path) -> None:
    spec = load_spec(sshd.cluster_file(tmp_path, "ssh-crash", {"s": ["n1", "n2"]}, []))
    with cleanup(sshd, spec):
        state = launch.up(spec)
        victim = state.nodes["n2"]
        os.kill(victim.pid, 9)  # no chance to unmount: a stale FUSE mount stays behind
        assert wait_for(lambda: not pid_is_daemon(victim.pid))
        by_name = {s.name: s for s in launch.status(spec.name)}
        assert by_name["n1"].up and not by_name["n2"].up
        assert by_name["n2"].detail == (f"daemon pid {victim.pid} is gone and {victim.mountpoint} is a stale mount: "
                                        f"run `gmount down`")
        with pytest.raises(GmountError, match=r"already up \(nodes n1\)"):
            launch.up(spec)
        assert launch.down(spec.name) == {}
        assert_nothing_left(sshd, tmp_path)
        (Path(victim.mountpoint) / "probe").write_text("unsealed by down")  # an ordinary directory again
        (Path(victim.mountpoint) / "probe").unlink()
        state = launch.up(spec)  # the mountpoints are usable again
        for record in state.nodes.values():  # every daemon dies: the next `up` starts afresh ...
            os.kill(record.pid, 9)
        assert wait_for(lambda: not any(pid_is_daemon(r.pid) for r in state.nodes.values()))
        launch.up(spec)  # ... over mountpoints kept unwritable meanwhile (node.directories)
        assert all(s.up for s in launch.status(spec.name))
        assert launch.down(spec.name) == {}
        assert_nothing_left(sshd, tmp_path)


def test_a_node_without_host_is_named(tmp_path: Path) -> None:
    (tmp_path / "c.toml").write_text(f"""name = "nohost"\nlauncher = "ssh"\n[defaults]\n
export = "{tmp_path}/{{node}}/e"\nmountpoint = "{tmp_path}/{{node}}/m"\n[sites.s]\nnodes = ["n1"]\n""")
    spec = load_spec(tmp_path / "c.toml")
    error = expect_launch_error(spec)
    assert error.failures == {"n1": "node 'n1' has no host: set host = \"user@machine\" for it (or in [defaults]) "
                                    "to launch it over SSH"}
