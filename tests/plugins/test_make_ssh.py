"""gmount.mk on a cluster launched over a real sshd: a recipe whose prerequisite is on another node
runs there over SSH (Cluster.spawn), with its exit status, and Ctrl-C stops it on that node."""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from pathlib import Path

from gmountpy import launch
from gmountpy.cluster.config import load_spec

from ..conftest import as_terminal_job, require, wait_for
from ..launch.conftest import Sshd, marked_pids, sshd  # noqa: F401  (the session fixture)
from ..launch.test_ssh import cleanup, daemon_pids
from .test_make import INCLUDE, env, make_problem


def test_make_over_ssh_runs_each_recipe_on_the_holder_and_ctrl_c_stops_it_there(sshd: Sshd,  # noqa: F811
                                                                                  tmp_path: Path) -> None:
    require("GNU make and gmount-sh", make_problem())
    spec = load_spec(sshd.cluster_file(tmp_path, f"mkssh{os.getpid()}", {"s": ["n1", "n2"]}, []))
    for node in spec.nodes.values():
        Path(node.export).mkdir(parents=True, exist_ok=True)
    with cleanup(sshd, spec):
        launch.up(spec)
        wf = tmp_path / "n2" / "export" / "wf"
        wf.mkdir()
        (wf / "in.txt").write_text("held by n2\n")
        token = f"{uuid.uuid4().int % 1000}.{uuid.uuid4().int % 10000:04d}"
        mount = tmp_path / "n1" / "mnt" / "wf"
        (tmp_path / "n1" / "export" / "wf").mkdir()
        (mount / "Makefile").write_text(INCLUDE + (
            "out.txt: in.txt\n\ttr a-z A-Z < $< > $@\n\techo \"$$GMOUNT_NODE\" > $@.node\n"
            "bad: in.txt\n\techo to-stderr >&2; exit 7\n"
            f"slow: in.txt\n\techo $$$$ > slow.pid; sleep {token} & sleep {token}; wait\n"))

        done = subprocess.run(["make", "out.txt"], cwd=mount, env=env(), capture_output=True, text=True,
                              timeout=180, check=False)
        assert done.returncode == 0, done.stderr
        assert (mount / "out.txt").read_text() == "HELD BY N2\n"
        assert (mount / "out.txt.node").read_text() == "n2\n"
        assert (tmp_path / "n2" / "export" / "wf" / "out.txt").exists()  # written on n2's disk

        bad = subprocess.run(["make", "bad"], cwd=mount, env=env(), capture_output=True, text=True,
                             timeout=180, check=False)
        assert bad.returncode == 2 and "Error 7" in bad.stderr and "to-stderr" in bad.stderr, bad.stderr
        lines = bad.stderr.splitlines()
        error = next(i for i, line in enumerate(lines) if line.endswith("bad] Error 7"))
        assert lines[error - 1] == "gmount: target bad failed on node n2: its recipe exited with status 7", lines

        daemons = set(daemon_pids(sshd))
        pid_file = tmp_path / "n2" / "export" / "wf" / "slow.pid"  # the recipe runs in n2's mount

        def sleeping() -> list[int]:
            found = []
            for entry in Path("/proc").iterdir():
                try:
                    if entry.name.isdigit() and (entry / "cmdline").read_bytes() == b"sleep\0" + token.encode() + b"\0":
                        found.append(int(entry.name))
                except OSError:
                    pass
            return found

        slow = subprocess.Popen(["make", "slow"], cwd=mount, env=env(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True, preexec_fn=as_terminal_job)
        try:
            assert wait_for(lambda: pid_file.exists() and len(sleeping()) == 2, timeout=120), \
                "the recipe never started on n2"
            assert set(sleeping()) <= set(marked_pids(sshd.marker))  # started through sshd: over SSH
            os.killpg(slow.pid, signal.SIGINT)  # Ctrl-C in make's terminal: its whole process group
            slow.wait(timeout=60)
        finally:
            if slow.poll() is None:
                os.killpg(slow.pid, signal.SIGKILL)
                slow.wait()
        assert slow.returncode != 0
        assert wait_for(lambda: not sleeping(), timeout=30), "the recipe kept running on n2 after Ctrl-C"
        assert wait_for(lambda: set(marked_pids(sshd.marker)) <= daemons, timeout=20)
