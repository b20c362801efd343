"""POSIX operations users hit, through the real mounts of the shared 4-node cluster.

n1, n2 are site tsukuba, n3, n4 site hongo. Each check compares what the
mount answers with what the export's own file system answers.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

from ..conftest import LocalCluster, require, wait_for

libc = ctypes.CDLL(None, use_errno=True)
UTIME_NOW = (1 << 30) - 1
UTIME_OMIT = (1 << 30) - 2
AT_FDCWD = -100


class Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def utimensat(path: Path, atime: tuple[int, int], mtime: tuple[int, int]) -> None:
    times = (Timespec * 2)(Timespec(*atime), Timespec(*mtime))
    if libc.utimensat(AT_FDCWD, os.fsencode(path), times, 0) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(path))


def fallocate(fd: int, offset: int, length: int) -> None:
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
    if libc.fallocate(fd, 0, offset, length) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def put(cluster: LocalCluster, node: str, rel: str, data: bytes) -> Path:
    path = cluster.export(node) / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    cluster.rescan(node)
    return path


# -- FIFOs and sockets ---------------------------------------------------------------


def test_mkfifo_through_the_mount_pipes_data_between_two_processes(cluster4: LocalCluster) -> None:
    rel = f"{unique('fifo')}/pipe"
    (cluster4.mount("n1") / rel).parent.mkdir()
    fifo = cluster4.mount("n1") / rel
    os.mkfifo(fifo, 0o640)
    on_disk = os.lstat(cluster4.export("n1") / rel)
    assert stat.S_ISFIFO(on_disk.st_mode) and stat.S_IMODE(on_disk.st_mode) == 0o640
    assert wait_for(lambda: stat.S_ISFIFO(os.lstat(cluster4.mount("n3") / rel).st_mode))
    # A reader and a writer process on one node, the way Snakemake's pipe() outputs are used.
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE)
    try:
        subprocess.run(["sh", "-c", f"seq 1 20000 > '{fifo}'"], check=True, timeout=30)
        out, _ = reader.communicate(timeout=30)
    finally:
        reader.kill()
        reader.wait()
    assert out == "".join(f"{i}\n" for i in range(1, 20001)).encode()


def test_mknod_of_a_socket_and_fifo_lands_in_the_local_export(cluster4: LocalCluster) -> None:
    top = unique("mknod")
    (cluster4.mount("n2") / top).mkdir()
    os.mknod(cluster4.mount("n2") / top / "sock", stat.S_IFSOCK | 0o600)
    os.mknod(cluster4.mount("n2") / top / "fifo", stat.S_IFIFO | 0o600)
    assert stat.S_ISSOCK(os.lstat(cluster4.export("n2") / top / "sock").st_mode)
    assert stat.S_ISFIFO(os.lstat(cluster4.export("n2") / top / "fifo").st_mode)
    assert sorted(os.listdir(cluster4.mount("n4") / top)) == ["fifo", "sock"]
    with pytest.raises(FileExistsError):
        os.mkfifo(cluster4.mount("n2") / top / "fifo")


# -- hard links ------------------------------------------------------------------------


def test_hard_link_within_one_node_is_that_nodes_link(cluster4: LocalCluster) -> None:
    top = unique("link")
    (cluster4.mount("n1") / top).mkdir()
    first, second = cluster4.mount("n1") / top / "a", cluster4.mount("n1") / top / "b"
    first.write_bytes(b"one inode")
    os.link(first, second)
    a, b = os.lstat(cluster4.export("n1") / top / "a"), os.lstat(cluster4.export("n1") / top / "b")
    assert a.st_ino == b.st_ino and a.st_nlink == 2
    assert os.lstat(first).st_nlink == 2 and os.lstat(second).st_nlink == 2
    with open(second, "r+b") as f:
        f.write(b"ONE")
    assert first.read_bytes() == b"ONE inode"
    for node in cluster4.nodes:  # every node's mount, once its attribute cache (0.5 s) expired
        assert wait_for(lambda node=node: os.lstat(cluster4.mount(node) / top / "a").st_nlink == 2), node
    with open(second, "ab") as f:  # a change through one name is seen through the other, everywhere
        f.write(b" grown")
    assert wait_for(lambda: os.lstat(cluster4.mount("n3") / top / "a").st_size == len(b"ONE inode grown"))
    os.unlink(second)
    assert os.lstat(cluster4.export("n1") / top / "a").st_nlink == 1
    assert wait_for(lambda: os.lstat(cluster4.mount("n3") / top / "a").st_nlink == 1)


def inode_numbers(cluster: LocalCluster, *paths: str) -> dict[str, list[int]]:
    """`stat -c %i` of each path (relative to a mount) through every node's mount."""
    return {node: [os.stat(cluster.mount(node) / path).st_ino for path in paths] for node in cluster.nodes}


