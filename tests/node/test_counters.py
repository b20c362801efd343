"""Per-node byte counters: what a mount read from its own export vs from other nodes, and what peers read.

Reads go through real mounts; the counters must add up to exactly the bytes read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from gmountpy import Cluster

from ..conftest import FOUR_NODE_LINKS, FOUR_NODES, fuse_problem, local_cluster, require


def _delta(after: dict[str, dict[str, int]], before: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    return {node: {k: v - before[node].get(k, 0) for k, v in row.items()} for node, row in after.items()}


def test_counters_add_up_to_bytes_read_through_mounts(tmp_path: Path) -> None:
    require("FUSE", fuse_problem())
    with local_cluster(tmp_path, f"ctr-{os.getpid()}", FOUR_NODES, FOUR_NODE_LINKS) as lc:
        sizes = {"n1": 70_001, "n2": 5_000_003, "n3": 123, "n4": 1_300_000}
        for node, size in sizes.items():
            path = lc.export(node) / "data" / f"from-{node}.bin"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(os.urandom(size))
        cluster = Cluster.open(lc.spec.name)
        before = cluster.counters()
        # n1 reads every file once (its own locally, three remotely); n3 reads n2's file.
        read_by = {"n1": list(sizes), "n3": ["n2"]}
        for reader, holders in read_by.items():
            for holder in holders:
                data = (lc.mount(reader) / "data" / f"from-{holder}.bin").read_bytes()
                assert len(data) == sizes[holder]
        # n3 writes a file (local) through its mount.
        (lc.mount("n3") / "data" / "written-by-n3.bin").write_bytes(b"x" * 4321)
        delta = _delta(cluster.counters(), before)

        assert delta["n1"]["read_local"] == sizes["n1"]
        assert delta["n1"]["read_remote"] == sizes["n2"] + sizes["n3"] + sizes["n4"]
        assert delta["n3"]["read_remote"] == sizes["n2"] and delta["n3"]["read_local"] == 0
        assert delta["n3"]["write_local"] == 4321 and delta["n3"]["write_remote"] == 0
        for node in ("n2", "n4"):
            assert delta[node]["read_local"] == delta[node]["read_remote"] == 0
        # Holders served at least what the mounts read remotely (read-ahead may fetch a window twice
        # or one it then drops); a file read in one request is served exactly once.
        assert delta["n2"]["served_read"] >= 2 * sizes["n2"]
        assert delta["n3"]["served_read"] == sizes["n3"]
        assert delta["n1"]["served_read"] == 0
        assert sum(d["served_read"] for d in delta.values()) >= sum(d["read_remote"] for d in delta.values())

        # The same numbers through `gmount status --json` and Cluster.status().
        out = subprocess.run([sys.executable, "-m", "gmountpy", "status", "--json", str(lc.base / "cluster.toml")],
                             capture_output=True, text=True, check=True).stdout
        rows = {row["name"]: row["counters"] for row in json.loads(out)}
        now = cluster.counters()
        for node in sizes:
            assert rows[node]["read_remote"] == now[node]["read_remote"]
            assert rows[node]["served_read"] == now[node]["served_read"]
        status = {n.name: n.counters for n in cluster.status().nodes}
        assert status["n1"]["read_local"] == now["n1"]["read_local"]
