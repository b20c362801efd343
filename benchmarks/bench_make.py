#!/usr/bin/env python3
"""What make's include costs per recipe: make with gmount.mk against plain make in the same mount.

Brings up a real local 4-node, 2-site cluster (n1 n2 | n3 n4), writes
in1..in4 into the exports of n1..n4, and measures from n1's mount:

- `make`: `make -j1` of N independent recipes (`@echo $@ > /dev/null`: a
  recipe plain make hands to /bin/sh) with `include gmount.mk` and without
  it, alternately, for three Makefiles: recipes without prerequisites, with
  a local one (in1.txt, on n1), and with four on four nodes (in1..in4: the
  recipe runs on n4, in n4's mount). Per recipe = (time of N recipes - time
  of none) / N, so make's own start is not counted; overhead = include -
  plain, the median over `--repeats` pairs. CPU per recipe likewise, of
  every process: make and all it started (RUSAGE_CHILDREN) plus the four
  node daemons (/proc; 10 ms ticks, so read over N recipes).
- `call`: one `SHELL -c 'echo t > /dev/null'` invocation as make makes it,
  for /bin/sh, gmount-job (C, the include's SHELL) and the Python gmount-sh
  (its fallback), with the same three kinds of prerequisites: median wall
  ms over `--calls` calls, CPU ms per call (the wrapper and its children,
  and the daemons).
- `make-include`: `gmount make-include`, run once per make.

    python benchmarks/bench_make.py [--out benchmarks/results/make.json] [--calls 40] [--recipes 200]

gmount-job and gmount-sh come from this Python's installation (`pip install .`
or nox). The cluster is always torn down, also on error or Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _jobs import BIN, NODES, children_cpu, local_cluster, processes_cpu, write_document  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "make.json"
#: the three kinds of recipes the targets are about: prerequisites, and the node the recipe runs on
KINDS = {"no prerequisites": ("", "n1"), "local prerequisite": ("in1.txt", "n1"),
         "prerequisites on four nodes": ("in1.txt in2.txt in3.txt in4.txt", "n4")}


def log(message: str) -> None:
    print(f"[bench-make {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def makefile(recipes: int, deps: str, include: str | None) -> str:
    lines = [f"include {include}"] if include else []
    targets = [f"t{i}" for i in range(recipes)]
    lines += [f".PHONY: all {' '.join(targets)}", f"all: {' '.join(targets)}", "\t@:"]
    for target in targets:
        lines += [f"{target}: {deps}", "\t@echo $@ > /dev/null"]
    return "\n".join(lines) + "\n"


def timed_run(argv: list[str], cwd: Path, env: dict[str, str], daemons: list[int]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the process tree and the daemons) of one run."""
    cpu_before, daemons_before = children_cpu(), processes_cpu(daemons)
    started = time.perf_counter()
    subprocess.run(argv, cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    return wall, (children_cpu() - cpu_before) + (processes_cpu(daemons) - daemons_before)


def make_rows(args: argparse.Namespace, here: Path, export: Path, env: dict[str, str], daemons: list[int],
              mk: str) -> list[dict[str, Any]]:
    rows = []
    for kind, (deps, node) in KINDS.items():
        samples: dict[str, list[tuple[float, float]]] = {"plain": [], "gmount": []}
        for _ in range(args.repeats):
            for variant, include in (("plain", None), ("gmount", mk)):
                per: dict[int, tuple[float, float]] = {}
                for recipes in (args.recipes, 0):
                    (export / "Makefile").write_text(makefile(recipes, deps, include))
                    per[recipes] = timed_run(["make", "-j1"], here, env, daemons)
                samples[variant].append(((per[args.recipes][0] - per[0][0]) / args.recipes,
                                         (per[args.recipes][1] - per[0][1]) / args.recipes))
        wall_over = [(g[0] - p[0]) * 1000 for g, p in zip(samples["gmount"], samples["plain"], strict=True)]
        cpu_over = [(g[1] - p[1]) * 1000 for g, p in zip(samples["gmount"], samples["plain"], strict=True)]
        row = {"what": "make", "case": kind, "runs_on": node, "recipes": args.recipes, "repeats": args.repeats,
               "plain_ms_per_recipe": round(statistics.median(s[0] for s in samples["plain"]) * 1000, 3),
               "gmount_ms_per_recipe": round(statistics.median(s[0] for s in samples["gmount"]) * 1000, 3),
               "plain_cpu_ms_per_recipe": round(statistics.median(s[1] for s in samples["plain"]) * 1000, 3),
               "gmount_cpu_ms_per_recipe": round(statistics.median(s[1] for s in samples["gmount"]) * 1000, 3),
               "overhead_ms": round(statistics.median(wall_over), 3),
               "overhead_cpu_ms": round(statistics.median(cpu_over), 3),
               "overhead_ms_samples": [round(v, 3) for v in wall_over],
               "overhead_cpu_ms_samples": [round(v, 3) for v in cpu_over]}
        rows.append(row)
        log(f"make, {kind}: {row['overhead_ms']:.2f} ms and {row['overhead_cpu_ms']:.2f} ms CPU per recipe over "
            f"plain make ({row['plain_ms_per_recipe']:.2f} ms per recipe)")
    return rows


def call_rows(args: argparse.Namespace, here: Path, env: dict[str, str], daemons: list[int],
              wrappers: dict[str, str]) -> list[dict[str, Any]]:
    rows = []
    recipe = "echo t > /dev/null"

    def stats(argv: list[str], call_env: dict[str, str]) -> dict[str, float]:
        walls = []
        cpu = 0.0
        for _ in range(args.calls):
            wall, used = timed_run(argv, here, call_env, daemons)
            walls.append(wall * 1000)
            cpu += used
        return {"ms_median": round(statistics.median(walls), 3), "ms_min": round(min(walls), 3),
                "cpu_ms": round(cpu * 1000 / args.calls, 3)}

    sh = stats(["/bin/sh", "-c", recipe], env)
    rows.append({"what": "call", "case": "/bin/sh -c", **sh})
    for label, wrapper in wrappers.items():
        for kind, (deps, node) in KINDS.items():
            result = stats([wrapper, "-c", recipe], {**env, "GMOUNT_TARGET": "t", "GMOUNT_DEPS": deps})
            rows.append({"what": "call", "case": f"{label}: {kind}", "runs_on": node, **result,
                         "ms_over_sh": round(result["ms_median"] - sh["ms_median"], 3),
                         "cpu_ms_over_sh": round(result["cpu_ms"] - sh["cpu_ms"], 3)})
            log(f"{label}, {kind}: {result['ms_median']:.2f} ms (sh {sh['ms_median']:.2f}), "
                f"cpu {result['cpu_ms']:.2f} ms (sh {sh['cpu_ms']:.2f})")
    return rows


def run(args: argparse.Namespace, base: Path) -> list[dict[str, Any]]:
    from gmountpy_make import JOB_PROGRAM, MAKEFILE

    python_wrapper = os.path.join(BIN, "gmount-sh")
    for program in (JOB_PROGRAM, python_wrapper):
        if not os.access(program, os.X_OK):
            raise SystemExit(f"bench_make: {program} is missing: install gmountpy (pip install .) first")
    log("starting a 4-node local cluster")
    with local_cluster(base, f"bench-make-{os.getpid()}") as (_, daemons):
        for i, node in enumerate(NODES, start=1):
            d = base / node / "export" / "bench"
            d.mkdir(parents=True, exist_ok=True)
            (d / f"in{i}.txt").write_bytes(os.urandom(4096 * i))
        subprocess.run([os.path.join(BIN, "gmount"), "rescan"], check=False, capture_output=True)
        here = base / "n1" / "mnt" / "bench"
        env = {**os.environ, "PATH": BIN + os.pathsep + os.environ["PATH"],
               "GMOUNT_PLACEMENT_LOG": str(base / "placement.jsonl"), "GMOUNT_SH_FALLBACK": python_wrapper}
        rows = make_rows(args, here, base / "n1" / "export" / "bench", env, daemons, MAKEFILE)
        placed = [json.loads(line) for line in (base / "placement.jsonl").read_text().splitlines()]
        if {entry["via"] for entry in placed} != {"daemon"} or {entry["node"] for entry in placed} != {"n1", "n4"}:
            raise SystemExit(f"bench_make: recipes went through {sorted({e['via'] for e in placed})} to nodes "
                             f"{sorted({e['node'] for e in placed})}, not the daemon to n1 and n4: "
                             "the numbers would not be the include's")
        rows += call_rows(args, here, env, daemons, {"gmount-job": JOB_PROGRAM, "gmount-sh (Python)": python_wrapper})
        started = time.perf_counter()
        subprocess.run([os.path.join(BIN, "gmount"), "make-include"], check=True, capture_output=True)
        rows.append({"what": "make-include", "case": "gmount make-include (once per make)",
                     "ms": round((time.perf_counter() - started) * 1000, 1)})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON output (default {DEFAULT_OUT})")
    parser.add_argument("--calls", type=int, default=40, help="invocations per call case (default 40)")
    parser.add_argument("--recipes", type=int, default=200, help="recipes per make run (default 200)")
    parser.add_argument("--repeats", type=int, default=5, help="pairs of make runs per case (default 5)")
    args = parser.parse_args()
    if shutil.which("make") is None:
        print("bench_make: GNU make is not installed (Debian package make)", file=sys.stderr)
        return 2
    base = Path(tempfile.mkdtemp(prefix="gmount-bench-make-"))
    os.environ["XDG_STATE_HOME"] = str(base / "state")  # never the user's own clusters
    load_start = os.getloadavg()
    try:
        rows = run(args, base)
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    finally:
        shutil.rmtree(base, ignore_errors=True)
    doc = write_document(args.out, load_start, vars(args) | {"out": str(args.out)}, rows=rows)
    for row in doc["rows"]:
        if row["what"] == "make":
            print(f"make  {row['case']:<30} over plain make: {row['overhead_ms']:6.2f} ms, "
                  f"cpu {row['overhead_cpu_ms']:6.2f} ms per recipe (plain: {row['plain_ms_per_recipe']:.2f} ms)")
        elif row["what"] == "call":
            print(f"call  {row['case']:<48} {row['ms_median']:7.2f} ms  cpu {row['cpu_ms']:6.2f} ms")
        else:
            print(f"{row['case']:<54} {row['ms']:7.1f} ms")
    print(f"results written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