def test_a_file_keeps_its_inode_number_across_renames_and_on_every_node(cluster4: LocalCluster) -> None:
    top = unique("ino")
    put(cluster4, "n3", f"{top}/remote.txt", b"held by n3")
    (cluster4.mount("n1") / top / "sub").mkdir()
    (cluster4.mount("n1") / top / "local.txt").write_bytes(b"held by n1")
    numbers = inode_numbers(cluster4, f"{top}/remote.txt", f"{top}/local.txt", f"{top}/sub")
    assert len({tuple(row) for row in numbers.values()}) == 1, numbers  # the same on every node
    remote, local, sub = numbers["n1"]
    assert len({remote, local, sub}) == 3
    here = cluster4.mount("n1") / top
    stat_i = subprocess.run(["stat", "-c", "%i", str(here / "remote.txt")], capture_output=True, text=True, check=True)
    subprocess.run(["mv", str(here / "remote.txt"), str(here / "moved.txt")], check=True)
    subprocess.run(["mv", str(here / "local.txt"), str(here / "sub/in.txt")], check=True)
    subprocess.run(["mv", str(here / "sub"), str(here / "dir")], check=True)
    after = subprocess.run(["stat", "-c", "%i", str(here / "moved.txt")], capture_output=True, text=True, check=True)
    assert after.stdout == stat_i.stdout == f"{remote}\n"
    assert wait_for(lambda: inode_numbers(cluster4, f"{top}/moved.txt", f"{top}/dir/in.txt", f"{top}/dir")
                    == {node: [remote, local, sub] for node in cluster4.nodes})
    # renamed through another node: this node finds it under its new name with its number
    os.rename(cluster4.mount("n4") / top / "moved.txt", cluster4.mount("n4") / top / "again.txt")
    assert os.stat(cluster4.mount("n1") / top / "again.txt").st_ino == remote
    # a different file under an old name is a different number, at once
    (cluster4.mount("n2") / top / "again.txt").unlink()
    (cluster4.mount("n2") / top / "again.txt").write_bytes(b"a new file")
    assert os.stat(cluster4.mount("n2") / top / "again.txt").st_ino not in (remote, local, sub)
    assert wait_for(lambda: os.stat(cluster4.mount("n1") / top / "again.txt").st_ino
                    == os.stat(cluster4.mount("n2") / top / "again.txt").st_ino)


@pytest.mark.parametrize("holder", ["n1", "n3"])
def test_hard_links_are_one_inode_and_an_unlink_shows_the_new_link_count_at_once(
        cluster4: LocalCluster, holder: str) -> None:
    """`ln a b; stat -c %i a b` shows one number; `rm b; stat -c %h a` shows 1 at once on the node
    that removed b (n1, which holds the file or not), on the others within attr_ttl (0.5 s)."""
    top = unique("nlink")
    (cluster4.mount(holder) / top).mkdir()
    a, b = cluster4.mount(holder) / top / "a", cluster4.mount(holder) / top / "b"
    a.write_bytes(b"one file")
    subprocess.run(["ln", str(a), str(b)], check=True)
    shown = subprocess.run(["stat", "-c", "%i %h", str(a), str(b)], capture_output=True, text=True, check=True)
    first, second = shown.stdout.splitlines()
    assert first == second and first.endswith(" 2"), shown.stdout
    through_n1 = cluster4.mount("n1") / top
    assert wait_for(lambda: os.stat(through_n1 / "a").st_nlink == 2 == os.stat(through_n1 / "b").st_nlink)
    assert os.stat(through_n1 / "a").st_ino == os.stat(through_n1 / "b").st_ino == int(first.split()[0])
    subprocess.run(["rm", str(through_n1 / "b")], check=True)
    assert subprocess.run(["stat", "-c", "%h", str(through_n1 / "a")], capture_output=True, text=True,
                          check=True).stdout == "1\n"
    for node in cluster4.nodes:
        assert wait_for(lambda node=node: os.stat(cluster4.mount(node) / top / "a").st_nlink == 1), node


