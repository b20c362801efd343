"""benchmarks/bench_dask.py at its CI size: placed tasks read at most 5 % of their input remotely, results equal.

A real 4-node cluster with real Dask workers; both placements in one run over the same
workers, remote bytes from the daemons' counters. The full-size run is in benchmarks/.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ..conftest import fuse_problem, require

ROOT = Path(__file__).resolve().parents[2]


def test_bench_dask_quick_placed_reads_locally_and_results_are_equal(tmp_path: Path) -> None:
    require("FUSE", fuse_problem())
    out = tmp_path / "dask.json"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_dask.py"), "--quick", "--check",
                          "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    doc = json.loads(out.read_text())
    assert doc["results_equal"] == {"csv": True, "parquet": True}
    rows = {(r["format"], r["placement"]): r for r in doc["rows"]}
    for kind in ("csv", "parquet"):
        placed, default = rows[(kind, "gmount")], rows[(kind, "dask default")]
        assert placed["remote_fraction"] <= 0.05, placed
        # Dask's own placement puts most partitions away from their data (3 nodes of 4 do not hold a file)
        assert default["remote_fraction"] >= 0.3, default
        assert placed["input_bytes"] == default["input_bytes"] > 0
        assert placed["read_local"] > 0
    assert doc["down_problems"] == {}
