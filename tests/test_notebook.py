"""The example notebooks, executed as a user would run them (`jupyter nbconvert --execute`) by a real kernel:
explore.ipynb attaches to a running cluster and must leave it exactly as it was; demo.ipynb starts a
throwaway cluster of its own and stops that one only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest

from gmountpy import Cluster, launch
from gmountpy.cluster import state as state_store

from .conftest import FOUR_NODE_LINKS, FOUR_NODES, LocalCluster, force_cleanup, fuse_problem, local_cluster, require

NOTEBOOKS = Path(__file__).resolve().parents[1] / "examples" / "notebook"
JUPYTER = Path(sys.executable).parent / "jupyter"


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Somebody's running cluster, with data in its exports."""
    require("FUSE", fuse_problem())
    base = tmp_path_factory.mktemp("running")
    with local_cluster(base, f"nbrun-{os.getpid()}", FOUR_NODES, FOUR_NODE_LINKS) as cluster:
        for node, path, text in [("n3", "data/hongo-a.csv", "hour,temperature\n0,14.5\n1,15.25\n2,16.0\n"),
                                 ("n2", "data/tsukuba-a.csv", "hour,temperature\n0,11.0\n1,12.0\n"),
                                 ("n1", "notes/README.txt", "Temperature logs from two stations.\n")]:
            target = cluster.export(node) / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        cluster.rescan()
        yield cluster


def execute(notebook: Path, tmp_path: Path, env: dict[str, str]) -> Any:
    """Run `jupyter nbconvert --to notebook --execute` on a copy's output; the executed notebook."""
    # A kernel running this very interpreter (whatever `python` on PATH may be), found through JUPYTER_PATH.
    spec_dir = tmp_path / "jupyter" / "kernels" / "gmount-test"
    spec_dir.mkdir(parents=True, exist_ok=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "gmount test", "language": "python"}))
    out = tmp_path / f"{notebook.stem}-executed.ipynb"
    run = subprocess.run([str(JUPYTER), "nbconvert", "--to", "notebook", "--execute", str(notebook),
                          "--output", str(out), "--ExecutePreprocessor.kernel_name=gmount-test",
                          "--ExecutePreprocessor.timeout=240"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "JUPYTER_PATH": str(tmp_path / "jupyter"), "JUPYTER_PLATFORM_DIRS": "1",
                              **env})
    assert run.returncode == 0, f"nbconvert --execute {notebook.name} failed:\n{run.stderr[-6000:]}"
    return nbformat.read(out, as_version=4)


def outputs(notebook: Any) -> dict[str, str]:
    """tag -> everything its cell showed: streams, plain text and HTML of its results, errors."""
    shown: dict[str, str] = {}
    for cell in notebook.cells:
        parts = []
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream":
                parts.append(output["text"])
            elif output.get("output_type") == "error":
                parts.append("\n".join(output.get("traceback", [])))
            else:
                data = output.get("data", {})
                parts += [data.get("text/plain", ""), data.get("text/html", "")]
        for tag in cell.get("metadata", {}).get("tags", []):
            shown[tag] = "\n".join(parts)
    return shown


def images(notebook: Any, tag: str) -> int:
    return sum("image/png" in o.get("data", {}) for cell in notebook.cells
               if tag in cell.get("metadata", {}).get("tags", []) for o in cell.get("outputs", []))


def snapshot(cluster: LocalCluster) -> dict[str, tuple[int, int, int]]:
    """Every entry of every export (size, mtime, mode) and the cluster file: what a read-only look leaves."""
    seen: dict[str, tuple[int, int, int]] = {}
    for node in cluster.nodes:
        for path in [cluster.export(node), *cluster.export(node).rglob("*")]:
            info = path.lstat()
            seen[str(path)] = (info.st_size, info.st_mtime_ns, info.st_mode)
    cluster_file = cluster.base / "cluster.toml"
    info = cluster_file.stat()
    seen[str(cluster_file)] = (info.st_size, info.st_mtime_ns, hash(cluster_file.read_bytes()))
    return seen


def test_explore_attaches_to_a_running_cluster_and_only_reads(running: LocalCluster, tmp_path: Path) -> None:
    before = snapshot(running)
    # attached by a path inside n2's mount: lookups are n2's
    executed = execute(NOTEBOOKS / "explore.ipynb", tmp_path, {"GMOUNT_CLUSTER": str(running.mount("n2"))})
    shown = outputs(executed)
    assert f"<Cluster {running.spec.name!r}: 4 nodes" in shown["open"] and "home node n2" in shown["open"]
    assert shown["status"].count(" up") >= 4
    assert "data" in shown["ls"] and "notes" in shown["ls"]
    assert "3 files below /" in shown["where"] and "/data/hongo-a.csv" in shown["where"]
    assert images(executed, "per-node") == 1 and images(executed, "draw") == 1
    assert "/data/hongo-a.csv: " in shown["read"] and "read from n3 (hongo)" in shown["read"]
    assert "15.25" in shown["read"] or "count" in shown["read"]
    assert "place on n" in shown["place"]
    assert "jobs running" in shown["jobs"]
    assert "read_local" in shown["counters"]
    # nothing changed: not a file, not a directory, not the cluster file, and the cluster still runs
    assert snapshot(running) == before
    assert Cluster.open(running.spec.name).status().up


def test_demo_starts_a_throwaway_cluster_and_stops_only_that(running: LocalCluster, tmp_path: Path) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    try:
        executed = execute(NOTEBOOKS / "demo.ipynb", tmp_path, {"TMPDIR": str(scratch)})
    finally:  # the notebook failed before its last cell: stop what it started (under our TMPDIR only)
        for state in state_store.all_states():
            if state.name.startswith("notebook-") and str(scratch) in next(iter(state.nodes.values())).mountpoint:
                launch.down(state.name)
                force_cleanup(state.spec, state)
    shown = outputs(executed)
    name = shown["parameters"].split()[1]
    assert name.startswith("notebook-") and str(scratch) in shown["parameters"]
    assert f"cluster {name}" in shown["up"] and "n4" in shown["up"]
    assert shown["status"].count(" up") >= 4
    assert "hongo-a.csv" in shown["ls"] and "tsukuba-a.csv" in shown["ls"]
    assert "/data/hongo-a.csv" in shown["where"] and "n3" in shown["where"]
    assert images(executed, "draw") == 1 and images(executed, "after") == 1
    assert "temperature" in shown["pandas"] and "count" in shown["pandas"]
    assert "48 rows read from n4 (hongo)" in shown["numpy"]
    assert "copied" in shown["stage"]
    assert "nearest holder for n1: before n3, after n1" in shown["after"]
    assert "n1's mount opens it from: n1" in shown["after"]
    assert "place on n" in shown["place"] and "&lt;- chosen" in shown["place"]
    assert "on n4 in " in shown["run"]
    assert f"cluster {name} stopped" in shown["down"]
    # its own cluster is gone, and its directory; the running cluster beside it is untouched
    assert state_store.load(name) is None
    assert list(scratch.iterdir()) == []
    assert Cluster.open(running.spec.name).status().up
