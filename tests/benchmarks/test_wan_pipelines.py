"""The pipeline comparison (benchmarks/wan/bench_pipelines.py): every system in one emulation, checked.

A tiny Montage run (4 tiles of 32x32 pixels) on gmountpy (locality, random) and Gfarm: each result
equals the single-directory run, each node's CPU time is on its own CPU only, the WAN bytes
are counted, and the JSON states the link and the CPU layout. Then the pure parts (ratios,
the plot) on a synthetic result.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from benchmarks.wan import bench_pipelines, cgroups
from benchmarks.wan import gfarm as gf
from gmountpy.pipelines.runner import placement_env

from ..conftest import fuse_problem, require
from .test_wan import wan  # noqa: F401 (fixture)


@pytest.mark.slow
def test_one_emulation_runs_every_system_and_checks_each_against_one_directory(
        wan: None, tmp_path: Path) -> None:  # noqa: F811
    require("FUSE", fuse_problem())
    require("cgroups", cgroups.problem())
    require("Gfarm (Debian gfmd gfsd gfarm2fs gfarm-client)", gf.problem())
    out = tmp_path / "result.json"
    code = bench_pipelines.main(["montage", "--size", "4", "--tile-pixels", "32", "--rtt-ms", "10", "--bandwidth-mbit",
                                 "1000", "--systems", "gmountpy-locality,gmountpy-random,gfarm", "--seed", "7",
                                 "--out", str(out)])
    assert code == 0
    result = json.loads(out.read_text())
    assert result["command"].startswith("python -m benchmarks.wan.bench_pipelines montage")
    assert result["commit"]
    [setting] = result["settings"]
    assert setting["rtt_ms"] == 10 and setting["bandwidth_mbit"] == 1000
    assert 8 <= setting["measured_link"]["rtt_ms"] <= 14
    assert setting["cpus"]["nodes"]["n1"]["cpus"] != setting["cpus"]["nodes"]["n2"]["cpus"]
    runs = {r["system"]: r for r in setting["runs"]}
    assert set(runs) == {"gmountpy-locality", "gmountpy-random", "gfarm"}
    assert result["seed"] == 7  # random placement, the same seed for gmountpy and Gfarm, recorded
    assert runs["gmountpy-random"]["placement"] == runs["gfarm"]["placement"] == "random"
    assert runs["gmountpy-random"]["seed"] == runs["gfarm"]["seed"] == 7
    for system, run in runs.items():
        assert run["check"] == "same as single directory", (system, run["check"])
        assert run["makespan_s"] > 0 and run["wan_bytes_total"] > 0, system
        for node, per_cpu in run["cpu_by_node_per_cpu"].items():
            own = {str(c) for c in setting["cpus"]["nodes"][node]["cpus"]}
            # a task moved into the node's cgroup while running on another CPU is charged there until the
            # scheduler migrates it (a millisecond); a node using another's CPU shows seconds
            assert all(seconds < 0.05 for cpu, seconds in per_cpu.items() if cpu not in own), (system, node, per_cpu)
    assert runs["gmountpy-locality"]["bytes_read"]["remote_fraction"] < 0.5
    assert "locality/gfarm" in setting["ratios"] and "locality/random" in setting["ratios"]
    assert out.with_suffix(".png").stat().st_size > 0


def test_ratios_and_plot_on_a_made_up_result(tmp_path: Path) -> None:
    def run(system: str, seconds: float) -> dict[str, Any]:
        return {"system": system, "makespan_s": seconds, "wan_bytes_total": 2**20}

    runs = [run("gmountpy-locality", 50.0), run("gmountpy-random", 100.0), run("gfarm", 400.0)]
    assert bench_pipelines.ratios(runs) == {"locality/random": 0.5, "locality/gfarm": 0.125}
    result = {"pipeline": "montage", "size": 4, "options": {"tile_pixels": 64}, "commit": "a" * 40,
              "settings": [{"rtt_ms": 20.0, "bandwidth_mbit": 100.0, "single_directory": run("single-directory", 30.0),
                            "runs": runs}]}
    bench_pipelines.plot(result, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 0


def test_ctrl_c_in_the_middle_of_a_run_tears_everything_down(wan: None, tmp_path: Path) -> None:  # noqa: F811
    """SIGINT while Gfarm runs the pipeline: the comparison stops, and no namespace, cgroup, mount or
    process of the run is left."""
    require("FUSE", fuse_problem())
    require("cgroups", cgroups.problem())
    require("Gfarm (Debian gfmd gfsd gfarm2fs gfarm-client)", gf.problem())
    root = Path(__file__).resolve().parents[2]
    process = subprocess.Popen([sys.executable, "-m", "benchmarks.wan.bench_pipelines", "montage", "--size", "4",
                                "--tile-pixels", "32", "--bandwidth-mbit", "1000", "--systems", "gfarm",
                                "--out", str(tmp_path / "r.json")], cwd=root, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "TMPDIR": str(tmp_path)})
    assert process.stderr is not None
    seen = []
    for line in process.stderr:
        seen.append(line)
        if "gfarm: running" in line:
            break
    time.sleep(3)  # the pipeline is running on the gfarm2fs mounts
    process.send_signal(signal.SIGINT)
    rest, _ = process.communicate(timeout=180)
    assert process.returncode != 0, "".join(seen) + rest
    prefix = f"gmw{process.pid}x"
    assert prefix not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        assert not list(hierarchy.glob(f"{prefix}*")), f"a cgroup of the run is left in {hierarchy}"
    with open("/proc/self/mounts") as f:
        assert str(tmp_path) not in f.read(), "a mount of the run is left"
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert not [line for line in out.splitlines() if str(tmp_path) in line and "ps -eo" not in line]
    assert not list(tmp_path.glob("gmw-pipe-*")), "the run's directory is left"


def test_a_gfarm_or_central_job_placed_on_n2_is_moved_onto_n2s_cpus() -> None:
    """The baseline wrapper runs a job placed on n2 from make's process, in n1's cgroup: only the cgroup
    watcher, which moves a process naming GMOUNT_NODE and a variant of the emulation's cluster, puts it
    on n2's CPU. The jobs of Gfarm's and the central server's runs must name such a cluster (they named
    "gfarm" and "central": every job ran on n1's CPU)."""
    emulation = "wanpipe-4242-100"
    for system in ("gfarm", "central"):
        env = placement_env({"n1": "/m1", "n2": "/m2"}, bench_pipelines.jobs_cluster(emulation, system), "random",
                            "n1", "n1", 1, "/bin/sh")
        environ = b"\0".join(f"{k}={v}".encode() for k, v in {**env, "GMOUNT_NODE": "n2"}.items()) + b"\0"
        assert cgroups.job_node(environ, [emulation]) == "n2", system
