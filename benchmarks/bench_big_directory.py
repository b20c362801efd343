#!/usr/bin/env python3
"""One directory of 100 000 entries made by 4 nodes x 8 writers at once: Giga+ splitting at scale.

Brings up a real local 4-node, 2-site cluster (n1 n2 | n3 n4) with the default
tuning (`lookup = "index"`, `index_split_entries` 8192 unless `--split`), then:

1. every node's 8 writer threads create their share of `--entries` new files
   (open O_CREAT|O_EXCL + close) in one fresh directory through their own mount;
2. `stat` of `--sample` names written by the other site, from n2, must find
   each one, and of as many names that exist nowhere, from n4, must say ENOENT
   (before any listing, so that no name is in a kernel's cache);
3. `ls` of the directory through every node's mount must list exactly every
   name (the listing asks each partition's server);

and reports creates/s, the partitions and the nodes serving them, seconds per
listing and messages per stat and per miss (counted by the daemons). It exits 1
if a name is missing, listed twice or found where it should not be: the run is
also a correctness check of the split index at a size the test suite does not
reach.

    python benchmarks/bench_big_directory.py [--entries 100000] [--split 8192] [--sample 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

try:
    from benchmarks.bench_core import _raise_interrupt, log, scratch_cluster, write_results
    from benchmarks.bench_lookup import messages_sent, write_cluster_file
    from benchmarks.bench_split import THREADS, creates_per_second, index_stats
except ImportError:  # run as `python benchmarks/bench_big_directory.py`: its siblings are importable by name
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_core import _raise_interrupt, log, scratch_cluster, write_results  # type: ignore[no-redef,import-not-found]
    from bench_lookup import messages_sent, write_cluster_file  # type: ignore[no-redef,import-not-found]
    from bench_split import THREADS, creates_per_second, index_stats  # type: ignore[no-redef,import-not-found]

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "big_directory.json"
NODES = ["n1", "n2", "n3", "n4"]
DIRECTORY = "big"


def run(entries: int, split: int, sample: int, base: Path, holder: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The measurements, and what was wrong (empty when every check held)."""
    from gmountpy import launch
    from gmountpy.cluster.config import load_spec

    name = f"bbd-{os.getpid()}"
    path = write_cluster_file(base, name, "index")
    path.write_text(path.read_text() + f"index_split_entries = {split}\n")
    spec = load_spec(path)
    holder["name"] = name
    holder["state"] = launch.up(spec)
    mounts = {node: Path(spec.node(node).mountpoint) for node in NODES}
    wrong: list[str] = []
    row: dict[str, Any] = {}
    try:
        os.mkdir(mounts["n1"] / DIRECTORY)
        for mount in mounts.values():  # each writer's node knows the directory (and its home) before timing
            os.path.exists(mount / DIRECTORY / "warm-up")
        per_writer = -(-entries // (len(NODES) * THREADS))
        rate = creates_per_second(list(mounts.values()), DIRECTORY, per_writer)
        made = per_writer * len(NODES) * THREADS
        stats = index_stats(holder["state"])
        row["creates"] = {"files": made, "writers": len(NODES) * THREADS, "creates_per_s": round(rate, 1)}
        row["partitions"] = {node: int(s.get("partitions", 0)) for node, s in stats.items()}
        row["partition_entries"] = {node: int(s.get("partition_entries", 0)) for node, s in stats.items()}
        row["splits"] = sum(int(s.get("splits", 0)) for s in stats.values())
        log(f"{made} creates at {rate:.0f}/s; partitions served per node: {row['partitions']}")

        expected = {f"{mount.parent.name}-t{t}-{i:05d}" for mount in mounts.values()
                    for t in range(THREADS) for i in range(per_writer)}
        rng = random.Random(7)
        remote = sorted(n for n in expected if n.startswith(("n3-", "n4-")))  # written at the other site
        chosen = rng.sample(remote, min(sample, len(remote)))
        before, start = messages_sent(name), time.perf_counter()
        for entry in chosen:
            try:
                os.stat(mounts["n2"] / DIRECTORY / entry)
            except OSError as exc:
                wrong.append(f"stat {entry} through n2: {exc}")
        row["stat_remote"] = {"count": len(chosen), "ops_per_s": round(len(chosen) / (time.perf_counter() - start), 1),
                              "messages_per_op": round((messages_sent(name) - before) / len(chosen), 3)}
        before, start = messages_sent(name), time.perf_counter()
        for i in range(sample):
            if os.path.lexists(mounts["n4"] / DIRECTORY / f"nowhere-{i:05d}"):
                wrong.append(f"nowhere-{i:05d} found through n4")
        row["stat_missing"] = {"count": sample, "ops_per_s": round(sample / (time.perf_counter() - start), 1),
                               "messages_per_op": round((messages_sent(name) - before) / sample, 3)}
        log(f"stat of remote names: {row['stat_remote']}; of missing names: {row['stat_missing']}")

        listings: dict[str, Any] = {}
        for node, mount in mounts.items():
            before = messages_sent(name)
            start = time.perf_counter()
            names = os.listdir(mount / DIRECTORY)
            seconds = time.perf_counter() - start
            listings[node] = {"seconds": round(seconds, 3), "messages": messages_sent(name) - before,
                              "names": len(names)}
            if len(names) != len(set(names)):
                wrong.append(f"ls through {node}: {len(names) - len(set(names))} names listed twice")
            if set(names) != expected:
                wrong.append(f"ls through {node}: {len(expected - set(names))} names missing, "
                             f"{len(set(names) - expected)} unexpected")
            log(f"ls through {node}: {len(names)} names in {seconds:.2f} s")
        row["listing"] = listings
    finally:
        problems = launch.down(name) or {}
        holder["name"] = holder["state"] = None
        for node, why in problems.items():
            log(f"down {node}: {why}")
    return row, wrong


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON output (default {DEFAULT_OUT})")
    parser.add_argument("--entries", type=int, default=100_000, help="names made in the directory (default 100000)")
    parser.add_argument("--split", type=int, default=8192, help="index_split_entries (default 8192, the library's)")
    parser.add_argument("--sample", type=int, default=1000, help="names stat'ed, existing and missing (default 1000)")
    args = parser.parse_args()
    if args.entries < 1 or args.split < 0 or args.sample < 1:
        print("bench_big_directory: --entries and --sample must be at least 1, --split at least 0", file=sys.stderr)
        return 2
    if not os.access("/dev/fuse", os.R_OK | os.W_OK) or not shutil.which("fusermount3"):
        print("bench_big_directory: needs /dev/fuse and fusermount3 (Debian package fuse3)", file=sys.stderr)
        return 2
    old_term = signal.signal(signal.SIGTERM, _raise_interrupt)
    load_start = os.getloadavg()
    try:
        with scratch_cluster("gmount-bench-big-directory-") as (base, holder):
            row, wrong = run(args.entries, args.split, args.sample, base, holder)
    except KeyboardInterrupt:
        log("interrupted: cleaned up")
        return 130
    finally:
        signal.signal(signal.SIGTERM, old_term)
    write_results(args.out, load_start, {"entries": args.entries, "split_entries": args.split, "sample": args.sample,
                                         "nodes": len(NODES), "sites": 2, "threads_per_node": THREADS},
                  row, wrong=wrong)
    print(json.dumps(row, indent=2))
    for problem in wrong[:20]:
        print(f"WRONG: {problem}", file=sys.stderr)
    print(f"results written to {args.out}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
