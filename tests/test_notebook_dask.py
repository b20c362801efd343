"""examples/notebook/dask.ipynb, executed with `jupyter nbconvert --execute` as a user would run it.

Once with no cluster named (it makes a throwaway one under a temporary directory and takes it
down), once attached to a running cluster (which it must leave up, with no Dask left behind).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import nbformat
import pytest

from gmountpy import Cluster
from gmountpy.cluster import state as state_store
from gmountpy.launch import dask as dask_launch

from .conftest import LocalCluster, fuse_problem, require
from .test_notebook import _text

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "notebook" / "dask.ipynb"

pytest.importorskip("distributed")


def execute(tmp_path: Path, env: dict[str, str]) -> dict[str, Any]:
    """Run the notebook with `jupyter nbconvert --execute` on a kernel of this interpreter; its cells by tag."""
    spec_dir = tmp_path / "jupyter" / "kernels" / "gmount-test"
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "gmount test", "language": "python"}))
    out = tmp_path / "executed.ipynb"
    run = subprocess.run(
        [sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute",
         "--ExecutePreprocessor.kernel_name=gmount-test", "--ExecutePreprocessor.timeout=300",
         "--output", str(out), str(NOTEBOOK)],
        env={**os.environ, "JUPYTER_PATH": str(tmp_path / "jupyter"), "JUPYTER_PLATFORM_DIRS": "1", **env},
        capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-5000:]
    notebook = nbformat.read(out, as_version=4)
    return {tag: cell for cell in notebook.cells for tag in cell.get("metadata", {}).get("tags", [])}


def check_computation(cells: dict[str, Any]) -> None:
    dask = _text(cells["dask"])
    assert all(f"worker {n} at tls://" in dask for n in ("n1", "n2", "n3", "n4")), dask
    for line in _text(cells["submit"]).strip().splitlines():
        held, ran = line.split("held by ")[1].split(", ran on ")
        assert ran.startswith(held + ","), line  # each task ran on its file's holder
    table = _text(cells["dataframe"])
    assert "results equal with both placements" in table
    rows = [line.split() for line in table.splitlines() if line.strip()[:1].isdigit() and "%" in line]
    shares = {(r[1], r[2]): r[-1] for r in rows}  # (format, placement) -> remote share
    assert shares[("csv", "gmount")] == "0%" and shares[("parquet", "gmount")] == "0%", table
    assert shares[("csv", "Dask")] != "0%", table


def test_dask_notebook_makes_and_removes_a_throwaway_cluster(tmp_path: Path) -> None:
    require("FUSE", fuse_problem())
    before = {s.name for s in state_store.all_states()}
    cells = execute(tmp_path, {"GMOUNT_NOTEBOOK_CLUSTER": ""})
    check_computation(cells)
    assert "Dask stopped -- throwaway cluster down" in _text(cells["cleanup"])
    assert {s.name for s in state_store.all_states()} == before  # nothing left running


def test_dask_notebook_attached_leaves_the_users_cluster_up(tmp_path: Path, cluster4: LocalCluster) -> None:
    name = cluster4.spec.name
    assert dask_launch.load(name) is None
    cells = execute(tmp_path, {"GMOUNT_NOTEBOOK_CLUSTER": name})
    check_computation(cells)
    assert f"Dask stopped -- cluster {name} left up" in _text(cells["cleanup"])
    assert Cluster.open(name).status().up
    assert dask_launch.load(name) is None
    assert not [e.path for e in Cluster.open(name).ls("/") if e.path.startswith("/dask-example")]
