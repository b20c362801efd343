"""Commands started without waiting (Cluster.spawn): stopping them leaves no process behind."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

from gmountpy import Cluster
from gmountpy.cluster.config import NodeSpec, SshOptions
from gmountpy.errors import GmountError
from gmountpy.jobs.spawn import remote_script, ssh_argv
from gmountpy.launch.ssh import _connect_options, destination

from .conftest import LocalCluster, wait_for


def alive(token: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if token.encode() in Path("/proc", entry, "cmdline").read_bytes():
                    pids.append(int(entry))
            except OSError:
                pass
    return pids


def test_spawn_runs_in_the_nodes_mount_and_stop_kills_the_whole_group(cluster4: LocalCluster) -> None:
    c = Cluster.open(cluster4.spec.name)
    (cluster4.export("n3") / "spawn-dir").mkdir(exist_ok=True)
    done = c.spawn("pwd; echo $GMOUNT_NODE $EXTRA", on="n3", cwd="/spawn-dir", env={"EXTRA": "x"},
                   stdout=subprocess.PIPE)
    out, _ = done.process.communicate(timeout=30)
    assert out.decode().split("\n")[:2] == [str(cluster4.mount("n3") / "spawn-dir"), "n3 x"]
    assert done.poll() == 0

    failing = c.spawn("exit 7", on="n2")
    assert failing.wait(30) == 7

    token = f"{uuid.uuid4().int % 1000}.{uuid.uuid4().int % 10000:04d}"
    job = c.spawn(f"sleep {token} & sleep {token}; wait", on="n4")
    assert wait_for(lambda: len(alive(f"sleep\0{token}")) == 2, timeout=10)
    assert job.poll() is None
    assert job.stop(grace=2) == 128 + 15  # SIGTERM
    assert wait_for(lambda: not alive(f"sleep\0{token}"), timeout=10)


def test_remote_side_stops_its_job_when_the_connection_goes(tmp_path: Path) -> None:
    """What runs on an SSH node, run here: closing stdin (ssh gone) stops the job's whole group."""
    token = f"{uuid.uuid4().int % 1000}.{uuid.uuid4().int % 10000:04d}"
    script = remote_script(f"sleep {token} & sleep {token}; wait", str(tmp_path), {"GMOUNT_NODE": "n9"})
    process = subprocess.Popen(["/bin/sh", "-c", script], stdin=subprocess.PIPE, start_new_session=True)
    try:
        assert wait_for(lambda: len(alive(f"sleep\0{token}")) == 2, timeout=10)
        assert process.stdin is not None
        process.stdin.close()
        assert process.wait(timeout=30) != 0
        assert wait_for(lambda: not alive(f"sleep\0{token}"), timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
    # a job that ends by itself, stdin still open (as over a live SSH connection): its own status
    finished = subprocess.Popen(["/bin/sh", "-c", remote_script("echo $GMOUNT_NODE; pwd; exit 4", str(tmp_path),
                                                                {"GMOUNT_NODE": "n9"})],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert finished.stdout is not None and finished.stdin is not None
    out = finished.stdout.read()
    assert finished.wait(timeout=30) == 4 and out.decode().split() == ["n9", str(tmp_path)]
    finished.stdin.close()
    finished.stdout.close()


def test_ssh_arguments_follow_the_cluster_files_ssh_settings() -> None:
    node = NodeSpec("n7", "s", "/e", "/m", host="alice@h7", ssh_port=2222)
    argv = ssh_argv(node, SshOptions(identity=("/k/id",), known_hosts="/k/known", config=None), "true", "/m", {})
    assert argv[:5] == ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"]
    for pair in (["-F", "/dev/null"], ["-p", "2222"], ["-i", "/k/id"], ["-o", "UserKnownHostsFile=/k/known"]):
        assert any(argv[i:i + 2] == pair for i in range(len(argv))), pair
    assert argv[-3:-1] == ["--", "alice@h7"] and argv[-1].startswith("exec /bin/sh -c ")
    unchecked = ssh_argv(node, SshOptions(verify_host_keys=False), "true", "/m", {})
    assert "StrictHostKeyChecking=no" in unchecked and "-F" not in unchecked


def _option(argv: list[str], name: str) -> str | None:
    """The value of `-o Name=value` in an ssh command line, or None."""
    for i, word in enumerate(argv[:-1]):
        if word == "-o" and argv[i + 1].startswith(name + "="):
            return argv[i + 1].partition("=")[2]
    return None


def _flag(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, word in enumerate(argv[:-2]) if word == flag]


@pytest.mark.parametrize("options", [
    SshOptions(),
    SshOptions(identity=("/k/id", "/k/id2"), known_hosts="/k/known", config=None, connect_timeout=4.0),
    SshOptions(verify_host_keys=False, config=("/k/config",)),
])
@pytest.mark.parametrize(("host", "port"), [("alice@h7", 2222), ("h8", 22)])
def test_jobs_and_the_launcher_read_the_ssh_table_the_same_way(options: SshOptions, host: str, port: int) -> None:
    """Jobs go through OpenSSH's ssh, the launcher through asyncssh (docs/design.md, "SSH: two clients"):
    the same user, port, keys, known_hosts, config files and host-key checking for both."""
    node = NodeSpec("n7", "s", "/e", "/m", host=host, ssh_port=port)
    launcher = _connect_options(options, destination(node))
    argv = ssh_argv(node, options, "true", "/m", {})
    assert argv[argv.index("--") + 1] == host and launcher.get("username") == (host.split("@")[0] if "@" in host
                                                                                else None)
    assert _flag(argv, "-p") == ([str(port)] if port != 22 else []) and launcher.get("port") == (port if port != 22
                                                                                                  else None)
    assert _flag(argv, "-i") == list(launcher.get("client_keys", []))
    assert (_option(argv, "IdentitiesOnly") == "yes") == ("client_keys" in launcher)
    assert _option(argv, "ConnectTimeout") == str(round(launcher["connect_timeout"]))
    if not options.verify_host_keys:
        assert launcher["known_hosts"] is None and _option(argv, "StrictHostKeyChecking") == "no"
    else:
        assert _option(argv, "UserKnownHostsFile") == launcher.get("known_hosts") and \
            _option(argv, "StrictHostKeyChecking") is None
    if "config" not in launcher:  # the user's own ~/.ssh/config, for both
        assert _flag(argv, "-F") == []
    else:
        assert _flag(argv, "-F") == (["/dev/null"] if launcher["config"] is None else launcher["config"])


def test_jobs_refuse_config_files_openssh_cannot_read_at_once() -> None:
    node = NodeSpec("n7", "s", "/e", "/m", host="h7")
    with pytest.raises(GmountError, match="reads one: name one file, with Include lines"):
        ssh_argv(node, SshOptions(config=("/a", "/b")), "true", "/m", {})
