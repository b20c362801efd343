#!/usr/bin/env python3
"""What the gmount executor costs per Snakemake job: many trivial `shell:` jobs, against plain Snakemake.

Brings up a real local 4-node, 2-site cluster (n1 n2 | n3 n4), writes one
small input per job into the exports of n1..n4 in turn, and runs the same
Snakefile (job i: `cp data/{i}.txt out/{i}.txt`, one `shell:` rule) three
ways, with `-j1` so that every job's cost is on the makespan:

- `gmount`: `snakemake --executor gmount` in n1's mount: each job runs on
  the node holding its input (the placement log says where, and by which
  path: "shell" is the command alone on the node);
- `plain`: plain `snakemake` (the local executor) in a plain directory;
- and, for comparison, a few jobs of a `run:` rule with the gmount executor:
  the path that keeps a Snakemake process per job.

Per job = (makespan of N jobs - makespan of N_SMALL jobs) / (N - N_SMALL),
so Snakemake's start (parsing, DAG) is not counted; overhead = gmount -
plain. The placement log gives, per job, the seconds from start to the
executor seeing its end; against the command's own time (the same command
run alone in the mount, median) that is the executor's per-job overhead.

    python benchmarks/bench_snakemake_jobs.py [--jobs 100] [--small 10] [--out benchmarks/results/snakemake_jobs.json]
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
from _jobs import NODES, local_cluster, log, write_document  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "snakemake_jobs.json"
SHELL_RULES = """\
N = int(config["count"])
rule all:
    input: expand("out/{i}.txt", i=range(N))

rule copy:
    input: "data/{i}.txt"
    output: "out/{i}.txt"
    shell: "cp {input} {output}"
"""
RUN_RULES = """\
N = int(config["count"])
rule all:
    input: expand("runout/{i}.txt", i=range(N))

rule copy_in_python:
    input: "data/{i}.txt"
    output: "runout/{i}.txt"
    run:
        import shutil
        shutil.copyfile(input[0], output[0])
"""


def say(message: str) -> None:
    log("bench-snakemake-jobs", message)


def snakemake(cwd: Path, snakefile: str, n: int, *extra: str) -> float:
    for directory in ("out", "runout", ".snakemake"):
        shutil.rmtree(cwd / directory, ignore_errors=True)
    (cwd / "Snakefile").write_text(snakefile)
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "snakemake", "-j1", *extra, "--config", f"count={n}"], cwd=cwd,
                            capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"snakemake failed in {cwd}:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}")
    return seconds


def write_inputs(directories: list[Path], n: int) -> None:
    for i in range(n):
        d = directories[i % len(directories)] / "data"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{i}.txt").write_text(f"input {i}\n" * 10)


def command_seconds(cwd: Path, calls: int = 20) -> float:
    """The median time of one job's command alone, run as the executor runs it (bash -c) in the mount."""
    samples = []
    for i in range(calls):
        started = time.perf_counter()
        subprocess.run(["bash", "-c", f"set -euo pipefail; cp data/{i}.txt cmd-probe.txt"], cwd=cwd, check=True)
        samples.append(time.perf_counter() - started)
    (cwd / "cmd-probe.txt").unlink()
    return statistics.median(samples)


