"""The union semantics of docs/design.md, over four real nodes, without FUSE.

n1, n2: site tsukuba; n3, n4: site hongo. Lookup order from n1 is n1, n2, (n3, n4);
from n4 it is n4, n3, (n1, n2).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from gmountpy.node.namespace import Namespace
from gmountpy.node.renames import RENAME_EXCHANGE, RENAME_NOREPLACE
from gmountpy.node.service import MAX_IO
from gmountpy.protocol import messages as msg

from .._trio import trio_test
from .harness import open_cluster, read_file


async def listing(namespace: Namespace, path: str) -> dict[str, tuple[str, int]]:
    """name -> (node that wins, size there)."""
    return {name: (loc.node, loc.attr.size) for name, loc in await namespace.listdir(path)}


def assert_errno(info: pytest.ExceptionInfo[OSError], code: int) -> None:
    assert info.value.errno == code, f"{info.value!r}, wanted {errno.errorcode[code]}"


# ---------------------------------------------------------------- lookup and listing


@trio_test
async def test_lookup_of_root_and_nearest_holder(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        root = await cluster["n3"].namespace.lookup("/")
        assert root.node == "n3" and root.attr.is_dir
        cluster["n2"].put("/f", b"22")
        cluster["n4"].put("/f", b"4444")
        assert (await cluster["n1"].namespace.lookup("/f")).node == "n2"
        assert (await cluster["n3"].namespace.lookup("/f")).node == "n4"
        with pytest.raises(FileNotFoundError):
            await cluster["n1"].namespace.lookup("/nowhere")


@trio_test
async def test_listdir_merges_all_nodes_and_the_nearest_wins(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        cluster["n1"].put("/d/only-n1", b"1")
        cluster["n2"].put("/d/dup", b"22")
        cluster["n3"].put("/d/dup", b"333")
        cluster["n3"].put("/d/only-n3", b"333")
        cluster["n4"].put("/d/dup", b"4444")
        cluster["n4"].mkdir("/d/subdir-n4")
        cluster["n2"].mkdir("/elsewhere")
        assert await listing(cluster["n1"].namespace, "/d") == {
            "only-n1": ("n1", 1), "dup": ("n2", 2), "only-n3": ("n3", 3), "subdir-n4": ("n4", 4096)}
        from_n4 = await listing(cluster["n4"].namespace, "/d")
        assert from_n4["dup"] == ("n4", 4) and from_n4["only-n1"] == ("n1", 1)
        assert set(await listing(cluster["n3"].namespace, "/")) == {"d", "elsewhere"}
        # the listing taught the locator where each entry is
        cluster.reset_counts()
        assert (await cluster["n1"].namespace.lookup("/d/only-n3")).node == "n3"
        assert sum(cluster.served("locate").values()) == 0


@trio_test
async def test_listdir_of_a_directory_that_exists_only_far_away(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        cluster["n4"].put("/far/away/f", b"x")
        assert await listing(cluster["n1"].namespace, "/far/away") == {"f": ("n4", 1)}
        with pytest.raises(FileNotFoundError):
            await cluster["n1"].namespace.listdir("/no/such/dir")


@trio_test
async def test_listdir_skips_a_stopped_node(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        cluster["n2"].put("/s/from-n2")
        cluster["n3"].put("/s/from-n3")
        cluster.stop("n3")
        assert set(await listing(cluster["n1"].namespace, "/s")) == {"from-n2"}


@trio_test
async def test_readlink_at_the_holder(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        os.symlink("../target", cluster["n3"].path("/link"))
        assert await cluster["n1"].namespace.readlink("/link") == "../target"


@trio_test
async def test_statfs_is_the_local_export(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        assert await cluster["n2"].namespace.statfs() == cluster["n2"].export.statfs()


# ---------------------------------------------------------------- creates land here


@trio_test
async def test_create_lands_on_the_local_node_with_parents(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        cluster["n3"].mkdir("/out/run1")  # the directory the job sees exists only on n3
        ns = cluster["n1"].namespace
        handle = await ns.create("/out/run1/result.txt", os.O_WRONLY, 0o644)
        assert await ns.write(handle, 0, b"made on n1") == 10
        await ns.release(handle)
        assert cluster["n1"].path("/out/run1/result.txt").read_bytes() == b"made on n1"
        assert cluster.holders("/out/run1/result.txt") == ["n1"]
        assert (await ns.lookup("/out/run1/result.txt")).node == "n1"
        # and everyone else sees it
        assert await read_file(cluster["n4"].namespace, "/out/run1/result.txt") == b"made on n1"


@trio_test
async def test_mkdir_and_symlink_land_on_the_local_node(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        ns = cluster["n4"].namespace
        attr = await ns.mkdir("/new/deep/dir", 0o755)
        assert attr.is_dir and cluster.holders("/new/deep/dir") == ["n4"]
        attr = await ns.symlink("../elsewhere", "/links/l")
        assert stat.S_ISLNK(attr.mode) and cluster.holders("/links/l") == ["n4"]
        assert os.readlink(cluster["n4"].path("/links/l")) == "../elsewhere"
        assert (await ns.lookup("/new/deep/dir")).node == "n4"
        assert await cluster["n1"].namespace.readlink("/links/l") == "../elsewhere"


# ---------------------------------------------------------------- data through handles


@trio_test
async def test_read_and_write_a_remote_file_at_offsets(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        data = bytearray(os.urandom(3 * 1024 * 1024))
        cluster["n4"].put("/big.bin", bytes(data))
        ns = cluster["n1"].namespace
        handle = await ns.open("/big.bin", os.O_RDWR)
        assert handle.node == "n4" and handle.fd is None
        for offset, size in ((0, 10), (2_000_000, 4096), (123, 1), (3 * 1024 * 1024 - 5, 100), (10**9, 10)):
            assert await ns.read(handle, offset, size) == bytes(data[offset:offset + size])
        # sequential reads (read-ahead kicks in) return the same bytes
        chunks = [await ns.read(handle, off, 128 * 1024) for off in range(0, len(data), 128 * 1024)]
        assert b"".join(chunks) == bytes(data)
        assert await ns.write(handle, 1_000_000, b"written from n1") == 15
        data[1_000_000:1_000_015] = b"written from n1"
        assert await ns.read(handle, 999_990, 40) == bytes(data[999_990:1_000_030])
        assert (await ns.fstat(handle)).size == len(data)
        await ns.fsync(handle, False)
        await ns.release(handle)
        assert cluster["n4"].path("/big.bin").read_bytes() == bytes(data)
        assert cluster.holders("/big.bin") == ["n4"]


@trio_test
async def test_reads_and_writes_larger_than_one_rpc(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        data = os.urandom(2 * MAX_IO + 333)
        cluster["n3"].put("/huge", data)
        ns = cluster["n2"].namespace
        handle = await ns.open("/huge", os.O_RDWR)
        assert await ns.read(handle, 7, len(data)) == data[7:]
        payload = os.urandom(MAX_IO + 10)
        assert await ns.write(handle, 5, payload) == len(payload)
        await ns.release(handle)
        assert cluster["n3"].path("/huge").read_bytes() == data[:5] + payload + data[5 + len(payload):]


@trio_test
async def test_a_local_file_is_read_through_a_local_descriptor(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        cluster["n2"].put("/mine", b"local bytes")
        ns = cluster["n2"].namespace
        handle = await ns.open("/mine", os.O_RDONLY)
        assert handle.fd is not None and handle.node == "n2"
        assert await ns.read(handle, 6, 100) == b"bytes"
        await ns.release(handle)
        assert sum(cluster.served("read").values()) == 0


@trio_test
async def test_open_after_the_holder_lost_the_file_looks_it_up_again(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        cluster["n3"].put("/vanishing")
        ns = cluster["n1"].namespace
        assert (await ns.lookup("/vanishing")).node == "n3"
        cluster["n3"].path("/vanishing").unlink()
        cluster["n2"].put("/vanishing", b"now on n2")
        assert await read_file(ns, "/vanishing") == b"now on n2"  # not ENOENT from the stale location
        cluster["n2"].path("/vanishing").unlink()
        with pytest.raises(FileNotFoundError):
            await ns.open("/vanishing", os.O_RDONLY)


# ---------------------------------------------------------------- removal


@trio_test
async def test_unlink_removes_every_holder(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        for name in ("n1", "n2", "n4"):
            cluster[name].put("/dup/file", name.encode())
        ns = cluster["n3"].namespace
        await ns.unlink("/dup/file")
        assert cluster.holders("/dup/file") == []
        with pytest.raises(FileNotFoundError):
            await ns.lookup("/dup/file")
        with pytest.raises(FileNotFoundError):
            await ns.unlink("/dup/file")
        with pytest.raises(IsADirectoryError):
            await ns.unlink("/dup")


@trio_test
async def test_unlink_removes_a_symlink_not_its_target(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        cluster["n2"].put("/target", b"kept")
        os.symlink("target", cluster["n2"].path("/link"))
        await cluster["n1"].namespace.unlink("/link")
        assert cluster.holders("/link") == [] and cluster["n2"].path("/target").read_bytes() == b"kept"


@trio_test
async def test_rmdir_removes_the_directory_everywhere(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        for name in ("n1", "n3", "n4"):
            cluster[name].mkdir("/empty")
        await cluster["n2"].namespace.rmdir("/empty")
        assert cluster.holders("/empty") == []
        with pytest.raises(FileNotFoundError):
            await cluster["n2"].namespace.lookup("/empty")
        with pytest.raises(FileNotFoundError):
            await cluster["n2"].namespace.rmdir("/empty")


@trio_test
async def test_rmdir_of_a_directory_not_empty_on_some_node(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        cluster["n1"].mkdir("/full")
        cluster["n3"].put("/full/child", b"c")
        ns = cluster["n1"].namespace
        with pytest.raises(OSError) as info:
            await ns.rmdir("/full")
        assert_errno(info, errno.ENOTEMPTY)
        cluster.forget_caches()
        # whatever was removed on the way, the union still shows the directory and its child
        assert await listing(ns, "/full") == {"child": ("n3", 1)}


# ---------------------------------------------------------------- rename


@trio_test
async def test_rename_of_a_file_on_a_remote_holder_is_that_nodes_rename(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        src = cluster["n3"].put("/r/src", b"the data")
        inode = src.stat().st_ino
        ns = cluster["n1"].namespace
        await ns.rename("/r/src", "/r/dst")
        assert cluster.holders("/r/src") == [] and cluster.holders("/r/dst") == ["n3"]
        assert cluster["n3"].path("/r/dst").stat().st_ino == inode  # rename(2), not a copy
        assert await read_file(ns, "/r/dst") == b"the data"
        with pytest.raises(FileNotFoundError):
            await ns.lookup("/r/src")


@trio_test
async def test_rename_replaces_every_other_holder_of_the_destination(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        cluster["n3"].put("/x/src", b"new content")
        cluster["n4"].put("/x/src", b"older copy of src")
        for name in ("n1", "n2", "n3"):
            cluster[name].put("/x/dst", f"old dst on {name}".encode())
        ns = cluster["n1"].namespace
        await ns.rename("/x/src", "/x/dst")
        assert cluster.holders("/x/src") == []
        assert cluster.holders("/x/dst") == ["n3"]
        assert cluster["n3"].path("/x/dst").read_bytes() == b"new content"
        assert await read_file(ns, "/x/dst") == b"new content"
        assert await read_file(cluster["n4"].namespace, "/x/dst") == b"new content"


@trio_test
async def test_rename_of_a_file_into_a_directory_its_holder_lacks(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        cluster["n2"].put("/in/f", b"moving")
        cluster["n4"].mkdir("/only-on-n4")
        await cluster["n1"].namespace.rename("/in/f", "/only-on-n4/f")
        assert cluster.holders("/only-on-n4/f") == ["n2"]  # the holder made the parent itself
        assert await read_file(cluster["n3"].namespace, "/only-on-n4/f") == b"moving"


@trio_test
async def test_rename_of_a_directory_present_on_several_nodes(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        cluster["n1"].put("/proj/a.txt", b"a")
        cluster["n3"].put("/proj/sub/b.txt", b"bb")
        cluster["n4"].mkdir("/proj")
        ns = cluster["n2"].namespace
        assert set(await listing(ns, "/proj")) == {"a.txt", "sub"}
        await ns.rename("/proj", "/renamed")
        assert cluster.holders("/proj") == []
        assert cluster.holders("/renamed") == ["n1", "n3", "n4"]
        assert await listing(ns, "/renamed") == {"a.txt": ("n1", 1), "sub": ("n3", 4096)}
        assert await read_file(ns, "/renamed/sub/b.txt") == b"bb"
        with pytest.raises(FileNotFoundError):
            await ns.lookup("/proj/a.txt")


@trio_test
async def test_rename_of_a_directory_onto_one_that_only_another_node_has_is_exdev(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        cluster["n1"].put("/srcdir/f", b"f")
        cluster["n3"].mkdir("/dstdir")
        with pytest.raises(OSError) as info:
            await cluster["n1"].namespace.rename("/srcdir", "/dstdir")
        assert_errno(info, errno.EXDEV)
        assert cluster.holders("/srcdir/f") == ["n1"] and cluster.holders("/dstdir") == ["n3"]


@trio_test
async def test_a_directory_rename_that_fails_on_a_later_node_is_undone_on_the_earlier_ones(tmp_path: Path) -> None:
    """n1 and n3 have /proj; renaming it to /x/proj works on n1 but fails on n3, whose /x is a
    file: n1's rename is undone, so /proj is whole under its old name, never split in two."""
    async with open_cluster(tmp_path) as cluster:
        cluster["n1"].put("/proj/a.txt", b"a")
        cluster["n3"].put("/proj/b.txt", b"bb")
        cluster["n3"].put("/x", b"a file where n1 will make a directory")
        ns = cluster["n1"].namespace
        with pytest.raises(OSError) as info:
            await ns.rename("/proj", "/x/proj")
        assert_errno(info, errno.ENOTDIR)
        assert cluster.holders("/proj/a.txt") == ["n1"] and cluster.holders("/proj/b.txt") == ["n3"]
        assert cluster.holders("/x/proj") == []
        assert await listing(ns, "/proj") == {"a.txt": ("n1", 1), "b.txt": ("n3", 2)}


