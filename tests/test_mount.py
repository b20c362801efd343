"""End-to-end through real FUSE mounts of a 4-node, 2-site local cluster.

n1, n2 are site tsukuba; n3, n4 site hongo (14 ms away). Every check goes
through the kernel: open/read/write/stat/ls/mv/rm on the mountpoints, and
looks at the exports directly to see where the bytes landed.
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading
import uuid
from pathlib import Path

import pytest

from .conftest import LocalCluster, require, wait_for


def unique(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def put(cluster: LocalCluster, node: str, rel: str, data: bytes) -> Path:
    """Write a file straight into a node's export (as if it was there before the cluster)."""
    path = cluster.export(node) / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    cluster.rescan(node)
    return path


def test_file_in_one_export_is_visible_byte_identical_everywhere(cluster4: LocalCluster) -> None:
    rel = f"{unique('vis')}/data.bin"
    data = os.urandom(300_000)
    put(cluster4, "n3", rel, data)
    for node in cluster4.nodes:
        assert (cluster4.mount(node) / rel).read_bytes() == data, node


def test_create_through_mount_lands_in_local_export_with_parents(cluster4: LocalCluster) -> None:
    rel = f"{unique('create')}/deep/er/out.txt"
    target = cluster4.mount("n1") / rel
    target.parent.mkdir(parents=True)
    target.write_text("made on n1")
    assert (cluster4.export("n1") / rel).read_text() == "made on n1"
    for other in ("n2", "n3", "n4"):
        assert not (cluster4.export(other) / rel).exists()
    assert (cluster4.mount("n4") / rel).read_text() == "made on n1"


def test_create_under_remote_directory_creates_parents_locally(cluster4: LocalCluster) -> None:
    top = unique("parents")
    put(cluster4, "n3", f"{top}/sub/existing.txt", b"x")
    (cluster4.mount("n1") / top / "sub" / "new.txt").write_text("local")
    assert (cluster4.export("n1") / top / "sub" / "new.txt").read_text() == "local"
    assert not (cluster4.export("n3") / top / "sub" / "new.txt").exists()


def test_directory_listings_merge(cluster4: LocalCluster) -> None:
    top = unique("merge")
    put(cluster4, "n1", f"{top}/a", b"1")
    put(cluster4, "n2", f"{top}/b", b"2")
    put(cluster4, "n3", f"{top}/c", b"3")
    put(cluster4, "n4", f"{top}/d", b"4")
    put(cluster4, "n4", f"{top}/a", b"far copy")
    for node in cluster4.nodes:
        assert sorted(os.listdir(cluster4.mount(node) / top)) == ["a", "b", "c", "d"], node
    # duplicates are shown once, the nearest wins: n1 sees its own copy, n3 sees n4's (same site)
    assert (cluster4.mount("n1") / top / "a").read_bytes() == b"1"
    assert (cluster4.mount("n3") / top / "a").read_bytes() == b"far copy"


def test_large_directory_listing(cluster4: LocalCluster) -> None:
    top = unique("big")
    for i in range(1500):
        put(cluster4, ("n1", "n3")[i % 2], f"{top}/f{i:05d}", b"")
    names = os.listdir(cluster4.mount("n2") / top)
    assert len(names) == 1500 and len(set(names)) == 1500


def test_unlink_acts_at_every_holder(cluster4: LocalCluster) -> None:
    rel = f"{unique('rm')}.txt"
    put(cluster4, "n3", rel, b"on n3")
    put(cluster4, "n4", rel, b"on n4")
    os.unlink(cluster4.mount("n1") / rel)
    assert not (cluster4.export("n3") / rel).exists()
    assert not (cluster4.export("n4") / rel).exists()
    assert wait_for(lambda: not (cluster4.mount("n2") / rel).exists())


def test_rename_at_the_holder(cluster4: LocalCluster) -> None:
    top = unique("mv")
    put(cluster4, "n3", f"{top}/old.txt", b"payload")
    os.rename(cluster4.mount("n1") / top / "old.txt", cluster4.mount("n1") / top / "new.txt")
    assert (cluster4.export("n3") / top / "new.txt").read_bytes() == b"payload"
    assert not (cluster4.export("n3") / top / "old.txt").exists()
    assert (cluster4.mount("n1") / top / "new.txt").read_bytes() == b"payload"
    assert not (cluster4.mount("n1") / top / "old.txt").exists()


