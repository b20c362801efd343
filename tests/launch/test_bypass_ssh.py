"""Jobs on SSH nodes preload that node's own copy of the bypass library (found through the node's python)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from gmountpy import Cluster, launch
from gmountpy.cluster.config import load_spec

from .conftest import Sshd
from .test_ssh import cleanup


def test_jobs_over_ssh_read_their_nodes_files_from_the_export(sshd: Sshd, tmp_path: Path) -> None:
    spec = load_spec(sshd.cluster_file(tmp_path, "sshbypass", {"s": ["n1", "n2"]}, []))
    with cleanup(sshd, spec):
        launch.up(spec)
        cluster = Cluster.open("sshbypass")
        (tmp_path / "n2" / "export" / "in.txt").write_text("held by n2")
        stats = tmp_path / "stats"
        run = cluster.run(f'echo "$LD_PRELOAD"; GMOUNT_BYPASS_STATS={stats} cat in.txt', on="n2")
        assert run.returncode == 0, run.stderr
        preload, content = run.stdout.splitlines()
        assert preload.endswith("gmountpy/jobs/libgmount_preload.so") and content == "held by n2"
        assert "open_direct=1" in stats.read_text()
        spawned = cluster.spawn(f"GMOUNT_BYPASS_STATS={stats}.spawn cat in.txt", on="n2", stdout=subprocess.PIPE)
        assert spawned.wait(timeout=60) == 0
        assert spawned.process.stdout is not None
        assert spawned.process.stdout.read() == b"held by n2"
        for pipe in (spawned.process.stdin, spawned.process.stdout):
            if pipe is not None:
                pipe.close()
        assert "open_direct=1" in Path(f"{stats}.spawn").read_text()
