"""The fault-injection soak, small (about 3 minutes): nothing lost, nothing wrong, no error undocumented.

Four nodes on two emulated WAN sites (benchmarks/wan) run writers through the
mounts (cp, dd, cat >, tar -x, ln -s, O_APPEND writes into the node whose disk
fills, directory renames and removals), Cluster.write_bytes and put, real make
and Snakemake runs, and cat/ls/stat loops on every node, while a seeded
schedule kills and restarts daemons (a directory's home, its backup, both, any
node), fills n4's disk (a tmpfs made for the test), drops and delays packets
between the sites and closes connections under running requests (`ss -K`).
Then every file whose close succeeded is read from every node. The test fails
on any failure the report lists: an error README.md and docs/failures.md do not
document for the fault around it, wrong bytes, a file unreadable afterwards, a
twin, a temporary file left behind, bytes outside the exports, a daemon that
grew by more than the bounds, an internal error in a daemon's log.

`python benchmarks/soak.py --minutes 30` is the same soak, long.
"""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path

import pytest

from benchmarks.faults import KINDS, SoakConfig, run_soak
from benchmarks.faults.cluster import problem

from .conftest import require

#: A dead node's mountpoint must take no files while `gmount up` replaces its mount: the soak's
#: writers find the bare directory otherwise (issue 28, item 5), and their files land outside every
#: export. The fix (sealed mountpoints) is on branch h28node; until it is merged the soak is expected
#: to fail on that alone, and is not run.
MOUNTPOINTS_SEALED = hasattr(importlib.import_module("gmountpy.node.directories"), "unseal_mountpoint")

#: The CI size: every kind of fault once (kills take ~12 s each with the restart), ~3 minutes in all.
CONFIG = SoakConfig(seconds=80.0, seed=28, warmup=10.0, quiet_tail=10.0, hold=(2.0, 4.0), gap=(3.0, 6.0),
                    disk_mib=256, writer_pause=(0.3, 1.0), reader_pause=(0.3, 1.0), workflow_pause=(5.0, 15.0))


@pytest.mark.xfail(not MOUNTPOINTS_SEALED, run=False, strict=True,
                   reason="needs sealed mountpoints (branch h28node): without them files land in a dead "
                          "node's bare mountpoint while it restarts")
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
    assert injected["kill"] >= 4  # a home, a backup, both, any node
    kinds = data["operations"]["by_kind"]
    for kind in ("cp", "dd", "cat>", "tar", "ln -s", "append", "mv", "rm", "write_bytes", "put", "checksum",
                 "make", "snakemake", "cat", "ls", "stat"):
        assert kind in kinds, f"no {kind} operation ran: {sorted(kinds)}"
    assert kinds["make"].get("ok", 0) + kinds["snakemake"].get("ok", 0) >= 1, kinds
    assert data["files_checked"] >= 200 and data["reads_checked"] >= 4 * 200
    assert set(KINDS) >= {"kill_home", "kill_backup", "kill_home_and_backup", "kill_any"}
    assert not os.listdir(tmp_path / "cluster" / "n1" / "mnt")
