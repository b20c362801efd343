"""The fault-injection soak, small (well under a minute): nothing lost, nothing wrong, no error undocumented.

Four nodes on two emulated WAN sites (benchmarks/wan) run writers through the
mounts (cp, dd, cat >, tar -x, ln -s, O_APPEND writes into the node whose disk
fills, directory renames and removals), Cluster.write_bytes and put, real make
and Snakemake runs, and cat/ls/stat loops on every node, while a seeded
schedule kills and restarts a daemon, fills n4's disk (a tmpfs made for the test), drops and delays packets
between the sites and closes connections under running requests (`ss -K`).
Then every file whose close succeeded is read from every node. The test fails
on any failure the report lists: an error README.md and docs/failures.md do not
document for the fault around it, wrong bytes, a file unreadable afterwards, a
twin, a temporary file left behind, bytes outside the exports, a daemon that
grew by more than the bounds, an internal error in a daemon's log.

`python benchmarks/soak.py --minutes 30` (`nox -s soak`) is the same soak, long, with every kind of
kill (a directory's home, its backup, both, any node) and every fault again and again.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from benchmarks.faults import SoakConfig, run_soak
from benchmarks.faults.cluster import problem

from .conftest import require

#: The CI size: each kind of fault once (a kill of any node: its restart takes ~8 s), one make and one
#: Snakemake run, in about 45 s with the checks.
CONFIG = SoakConfig(seconds=18.0, seed=28, warmup=2.0, quiet_tail=1.0, grace=5.0, hold=(1.0, 2.0), gap=(0.5, 1.0),
                    faults=("kill_any", "disk_full", "drop", "delay", "conn_kill"), disk_mib=256,
                    writer_pause=(0.2, 0.6), reader_pause=(0.2, 0.6), workflow_pause=(1.0, 3.0))


def test_soak_loses_nothing_and_every_error_is_documented(tmp_path: Path) -> None:
    require("the soak (root, network namespaces, iptables-legacy, gcc, libnetfilter-queue, FUSE, ss)", problem())
    report = run_soak(CONFIG, tmp_path)
    data = report.data
    (tmp_path / "soak.json").write_text(json.dumps(data, indent=1))
    summary = {"operations": data["operations"]["total"], "faults": data["faults"]["by_kind"],
               "files_checked": data["files_checked"], "failures": data["failures"]["by_category"]}
    print(json.dumps(summary))
    assert report.failures == 0, (f"{report.failures} failures ({data['failures']['by_category']}); the first:\n"
                                  + "\n".join(json.dumps(f) for f in data["failures"]["list"][:15])
                                  + f"\nreport: {tmp_path / 'soak.json'}")
    # the soak did what it says: every kind of fault, every kind of operation, files checked everywhere
    injected = data["faults"]["by_kind"]
    assert set(injected) == {"kill", "disk_full", "drop", "delay", "conn_kill"}, injected
    kinds = data["operations"]["by_kind"]
    for kind in ("cp", "dd", "cat>", "tar", "ln -s", "append", "mv", "rm", "write_bytes", "put", "checksum",
                 "make", "snakemake", "cat", "ls", "stat"):
        assert kind in kinds, f"no {kind} operation ran: {sorted(kinds)}"
    assert kinds["make"].get("ok", 0) + kinds["snakemake"].get("ok", 0) >= 1, kinds
    assert data["files_checked"] >= 50 and data["reads_checked"] >= 4 * 50
    assert not os.listdir(tmp_path / "cluster" / "n1" / "mnt")
