#!/usr/bin/env python3
"""Lookups, misses and creates: flooding search vs homed directory index vs central metadata.

Brings up a real local 4-node, 2-site cluster (n1 n2 | n3 n4) once per
`lookup` mode ("flood", "index", "central"; default tuning otherwise) and,
through n1's mount, times:

- `stat remote`: first stat of N distinct files held by n3 (other site);
- `stat missing`: stat of N distinct names that exist nowhere;
- `stat local`: first stat of N distinct files held by n1;
- `create`: open(O_CREAT|O_EXCL) + close of N new names (they land on n1);
- `readdir`: listing of N/10 distinct directories of 10 files held by n3;
- `rename local`: rename(2) of the N files `create` made (held by n1) to
  new names in their directory; `rename remote`: the same for the N files
  of `stat remote` (held by n3).

For each row it reports ops/s and messages per operation: the requests all
daemons sent to other nodes during the row (their `messages_sent` counters),
divided by N (mean over the repeats: each repeat uses its own directories,
and with `index` a directory homed on n1 itself costs no message; with
`central` the home of everything is n3, at the other site). Every directory
is touched once before its row is timed, so a home's one-time listing of the
directory is not in the row. No WAN delay:
everything runs over loopback, so ops/s here mostly measures CPU per message.

    python benchmarks/bench_lookup.py [--files N] [--repeats R] [--out benchmarks/results/lookup.json]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

try:
    from benchmarks.bench_core import _raise_interrupt, log, scratch_cluster, write_results
except ImportError:  # run as `python benchmarks/bench_lookup.py`: its sibling is importable by name
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_core import _raise_interrupt, log, scratch_cluster, write_results  # type: ignore[no-redef,import-not-found]

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "lookup.json"
SITES = {"tsukuba": ["n1", "n2"], "hongo": ["n3", "n4"]}
LINK = ("tsukuba", "hongo", 14.0)
MODES = ("flood", "index", "central")
CENTRAL = "n3"  # the central metadata node: another site than the measuring node n1, as a server would be
ROWS = ("stat remote", "stat missing", "stat local", "create", "readdir", "rename local", "rename remote")


def write_cluster_file(base: Path, name: str, mode: str) -> Path:
    lines = [f'name = "{name}"', 'launcher = "local"', "[defaults]",
             f'export = "{base}/{{node}}/export"', f'mountpoint = "{base}/{{node}}/mnt"']
    for site, nodes in SITES.items():
        lines += [f"[sites.{site}]", "nodes = [" + ", ".join(f'"{n}"' for n in nodes) + "]"]
    lines += ["[[links]]", f'sites = ["{LINK[0]}", "{LINK[1]}"]', f"rtt_ms = {LINK[2]}"]
    lines += ["[tuning]", f'lookup = "{mode}"']
    if mode == "central":
        lines.append(f'central_node = "{CENTRAL}"')
    for node in (n for members in SITES.values() for n in members):
        (base / node / "export").mkdir(parents=True, exist_ok=True)
    path = base / "cluster.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def messages_sent(name: str) -> int:
    from gmountpy import Cluster
    return sum(int(row.get("messages_sent", 0)) for row in Cluster.open(name).counters().values())


def timed(name: str, paths: list[Path], op: str) -> tuple[float, float]:
    """(ops/s, messages/op) of `op` on every path."""
    before = messages_sent(name)
    start = time.perf_counter()
    for path in paths:
        if op == "stat":
            try:
                os.stat(path)
            except FileNotFoundError:
                pass
        elif op == "listdir":
            os.listdir(path)
        elif op == "rename":
            os.rename(path, path.with_name("renamed-" + path.name))
        else:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    seconds = time.perf_counter() - start
    return len(paths) / seconds, (messages_sent(name) - before) / len(paths)


def run_mode(mode: str, files: int, repeats: int, base: Path, holder: dict[str, Any]) -> dict[str, Any]:
    from gmountpy import launch
    from gmountpy.cluster.config import load_spec

    name = f"bl-{mode}-{os.getpid()}"
    spec = load_spec(write_cluster_file(base, name, mode))
    export = {n: Path(spec.node(n).export) for n in spec.nodes}
    mnt = Path(spec.node("n1").mountpoint)
    for r in range(repeats):
        for row, node in (("remote", "n3"), ("local", "n1")):
            d = export[node] / "bench" / row / f"r{r}"
            d.mkdir(parents=True)
            for i in range(files):
                os.close(os.open(d / f"f{i:05d}", os.O_CREAT | os.O_WRONLY, 0o644))
        for row in ("missing", "create"):
            (export["n1"] / "bench" / row / f"r{r}").mkdir(parents=True)
        for j in range(max(1, files // 10)):
            d = export["n3"] / "bench" / "lists" / f"r{r}" / f"d{j:04d}"
            d.mkdir(parents=True)
            for i in range(10):
                os.close(os.open(d / f"f{i}", os.O_CREAT | os.O_WRONLY, 0o644))
    holder["name"] = name
    state = launch.up(spec)
    holder["state"] = state
    samples: dict[str, list[tuple[float, float]]] = {row: [] for row in ROWS}
    try:
        for r in range(repeats):
            dirs = {row: mnt / "bench" / row / f"r{r}" for row in ("remote", "missing", "local", "create")}
            for d in dirs.values():  # touch each directory once: a home lists it on first demand
                os.stat(d)
                os.path.exists(d / "warm-up")
            samples["stat remote"].append(timed(name, [dirs["remote"] / f"f{i:05d}" for i in range(files)], "stat"))
            samples["stat missing"].append(timed(name, [dirs["missing"] / f"m{i:05d}" for i in range(files)], "stat"))
            samples["stat local"].append(timed(name, [dirs["local"] / f"f{i:05d}" for i in range(files)], "stat"))
            samples["create"].append(timed(name, [dirs["create"] / f"c{i:05d}" for i in range(files)], "create"))
            listed = sorted((mnt / "bench" / "lists" / f"r{r}").iterdir())
            for d in listed:
                os.path.exists(d / "warm-up")
            samples["readdir"].append(timed(name, listed, "listdir"))
            # the files n1 just created (held by n1), then files held by n3, each to a new name in its directory
            samples["rename local"].append(timed(name, [dirs["create"] / f"c{i:05d}" for i in range(files)], "rename"))
            samples["rename remote"].append(timed(name, [dirs["remote"] / f"f{i:05d}" for i in range(files)], "rename"))
    finally:
        problems = launch.down(name) or {}
        holder["name"] = holder["state"] = None
        for node, why in problems.items():
            log(f"{mode}: down {node}: {why}")
    return {row: {"ops_per_s": round(statistics.median(s[0] for s in values), 1),
                  # mean: with an index, a directory homed on n1 itself costs no message
                  "messages_per_op": round(statistics.fmean(s[1] for s in values), 3),
                  "samples": [[round(a, 1), round(b, 3)] for a, b in values]}
            for row, values in samples.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON output (default {DEFAULT_OUT})")
    parser.add_argument("--files", type=int, default=300, help="operations per row and repeat (default 300)")
    parser.add_argument("--repeats", type=int, default=3, help="repetitions per row (default 3)")
    parser.add_argument("--modes", default=",".join(MODES), help="lookup modes to compare (default all)")
    args = parser.parse_args()
    if args.files < 1 or args.repeats < 1:
        print("bench_lookup: --files and --repeats must be at least 1", file=sys.stderr)
        return 2
    if not os.access("/dev/fuse", os.R_OK | os.W_OK) or not shutil.which("fusermount3"):
        print("bench_lookup: needs /dev/fuse and fusermount3 (Debian package fuse3)", file=sys.stderr)
        return 2
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for mode in modes:
        if mode not in MODES:
            print(f"bench_lookup: unknown mode {mode!r} (choose from {', '.join(MODES)})", file=sys.stderr)
            return 2
    old_term = signal.signal(signal.SIGTERM, _raise_interrupt)
    results: dict[str, Any] = {}
    load_start = os.getloadavg()
    try:
        for mode in modes:
            with scratch_cluster(f"gmount-bench-lookup-{mode}-") as (base, holder):
                log(f"{mode}: 4 nodes, {args.files} operations per row, {args.repeats} repeats")
                results[mode] = run_mode(mode, args.files, args.repeats, base, holder)
    except KeyboardInterrupt:
        log("interrupted: cleaned up")
        return 130
    finally:
        signal.signal(signal.SIGTERM, old_term)
    write_results(args.out, load_start, {"files": args.files, "repeats": args.repeats, "nodes": 4, "sites": 2,
                                         "via": "n1's mount"}, results)
    print(f"{'row':<14}" + "".join(f"{m + ' ops/s':>16}{m + ' msg/op':>16}" for m in results))
    for row in ROWS:
        print(f"{row:<14}" + "".join(f"{results[m][row]['ops_per_s']:>16}{results[m][row]['messages_per_op']:>16}"
                                     for m in results))
    print(f"results written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
