"""Cluster.spawn over a real OpenSSH sshd: the job runs in the node's mount, and stopping it stops it there."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

from gmountpy import Cluster, launch
from gmountpy.cluster.config import load_spec

from ..conftest import wait_for
from .conftest import Sshd, marked_pids
from .test_ssh import cleanup, daemon_pids


def test_spawn_over_ssh_runs_there_and_stop_leaves_nothing(sshd: Sshd, tmp_path: Path) -> None:
    spec = load_spec(sshd.cluster_file(tmp_path, "sshspawn", {"s": ["n1", "n2"]}, []))
    with cleanup(sshd, spec):
        launch.up(spec)
        cluster = Cluster.open("sshspawn")
        (tmp_path / "n2" / "export" / "work").mkdir()
        done = cluster.spawn("echo $GMOUNT_NODE; pwd; echo to-stderr >&2; exit 5", on="n2", cwd="/work",
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert done.over_ssh
        # not communicate(): closing the job's stdin is how a spawned SSH job is told to stop
        assert done.wait(timeout=60) == 5
        out, err = done.process.stdout.read(), done.process.stderr.read()  # a few bytes: the pipes held them
        for pipe in (done.process.stdin, done.process.stdout, done.process.stderr):
            pipe.close()
        assert out.decode().split() == ["n2", str(tmp_path / "n2" / "mnt" / "work")]
        assert b"to-stderr" in err

        token = f"{uuid.uuid4().int % 1000}.{uuid.uuid4().int % 10000:04d}"
        job = cluster.spawn(f"sleep {token} & sleep {token}; wait", on="n1")
        daemons = set(daemon_pids(sshd))

        def cmdline(pid: int) -> bytes:
            try:
                return Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                return b""  # gone meanwhile

        def sleeping() -> list[int]:
            """The job's two `sleep`s (not the shells around them, whose command lines hold the token too)."""
            return [p for p in marked_pids(sshd.marker) if cmdline(p).split(b"\0")[:2] == [b"sleep", token.encode()]]

        try:
            assert wait_for(lambda: len(sleeping()) == 2, timeout=30), "the job's two sleeps never started on n1"
        finally:
            job.stop(grace=3)  # also when they did not: what is left would fail the next tests' checks
        # nothing the job started is left on the node: only the daemons remain of what sshd started
        assert wait_for(lambda: set(marked_pids(sshd.marker)) <= daemons, timeout=20), \
            [cmdline(p) for p in set(marked_pids(sshd.marker)) - daemons]
