#!/usr/bin/env python3
"""Creates into one directory from 1, 2 and 4 nodes x 8 writers: the index with and without Giga+ splitting.

Brings up a real local 4-node, 2-site cluster (n1 n2 | n3 n4, `lookup = "index"`)
once with `index_split_entries = 0` (the directory's whole index at its home)
and once with `--split` (a small threshold, so the directory splits over the
nodes early in the run). In each, for 1, 2 and 4 writing nodes, 8 threads per
node create `--files` new files each (open O_CREAT|O_EXCL + close) in one
fresh directory through their own node's mount; it reports creates/s over all
writers, and for the split run how many nodes served partitions of it.

The machine running every daemon and writer is shared (2 cores here): compare
the ratios within one run, not the absolute rates.

    python benchmarks/bench_split.py [--files 40] [--split 64] [--out benchmarks/results/split.json]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

try:
    from benchmarks.bench_core import _raise_interrupt, log, scratch_cluster, write_results
    from benchmarks.bench_lookup import write_cluster_file
except ImportError:  # run as `python benchmarks/bench_split.py`: its siblings are importable by name
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_core import _raise_interrupt, log, scratch_cluster, write_results  # type: ignore[no-redef,import-not-found]
    from bench_lookup import write_cluster_file  # type: ignore[no-redef,import-not-found]

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "split.json"
WRITERS = {1: ["n1"], 2: ["n1", "n3"], 4: ["n1", "n2", "n3", "n4"]}
THREADS = 8


def creates_per_second(mounts: list[Path], directory: str, files: int) -> float:
    errors: list[str] = []

    def writer(mount: Path, tag: str) -> None:
        try:
            for i in range(files):
                os.close(os.open(mount / directory / f"{tag}-{i:05d}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        except OSError as exc:
            errors.append(f"{tag}: {exc}")

    threads = [threading.Thread(target=writer, args=(mount, f"{mount.parent.name}-t{t}"))
               for mount in mounts for t in range(THREADS)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"creates failed: {errors[:3]}")
    return len(threads) * files / seconds


def index_stats(cluster: Any) -> dict[str, Any]:
    """Each node's directory index statistics (DirectoryIndex.statistics, through `stats`)."""
    import trio

    from gmountpy.protocol import client
    from gmountpy.protocol import messages as msg

    async def main() -> dict[str, Any]:
        return {node: (await client.ask(cluster, node, msg.Stats())).get("index", {}) for node in cluster.nodes}

    return trio.run(main)


def run(split: int, files: int, base: Path, holder: dict[str, Any]) -> dict[str, Any]:
    from gmountpy import launch
    from gmountpy.cluster.config import load_spec

    name = f"bs-{split}-{os.getpid()}"
    path = write_cluster_file(base, name, "index")
    path.write_text(path.read_text() + f"index_split_entries = {split}\n")
    spec = load_spec(path)
    holder["name"] = name
    holder["state"] = launch.up(spec)
    rows: dict[str, Any] = {}
    try:
        for count, nodes in WRITERS.items():
            directory = f"one-dir-{count}"
            os.mkdir(Path(spec.node("n1").mountpoint) / directory)
            for node in nodes:  # each writer's node knows the directory (and its home) before timing
                os.path.exists(Path(spec.node(node).mountpoint) / directory / "warm-up")
            rate = creates_per_second([Path(spec.node(n).mountpoint) for n in nodes], directory, files)
            stats = index_stats(holder["state"])
            rows[str(count)] = {"creates_per_s": round(rate, 1), "writers": count * THREADS,
                                "files": count * THREADS * files,
                                "nodes_serving_partitions": sum(1 for s in stats.values() if s.get("partitions")),
                                "splits_so_far": sum(int(s.get("splits", 0)) for s in stats.values())}
            log(f"split={split}: {count} node(s) x {THREADS} writers: {rate:.0f} creates/s")
    finally:
        problems = launch.down(name) or {}
        holder["name"] = holder["state"] = None
        for node, why in problems.items():
            log(f"down {node}: {why}")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON output (default {DEFAULT_OUT})")
    parser.add_argument("--files", type=int, default=40, help="files per writer thread (default 40)")
    parser.add_argument("--split", type=int, default=64, help="index_split_entries of the split run (default 64)")
    args = parser.parse_args()
    if args.files < 1 or args.split < 1:
        print("bench_split: --files and --split must be at least 1", file=sys.stderr)
        return 2
    if not os.access("/dev/fuse", os.R_OK | os.W_OK) or not shutil.which("fusermount3"):
        print("bench_split: needs /dev/fuse and fusermount3 (Debian package fuse3)", file=sys.stderr)
        return 2
    old_term = signal.signal(signal.SIGTERM, _raise_interrupt)
    results: dict[str, Any] = {}
    load_start = os.getloadavg()
    try:
        for label, split in (("unsplit", 0), ("split", args.split)):
            with scratch_cluster(f"gmount-bench-split-{label}-") as (base, holder):
                results[label] = run(split, args.files, base, holder)
    except KeyboardInterrupt:
        log("interrupted: cleaned up")
        return 130
    finally:
        signal.signal(signal.SIGTERM, old_term)
    write_results(args.out, load_start, {"files_per_writer": args.files, "threads_per_node": THREADS,
                                         "split_entries": args.split, "nodes": 4, "sites": 2}, results)
    print(f"{'writing nodes':<14}{'unsplit c/s':>14}{'split c/s':>14}{'split/unsplit':>15}{'servers':>9}")
    for count in map(str, WRITERS):
        plain, split_row = results["unsplit"][count], results["split"][count]
        print(f"{count:<14}{plain['creates_per_s']:>14}{split_row['creates_per_s']:>14}"
              f"{split_row['creates_per_s'] / plain['creates_per_s']:>15.2f}{split_row['nodes_serving_partitions']:>9}")
    print(f"results written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
