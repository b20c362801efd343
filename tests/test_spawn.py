"""Commands started without waiting (Cluster.spawn): stopping them leaves no process behind."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

from gmountpy import Cluster
from gmountpy.cluster.config import NodeSpec, SshOptions
from gmountpy.jobs.spawn import remote_script, ssh_argv

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
