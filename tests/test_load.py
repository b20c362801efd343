"""Load: many concurrent writers on every node into one shared directory.

The full size from the issue (4 nodes x 8 writers x 5,000 files) runs when
GMOUNT_LOAD_FILES=5000; CI runs a smaller count so the suite stays quick.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from gmountpy.launch.orchestrate import pid_is_daemon

from .conftest import FOUR_NODE_LINKS, FOUR_NODES, fuse_problem, local_cluster, require

FILES_PER_WRITER = int(os.environ.get("GMOUNT_LOAD_FILES", "400"))
WRITERS_PER_NODE = 8


def peak_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmHWM for pid {pid}")


def test_concurrent_writers_on_every_node(tmp_path: Path) -> None:
    require("FUSE", fuse_problem())
    with local_cluster(tmp_path, "load", FOUR_NODES, FOUR_NODE_LINKS) as cluster:
        errors: list[BaseException] = []

        def writer(node: str, index: int) -> None:
            directory = cluster.mount(node) / "shared"
            try:
                for i in range(FILES_PER_WRITER):
                    name = f"{node}-w{index}-{i:05d}"
                    with open(directory / name, "w") as f:
                        f.write(name)
            except BaseException as exc:  # reported below, with the others
                errors.append(exc)

        for node in cluster.nodes:
            (cluster.mount(node) / "shared").mkdir(exist_ok=True)
        threads = [threading.Thread(target=writer, args=(node, w))
                   for node in cluster.nodes for w in range(WRITERS_PER_NODE)]
        started = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - started
        assert not errors, errors[:3]
        total = len(cluster.nodes) * WRITERS_PER_NODE * FILES_PER_WRITER
        names = os.listdir(cluster.mount("n1") / "shared")
        assert len(names) == total and len(set(names)) == total
        for node in cluster.nodes:  # each file exists once, on the node that wrote it, with its content
            local = os.listdir(cluster.export(node) / "shared")
            assert len(local) == WRITERS_PER_NODE * FILES_PER_WRITER
            assert all(name.startswith(node + "-") for name in local)
        for name in names[:: max(1, total // 500)]:
            assert (cluster.mount("n3") / "shared" / name).read_text() == name
        rss = {}
        for node, record in cluster.state.nodes.items():
            assert pid_is_daemon(record.pid), f"daemon of {node} died under load"
            rss[node] = peak_rss_kib(record.pid)
        print(f"\n{total} files in {elapsed:.1f}s ({total / elapsed:.0f} creates/s); peak RSS KiB {rss}")
        assert max(rss.values()) < 1024 * 1024, rss  # bounded: well under 1 GiB per daemon