def test_rsync_tar_du_cp_and_find_see_one_file_for_two_links(cluster4: LocalCluster) -> None:
    top = cluster4.mount("n2") / unique("tools")
    src = top / "src"
    (src / "sub").mkdir(parents=True)
    (src / "big").write_bytes(os.urandom(1 << 20))
    os.link(src / "big", src / "twin")
    os.link(src / "big", src / "sub" / "third")
    (src / "other").write_bytes(b"x" * 4096)
    put(cluster4, "n3", f"{top.name}/src/far", b"held by n3")  # a file of another node in the tree

    def run(*command: str) -> str:
        return subprocess.run(command, capture_output=True, text=True, check=True).stdout

    same = run("find", str(src), "-samefile", str(src / "big"))
    assert sorted(same.split()) == sorted(str(p) for p in (src / "big", src / "twin", src / "sub" / "third"))
    kib = int(run("du", "-sk", str(src)).split()[0])
    assert 1024 <= kib < 1024 + 64, kib  # the linked MiB once, not three times
    for copy, command in (("rsynced", ["rsync", "-aH", f"{src}/", f"{top}/rsynced/"]),
                          ("copied", ["cp", "-a", str(src), f"{top}/copied"])):
        run(*command)
        numbers = {os.stat(top / copy / name).st_ino for name in ("big", "twin", "sub/third")}
        assert len(numbers) == 1 and os.stat(top / copy / "big").st_nlink == 3, (copy, numbers)
        on_disk = {os.stat(cluster4.export("n2") / top.name / copy / name).st_ino
                   for name in ("big", "twin", "sub/third")}
        assert len(on_disk) == 1, copy  # the links made anew on the disk, not three copies
        assert (top / copy / "far").read_bytes() == b"held by n3"
    listing = run("tar", "-cvvf", str(top / "t.tar"), "-C", str(src), ".")
    assert sum(" link to " in line for line in listing.splitlines()) == 2, listing
    assert os.stat(top / "t.tar").st_size < (1 << 20) + 64 * 1024


def test_hard_link_across_nodes_is_exdev_never_eperm(cluster4: LocalCluster) -> None:
    top = unique("xlink")
    put(cluster4, "n3", f"{top}/remote.txt", b"held by n3")
    source = cluster4.mount("n1") / top / "remote.txt"
    with pytest.raises(OSError) as raised:
        os.link(source, cluster4.mount("n1") / top / "here.txt")
    assert raised.value.errno == errno.EXDEV
    ln = subprocess.run(["ln", str(source), str(cluster4.mount("n1") / top / "ln.txt")],
                        capture_output=True, text=True, check=False)
    assert ln.returncode != 0 and "Invalid cross-device link" in ln.stderr
    assert not (cluster4.export("n1") / top / "here.txt").exists()
    # mv falls back to copy-and-delete on EXDEV from rename; cp (without -l) copies
    subprocess.run(["cp", str(source), str(cluster4.mount("n1") / top / "copy.txt")], check=True)
    assert (cluster4.export("n1") / top / "copy.txt").read_bytes() == b"held by n3"


# -- owners ----------------------------------------------------------------------------


def test_chown_and_lchown_as_a_root_daemon_locally_and_on_the_holder(cluster4: LocalCluster) -> None:
    require("chown to other users", None if os.geteuid() == 0
            else "needs a root daemon (the test runs the daemons as you)")
    top = unique("chown")
    put(cluster4, "n3", f"{top}/remote.txt", b"r")
    (cluster4.mount("n1") / top).mkdir(exist_ok=True)
    local = cluster4.mount("n1") / top / "local.txt"
    local.write_text("l")
    os.symlink("local.txt", cluster4.mount("n1") / top / "link")
    os.chown(local, 12345, 23456)
    os.chown(cluster4.mount("n1") / top / "remote.txt", 12346, -1)
    os.lchown(cluster4.mount("n1") / top / "link", 12347, 12347)
    on_n1 = os.lstat(cluster4.export("n1") / top / "local.txt")
    assert (on_n1.st_uid, on_n1.st_gid) == (12345, 23456)
    assert os.lstat(cluster4.export("n3") / top / "remote.txt").st_uid == 12346
    assert os.lstat(cluster4.export("n3") / top / "remote.txt").st_gid == 0
    assert os.lstat(cluster4.export("n1") / top / "link").st_uid == 12347
    assert os.lstat(cluster4.export("n1") / top / "local.txt").st_uid == 12345  # lchown did not follow
    assert (os.lstat(local).st_uid, os.lstat(local).st_gid) == (12345, 23456)
    assert wait_for(lambda: os.lstat(cluster4.mount("n4") / top / "remote.txt").st_uid == 12346)