def test_rename_over_a_file_on_another_node_replaces_it(cluster4: LocalCluster) -> None:
    top = unique("mvover")
    put(cluster4, "n3", f"{top}/dst", b"old destination")
    src = cluster4.mount("n1") / top / "src"
    src.write_bytes(b"new content")  # created on n1 (local), top exists on n3 only
    os.replace(src, cluster4.mount("n1") / top / "dst")
    assert (cluster4.export("n1") / top / "dst").read_bytes() == b"new content"
    assert not (cluster4.export("n3") / top / "dst").exists()
    assert wait_for(lambda: (cluster4.mount("n4") / top / "dst").read_bytes() == b"new content")


def test_rename_directory(cluster4: LocalCluster) -> None:
    top = unique("mvdir")
    put(cluster4, "n2", f"{top}/d/x", b"x")
    put(cluster4, "n4", f"{top}/d/y", b"y")
    os.rename(cluster4.mount("n1") / top / "d", cluster4.mount("n1") / top / "e")
    assert sorted(os.listdir(cluster4.mount("n1") / top / "e")) == ["x", "y"]
    assert (cluster4.export("n2") / top / "e" / "x").exists()
    assert (cluster4.export("n4") / top / "e" / "y").exists()
    assert not (cluster4.mount("n1") / top / "d").exists()


def test_chmod_truncate_utime_at_the_holder(cluster4: LocalCluster) -> None:
    rel = f"{unique('attr')}.dat"
    put(cluster4, "n4", rel, b"0123456789")
    through = cluster4.mount("n2") / rel
    os.chmod(through, 0o640)
    assert stat.S_IMODE((cluster4.export("n4") / rel).stat().st_mode) == 0o640
    os.truncate(through, 4)
    assert (cluster4.export("n4") / rel).read_bytes() == b"0123"
    os.utime(through, ns=(1_000_000_000, 2_000_000_000))
    assert (cluster4.export("n4") / rel).stat().st_mtime_ns == 2_000_000_000
    assert through.stat().st_mtime_ns == 2_000_000_000
    assert through.stat().st_size == 4


def test_write_to_remote_file_at_offsets(cluster4: LocalCluster) -> None:
    rel = f"{unique('rw')}.bin"
    put(cluster4, "n3", rel, b"a" * 100)
    fd = os.open(cluster4.mount("n1") / rel, os.O_RDWR)
    try:
        os.pwrite(fd, b"XYZ", 50)
        os.fsync(fd)
        assert os.pread(fd, 5, 49) == b"aXYZa"
    finally:
        os.close(fd)
    assert (cluster4.export("n3") / rel).read_bytes() == b"a" * 50 + b"XYZ" + b"a" * 47
    with open(cluster4.mount("n2") / rel, "ab") as f:
        f.write(b"END")
    assert (cluster4.export("n3") / rel).read_bytes().endswith(b"aEND")


def test_symlinks(cluster4: LocalCluster) -> None:
    top = unique("ln")
    put(cluster4, "n3", f"{top}/target.txt", b"pointed at")
    os.symlink("target.txt", cluster4.mount("n1") / top / "link")
    assert os.readlink(cluster4.export("n1") / top / "link") == "target.txt"
    assert (cluster4.mount("n4") / top / "link").read_bytes() == b"pointed at"


def test_rmdir_and_errors(cluster4: LocalCluster) -> None:
    top = unique("rmdir")
    (cluster4.mount("n1") / top / "empty").mkdir(parents=True)
    os.rmdir(cluster4.mount("n1") / top / "empty")
    assert not (cluster4.export("n1") / top / "empty").exists()
    put(cluster4, "n3", f"{top}/full/f", b"")
    with pytest.raises(OSError) as info:
        os.rmdir(cluster4.mount("n1") / top / "full")
    assert info.value.errno == 39  # ENOTEMPTY
    with pytest.raises(FileNotFoundError):
        (cluster4.mount("n1") / top / "missing").stat()


