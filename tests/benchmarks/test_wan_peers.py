"""The pipelines' peer systems across a 2-site emulation: Gfarm (gfmd, gfsd per node, gfarm2fs per node)
and a central file server (sshd at one site, sshfs on every node).

Each test fails when the emulated property is missing: Gfarm not serving (a gfsd down is reported
by `check`, naming the node), a write not landing on the writer's own gfsd, a daemon outside its
node's cgroup, or anything left after teardown. Like every capability these tests need (root,
namespaces, FUSE), a missing one skips them on a developer's machine and fails them under CI.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.wan import cgroups, emulate
from benchmarks.wan import gfarm as gf
from benchmarks.wan import sshfs as central

from ..conftest import fuse_problem, require
from .test_wan import assert_gone, base, cluster_file, host_snapshot, wan  # noqa: F401 (fixtures)

ROOT = Path(__file__).resolve().parents[2]


def _ours_running(marker: str) -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if marker in line and "ps -eo" not in line]


def test_gfarm_serves_both_sites_writes_locally_and_leaves_nothing(wan: None, base: Path) -> None:  # noqa: F811
    require("Gfarm (Debian gfmd gfsd gfarm2fs gfarm-client)", gf.problem())
    require("FUSE", fuse_problem())
    require("cgroups", cgroups.problem())
    before = host_snapshot()
    payload = os.urandom(3 << 20)
    with emulate(cluster_file(base, 6.0), workdir=base, node_cpus=True, cpus=[0, 1]) as emu:
        groups = emu.node_cgroups()
        assert groups is not None
        system = gf.Gfarm(emu, base)
        with system.running():
            system.check()
            (system.mount("w1") / "west.bin").write_bytes(payload)
            (system.mount("e1") / "east.txt").write_text("east\n")
            # across the WAN; gfarm2fs tells gfmd a closed file's size at release, just after close() returned
            deadline = time.monotonic() + 5.0
            while (seen := (system.mount("e1") / "west.bin").read_bytes()) != payload and time.monotonic() < deadline:
                time.sleep(0.2)
            assert seen == payload
            assert (system.mount("w1") / "east.txt").read_text() == "east\n"
            assert system.holders("west.bin") == ["w1"], "a write did not land on the writer's gfsd"
            assert system.holders("east.txt") == ["e1"]
            assert list(system.spool("w1").rglob("*")), "no file copy in w1's spool"
            for node in ("e1", "w1"):  # gfsd and gfarm2fs are the node's daemons: on its CPUs
                for key in (f"gfsd:{node}", f"gfarm2fs:{node}"):
                    assert groups.node_of(system.processes[key].pid) == node, key
            assert groups.node_of(system.processes["gfmd"].pid) is None  # a server of its own
            pids = [p.pid for p in system.processes.values()]
        assert not system.dir.exists()
        assert not os.path.ismount(system.mount("e1"))
        assert _ours_running(str(base)) == []
    assert_gone(emu, before, [*pids, emu.delay_pid])


def test_gfarm_check_fails_when_a_gfsd_stops_serving(wan: None, base: Path) -> None:  # noqa: F811
    require("Gfarm (Debian gfmd gfsd gfarm2fs gfarm-client)", gf.problem())
    require("FUSE", fuse_problem())
    with emulate(cluster_file(base, 2.0), workdir=base) as emu:
        system = gf.Gfarm(emu, base)
        with system.running():
            system.check()
            os.kill(system.processes["gfsd:w1"].pid, signal.SIGKILL)
            system.processes["gfsd:w1"].wait()
            with pytest.raises(gf.GfarmError, match="w1"):
                system.check()
        assert not system.dir.exists() or (system.dir / "log").exists()


def test_gfarm_startup_failure_names_the_node_and_cleans_up(wan: None, base: Path) -> None:  # noqa: F811
    """A gfsd that cannot start (its port is taken) fails `running()` with the node; nothing is left running."""
    require("Gfarm (Debian gfmd gfsd gfarm2fs gfarm-client)", gf.problem())
    require("FUSE", fuse_problem())
    with emulate(cluster_file(base, 2.0), workdir=base) as emu:
        squatter = emu.spawn("west", [sys.executable, "-m", "benchmarks.wan.probe", "serve", emu.address["w1"],
                                      str(gf.GFSD_PORT)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
        assert squatter.stdout is not None and squatter.stdout.readline().strip() == "LISTENING"
        system = gf.Gfarm(emu, base)
        with pytest.raises(gf.GfarmError, match="w1"), system.running():
            pass
        assert all(p.poll() is not None for p in system.processes.values())
        assert not os.path.ismount(system.mount("e1"))
        squatter.kill()
        squatter.wait()
        squatter.stdout.close()


def test_central_server_is_one_directory_every_node_reaches(wan: None, base: Path) -> None:  # noqa: F811
    require("sshfs, sshd", central.problem())
    require("FUSE", fuse_problem())
    require("cgroups", cgroups.problem())
    before = host_snapshot()
    with emulate(cluster_file(base, 6.0), workdir=base, node_cpus=True, cpus=[0, 1]) as emu:
        groups = emu.node_cgroups()
        assert groups is not None
        server = central.CentralServer(emu, base, "e1")
        with server.running():
            server.check()
            (server.mount("w1") / "from-west.txt").write_text("west\n")
            assert (server.data / "from-west.txt").read_text() == "west\n"  # stored at the server's site
            assert (server.mount("e1") / "from-west.txt").read_text() == "west\n"
            assert groups.node_of(server.processes["sshfs:w1"].pid) == "w1"
            assert groups.node_of(server.processes["sshd"].pid) is None
            os.kill(server.processes["sshfs:w1"].pid, signal.SIGKILL)
            server.processes["sshfs:w1"].wait()
            with pytest.raises(central.SshfsError, match="w1"):
                server.check()
            pids = [p.pid for p in server.processes.values()]
        assert not os.path.ismount(server.mount("e1"))
    assert_gone(emu, before, [*pids, emu.delay_pid])