# -- statfs, access, times, fallocate, O_APPEND ------------------------------------------


def test_statfs_is_the_local_exports(cluster4: LocalCluster) -> None:
    through, direct = os.statvfs(cluster4.mount("n2")), os.statvfs(cluster4.export("n2"))
    for field in ("f_bsize", "f_frsize", "f_blocks", "f_files", "f_namemax"):
        assert getattr(through, field) == getattr(direct, field), field
    assert abs(through.f_bavail - direct.f_bavail) < direct.f_blocks // 100


def test_access_answers_from_the_modes_like_the_export(cluster4: LocalCluster) -> None:
    top = unique("access")
    for name, mode in (("plain", 0o644), ("script", 0o750), ("secret", 0o000)):
        put(cluster4, "n3", f"{top}/{name}", b"#!/bin/sh\n").chmod(mode)
    for name in ("plain", "script", "secret"):
        for how in (os.R_OK, os.W_OK, os.X_OK, os.F_OK):
            assert os.access(cluster4.mount("n1") / top / name, how) == \
                os.access(cluster4.export("n3") / top / name, how), (name, how)
    assert not os.access(cluster4.mount("n1") / top / "missing", os.F_OK)


@pytest.mark.parametrize("holder", ["n1", "n3"])
def test_utimensat_with_utime_now_and_utime_omit(cluster4: LocalCluster, holder: str) -> None:
    rel = f"{unique('times')}.txt"
    put(cluster4, holder, rel, b"t")
    through, direct = cluster4.mount("n1") / rel, cluster4.export(holder) / rel
    utimensat(through, (1_000_000, 111), (2_000_000, 222))
    assert (os.lstat(direct).st_atime_ns, os.lstat(direct).st_mtime_ns) == (1_000_000_000_000_111,
                                                                             2_000_000_000_000_222)
    utimensat(through, (0, UTIME_OMIT), (3_000_000, 333))   # mtime only
    after = os.lstat(direct)
    assert (after.st_atime_ns, after.st_mtime_ns) == (1_000_000_000_000_111, 3_000_000_000_000_333)
    before = time.time_ns()
    utimensat(through, (0, UTIME_NOW), (0, UTIME_OMIT))     # atime now, mtime kept
    after = os.lstat(direct)
    assert after.st_atime_ns >= before - 10**9 and after.st_mtime_ns == 3_000_000_000_000_333
    assert os.lstat(through).st_mtime_ns == 3_000_000_000_000_333


@pytest.mark.parametrize("holder", ["n1", "n3"])
def test_posix_fallocate_extends_and_fallocate_is_not_supported(cluster4: LocalCluster, holder: str) -> None:
    rel = f"{unique('falloc')}.bin"
    put(cluster4, holder, rel, b"head")
    fd = os.open(cluster4.mount("n1") / rel, os.O_RDWR)
    try:
        # pyfuse3 3.5 has no fallocate handler: the kernel answers EOPNOTSUPP, as for any
        # file system without it, and glibc's posix_fallocate then writes the blocks itself.
        with pytest.raises(OSError) as raised:
            fallocate(fd, 0, 1 << 20)
        assert raised.value.errno == errno.EOPNOTSUPP
        os.posix_fallocate(fd, 0, 1 << 20)
    finally:
        os.close(fd)
    on_disk = cluster4.export(holder) / rel
    assert os.lstat(on_disk).st_size == 1 << 20
    assert on_disk.read_bytes()[:4] == b"head" and on_disk.read_bytes()[4:] == bytes((1 << 20) - 4)