def test_large_remote_file_reads_back_from_every_mount(cluster4: LocalCluster) -> None:
    rel = f"{unique('large')}.bin"
    size = 256 * 1024 * 1024
    digest = hashlib.sha256()
    path = cluster4.export("n3") / rel
    with open(path, "wb") as f:
        block = os.urandom(1024 * 1024)
        for i in range(size // len(block)):
            chunk = block[:-8] + i.to_bytes(8, "little")  # distinct blocks catch misplaced offsets
            f.write(chunk)
            digest.update(chunk)
    cluster4.rescan("n3")
    expected = digest.hexdigest()

    def sha(p: Path) -> str:
        h = hashlib.sha256()
        with open(p, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        return h.hexdigest()

    for node in cluster4.nodes:
        assert sha(cluster4.mount(node) / rel) == expected, node

    # concurrent readers on the other site's nodes and the holder's site-mate
    results: dict[str, str] = {}

    def reader(node: str, index: int) -> None:
        results[f"{node}-{index}"] = sha(cluster4.mount(node) / rel)

    threads = [threading.Thread(target=reader, args=(n, i)) for n in ("n1", "n2", "n4") for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(results.values()) == {expected}
    path.unlink()


def test_where_and_xattrs_report_holders_in_locality_order(cluster4: LocalCluster) -> None:
    rel = f"{unique('where')}.txt"
    for node in ("n4", "n2", "n3"):
        put(cluster4, node, rel, node.encode())
    from_n1 = cluster4.mount("n1") / rel
    assert os.getxattr(from_n1, "user.gmount.where").decode().split("\n") == ["n2", "n3", "n4"]
    assert os.getxattr(from_n1, "user.gmount.node") == b"n2"
    assert os.getxattr(from_n1, "user.gmount.site") == b"tsukuba"
    from_n4 = cluster4.mount("n4") / rel
    assert os.getxattr(from_n4, "user.gmount.where").decode().split("\n") == ["n4", "n3", "n2"]
    assert os.getxattr(from_n4, "user.gmount.local_path").decode() == str(cluster4.export("n4") / rel)
    with pytest.raises(OSError):
        os.getxattr(from_n1, "user.gmount.local_path")  # not on n1
    assert "user.gmount.where" in os.listxattr(from_n1)


def test_nearest_copy_is_the_one_opened(cluster4: LocalCluster) -> None:
    rel = f"{unique('near')}.txt"
    put(cluster4, "n2", rel, b"copy on n2")
    put(cluster4, "n3", rel, b"copy on n3")
    assert (cluster4.mount("n1") / rel).read_bytes() == b"copy on n2"
    assert (cluster4.mount("n4") / rel).read_bytes() == b"copy on n3"


def test_changes_in_an_export_are_seen_after_the_ttl(cluster4: LocalCluster) -> None:
    rel = f"{unique('ttl')}.txt"
    through = cluster4.mount("n1") / rel
    assert not through.exists()
    put(cluster4, "n3", rel, b"late arrival")
    assert wait_for(through.exists, timeout=3)
    (cluster4.export("n3") / rel).write_bytes(b"changed behind our back")
    assert wait_for(lambda: through.read_bytes() == b"changed behind our back", timeout=3)


def test_statfs_and_user_xattrs(cluster4: LocalCluster) -> None:
    st = os.statvfs(cluster4.mount("n1"))
    assert st.f_blocks > 0
    rel = f"{unique('ux')}.txt"
    put(cluster4, "n3", rel, b"")
    through = cluster4.mount("n1") / rel
    try:
        os.setxattr(through, "user.note", b"hello")
    except OSError as exc:
        if exc.errno == 95:  # the export's file system has no user xattrs
            require("user xattrs", "the export's file system has none")
        raise
    assert os.getxattr(cluster4.export("n3") / rel, "user.note") == b"hello"
    assert os.getxattr(through, "user.note") == b"hello"
    with pytest.raises(PermissionError):
        os.setxattr(through, "user.gmount.node", b"n1")
