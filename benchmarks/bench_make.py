#!/usr/bin/env python3
"""What make's SHELL under gmount costs per recipe: gmount-sh compared with /bin/sh.

Brings up a real local 4-node, 2-site cluster (n1 n2 | n3 n4) with the
library, writes in1..in4 into the exports of n1..n4, and measures from n1's
mount:

- `call`: one `SHELL -c :` invocation, as make makes it, for a `$(shell)`
  (no target), a recipe without prerequisites, one with a prerequisite on
  n1 (local), on n3 (other site), and one with four prerequisites on four
  nodes (the full placement rule), one with 16 (4 files x 4 nodes, read in
  parallel). Median wall time in ms over N calls, and CPU time per call: of
  gmount-sh and its children (`cpu_ms`), and of the four node daemons
  (`daemons_cpu_ms`, from /proc; 10 ms ticks, so averaged over N) -- on a
  shared machine CPU time is the steadier number, and every node is a
  process on this machine, so CPU spent per recipe is makespan.
- `make`: `make -j1` of N independent recipes (`:`, each reading one of
  in1..in4) with `include gmount.mk` against the same Makefile without it;
  ms per recipe = (time(N recipes) - time(no recipe)) / N, so make's own
  start and the `$(shell gmount make-include)` are not counted (reported
  on their own as `make-include`).

    python benchmarks/bench_make.py [--out benchmarks/results/make.json] [--calls 30] [--recipes 40]

gmount-sh is taken from beside this Python (a `pip install .` or nox puts it
there). The cluster is always torn down, also on error or Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "make.json"
BIN = os.path.dirname(os.path.abspath(sys.executable))
NODES = ["n1", "n2", "n3", "n4"]


def log(message: str) -> None:
    print(f"[bench-make {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def cluster_file(base: Path, name: str) -> Path:
    path = base / "cluster.toml"
    path.write_text("\n".join([
        f'name = "{name}"', 'launcher = "local"', "create_export = true", "[defaults]",
        f'export = "{base}/{{node}}/export"', f'mountpoint = "{base}/{{node}}/mnt"',
        "[sites.tsukuba]", 'nodes = ["n1", "n2"]', "[sites.hongo]", 'nodes = ["n3", "n4"]',
        "[[links]]", 'sites = ["tsukuba", "hongo"]', "rtt_ms = 14.0", ""]))
    return path


def timed(argv: list[str], cwd: Path, env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def median_ms(argv: list[str], cwd: Path, env: dict[str, str], n: int) -> tuple[float, float]:
    samples = [timed(argv, cwd, env) * 1000 for _ in range(n)]
    return statistics.median(samples), min(samples)


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def processes_cpu(pids: list[int]) -> float:
    """User + system seconds the processes have used (utime, stime of /proc/PID/stat)."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def call_stats(argv: list[str], cwd: Path, env: dict[str, str], n: int, daemons: list[int]) -> dict[str, float]:
    """Median and min wall ms, and CPU ms per call of the process tree and of the daemons."""
    cpu_before, daemons_before = children_cpu(), processes_cpu(daemons)
    samples = [timed(argv, cwd, env) * 1000 for _ in range(n)]
    return {"ms_median": statistics.median(samples), "ms_min": min(samples),
            "cpu_ms": round((children_cpu() - cpu_before) * 1000 / n, 2),
            "daemons_cpu_ms": round((processes_cpu(daemons) - daemons_before) * 1000 / n, 2)}