@pytest.mark.parametrize("holder", ["n1", "n3"])
def test_o_append_from_two_handles_interleaves_whole_records(cluster4: LocalCluster, holder: str) -> None:
    rel = f"{unique('append')}.log"
    put(cluster4, holder, rel, b"")
    first = os.open(cluster4.mount("n1") / rel, os.O_WRONLY | os.O_APPEND)
    second = os.open(cluster4.mount("n1") / rel, os.O_WRONLY | os.O_APPEND)
    try:
        for i in range(50):
            os.write(first, f"a{i:03d}\n".encode())
            os.write(second, f"b{i:03d}\n".encode())
    finally:
        os.close(first)
        os.close(second)
    expected = "".join(f"a{i:03d}\nb{i:03d}\n" for i in range(50)).encode()
    assert (cluster4.export(holder) / rel).read_bytes() == expected


def test_o_append_from_two_nodes_loses_no_record(cluster4: LocalCluster) -> None:
    rel = f"{unique('append2')}.log"
    put(cluster4, "n3", rel, b"")

    def append(node: str) -> None:
        fd = os.open(cluster4.mount(node) / rel, os.O_WRONLY | os.O_APPEND)
        try:
            for i in range(100):
                os.write(fd, f"{node}-{i:03d}\n".encode())
        finally:
            os.close(fd)

    writers = [threading.Thread(target=append, args=(node,)) for node in ("n1", "n2")]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    lines = (cluster4.export("n3") / rel).read_text().splitlines()
    assert sorted(lines) == sorted(f"{node}-{i:03d}" for node in ("n1", "n2") for i in range(100))
    for node in ("n1", "n2"):  # each writer's records in its own order
        assert [line for line in lines if line.startswith(node)] == [f"{node}-{i:03d}" for i in range(100)]


@pytest.mark.parametrize("holder", ["n1", "n3"])
def test_open_with_o_trunc_shows_the_new_size_at_once(cluster4: LocalCluster, holder: str) -> None:
    rel = f"{unique('trunc')}.bin"
    put(cluster4, holder, rel, b"x" * 10000)
    through = cluster4.mount("n1") / rel
    assert os.stat(through).st_size == 10000
    fd = os.open(through, os.O_WRONLY | os.O_TRUNC)
    try:
        assert os.fstat(fd).st_size == 0
    finally:
        os.close(fd)
    assert os.stat(through).st_size == 0 == os.stat(cluster4.export(holder) / rel).st_size


def test_a_directory_shows_its_new_nlink_and_mtime_after_creates_in_it(cluster4: LocalCluster) -> None:
    top = cluster4.mount("n2") / unique("dirattr")
    top.mkdir()
    assert os.stat(top).st_nlink == 2
    (top / "a").mkdir()
    (top / "b").mkdir()
    (top / "f").write_text("x")
    on_disk = os.stat(cluster4.export("n2") / top.name)
    seen = os.stat(top)
    assert (seen.st_nlink, seen.st_mtime_ns) == (on_disk.st_nlink, on_disk.st_mtime_ns) and seen.st_nlink == 4
    os.rmdir(top / "b")
    assert os.stat(top).st_nlink == 3


def test_ls_a_lists_dot_and_dotdot_with_their_inodes_also_in_a_long_listing(cluster4: LocalCluster) -> None:
    """`ls -a` shows "." and ".." as on a local disk; a listing the kernel reads in many pieces
    (2,000 names) still shows every name once."""
    top = cluster4.mount("n3") / unique("dots")
    (top / "sub").mkdir(parents=True)
    for i in range(2000):
        (top / "sub" / f"file-{i:04d}").touch()
    for asking in ("n3", "n1"):
        sub = cluster4.mount(asking) / top.name / "sub"
        listed = subprocess.run(["ls", "-a1", str(sub)], capture_output=True, text=True, check=True).stdout.split()
        assert listed[:2] == [".", ".."] and len(listed) == 2002 and len(set(listed)) == 2002, asking
        assert sorted(listed[2:]) == [f"file-{i:04d}" for i in range(2000)]
        inodes = {line.split()[1]: int(line.split()[0]) for line in subprocess.run(
            ["ls", "-ai1", "-f", str(sub.parent)], capture_output=True, text=True, check=True).stdout.splitlines()}
        assert inodes["."] == os.stat(sub.parent).st_ino and inodes["sub"] == os.stat(sub).st_ino
        assert inodes[".."] == os.stat(sub.parent.parent).st_ino
        long = subprocess.run(["ls", "-la", str(sub)], capture_output=True, text=True, check=True)
        assert long.stderr == "" and [line.split()[-1] for line in long.stdout.splitlines()[1:3]] == [".", ".."]
    assert sorted(os.listdir(cluster4.mount("n2") / top.name)) == ["sub"]  # Python never sees them


