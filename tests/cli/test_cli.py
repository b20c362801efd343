"""The `gmount` command, run as a user would (subprocess), against a real cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ..conftest import LocalCluster, force_cleanup, fuse_problem, require


def gmount(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([sys.executable, "-m", "gmountpy", *args], capture_output=True, text=True,
                            timeout=120, env={**os.environ, "COLUMNS": "200"})
    if check and result.returncode != 0:
        raise AssertionError(f"gmount {' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


def test_where_json_from_a_mount_path_and_with_cluster(cluster4: LocalCluster) -> None:
    (cluster4.export("n3") / "cli-where.txt").write_text("x")
    (cluster4.export("n2") / "cli-where.txt").write_text("xy")
    data = json.loads(gmount("where", "--json", str(cluster4.mount("n1") / "cli-where.txt")).stdout)
    holders = data[str(cluster4.mount("n1") / "cli-where.txt")]
    assert [h["node"] for h in holders] == ["n2", "n3"]
    assert holders[0]["size"] == 2 and holders[0]["site"] == "tsukuba"
    assert holders[1]["export_path"] == str(cluster4.export("n3") / "cli-where.txt")
    assert holders[1]["rtt_ms"] == 14.0
    data = json.loads(gmount("where", "--json", "--cluster", str(cluster4.base / "cluster.toml"),
                             "--node", "n4", "cli-where.txt").stdout)
    assert [h["node"] for h in data["cli-where.txt"]] == ["n3", "n2"]


def test_where_missing_path_and_outside_mount(cluster4: LocalCluster, tmp_path: Path) -> None:
    result = gmount("where", str(cluster4.mount("n1") / "no-such-file"), check=False)
    assert result.returncode == 1 and "no node holds it" in result.stdout
    result = gmount("where", str(tmp_path), check=False)
    assert result.returncode == 1
    assert "not inside the mount of any running cluster" in result.stderr
    assert "Traceback" not in result.stderr


def test_status_table(cluster4: LocalCluster) -> None:
    out = gmount("status", str(cluster4.base / "cluster.toml")).stdout
    for node in cluster4.nodes:
        assert node in out
    assert out.count(" up ") + out.count(" up\n") + out.count("│ up") >= 4


def test_bad_cluster_file_is_one_clear_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\n[sites.a]\nnodes = ["n1"]\n[defaults]\nexprot = "/tmp"\n')
    result = gmount("up", str(bad), check=False)
    assert result.returncode == 1
    assert "exprot" in result.stderr and "Traceback" not in result.stderr


def test_demo_brings_up_a_cluster_and_down_stops_it(tmp_path: Path) -> None:
    require("FUSE", fuse_problem())
    base = tmp_path / "demo"
    from gmountpy.cluster.config import load_spec
    try:
        out = gmount("demo", "--dir", str(base)).stdout
        assert "inputs/survey/tile-002.txt" in out and "n4" in out
        assert "gmount down" in out
        # the duplicate shared/config.yaml is opened from n2 (same site as n1)
        assert (base / "n1" / "mnt" / "shared" / "config.yaml").read_text().startswith("owner: n2")
        gmount("down", str(base / "cluster.toml"))
        assert not os.path.ismount(base / "n1" / "mnt")
    finally:
        spec = load_spec(base / "cluster.toml")
        from gmountpy import launch
        launch.down(spec.name)
        force_cleanup(spec, None)