@trio_test
async def test_a_directory_rename_that_cannot_be_undone_says_where_each_name_is(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        cluster["n1"].put("/proj/a.txt", b"a")
        cluster["n2"].put("/proj/c.txt", b"c")
        cluster["n3"].put("/proj/b.txt", b"bb")
        cluster["n3"].put("/x", b"a file")
        ns = cluster["n1"].namespace
        real = cluster["n2"].service.op_rename

        def rename_once(request: msg.Rename) -> None:
            if request.src == "/x/proj":
                raise OSError(errno.EIO, "the disk failed")  # n2 cannot rename it back
            real(request)

        cluster["n2"].service._ops[msg.Rename] = rename_once
        with pytest.raises(OSError) as info:
            await ns.rename("/proj", "/x/proj")
        assert_errno(info, errno.EIO)
        message = str(info.value)
        assert "n3" in message and "n2" in message and "/x/proj" in message and "docs/failures.md" in message
        assert cluster.holders("/proj") == ["n1", "n3"] and cluster.holders("/x/proj") == ["n2"]


@trio_test
async def test_rename_type_mismatches_and_flags(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        ns = cluster["n1"].namespace
        cluster["n2"].put("/file", b"f")
        cluster["n3"].mkdir("/dir")
        cluster["n4"].mkdir("/dir2")
        with pytest.raises(IsADirectoryError):
            await ns.rename("/file", "/dir")
        with pytest.raises(NotADirectoryError):
            await ns.rename("/dir2", "/file")
        with pytest.raises(FileExistsError):
            await ns.rename("/file", "/dir", RENAME_NOREPLACE)
        with pytest.raises(OSError) as info:
            await ns.rename("/file", "/other", RENAME_EXCHANGE)
        assert_errno(info, errno.EINVAL)
        with pytest.raises(FileNotFoundError):
            await ns.rename("/missing", "/other")
        await ns.rename("/file", "/fresh", RENAME_NOREPLACE)
        assert cluster.holders("/fresh") == ["n2"] and cluster.holders("/file") == []
        assert cluster.holders("/dir") == ["n3"] and cluster.holders("/dir2") == ["n4"]


# ---------------------------------------------------------------- attributes at the holder


@trio_test
async def test_setattr_acts_on_the_nearest_holder(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        cluster["n2"].put("/attr/f", b"0123456789")
        cluster["n3"].put("/attr/f", b"farther copy")
        ns = cluster["n1"].namespace
        attr = await ns.setattr("/attr/f", mode=stat.S_IFREG | 0o600)
        assert stat.S_IMODE(attr.mode) == 0o600
        attr = await ns.setattr("/attr/f", size=4)
        assert attr.size == 4
        attr = await ns.setattr("/attr/f", atime_ns=1_000, mtime_ns=2_000_000_000)
        assert (attr.atime_ns, attr.mtime_ns) == (1_000, 2_000_000_000)
        on_n2 = cluster["n2"].path("/attr/f").stat()
        assert (stat.S_IMODE(on_n2.st_mode), on_n2.st_size, on_n2.st_mtime_ns) == (0o600, 4, 2_000_000_000)
        assert cluster["n3"].path("/attr/f").read_bytes() == b"farther copy"  # untouched
        assert (await ns.lookup("/attr/f")).attr == attr  # the cache learned the new attributes


@trio_test
async def test_setattr_through_open_handles(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        cluster["n4"].put("/h/remote", b"remote content")
        cluster["n1"].put("/h/local", b"local content")
        ns = cluster["n1"].namespace
        for path, node in (("/h/remote", "n4"), ("/h/local", "n1")):
            handle = await ns.open(path, os.O_RDWR)
            attr = await ns.setattr(path, size=6, handle=handle)
            assert attr.size == 6
            assert await ns.read(handle, 0, 100) == cluster[node].path(path).read_bytes()[:6]
            await ns.release(handle)
            assert cluster[node].path(path).stat().st_size == 6


@trio_test
async def test_setattr_of_only_times_keeps_the_other(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        path = cluster["n3"].put("/t", b"")
        os.utime(path, ns=(111, 222))
        attr = await cluster["n1"].namespace.setattr("/t", mtime_ns=333)
        assert (attr.atime_ns, attr.mtime_ns) == (111, 333)


# ---------------------------------------------------------------- extended attributes


@trio_test
async def test_virtual_xattrs(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        cluster["n1"].put("/v/f", b"on n1")
        cluster["n4"].put("/v/f", b"on n4")
        cluster["n3"].put("/v/g", b"on n3")
        n1, n2 = cluster["n1"].namespace, cluster["n2"].namespace
        assert await n1.getxattr("/v/f", "user.gmount.node") == b"n1"
        assert await n2.getxattr("/v/f", "user.gmount.node") == b"n1"
        assert await n2.getxattr("/v/g", "user.gmount.site") == b"hongo"
        assert await n1.getxattr("/v/f", "user.gmount.where") == b"n1\nn4"
        assert await cluster["n3"].namespace.getxattr("/v/f", "user.gmount.where") == b"n4\nn1"
        assert await n1.getxattr("/v/f", "user.gmount.local_path") == str(cluster["n1"].path("/v/f")).encode()
        with pytest.raises(OSError) as info:
            await n2.getxattr("/v/g", "user.gmount.local_path")
        assert_errno(info, errno.ENODATA)
        assert "n3" in str(info.value)
        assert set(await n1.listxattr("/v/f")) >= {"user.gmount.node", "user.gmount.site", "user.gmount.where",
                                                  "user.gmount.local_path"}
        assert "user.gmount.local_path" not in await n2.listxattr("/v/g")
        with pytest.raises(FileNotFoundError):
            await n1.getxattr("/v/none", "user.gmount.where")
        with pytest.raises(FileNotFoundError):
            await n1.getxattr("/v/none", "user.gmount.node")


@trio_test
async def test_a_holders_error_on_listxattr_is_an_error_not_an_empty_list(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        cluster["n3"].put("/lx/f", b"")
        ns = cluster["n1"].namespace
        assert "user.gmount.where" in await ns.listxattr("/lx/f")
        cluster["n3"].fail["listxattr"] = errno.EIO  # the holder's disk fails
        with pytest.raises(OSError) as info:
            await ns.listxattr("/lx/f")
        assert_errno(info, errno.EIO)
        cluster["n3"].fail["listxattr"] = errno.EOPNOTSUPP  # a file system without xattrs: none to list
        assert "user.project" not in await ns.listxattr("/lx/f")


@trio_test
async def test_peers_may_set_and_remove_only_user_xattrs(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        path = cluster["n3"].put("/sx/f", b"")
        call = cluster["n1"].pool.call
        await call("n3", "setxattr", "/sx/f", "user.ok", b"1")
        for name in ("trusted.overlay.opaque", "security.capability", "system.posix_acl_access", "user"):
            with pytest.raises(OSError) as info:
                await call("n3", "setxattr", "/sx/f", name, b"1")
            assert_errno(info, errno.EOPNOTSUPP)
        os.setxattr(path, "trusted.keep", b"1")
        with pytest.raises(OSError) as info:
            await call("n3", "removexattr", "/sx/f", "trusted.keep")
        assert_errno(info, errno.EOPNOTSUPP)
        assert sorted(os.listxattr(path)) == ["trusted.keep", "user.ok"]


@trio_test
async def test_real_xattrs_live_at_the_holder_and_gmount_names_are_read_only(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        cluster["n3"].put("/x/f", b"")
        ns = cluster["n1"].namespace
        await ns.setxattr("/x/f", "user.project", b"montage")
        assert os.getxattr(cluster["n3"].path("/x/f"), "user.project") == b"montage"
        assert await ns.getxattr("/x/f", "user.project") == b"montage"
        assert "user.project" in await ns.listxattr("/x/f")
        for name in ("user.gmount.node", "user.gmount.anything"):
            with pytest.raises(PermissionError):
                await ns.setxattr("/x/f", name, b"forged")
            with pytest.raises(PermissionError):
                await ns.removexattr("/x/f", name)
        # a gmount-looking xattr planted on disk is not shown as if it were ours
        os.setxattr(cluster["n3"].path("/x/f"), "user.gmount.node", b"forged")
        assert (await ns.listxattr("/x/f")).count("user.gmount.node") == 1
        assert await ns.getxattr("/x/f", "user.gmount.node") == b"n3"
        await ns.removexattr("/x/f", "user.project")
        assert "user.project" not in os.listxattr(cluster["n3"].path("/x/f"))


# ---------------------------------------------------------------- all-or-nothing and shadowing


@trio_test
async def test_rename_of_a_directory_onto_a_non_empty_one_changes_nothing(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        cluster["n1"].put("/a/from-n1", b"1")
        cluster["n3"].put("/a/from-n3", b"3")
        cluster["n3"].put("/b/occupied", b"b")
        with pytest.raises(OSError) as info:
            await cluster["n1"].namespace.rename("/a", "/b")
        assert_errno(info, errno.ENOTEMPTY)
        assert cluster.holders("/a") == ["n1", "n3"]
        assert cluster.holders("/b/from-n1") == []


@trio_test
async def test_unlinking_a_file_that_shadows_a_directory_uncovers_the_directory(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        cluster["n1"].put("/mixed", b"a file on n1")
        cluster["n3"].put("/mixed/inside", b"a directory on n3")
        ns = cluster["n1"].namespace
        await ns.unlink("/mixed")
        location = await ns.lookup("/mixed")
        assert location.node == "n3" and location.attr.is_dir


def test_harness_topology(tmp_path: Path) -> None:
    """The harness matches the demo cluster the FUSE tests use."""
    from .harness import make_spec
    spec = make_spec(tmp_path)
    assert {site: list(nodes) for site, nodes in spec.sites.items()} == {"tsukuba": ["n1", "n2"],
                                                                          "hongo": ["n3", "n4"]}


@trio_test
async def test_a_directory_too_big_for_one_reply_is_listed_in_pages(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import gmountpy.node.service as service

    monkeypatch.setattr(service, "LISTDIR_MAX", 10)  # as if each node held hundreds of thousands
    async with open_cluster(tmp_path) as cluster:
        for i in range(35):
            cluster["n3"].put(f"/huge/f{i:03d}", b"")
        for i in range(12):
            cluster["n2"].put(f"/huge/g{i:03d}", b"")
        names = sorted(name for name, _ in await cluster["n1"].namespace.listdir("/huge"))
        assert names == sorted([f"f{i:03d}" for i in range(35)] + [f"g{i:03d}" for i in range(12)])
        assert cluster["n3"].served["opendir"] == 1 and cluster["n3"].served["closedir"] == 1
        assert cluster["n3"].served["readdir"] == 4
