#!/usr/bin/env python3
"""Dask on gmount: tasks placed on the nodes holding their input vs Dask's own placement, same run.

Brings up a real local 4-node, 2-site cluster (n1 n2 | n3 n4) with the
library, writes FILES CSV files and FILES Parquet files of weather readings
straight into the exports, spread evenly over the four nodes in a seeded
random order, and starts Dask on it (`Cluster.dask()`: one worker per node
in its mount). Then, with the same workers, it aggregates each format --
`dask.dataframe.read_csv` / `read_parquet` of `gmount://` globs, grouped by
station: count, mean, min and max -- first with Dask's default placement
(`set_placement(client, False)`), then with gmount's placement.

Remote bytes are the daemons' own counters (`Cluster.counters()`): bytes the
nodes' mounts handed to the tasks from other nodes (`read_remote`) during the
run, against the input's size -- the claim `--check` holds placed runs to.
`served_bytes` is everything the exports sent over RPC in the run: those
remote reads plus what the mounts' read-ahead fetched beyond them, and what
this process read itself (dask samples the first CSV file and reads Parquet
footers here). The default run goes first: a node's page cache then helps the
placed run's local reads only, never its remote ones. Every result is
checked equal to pandas over the export files.

    python benchmarks/bench_dask.py                 # 100 + 100 files of 40 000 rows, a few minutes
    python benchmarks/bench_dask.py --quick         # 12 + 12 files of 2 000 rows, under a minute
    python benchmarks/bench_dask.py --check         # exit 1 unless placed remote <= 5 % and results equal

JSON goes to --out (default benchmarks/results/dask.json). The cluster, its
Dask processes, mounts and files are removed at the end, also on error or Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "dask.json"
NODES = ["n1", "n2", "n3", "n4"]
STATIONS = 40
#: the claim checked by --check: placed tasks read at most this share of their input from other nodes
MAX_PLACED_REMOTE = 0.05


def log(message: str) -> None:
    print(f"[bench-dask {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def cluster_file(base: Path, name: str) -> Path:
    path = base / "cluster.toml"
    path.write_text("\n".join([
        f'name = "{name}"', 'launcher = "local"', "create_export = true", "[defaults]",
        f'export = "{base}/{{node}}/export"', f'mountpoint = "{base}/{{node}}/mnt"', "slots = 2",
        "[sites.tsukuba]", 'nodes = ["n1", "n2"]', "[sites.hongo]", 'nodes = ["n3", "n4"]',
        "[[links]]", 'sites = ["tsukuba", "hongo"]', "rtt_ms = 14.0", ""]))
    return path


def write_data(base: Path, files: int, rows: int, seed: int = 34) -> dict[str, Any]:
    """FILES CSV and FILES Parquet files in the exports, an equal share per node; where each one is."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    layout: dict[str, Any] = {"files": {}, "bytes": {"csv": 0, "parquet": 0}}
    for kind in ("csv", "parquet"):
        holders = rng.permutation([NODES[i % len(NODES)] for i in range(files)])
        for i, node in enumerate(holders):
            frame = pd.DataFrame({
                "station": rng.integers(0, STATIONS, rows).astype("int64"),
                "hour": rng.integers(0, 24, rows).astype("int64"),
                "temperature": rng.normal(15.0, 8.0, rows).round(2),
            })
            target = base / str(node) / "export" / kind / f"part-{i:03d}.{kind}"
            target.parent.mkdir(parents=True, exist_ok=True)
            if kind == "csv":
                frame.to_csv(target, index=False)
            else:
                frame.to_parquet(target, index=False)
            layout["files"][f"/{kind}/{target.name}"] = str(node)
            layout["bytes"][kind] += target.stat().st_size
    return layout


def aggregate(frame: Any) -> Any:
    """What every run computes: per station, count, mean, min and max temperature."""
    return frame.groupby("station")["temperature"].agg(["count", "mean", "min", "max"])


def expected(base: Path, kind: str) -> Any:
    """The same aggregation by pandas over the export files themselves."""
    import pandas as pd

    paths = sorted(p for node in NODES for p in (base / node / "export" / kind).glob(f"*.{kind}"))
    frames = [pd.read_csv(p) if kind == "csv" else pd.read_parquet(p) for p in paths]
    return aggregate(pd.concat(frames)).sort_index()