def run(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    results: dict[str, Any] = {}
    plain = base / "plain"
    write_inputs([plain], args.jobs)
    say("starting a 4-node local cluster")
    with local_cluster(base, f"bench-smk-{os.getpid()}"):
        workdir = "smk"
        write_inputs([base / node / "export" / workdir for node in NODES], args.jobs)
        here = base / "n1" / "mnt" / workdir
        time.sleep(2)  # files written straight into the exports reach their homes within the scan interval
        makespans: dict[str, dict[int, list[float]]] = {"gmount": {}, "plain": {}}
        logs: list[dict[str, Any]] = []
        for repeat in range(args.repeats):
            for n in (args.small, args.jobs):
                placement = here / f"placement-{repeat}-{n}.jsonl"
                makespans["gmount"].setdefault(n, []).append(snakemake(
                    here, SHELL_RULES, n, "--executor", "gmount", "--gmount-placement-log", str(placement)))
                makespans["plain"].setdefault(n, []).append(snakemake(plain, SHELL_RULES, n))
                say(f"repeat {repeat}, {n} jobs: gmount {makespans['gmount'][n][-1]:.1f} s, "
                    f"plain {makespans['plain'][n][-1]:.1f} s")
                if n == args.jobs:
                    logs += [json.loads(line) for line in placement.read_text().splitlines()]
        per_job = {how: [(big - small) / (args.jobs - args.small) for big, small in
                         zip(runs[args.jobs], runs[args.small], strict=True)] for how, runs in makespans.items()}
        own = command_seconds(here)
        seconds = [float(entry["seconds"]) for entry in logs]
        wrong = [entry for entry in logs if entry["via"] != "shell" or entry["placed_by"] != "daemon"
                 or entry["node"] != NODES[int(Path(entry["inputs"][0]).stem) % 4]]
        results["shell_jobs"] = {
            "jobs": args.jobs, "small": args.small, "repeats": args.repeats,
            "makespans_s": makespans, "per_job_s": per_job,
            "gmount_per_job_s": round(statistics.median(per_job["gmount"]), 4),
            "plain_per_job_s": round(statistics.median(per_job["plain"]), 4),
            "overhead_per_job_s": round(statistics.median(g - p for g, p in zip(per_job["gmount"], per_job["plain"],
                                                                                 strict=True)), 4),
            "placement_log_seconds_median": round(statistics.median(seconds), 4),
            "command_alone_seconds_median": round(own, 4),
            "executor_overhead_per_job_s": round(statistics.median(seconds) - own, 4),
            "jobs_not_on_the_path_or_node_expected": len(wrong),
        }
        if wrong:
            raise SystemExit(f"bench: {len(wrong)} jobs were not run as expected, e.g. {wrong[0]}")
        if args.snakemake_jobs:
            times = {}
            for n in (1, 1 + args.snakemake_jobs):
                times[n] = snakemake(here, RUN_RULES, n, "--executor", "gmount")
            results["own_snakemake_jobs"] = {
                "jobs": args.snakemake_jobs,
                "per_job_s": round((times[1 + args.snakemake_jobs] - times[1]) / args.snakemake_jobs, 3)}
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=100, help="jobs in the large run (default 100)")
    parser.add_argument("--small", type=int, default=10, help="jobs in the small run (default 10)")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each (default 2)")
    parser.add_argument("--snakemake-jobs", type=int, default=4,
                        help="`run:` jobs measured on the own-Snakemake path (default 4; 0: none)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON output (default {DEFAULT_OUT})")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="gmount-bench-smk-"))
    os.environ["XDG_STATE_HOME"] = str(base / "state")
    load_start = os.getloadavg()
    try:
        results = run(args, base)
    except KeyboardInterrupt:
        say("interrupted")
        return 130
    finally:
        shutil.rmtree(base, ignore_errors=True)
    write_document(args.out, load_start, {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                   results=results)
    shell_jobs = results["shell_jobs"]
    print(f"shell: jobs, -j1: {shell_jobs['gmount_per_job_s']:.3f} s per job with the gmount executor, "
          f"{shell_jobs['plain_per_job_s']:.3f} s plain: overhead {shell_jobs['overhead_per_job_s']:.3f} s per job")
    print(f"placement log: {shell_jobs['placement_log_seconds_median']:.3f} s per job (median), the command alone "
          f"{shell_jobs['command_alone_seconds_median']:.3f} s: executor overhead "
          f"{shell_jobs['executor_overhead_per_job_s']:.3f} s")
    if "own_snakemake_jobs" in results:
        print(f"run: jobs (own Snakemake process each): {results['own_snakemake_jobs']['per_job_s']:.2f} s per job")
    print(f"results written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
