"""Emulated nodes own their CPUs (benchmarks/wan/cgroups.py): a cgroup per node, daemons and jobs inside.

Each test fails when the property is missing: a job that names a node and runs on another
node's CPU, a node taking more than its quota, a daemon outside its node's cgroup, or a
cgroup left behind after the run (also after Ctrl-C).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.wan import cgroups, down, emulate, gmount_cluster, problem
from benchmarks.wan.cgroups import Allotment, NodeCgroups, job_node, layout, wait_for_node

from ..conftest import fuse_problem, require
from .test_wan import assert_gone, base, cluster_file, host_snapshot  # noqa: F401  (base is a fixture)

ROOT = Path(__file__).resolve().parents[2]
BUSY = "import time\nend = time.time() + float(__import__('sys').argv[1])\nwhile time.time() < end: pass"


@pytest.fixture
def wan_cgroups() -> None:
    require("WAN emulation (root, netns, iptables-legacy, gcc, libnetfilter-queue)", problem())
    require("cgroups with the cpuset and cpu controllers", cgroups.problem())


def busy(seconds: float, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", BUSY, str(seconds)], env={**os.environ, **env})


def cluster_name(path: Path) -> str:
    return path.read_text().split('"')[1]


def test_layout_gives_each_node_its_own_cpus_or_an_equal_quota() -> None:
    assert layout(["a", "b"], [0, 1]) == {"a": Allotment((0,)), "b": Allotment((1,))}
    assert layout(["a", "b"], [0, 1, 2]) == {"a": Allotment((0, 1)), "b": Allotment((2,))}
    four = layout(["a", "b", "c", "d"], [0, 1])
    assert [a.cpus for a in four.values()] == [(0,), (1,), (0,), (1,)]
    assert all(a.quota == 0.5 for a in four.values())
    assert cgroups.parse_cpus("0-2,5") == [0, 1, 2, 5]


def test_a_job_is_matched_by_its_node_and_the_emulations_cluster_or_a_variant() -> None:
    env = b"PATH=/bin\0GMOUNT_NODE=w1\0GMOUNT_CLUSTER=wan-1-gfarm\0"
    assert job_node(env, ["wan-1"]) == "w1"
    assert job_node(env, ["wan-12"]) is None  # another emulation whose name starts the same
    assert job_node(b"GMOUNT_NODE=w1\0", ["wan-1"]) is None  # no cluster: not ours
    assert job_node(b"GMOUNT_CLUSTER=wan-1\0", ["wan-1"]) is None


def test_jobs_naming_a_node_run_on_its_cpus_only_whoever_starts_them(wan_cgroups: None, base: Path) -> None:  # noqa: F811
    """Processes started here (not by the harness) with GMOUNT_NODE land in their node's cgroup: the
    CPU accounting shows every node's time on its own CPU and none on the other's."""
    toml = cluster_file(base, 2.0)
    name = cluster_name(toml)
    before = host_snapshot()
    with emulate(toml, workdir=base, node_cpus=True, cpus=[0, 1]) as emu:
        groups = emu.node_cgroups()
        assert groups is not None
        described = emu.link()["cpus"]
        assert isinstance(described, dict) and described["nodes"]["e1"]["cpus"] == [0]
        jobs = {node: busy(1.0, {"GMOUNT_NODE": node, "GMOUNT_CLUSTER": name}) for node in ("e1", "w1")}
        # a job's own children (a shell running two commands) follow it
        shell = subprocess.Popen(["/bin/sh", "-c", f"{sys.executable} -c \"$BUSY\" 0.5 & wait"],
                                 env={**os.environ, "BUSY": BUSY, "GMOUNT_NODE": "w1", "GMOUNT_CLUSTER": name})
        stranger = busy(0.5, {"GMOUNT_NODE": "e1", "GMOUNT_CLUSTER": "another-cluster"})
        for node, job in jobs.items():
            assert wait_for_node(groups, job.pid, node), f"job for {node} not in its cgroup"
            assert os.sched_getaffinity(job.pid) == set(groups.allotments[node].cpus)
        assert wait_for_node(groups, shell.pid, "w1")
        assert groups.node_of(stranger.pid) is None, "a job of another cluster was moved"
        for process in [*jobs.values(), shell, stranger]:
            process.wait()
        usage = groups.usage_all()
        for node, other_cpu in (("e1", "1"), ("w1", "0")):
            per_cpu = usage[node]["per_cpu"]
            assert isinstance(per_cpu, dict) and per_cpu[other_cpu] == 0, f"{node} used another node's CPU: {usage}"
            assert float(usage[node]["cpu_seconds"]) > 0, usage  # type: ignore[arg-type]
        made = list(groups.made)
        pids = [emu.watcher_pid, emu.delay_pid]
    assert all(not Path(d).exists() for d in made), "a node cgroup was left behind"
    assert_gone(emu, before, pids)


def test_more_nodes_than_cpus_share_them_by_quota(wan_cgroups: None, base: Path) -> None:  # noqa: F811
    """Four nodes on one CPU: each gets a quarter of it, however much it asks for."""
    toml = cluster_file(base, 2.0, nodes_per_site=2)
    name = cluster_name(toml)
    with emulate(toml, workdir=base, node_cpus=True, cpus=[0]) as emu:
        groups = emu.node_cgroups()
        assert groups is not None and all(a.quota == 0.25 for a in groups.allotments.values())
        started = time.monotonic()
        greedy = [busy(1.5, {"GMOUNT_NODE": "e1", "GMOUNT_CLUSTER": name}) for _ in range(2)]
        for job in greedy:
            job.wait()
        wall = time.monotonic() - started
        used = float(groups.usage("e1")["cpu_seconds"])  # type: ignore[arg-type]
        assert used <= 0.25 * wall * 1.15 + 0.05, f"e1 used {used:.2f} s of CPU in {wall:.2f} s with a 0.25 quota"
        assert float(groups.usage("e1")["throttled_seconds"]) > 0  # type: ignore[arg-type]


def test_daemons_and_the_jobs_make_places_run_on_their_nodes_cpus(wan_cgroups: None, base: Path) -> None:  # noqa: F811
    """The real paths: each node's gmount daemon is in its cgroup; a recipe that make's gmount-sh places on
    w1 (it holds the prerequisite) runs on w1's CPU, and `Cluster.spawn(on=e1)` on e1's."""
    require("FUSE", fuse_problem())
    if shutil.which("make") is None:
        pytest.fail("GNU make is not installed (Debian: make)")
    toml = cluster_file(base, 2.0)
    (base / "w1" / "export").mkdir(parents=True)
    (base / "w1" / "export" / "input.txt").write_text("held by w1\n")
    with emulate(toml, workdir=base, node_cpus=True, cpus=[0, 1]) as emu, gmount_cluster(emu) as spec:
        groups = emu.node_cgroups()
        assert groups is not None
        from gmountpy.cluster import state as state_store

        state = state_store.load(spec.name)
        assert state is not None
        for node, record in state.nodes.items():
            assert groups.node_of(record.pid) == node, f"daemon of {node} is not in its cgroup"
        work = Path(spec.node("e1").mountpoint)
        include = subprocess.run([str(Path(sys.executable).with_name("gmount")), "make-include"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        recipe = "sleep 0.3; cat /proc/self/cgroup > $@"  # the watcher moves a job within milliseconds of its exec
        (work / "Makefile").write_text(f"include {include}\nout.txt: input.txt\n\t{recipe}\n")
        made = emu.run("east", ["make", "-s"], cwd=work, capture_output=True, text=True,
                       env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
        assert made.returncode == 0, made.stderr
        assert (base / "w1" / "export" / "out.txt").exists(), "the recipe did not run on w1"
        cpuset_line = next(line for line in (work / "out.txt").read_text().splitlines() if ":cpuset:" in line
                           or line.startswith("0::"))
        assert cpuset_line.endswith(f"/{emu.prefix}/w1"), cpuset_line
        from gmountpy.api import Cluster

        job = Cluster.open(spec.name).spawn(f"{sys.executable} -c \"$BUSY\" 0.3", on="e1", env={"BUSY": BUSY})
        assert wait_for_node(groups, job.pid, "e1") or job.poll() is not None
        assert job.wait() == 0


def test_ctrl_c_removes_the_node_cgroups_and_the_watcher(wan_cgroups: None, base: Path) -> None:  # noqa: F811
    toml = cluster_file(base, 2.0)
    with pytest.raises(KeyboardInterrupt), emulate(toml, workdir=base, node_cpus=True) as emu:
        groups = emu.node_cgroups()
        assert groups is not None
        made, watcher = list(groups.made), emu.watcher_pid
        sleeper = busy(60, {"GMOUNT_NODE": "e1", "GMOUNT_CLUSTER": cluster_name(toml)})
        assert wait_for_node(groups, sleeper.pid, "e1")
        raise KeyboardInterrupt
    sleeper.wait(timeout=10)  # a job left on a node's CPUs is stopped by the teardown
    assert all(not Path(d).exists() for d in made)
    assert not Path(f"/proc/{watcher}").exists() or Path(f"/proc/{watcher}/stat").read_text().split()[2] == "Z"
    assert down(cluster_name(toml)) == []


def test_removing_node_cgroups_twice_is_safe(wan_cgroups: None) -> None:
    groups = NodeCgroups.create(f"gmwtest{os.getpid()}", layout(["a"], [0]))
    try:
        assert groups.pids("a") == []
    finally:
        assert groups.remove() == []
    assert groups.remove() == []