def counters_delta(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for node, values in after.items():
        for key in ("read_local", "read_remote", "served_read"):
            total[key] = total.get(key, 0) + values.get(key, 0) - before.get(node, {}).get(key, 0)
    return total


def one_run(cluster: Any, client: Any, kind: str, placed: bool, input_bytes: int) -> tuple[dict[str, Any], Any]:
    import dask.dataframe as dd

    from gmountpy.api.dask import set_placement

    set_placement(client, placed)
    url = f"gmount://{cluster.name}/{kind}/*.{kind}"
    before = cluster.counters()
    started = time.perf_counter()
    frame = dd.read_csv(url) if kind == "csv" else dd.read_parquet(url)
    result = aggregate(frame).compute().sort_index()
    seconds = time.perf_counter() - started
    moved = counters_delta(before, cluster.counters())
    row = {"format": kind, "placement": "gmount" if placed else "dask default", "seconds": round(seconds, 3),
           "partitions": frame.npartitions, "input_bytes": input_bytes, "read_local": moved["read_local"],
           "read_remote": moved["read_remote"], "remote_fraction": round(moved["read_remote"] / input_bytes, 4),
           "served_bytes": moved["served_read"]}
    log(f"{kind:<8} {row['placement']:<13} {seconds:6.2f}s  remote {row['read_remote']:>11,} B "
        f"({row['remote_fraction']:.1%})  local {row['read_local']:>11,} B")
    return row, result


def same(a: Any, b: Any) -> bool:
    import pandas as pd

    try:
        pd.testing.assert_frame_equal(a, b, check_dtype=False, check_exact=False, rtol=1e-9, check_names=False)
    except AssertionError:
        return False
    return True


def run(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    from gmountpy import Cluster

    name = f"bench-dask-{os.getpid()}"
    log(f"writing {args.files} CSV and {args.files} Parquet files of {args.rows} rows into the exports")
    layout = write_data(base, args.files, args.rows)
    cluster = Cluster.up(cluster_file(base, name))
    try:
        cluster.rescan()
        started = time.perf_counter()
        client = cluster.dask()
        log(f"Dask up in {time.perf_counter() - started:.1f}s: {client}")
        client.run(_warm_up)  # the first task on a worker imports pandas and pyarrow: not part of any run
        rows, equal = [], {}
        try:
            for kind in ("csv", "parquet"):
                truth = expected(base, kind)
                default_row, default_result = one_run(cluster, client, kind, False, layout["bytes"][kind])
                placed_row, placed_result = one_run(cluster, client, kind, True, layout["bytes"][kind])
                rows += [default_row, placed_row]
                equal[kind] = same(default_result, truth) and same(placed_result, truth)
        finally:
            client.close()
    finally:
        problems = _down(name)
    return {"rows": rows, "results_equal": equal, "down_problems": problems,
            "nodes_holding": {node: sum(1 for n in layout["files"].values() if n == node) for node in NODES}}


def _warm_up() -> None:
    import dask.dataframe  # noqa: F401
    import pandas  # noqa: F401
    import pyarrow.parquet  # noqa: F401


def _down(name: str) -> dict[str, str]:
    from gmountpy import launch

    return launch.down(name)  # the Dask processes first, then the daemons


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON output (default {DEFAULT_OUT})")
    parser.add_argument("--files", type=int, default=100, help="CSV files, and as many Parquet files (default 100)")
    parser.add_argument("--rows", type=int, default=40_000, help="rows per file (default 40 000)")
    parser.add_argument("--quick", action="store_true", help="12 + 12 files of 2 000 rows")
    parser.add_argument("--check", action="store_true",
                        help=f"exit 1 unless placed runs read <= {MAX_PLACED_REMOTE:.0%} remotely and results equal")
    args = parser.parse_args(argv)
    if args.quick:
        args.files, args.rows = 12, 2_000
    base = Path(tempfile.mkdtemp(prefix="gmount-bench-dask-"))
    state_home = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = str(base / "state")  # never the user's own clusters
    load_start = os.getloadavg()
    try:
        doc = run(args, base)
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    finally:
        if state_home is None:
            os.environ.pop("XDG_STATE_HOME", None)
        else:
            os.environ["XDG_STATE_HOME"] = state_home
        shutil.rmtree(base, ignore_errors=True)
    import dask
    import distributed

    doc = {"command": " ".join(["python", "benchmarks/bench_dask.py", *(argv if argv is not None else sys.argv[1:])]),
           "commit": git_commit(), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "kernel": platform.release(),
                       "dask": dask.__version__, "distributed": distributed.__version__,
                       "loadavg_at_start": load_start, "loadavg_at_end": os.getloadavg()},
           "parameters": {"files_per_format": args.files, "rows_per_file": args.rows, "nodes": NODES,
                          "threads_per_worker": 2}, **doc}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"{'format':<8} {'placement':<13} {'seconds':>8} {'remote bytes':>14} {'remote':>7} {'served bytes':>13}")
    for row in doc["rows"]:
        print(f"{row['format']:<8} {row['placement']:<13} {row['seconds']:8.2f} {row['read_remote']:14,} "
              f"{row['remote_fraction']:7.1%} {row['served_bytes']:13,}")
    print(f"results equal to pandas over the exports: {doc['results_equal']}")
    print(f"results written to {args.out}")
    if args.check:
        placed = [row for row in doc["rows"] if row["placement"] == "gmount"]
        failed = [f"{r['format']}: placed remote {r['remote_fraction']:.1%}" for r in placed
                  if r["remote_fraction"] > MAX_PLACED_REMOTE]
        failed += [f"{kind}: results differ" for kind, ok in doc["results_equal"].items() if not ok]
        if failed:
            print("check failed: " + "; ".join(failed), file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