def makefile(recipes: int, include: str | None) -> str:
    lines = [f"include {include}"] if include else []
    targets = [f"t{i}" for i in range(recipes)]
    lines += [f".PHONY: all {' '.join(targets)}", f"all: {' '.join(targets)}", "\t@:"]
    for i, target in enumerate(targets):
        lines += [f"{target}: in{i % 4 + 1}.txt", "\t@true"]
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    from gmountpy import launch
    from gmountpy.cluster import state as state_store
    from gmountpy.cluster.config import load_spec
    from gmountpy_make import MAKEFILE

    wrapper = os.path.join(BIN, "gmount-sh")
    if not os.access(wrapper, os.X_OK):
        raise SystemExit(f"bench_make: {wrapper} is missing: install gmountpy (pip install .) first")
    spec = load_spec(cluster_file(base, f"bench-make-{os.getpid()}"))
    log("starting a 4-node local cluster")
    launch.up(spec)
    try:
        for i, node in enumerate(NODES, start=1):
            d = base / node / "export" / "bench"
            d.mkdir(parents=True, exist_ok=True)
            (d / f"in{i}.txt").write_bytes(os.urandom(4096 * i))
            for k in range(3):
                (d / f"more{i}{k}.txt").write_bytes(os.urandom(1024 * (k + 1)))
        here = base / "n1" / "mnt" / "bench"
        running = state_store.load(spec.name)
        daemons = [record.pid for record in running.nodes.values()] if running is not None else []
        env = {**os.environ, "PATH": BIN + os.pathsep + os.environ["PATH"],
               "GMOUNT_PLACEMENT_LOG": str(base / "placement.jsonl")}
        rows: list[dict[str, Any]] = []
        cases = [("$(shell) (no target)", "", ""), ("recipe, no prerequisites", "t", ""),
                 ("recipe, 1 input on n1 (local)", "t", "in1.txt"),
                 ("recipe, 1 input on n3 (other site)", "t", "in3.txt"),
                 ("recipe, 4 inputs on 4 nodes", "t", "in1.txt in2.txt in3.txt in4.txt"),
                 ("recipe, 16 inputs on 4 nodes", "t",
                  " ".join(f"in{i}.txt more{i}0.txt more{i}1.txt more{i}2.txt" for i in range(1, 5)))]
        sh = call_stats(["/bin/sh", "-c", ":"], here, env, args.calls, daemons)
        rows.append({"what": "call", "case": "/bin/sh -c :", **sh})
        log(f"/bin/sh: {sh['ms_median']:.1f} ms")
        for case, target, deps in cases:
            stats = call_stats([wrapper, "-c", ":"], here, {**env, "GMOUNT_TARGET": target, "GMOUNT_DEPS": deps},
                               args.calls, daemons)
            rows.append({"what": "call", "case": f"gmount-sh: {case}", **stats,
                         "ms_over_sh": stats["ms_median"] - sh["ms_median"]})
            log(f"gmount-sh {case}: {stats['ms_median']:.1f} ms, cpu {stats['cpu_ms']:.1f} ms, "
                f"daemons' cpu {stats['daemons_cpu_ms']:.1f} ms")

        per_recipe: dict[str, float] = {}
        for label, include in (("make + /bin/sh", None), ("make + gmount.mk", MAKEFILE)):
            cpu: dict[int, tuple[float, float]] = {}
            seconds: dict[int, float] = {}
            for recipes in (args.recipes, 0):
                (base / "n1" / "export" / "bench" / "Makefile").write_text(makefile(recipes, include))
                cpu_before, daemons_before = children_cpu(), processes_cpu(daemons)
                seconds[recipes] = statistics.median(timed(["make", "-j1"], here, env) for _ in range(args.repeats))
                cpu[recipes] = ((children_cpu() - cpu_before) / args.repeats,
                                (processes_cpu(daemons) - daemons_before) / args.repeats)
            full, empty = seconds[args.recipes], seconds[0]
            per_recipe[label] = (full - empty) * 1000 / args.recipes
            rows.append({"what": "make", "case": label, "recipes": args.recipes, "seconds_all": full,
                         "seconds_no_recipe": empty, "ms_per_recipe": per_recipe[label],
                         "cpu_ms": round((cpu[args.recipes][0] - cpu[0][0]) * 1000 / args.recipes, 2),
                         "daemons_cpu_ms": round((cpu[args.recipes][1] - cpu[0][1]) * 1000 / args.recipes, 2)})
            log(f"{label}: {per_recipe[label]:.1f} ms per recipe (make with no recipe: {empty:.2f} s)")
        include_ms, _ = median_ms([os.path.join(BIN, "gmount"), "make-include"], here, env, min(args.calls, 5))
        rows.append({"what": "make-include", "case": "gmount make-include (once per make)", "ms_median": include_ms})
        return {"rows": rows, "ms_per_recipe_overhead": per_recipe["make + gmount.mk"] - per_recipe["make + /bin/sh"]}
    finally:
        log("stopping the cluster")
        problems = launch.down(spec.name)
        for node, why in (problems or {}).items():
            log(f"down: {node}: {why}")
        for node in NODES:
            mnt = str(base / node / "mnt")
            with open("/proc/self/mounts") as f:
                if any(line.split(" ")[1] == mnt for line in f):
                    subprocess.run(["fusermount3", "-u", "-z", mnt], check=False, capture_output=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON output (default {DEFAULT_OUT})")
    parser.add_argument("--calls", type=int, default=30, help="invocations per call case (default 30)")
    parser.add_argument("--recipes", type=int, default=40, help="recipes in the make case (default 40)")
    parser.add_argument("--repeats", type=int, default=3, help="make runs per variant (default 3)")
    args = parser.parse_args()
    if shutil.which("make") is None:
        print("bench_make: GNU make is not installed (Debian package make)", file=sys.stderr)
        return 2
    base = Path(tempfile.mkdtemp(prefix="gmount-bench-make-"))
    os.environ["XDG_STATE_HOME"] = str(base / "state")  # never the user's own clusters
    load_start = os.getloadavg()
    try:
        doc = run(args, base)
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    finally:
        shutil.rmtree(base, ignore_errors=True)
    doc = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "kernel": platform.release(),
                       "loadavg_at_start": load_start, "loadavg_at_end": os.getloadavg()},
           "parameters": {"calls": args.calls, "recipes": args.recipes, "repeats": args.repeats},
           "gmount_sh": os.path.join(BIN, "gmount-sh"), **doc, "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    for row in doc["rows"]:
        value = row.get("ms_per_recipe", row.get("ms_median"))
        cpu = f"  cpu {row['cpu_ms']:6.1f} ms  daemons {row['daemons_cpu_ms']:6.1f} ms" if "cpu_ms" in row else ""
        print(f"{row['what']:<13} {row['case']:<48} {value:8.1f} ms{cpu}")
    print(f"results written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
