"""Read-ahead through real FUSE mounts, with the default tuning: closing a file never costs a peer.

`cat` of a fresh 1 MiB file held by another node reads sequentially, so the
node keeps 1 MiB blocks in flight ahead of it; `cat` closes the file while
some are still on their way, and the close cancels them. A cancelled request
must never take the shared connection down (nor mark the holder down): every
other reader of every other file from that holder shares that connection.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..conftest import FOUR_NODE_LINKS, FOUR_NODES, LocalCluster, fuse_problem, local_cluster, require

FILES = 100
SIZE = 1 << 20


@pytest.fixture
def default_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """Four nodes on two sites with the default tuning (read-ahead on), as a user gets it."""
    require("FUSE", fuse_problem())
    with local_cluster(tmp_path / "c", f"ra-{os.getpid()}-{uuid.uuid4().hex[:6]}", FOUR_NODES, FOUR_NODE_LINKS,
                       tuning="") as cluster:
        yield cluster


def test_cat_of_fresh_remote_files_from_every_other_node_never_fails(default_cluster: LocalCluster) -> None:
    cluster = default_cluster
    top = f"fresh-{uuid.uuid4().hex[:8]}"
    (cluster.mount("n3") / top).mkdir()
    digests: dict[str, str] = {}
    for i in range(FILES):  # written through n3's mount: held by n3, fresh everywhere else
        data = os.urandom(SIZE)
        (cluster.mount("n3") / top / f"f{i:03}.bin").write_bytes(data)
        digests[f"f{i:03}.bin"] = hashlib.sha256(data).hexdigest()

    failures: list[str] = []
    wrong: list[str] = []
    read = 0
    lock = threading.Lock()

    def cat_all(node: str) -> None:
        nonlocal read
        for name, digest in digests.items():
            path = cluster.mount(node) / top / name
            result = subprocess.run(["cat", str(path)], capture_output=True, timeout=60)
            with lock:
                read += 1
                if result.returncode != 0:
                    failures.append(f"{node}: cat {name}: {result.stderr.decode(errors='replace').strip()}")
                elif hashlib.sha256(result.stdout).hexdigest() != digest:
                    wrong.append(f"{node}: {name}: {len(result.stdout)} bytes, not the {SIZE} written")

    readers = [threading.Thread(target=cat_all, args=(node,)) for node in ("n1", "n2", "n4")]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join()
    assert read == 3 * FILES
    assert failures == [], f"{len(failures)} of {read} cat failed, e.g. {failures[:5]}"
    assert wrong == [], f"{len(wrong)} of {read} cat read wrong bytes, e.g. {wrong[:5]}"
    for node in ("n1", "n2", "n4"):  # and the listing shows every name (no holder taken for down)
        assert sorted(os.listdir(cluster.mount(node) / top)) == sorted(digests), node
    for node in ("n1", "n2", "n4"):
        log = Path(cluster.state.nodes[node].log).read_text(errors="replace")
        assert "is unavailable" not in log, f"{node} took a peer for down:\n" + "\n".join(
            line for line in log.splitlines() if "unavailable" in line)
