"""Kernel FUSE passthrough of a node's own files (tuning `passthrough = true`), through real mounts.

Needs a daemon with CAP_SYS_ADMIN on Linux >= 6.9 (the tests run as root here); the kernel then
serves the reads and writes of this node's files itself, so no READ reaches the daemon.
"""

from __future__ import annotations

import mmap
import os
import platform
from collections.abc import Iterator
from pathlib import Path

import pytest

from gmountpy import Cluster
from gmountpy.protocol.client import call, run_sync

from ..conftest import LocalCluster, fuse_problem, local_cluster, require

SITES = {"s": ["a", "b"]}


def passthrough_problem() -> str | None:
    major, minor = (int(part) for part in platform.release().split("-")[0].split(".")[:2])
    if (major, minor) < (6, 9):
        return f"kernel {platform.release()} has no FUSE passthrough (6.9+)"
    if os.geteuid() != 0:
        return "the daemons must run as root (CAP_SYS_ADMIN registers backing files)"
    return None


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    require("FUSE", fuse_problem())
    require("kernel passthrough", passthrough_problem())
    base = tmp_path_factory.mktemp("passthrough")
    with local_cluster(base, f"pt-{os.getpid()}", SITES, [], "attr_ttl = 2.0\nnegative_ttl = 2.0\npassthrough = true") \
            as running:
        yield running


def stats(cluster: LocalCluster, node: str) -> dict[str, int]:
    return dict(run_sync(call, cluster.state, node, "stats"))


def reads(cluster: LocalCluster) -> dict[str, int]:
    return {node: row["read_local"] + row["read_remote"] for node, row in Cluster.open(cluster.spec.name)
            .counters().items()}


def test_this_nodes_files_are_read_and_written_by_the_kernel(cluster: LocalCluster) -> None:
    data = os.urandom(5 * 1024 * 1024 + 3)
    mine = cluster.mount("a") / "mine.bin"
    before = stats(cluster, "a")["passthrough_opens"]
    mine.write_bytes(data)  # a create and writes, through the mount: passed through
    daemon_reads = reads(cluster)
    assert mine.read_bytes() == data
    with open(mine, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mapped:
        assert mapped[1000:2000] == data[1000:2000]
    assert reads(cluster) == daemon_reads  # the kernel read them from the backing file, not the daemon
    assert stats(cluster, "a")["passthrough_opens"] - before >= 3
    # the written size reached the other node at close, as through the daemon
    assert (cluster.mount("b") / "mine.bin").stat().st_size == len(data)
    assert (cluster.mount("b") / "mine.bin").read_bytes() == data


def test_two_handles_on_one_file_share_its_backing_file(cluster: LocalCluster) -> None:
    path = cluster.mount("a") / "shared.bin"
    path.write_bytes(b"0" * 8192)
    with open(path, "r+b", buffering=0) as writer, open(path, "rb", buffering=0) as reader:
        writer.seek(4096)
        writer.write(b"passed through")
        assert os.pread(reader.fileno(), 14, 4096) == b"passed through"
        assert os.fstat(reader.fileno()).st_size == 8192
    assert stats(cluster, "a")["passthrough_inodes"] == 0  # every backing file closed with its last handle


def test_another_nodes_file_is_served_by_the_daemon(cluster: LocalCluster) -> None:
    data = os.urandom(300_000)
    (cluster.mount("b") / "theirs.bin").write_bytes(data)
    before = stats(cluster, "a")["passthrough_opens"]
    daemon_reads = reads(cluster)
    assert (cluster.mount("a") / "theirs.bin").read_bytes() == data
    assert stats(cluster, "a")["passthrough_opens"] == before
    assert reads(cluster)["a"] - daemon_reads["a"] == len(data)


def test_passthrough_is_off_unless_asked(tmp_path: Path) -> None:
    require("FUSE", fuse_problem())
    with local_cluster(tmp_path, f"ptoff-{os.getpid()}", SITES, []) as plain:
        (plain.mount("a") / "f.txt").write_text("through the daemon")
        assert (plain.mount("a") / "f.txt").read_text() == "through the daemon"
        assert "passthrough_opens" not in stats(plain, "a")
        assert reads(plain)["a"] == len("through the daemon")