# -- extended attributes -------------------------------------------------------------


@pytest.mark.parametrize("holder", ["n1", "n3"])
def test_ls_l_of_a_symlink_prints_it_without_an_error(cluster4: LocalCluster, holder: str) -> None:
    """`ls -l` asks every entry for security.selinux (and ACLs) without following symlinks:
    the answer for a symlink is the one ext4 gives (no such attribute), not ELOOP."""
    name = unique("link")
    os.symlink("target-" + name, cluster4.mount(holder) / name)
    for asking in ("n1", "n2"):
        link = cluster4.mount(asking) / name
        listed = subprocess.run(["ls", "-l", str(link)], capture_output=True, text=True, check=False)
        assert (listed.returncode, listed.stderr) == (0, ""), listed
        assert listed.stdout.startswith("l") and f"-> target-{name}" in listed.stdout
        with pytest.raises(OSError) as info:
            os.getxattr(link, "security.selinux", follow_symlinks=False)
        assert info.value.errno == errno.ENODATA
        shown = subprocess.run(["getfattr", "-h", "-d", "-m", "-", str(link)], capture_output=True, text=True,
                               check=False)
        assert shown.returncode == 0 and "Too many levels" not in shown.stderr, shown


@pytest.mark.parametrize("holder", ["n1", "n3"])
def test_only_user_xattrs_can_be_set_through_the_mount(cluster4: LocalCluster, holder: str) -> None:
    """trusted.* and security.* need privileges on the holder: a root daemon must not set them
    for whoever asks (a peer, any user of an allow_other mount). user.* works as on the export."""
    name = unique("xattr")
    (cluster4.mount(holder) / name).write_bytes(b"x")
    through = cluster4.mount("n2") / name
    os.setxattr(through, "user.color", b"blue")
    assert os.getxattr(cluster4.export(holder) / name, "user.color") == b"blue"
    for attribute in ("trusted.gmount-test", "security.gmount-test"):
        with pytest.raises(OSError) as info:
            os.setxattr(through, attribute, b"1")
        assert info.value.errno == errno.EOPNOTSUPP, attribute
        assert attribute not in os.listxattr(cluster4.export(holder) / name)
    os.setxattr(cluster4.export(holder) / name, "trusted.gmount-test", b"1")  # root, on the export itself
    with pytest.raises(OSError) as info:
        os.removexattr(through, "trusted.gmount-test")
    assert info.value.errno == errno.EOPNOTSUPP
    assert os.getxattr(cluster4.export(holder) / name, "trusted.gmount-test") == b"1"
    os.removexattr(through, "user.color")


# -- directory renames across nodes ----------------------------------------------------


def test_mv_of_a_directory_that_one_holder_cannot_rename_leaves_it_whole(cluster4: LocalCluster) -> None:
    """`mv` of a directory that n1 and n3 both have, where n3's rename(2) fails (its copy is a
    mountpoint there: EBUSY): n1's rename is undone, the directory keeps its name everywhere."""
    if os.geteuid() != 0:
        require("a mount inside an export (needs root)", "not root")
    name, renamed = unique("busy"), unique("renamed")
    (cluster4.export("n1") / name).mkdir()
    (cluster4.export("n1") / name / "a.txt").write_text("on n1")
    busy = cluster4.export("n3") / name
    busy.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "gmount-test-busy", str(busy)], check=True)
    try:
        (busy / "b.txt").write_text("on n3")
        cluster4.rescan("n1", "n3")
        moved = subprocess.run(["mv", str(cluster4.mount("n1") / name), str(cluster4.mount("n1") / renamed)],
                               capture_output=True, text=True, check=False)
        assert moved.returncode != 0 and "busy" in moved.stderr.lower(), moved
        assert (cluster4.export("n1") / name / "a.txt").read_text() == "on n1"
        assert not (cluster4.export("n1") / renamed).exists()
        assert wait_for(lambda: sorted(os.listdir(cluster4.mount("n2") / name)) == ["a.txt", "b.txt"])
    finally:
        subprocess.run(["umount", "-l", str(busy)], check=False)
