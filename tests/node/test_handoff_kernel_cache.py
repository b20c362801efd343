"""The kernel's caches across nodes, through real mounts: page cache kept, dropped, and attribute TTLs.

Three nodes: n1 (= A, the reader), n2 (the holder), n3 (= B, another node that changes
n2's files through its own mount). What README "Consistency" promises, tested as stated:

- keep_cache: a file opened again on A unchanged since A's last open is read from A's
  page cache: the daemons see no read (their byte counters do not move);
- close-to-open: once the holder's file changed (through B's mount, or written straight
  into the holder's export), the next open on A reads exactly the new contents and size,
  never a stale page, even within attr_ttl and even when the size did not change;
- attributes: `stat` on A may show the old mode and size until attr_ttl has passed since
  A last fetched them, and shows the new ones after that; an open on A is exact at once,
  and `stat` after that open shows the new attributes too.

With `lookup = "index"` (GMOUNT_TEST_LOOKUP=index) `stat` answers from the directory's home,
which learns of a change outside the mount at its next listing and of a close on B when B's
kernel releases the file (after close returns): there, `stat` right after an open may
still show the old attributes (README, "Lookups that never flood"); reads are exact either way.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gmountpy import Cluster

from ..conftest import LocalCluster, fuse_problem, local_cluster, require

ATTR_TTL = 2.0
TUNING = f"attr_ttl = {ATTR_TTL}\nnegative_ttl = {ATTR_TTL}\nrpc_timeout = 5.0"
#: the kernel counts entry and attribute timeouts in jiffies, rounded up
KERNEL_TICKS = 0.05
A, HOLDER, B = "n1", "n2", "n3"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    require("FUSE", fuse_problem())
    base = tmp_path_factory.mktemp("kernel-cache")
    sites = {"tsukuba": [A, HOLDER], "hongo": [B]}
    with local_cluster(base, f"kc-{os.getpid()}", sites, [("tsukuba", "hongo", 5.0)], TUNING) as running:
        yield running


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}.bin"


def read_all(path: Path) -> tuple[bytes, int]:
    """One open: the whole contents, and the size `fstat` gives on that handle."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks), size
    finally:
        os.close(fd)


def daemon_reads(api: Cluster) -> dict[str, int]:
    """Bytes each daemon read for its mount (own export + other nodes) and served to peers."""
    return {node: row["read_local"] + row["read_remote"] + row["served_read"]
            for node, row in api.counters().items()}


def create_on_holder(cluster: LocalCluster, rel: str, data: bytes) -> Path:
    """Made through the holder's mount (so that with `lookup = "index"` its home knows it at once)."""
    (cluster.mount(HOLDER) / rel).write_bytes(data)
    path = cluster.export(HOLDER) / rel
    assert path.read_bytes() == data
    return path


def wait_past_attr_ttl(fetched_at: float) -> None:
    """Until attr_ttl has passed since A's kernel and daemon last fetched the attributes."""
    time.sleep(max(0.0, fetched_at + ATTR_TTL + KERNEL_TICKS - time.monotonic()))


# ---------------------------------------------------------------- keep_cache


@pytest.mark.parametrize("size", [4000, 3 * (1 << 20) + 17], ids=["small", "read-ahead"])
def test_unchanged_remote_file_is_read_again_from_the_page_cache(cluster: LocalCluster, size: int) -> None:
    rel = unique("kept")
    data = os.urandom(size)
    create_on_holder(cluster, rel, data)
    api = Cluster.open(cluster.spec.name)
    before = daemon_reads(api)
    assert read_all(cluster.mount(A) / rel) == (data, size)
    first = daemon_reads(api)
    assert first[A] - before[A] >= size and first[HOLDER] - before[HOLDER] >= size  # it did go to n2
    assert read_all(cluster.mount(A) / rel) == (data, size)
    assert daemon_reads(api) == first, "the second open of an unchanged file was not served by the page cache"


def test_unchanged_local_file_is_read_again_from_the_page_cache(cluster: LocalCluster) -> None:
    rel = unique("kept-local")
    (cluster.mount(A) / rel).write_bytes(b"written through A's mount: pages A may keep")
    data = os.urandom(70_000)
    (cluster.export(A) / rel).write_bytes(data)  # changed on disk since: the first open reads it
    api = Cluster.open(cluster.spec.name)
    before = daemon_reads(api)
    assert read_all(cluster.mount(A) / rel) == (data, len(data))
    first = daemon_reads(api)
    assert first[A] - before[A] == len(data)
    assert read_all(cluster.mount(A) / rel) == (data, len(data))
    assert daemon_reads(api) == first


# ---------------------------------------------------------------- close-to-open after remote changes


def rewrite_through_b(cluster: LocalCluster, rel: str, data: bytes) -> None:
    """A job on B rewrites the file: open (truncate) and write through B's mount, at the holder."""
    with open(cluster.mount(B) / rel, "r+b") as f:
        f.truncate(0)
        f.write(data)
    assert (cluster.export(HOLDER) / rel).read_bytes() == data  # written where the file is
    assert not (cluster.export(B) / rel).exists()


