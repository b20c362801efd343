"""The node stays responsive: no disk call of the export blocks the daemon's event loop.

A FIFO without a peer and a deliberately slow file system mounted inside an
export (tests/node/slowfs.py: every read takes seconds) must not delay the
other requests the same daemon serves. Each test has its own small cluster:
on a daemon whose event loop blocks, the damage would spill into other tests.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gmountpy.protocol.client import call, run_sync

from ..conftest import LocalCluster, fuse_problem, local_cluster, require
from . import slowfs

SLOW_READ_SECONDS = 6.0


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[LocalCluster]:
    require("FUSE", fuse_problem())
    with local_cluster(tmp_path / "c", f"resp-{os.getpid()}-{tmp_path.name[-8:]}", {"here": ["n1", "n2"]}, [],
                       tuning="attr_ttl = 0.5\nnegative_ttl = 0.5\nrpc_timeout = 20") as cluster:
        yield cluster


@contextmanager
def slow_filesystem(mountpoint: Path) -> Iterator[Path]:
    """Mount slowfs at `mountpoint` (inside an export) for the block; always unmounted after."""
    with slowfs.mounted(mountpoint, SLOW_READ_SECONDS):
        yield mountpoint / "slow.bin"


def _in_background(func) -> tuple[threading.Thread, dict[str, object]]:  # type: ignore[no-untyped-def]
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["value"] = func()
        except Exception as exc:  # noqa: BLE001 -- handed to the test below
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def test_a_slow_disk_under_the_export_delays_only_its_own_reads(pair: LocalCluster) -> None:
    for i in range(10):
        (pair.export("n1") / f"quick-{i}.txt").write_text(f"quick {i}\n")
    with slow_filesystem(pair.export("n1") / "slowdir") as slow_file:
        assert slow_file.exists()
        # one slow read through n1's own mount (a local pread) and one from n2 (n1 serves it to a peer)
        local_slow, local_result = _in_background(lambda: (pair.mount("n1") / "slowdir/slow.bin").read_bytes())
        remote_slow, remote_result = _in_background(lambda: (pair.mount("n2") / "slowdir/slow.bin").read_bytes())
        try:
            local_slow.join(0.5)
            for i in range(10):  # fresh names: each is a real lookup and read on n1's daemon
                for node in ("n1", "n2"):
                    path = pair.mount(node) / f"quick-{i}.txt"
                    assert os.stat(path).st_size == len(f"quick {i}\n")
                    assert path.read_text() == f"quick {i}\n"
            # Every other request was answered while both slow reads are still waiting on the disk.
            assert local_slow.is_alive() and remote_slow.is_alive()
        finally:
            local_slow.join(SLOW_READ_SECONDS * 4)
            remote_slow.join(SLOW_READ_SECONDS * 4)
        assert local_result.get("value", local_result.get("error")) == b"slow data\n" * 400
        assert remote_result.get("value", remote_result.get("error")) == b"slow data\n" * 400


def test_opening_a_fifo_without_a_peer_never_blocks_the_daemon(pair: LocalCluster) -> None:
    (pair.export("n1") / "lonely.fifo").parent.mkdir(exist_ok=True)
    os.mkfifo(pair.export("n1") / "lonely.fifo")
    (pair.export("n1") / "other.txt").write_text("still served\n")
    # A client (the API, a peer) opening the FIFO: with no writer, a blocking open would
    # never return, and the daemon would stop serving everything.
    handle, _ = run_sync(lambda: call(pair.state, "n1", "open", "/lonely.fifo", os.O_RDONLY, timeout=5))
    assert isinstance(handle, int)
    with pytest.raises(OSError) as raised:  # a writer with no reader: ENXIO at once, as O_NONBLOCK answers
        run_sync(lambda: call(pair.state, "n1", "open", "/lonely.fifo", os.O_WRONLY, timeout=5))
    assert raised.value.errno == 6  # ENXIO
    assert (pair.mount("n1") / "other.txt").read_text() == "still served\n"
    assert (pair.mount("n2") / "other.txt").read_text() == "still served\n"
