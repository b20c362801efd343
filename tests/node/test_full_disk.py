"""A full disk on another node, through the real mounts: a short write says what was written.

n2's export is a small tmpfs of its own (mounted for the test, as root), so its disk
really fills up. POSIX: a write that stores some bytes returns how many; an error
(ENOSPC) only when none were. An application that retries an O_APPEND write after
being told less than what landed would duplicate data.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..conftest import LocalCluster, fuse_problem, local_cluster, require

DISK_BYTES = 4 * 1024 * 1024
CHUNK = 1024 * 1024


@contextlib.contextmanager
def small_disk(path: Path, size: int) -> Iterator[Path]:
    """A tmpfs of `size` bytes mounted at `path` for the block; always unmounted after."""
    if os.geteuid() != 0:
        require("a tmpfs to fill (mounting needs root)", "not root")
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "gmount-test-full", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    require("FUSE", fuse_problem())
    with small_disk(tmp_path / "n2" / "export", DISK_BYTES), \
            local_cluster(tmp_path, f"full-{os.getpid()}", {"s": ["n1", "n2"]}, []) as running:
        yield running


def test_a_write_that_fills_another_nodes_disk_reports_exactly_what_landed(cluster: LocalCluster) -> None:
    (cluster.mount("n2") / "log").write_bytes(b"head\n")  # n2 holds it; 5 bytes: later writes are unaligned
    told = 5
    answers = []
    fd = os.open(cluster.mount("n1") / "log", os.O_WRONLY | os.O_APPEND)
    try:
        while True:
            try:
                wrote = os.write(fd, b"x" * CHUNK)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                answers.append("ENOSPC")
                break
            told += wrote
            answers.append(wrote)
            assert len(answers) < 2 * DISK_BYTES // CHUNK, answers  # the disk must fill up
    finally:
        os.close(fd)
    on_disk = (cluster.export("n2") / "log").stat().st_size
    assert on_disk == told, f"the application was told {told} bytes, n2's disk holds {on_disk}; writes: {answers}"
    assert any(isinstance(a, int) and a < CHUNK for a in answers), answers  # a short write, then the error
    fd = os.open(cluster.mount("n1") / "log", os.O_RDONLY)  # close-to-open: the holder's size
    try:
        assert os.fstat(fd).st_size == told
    finally:
        os.close(fd)


def test_a_put_into_a_full_node_says_which_node_is_full(cluster: LocalCluster) -> None:
    from gmountpy import Cluster

    with pytest.raises(OSError) as info:
        Cluster.open(cluster.spec.name).write_bytes("/too-big.bin", b"x" * (2 * DISK_BYTES), on="n2")
    assert info.value.errno == errno.ENOSPC and "node n2" in str(info.value), info.value
    assert not (cluster.export("n2") / "too-big.bin").exists()