def rewrite_in_the_export(cluster: LocalCluster, rel: str, data: bytes) -> None:
    """Someone writes the holder's file outside the mounts."""
    (cluster.export(HOLDER) / rel).write_bytes(data)


@pytest.mark.parametrize("change", [rewrite_through_b, rewrite_in_the_export], ids=["through-B", "in-export"])
@pytest.mark.parametrize("new_size", [40_000, 25_000, 90_000], ids=["same-size", "shorter", "longer"])
def test_open_after_a_remote_change_reads_the_new_contents_not_cached_pages(
        cluster: LocalCluster, change: object, new_size: int) -> None:
    rel = unique("changed")
    old = os.urandom(40_000)
    create_on_holder(cluster, rel, old)
    through_a = cluster.mount(A) / rel
    for _ in range(2):  # the second time from A's page cache (keep_cache)
        assert read_all(through_a) == (old, len(old))
    new = os.urandom(new_size)
    change(cluster, rel, new)  # type: ignore[operator]
    assert read_all(through_a) == (new, new_size)  # at once: well within attr_ttl
    if cluster.spec.tuning.lookup == "flood":  # the open dropped the kernel's and the daemon's old attributes
        assert through_a.stat().st_size == new_size
    assert read_all(through_a) == (new, new_size)


def test_a_change_that_keeps_size_and_mtime_is_still_seen(cluster: LocalCluster) -> None:
    """Written straight into the export with the old mtime put back: ctime still tells."""
    rel = unique("same-mtime")
    old = os.urandom(10_000)
    path = create_on_holder(cluster, rel, old)
    stamp = path.stat()
    through_a = cluster.mount(A) / rel
    for _ in range(2):
        assert read_all(through_a) == (old, len(old))
    new = os.urandom(len(old))
    path.write_bytes(new)
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert path.stat().st_mtime_ns == stamp.st_mtime_ns
    assert read_all(through_a) == (new, len(new))


# ---------------------------------------------------------------- attributes and attr_ttl


def test_remote_chmod_and_truncate_reach_stat_after_attr_ttl_and_open_at_once(cluster: LocalCluster) -> None:
    rel = unique("attrs")
    data = os.urandom(50_000)
    path = create_on_holder(cluster, rel, data)
    os.chmod(cluster.mount(HOLDER) / rel, 0o640)
    through_a = cluster.mount(A) / rel
    seen = through_a.stat()  # A's kernel and daemon now hold these attributes for attr_ttl
    fetched_at = time.monotonic()
    assert (seen.st_mode & 0o777, seen.st_size) == (0o640, len(data))

    os.chmod(cluster.mount(B) / rel, 0o600)
    os.truncate(cluster.mount(B) / rel, 1234)
    assert (path.stat().st_mode & 0o777, path.stat().st_size) == (0o600, 1234)  # done at the holder

    # Within attr_ttl `stat` on A may show either (README: "stat on another node may show the
    # old size until then") -- but nothing else.
    within = through_a.stat()
    assert (within.st_mode & 0o777, within.st_size) in ((0o640, len(data)), (0o600, 1234))
    wait_past_attr_ttl(fetched_at)
    after = through_a.stat()
    assert (after.st_mode & 0o777, after.st_size) == (0o600, 1234)


def test_open_within_attr_ttl_is_exact_and_refreshes_stat(cluster: LocalCluster) -> None:
    rel = unique("attrs-open")
    data = os.urandom(50_000)
    create_on_holder(cluster, rel, data)
    os.chmod(cluster.mount(HOLDER) / rel, 0o640)
    through_a = cluster.mount(A) / rel
    assert through_a.stat().st_size == len(data)  # cached on A for attr_ttl

    os.chmod(cluster.mount(B) / rel, 0o600)
    os.truncate(cluster.mount(B) / rel, 1234)
    assert read_all(through_a) == (data[:1234], 1234)  # close-to-open: exact at once
    after_open = through_a.stat()  # (milliseconds after the first stat: well within attr_ttl)
    assert (after_open.st_mode & 0o777, after_open.st_size) == (0o600, 1234)


def test_a_directory_made_after_a_miss_stays_the_cwd_of_its_processes_when_peers_create_in_it(
        cluster: LocalCluster) -> None:
    """A looks a name up (its kernel caches "not found"), then makes the directory and a process
    works in it -- as `make` in a new run directory. B creating files below it tells A "created"
    for each path: that drops A's negative entries on the way up, but never A's live entry of
    the directory itself, which would leave the process's cwd unreachable (getcwd: ENOENT)."""
    name = f"cwd-{uuid.uuid4().hex[:8]}"
    made = cluster.mount(A) / name
    assert not made.exists()
    made.mkdir()
    worker = subprocess.Popen([sys.executable, "-c", "import os, sys; sys.stdin.readline(); print(os.getcwd())"],
                              cwd=made, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        (cluster.mount(B) / name / "sub").mkdir()
        (cluster.mount(B) / name / "sub" / "made-on-b").write_bytes(b"b")
        (cluster.mount(B) / name / "made-on-b").write_bytes(b"b")
        out, err = worker.communicate("go\n", timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert worker.returncode == 0 and out.strip() == str(made), err
    assert sorted(os.listdir(made)) == ["made-on-b", "sub"]
