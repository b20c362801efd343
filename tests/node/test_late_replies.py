"""A reply that comes after its caller gave up leaves nothing behind on the node that sent it.

A holder whose disk is slow (tests/node/slowfs.py, mounted inside its export, opens taking
longer than rpc_timeout) still opens the file and answers with a handle after the asking node
timed out. Left alone, that descriptor would stay open for the connection's life: after
tuning.handles_per_connection of them, every open from that peer fails with EMFILE.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gmountpy.protocol.client import call, run_sync

from ..conftest import LocalCluster, fuse_problem, local_cluster, require, wait_for
from . import slowfs

OPEN_SECONDS = 1.5


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[LocalCluster]:
    require("FUSE", fuse_problem())
    with local_cluster(tmp_path / "c", f"late-{os.getpid()}-{tmp_path.name[-8:]}", {"here": ["n1", "n2"]}, [],
                       tuning="attr_ttl = 0.5\nnegative_ttl = 0.5\nrpc_timeout = 0.5") as cluster:
        yield cluster


@contextmanager
def slow_opens(mountpoint: Path) -> Iterator[tuple[Path, list[str]]]:
    """slowfs at `mountpoint` with opens that take OPEN_SECONDS; yields its file and the opens it finished."""
    with slowfs.mounted(mountpoint, 0, OPEN_SECONDS) as opened:
        yield mountpoint / "slow.bin", opened


def test_opens_answered_after_the_timeout_leave_no_descriptor_on_the_holder(pair: LocalCluster) -> None:
    with slow_opens(pair.export("n2") / "slowdir") as (slow_file, opened):
        assert slow_file.exists()
        path = pair.mount("n1") / "slowdir" / "slow.bin"
        outcomes: list[int | None] = []

        def cat() -> None:
            result = subprocess.run(["cat", str(path)], capture_output=True, timeout=30)
            outcomes.append(result.returncode)

        readers = [threading.Thread(target=cat) for _ in range(3)]
        for reader in readers:  # three opens on n2 at once, each answered after n1 gave up on it
            reader.start()
        for reader in readers:
            reader.join()
        assert outcomes == [1, 1, 1]  # EIO: n2 did not answer within rpc_timeout
        assert wait_for(lambda: len(opened) == 3, timeout=4 * OPEN_SECONDS), "n2 never finished the opens"
        time.sleep(0.5)  # the late replies reach n1, which closes their handles
        held = wait_for(lambda: run_sync(call, pair.state, "n2", "stats")["peer_handles"] == 0, timeout=5)
        assert held, f"n2 still holds {run_sync(call, pair.state, 'n2', 'stats')['peer_handles']} handles for n1"
        # and n2 serves n1 as before
        (pair.export("n2") / "fine.txt").write_text("fine\n")
        pair.rescan("n2")
        assert wait_for(lambda: (pair.mount("n1") / "fine.txt").exists(), timeout=5)
        assert (pair.mount("n1") / "fine.txt").read_text() == "fine\n"
