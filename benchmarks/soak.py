#!/usr/bin/env python3
"""The fault-injection soak, long: `python benchmarks/soak.py --minutes 30`.

Four nodes on two emulated WAN sites (benchmarks/wan: network namespaces, root
needed) run writers (cp, dd, cat >, tar through the mounts; Cluster.write_bytes
and put), real make and Snakemake runs, and cat/ls/stat loops on every node,
while the harness kills and restarts daemons (directory homes, their backups,
both, any), fills one node's disk (a tmpfs made for the run), drops and delays
packets between the sites and closes connections under running requests. Then
every file whose close succeeded is read from every node, and the exports are
checked for twins, leftovers and bytes outside them; the daemons' descriptors and
memory before and after are compared with bounds. Every error that README.md and
docs/failures.md do not document for the fault around it is a failure.

    python benchmarks/soak.py [--minutes 30] [--seed 28] [--out benchmarks/results/soak.json]

Writes the JSON report (command, commit, operations, faults by kind, files
checked, failures with their reasons) to --out; exits 1 if there was any
failure. Everything it made (namespaces, mounts, the tmpfs, daemons) is removed
at the end, also after an error or Ctrl-C. The state and logs go to a temporary
XDG_STATE_HOME unless --keep names a directory to keep them in.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.faults import KINDS, SoakConfig, run_soak, write_report  # noqa: E402
from benchmarks.faults.cluster import problem  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "soak.json"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30.0, help="length of the faulty phase (default 30)")
    parser.add_argument("--seed", type=int, default=28)
    parser.add_argument("--faults", default=",".join(KINDS), help=f"kinds to inject (default: all: {','.join(KINDS)})")
    parser.add_argument("--disk-mib", type=int, default=2048, help="size of n4's disk (tmpfs), default 2048")
    parser.add_argument("--no-workflows", action="store_true", help="no make and Snakemake runs")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--keep", type=Path, help="keep the run's directory (state, logs, exports) here")
    parser.add_argument("--note", default="", help="a line for the report (what code ran, the machine's load)")
    args = parser.parse_args()
    if (why := problem()) is not None:
        print(f"soak: cannot run here: {why}", file=sys.stderr)
        return 2
    kinds = tuple(k for k in args.faults.split(",") if k)
    unknown = set(kinds) - set(KINDS)
    if unknown:
        parser.error(f"unknown fault kinds: {', '.join(sorted(unknown))}")
    config = SoakConfig(seconds=args.minutes * 60, seed=args.seed, faults=kinds, disk_mib=args.disk_mib,
                        quiet_tail=60.0, gap=(5.0, 25.0), hold=(3.0, 20.0),
                        workflows=() if args.no_workflows else ("make", "snakemake"), workflow_pause=(20.0, 60.0))
    # Ctrl-C and SIGTERM end the run through its cleanup (a shell without job control starts background
    # jobs with SIGINT ignored; give it its default back)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    work = args.keep or Path(tempfile.mkdtemp(prefix="gmsoak-"))
    work.mkdir(parents=True, exist_ok=True)
    os.environ["XDG_STATE_HOME"] = str(work / "state")
    try:
        report = run_soak(config, work)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    command = "python benchmarks/soak.py " + " ".join(sys.argv[1:])
    write_report(report, args.out, command.strip(), note=args.note)
    print(f"soak: {report.failures} failures; report in {args.out}", file=sys.stderr)
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
