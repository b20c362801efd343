"""examples/notebook/explore.ipynb, executed by a real Jupyter kernel against a real cluster it brings up."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import nbclient
import nbformat
import pytest

from gmountpy.cluster import state as state_store
from gmountpy.cluster.config import load_spec

from .conftest import force_cleanup, fuse_problem, require

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "notebook" / "explore.ipynb"


def _text(cell: Any) -> str:
    """Everything a cell showed: streams, plain text and HTML of its results."""
    parts = []
    for output in cell.get("outputs", []):
        if output.get("output_type") == "stream":
            parts.append(output["text"])
        elif output.get("output_type") == "error":
            parts.append("\n".join(output.get("traceback", [])))
        else:
            data = output.get("data", {})
            parts += [data.get("text/plain", ""), data.get("text/html", "")]
    return "\n".join(parts)


def test_explore_notebook_runs_against_a_real_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    require("FUSE", fuse_problem())
    name = f"nb-{os.getpid()}"
    # The kernel inherits the environment: the notebook's parameters and our private state dir.
    monkeypatch.setenv("GMOUNT_NOTEBOOK_DIR", str(tmp_path / "cluster"))
    monkeypatch.setenv("GMOUNT_NOTEBOOK_CLUSTER", name)
    monkeypatch.setenv("JUPYTER_PLATFORM_DIRS", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    # A kernel running this very interpreter (whatever `python` on PATH may be).
    spec_dir = tmp_path / "jupyter" / "kernels" / "gmount-test"
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "gmount test", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=120, kernel_name="gmount-test",
                                     resources={"metadata": {"path": str(tmp_path)}})
    try:
        client.execute()
    finally:
        cluster_file = tmp_path / "cluster" / "cluster.toml"
        if cluster_file.exists():
            spec = load_spec(cluster_file)
            state = state_store.load(spec.name)
            if state is not None:  # the notebook failed before its last cell brought the cluster down
                from gmountpy import launch
                launch.down(spec.name)
            force_cleanup(spec, state)

    cells = {tag: cell for cell in notebook.cells for tag in cell.get("metadata", {}).get("tags", [])}
    assert "cluster " + name in _text(cells["up"]) and "n4" in _text(cells["up"])
    assert _text(cells["status"]).count("up") >= 4
    ls = _text(cells["ls"])
    assert "hongo-a.csv" in ls and "tsukuba-a.csv" in ls
    where = _text(cells["where"])
    assert "/data/hongo-a.csv" in where and "n3" in where and "/notes/README.txt" in where
    assert any("image/png" in o.get("data", {}) for o in cells["draw"].outputs)
    assert (tmp_path / "cluster" / "overlay.png").stat().st_size > 1000
    assert "temperature" in _text(cells["pandas"]) and "count" in _text(cells["pandas"])
    assert "48 rows read from n4 (hongo)" in _text(cells["numpy"])
    assert "copied" in _text(cells["stage"])
    after = _text(cells["after"])
    assert "nearest holder for n1: before n3, after n1" in after
    assert "n1's mount opens it from: n1" in after
    assert any("image/png" in o.get("data", {}) for o in cells["after"].outputs)
    assert (tmp_path / "cluster" / "overlay-staged.png").stat().st_size > 1000
    assert "place on n" in _text(cells["place"]) and "&lt;- chosen" in _text(cells["place"])
    assert f"on n4 in {tmp_path / 'cluster' / 'n4' / 'mnt'}" in _text(cells["run"])
    # the replica stays on n1's disk after `down`
    assert (tmp_path / "cluster" / "n1" / "export" / "data" / "hongo-a.csv").exists()
    assert state_store.load(name) is None
