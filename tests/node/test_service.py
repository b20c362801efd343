"""What a node answers its peers, asked over real RPC: export operations, handles owned by the connection."""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from pathlib import Path

import pytest
import trio

from gmountpy.node.peers import PeerPool
from gmountpy.node.service import MAX_IO
from gmountpy.protocol.attr import Attr

from .._trio import trio_test
from .harness import SECRET, open_cluster


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@trio_test
async def test_ping(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        info = await cluster["n1"].pool.call("n3", "ping")
        assert info["node"] == "n3" and info["site"] == "hongo" and info["pid"] == os.getpid()


@trio_test
async def test_lookup_locate_and_listdir_answer_none_for_absent_paths(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        call = cluster["n1"].pool.call
        cluster["n2"].put("/d/f", b"abc")
        attr = Attr.from_wire(await call("n2", "lookup", "/d/f"))
        assert attr.size == 3 and attr.is_file
        located = await call("n2", "locate", "/d/f")
        assert Attr.from_wire(located[0]) == attr and located[1] is None
        for op in ("lookup", "locate", "listdir"):
            assert await call("n2", op, "/nothing") is None
            assert await call("n2", op, "/d/f/below-a-file") is None
        assert await call("n2", "listdir", "/d/f") is None
        listing = await call("n2", "listdir", "/d")
        assert [(name, Attr.from_wire(a).size) for name, a, _ in listing] == [("f", 3)]  # [name, attr, replica_of]


@trio_test
async def test_forbidden_paths_are_errors_not_absences(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        for op in ("lookup", "locate", "listdir"):
            for path in ("/../n1", "relative", "/a/./b", "/a\0b"):
                with pytest.raises(OSError) as info:
                    await cluster["n1"].pool.call("n2", op, path)
                assert info.value.errno == errno.EINVAL


@trio_test
async def test_handles_read_write_at_offsets(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        call = cluster["n1"].pool.call
        cluster["n4"].put("/data", bytes(range(256)) * 40)
        handle, attr = await call("n4", "open", "/data", os.O_RDWR)
        assert Attr.from_wire(attr).size == 10240
        assert await call("n4", "read", handle, 1000, 8) == (bytes(range(256)) * 40)[1000:1008]
        assert await call("n4", "read", handle, 10236, 100) == bytes(range(252, 256))
        assert await call("n4", "read", handle, 20000, 100) == b""
        assert await call("n4", "write", handle, 5, b"XYZ") == 3
        assert await call("n4", "write", handle, 20000, b"end") == 3
        assert Attr.from_wire(await call("n4", "fstat", handle)).size == 20003
        await call("n4", "fsync", handle, True)
        await call("n4", "fsync", handle, False)
        assert Attr.from_wire(await call("n4", "ftruncate", handle, 10)).size == 10
        await call("n4", "close", handle)
        assert cluster["n4"].path("/data").read_bytes() == bytes(range(5)) + b"XYZ" + bytes([8, 9])
        with pytest.raises(OSError) as info:
            await call("n4", "read", handle, 0, 1)
        assert info.value.errno == errno.EBADF


@trio_test
async def test_handles_belong_to_their_connection(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        cluster["n2"].put("/private", b"mine")
        handle, _ = await cluster["n1"].pool.call("n2", "open", "/private", os.O_RDONLY)
        with pytest.raises(OSError) as info:
            await cluster["n3"].pool.call("n2", "read", handle, 0, 4)
        assert info.value.errno == errno.EBADF
        assert await cluster["n1"].pool.call("n2", "read", handle, 0, 4) == b"mine"


@trio_test
async def test_a_closed_connection_closes_its_descriptors(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        for i in range(5):
            cluster["n2"].put(f"/many/{i}", b"x")
        pool = PeerPool("n1", cluster["n1"].service, SECRET, cluster.nursery)
        pool.set_peers(cluster.addresses())
        await pool.call("n2", "ping")
        before = open_fds()
        for i in range(5):
            await pool.call("n2", "open", f"/many/{i}", os.O_RDONLY)
        assert open_fds() == before + 5
        await pool.aclose()
        with trio.fail_after(2):
            while open_fds() > before - 2:  # our socket and the server's end are gone too
                await trio.sleep(0.01)


@trio_test
async def test_io_limits_and_bad_arguments(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        call = cluster["n1"].pool.call
        cluster["n2"].put("/f", b"abc")
        handle, _ = await call("n2", "open", "/f", os.O_RDWR)
        for args in ((handle, 0, MAX_IO + 1), (handle, 0, -1), (handle, -5, 1), (handle, "0", 1)):
            with pytest.raises(OSError) as info:
                await call("n2", "read", *args)
            assert info.value.errno == errno.EINVAL, args
        for data in ("text", b"x" * (MAX_IO + 1)):
            with pytest.raises(OSError) as info:
                await call("n2", "write", handle, 0, data)
            assert info.value.errno == errno.EINVAL
        with pytest.raises(OSError) as info:
            await call("n2", "chmod", "/f", "0644")
        assert info.value.errno == errno.EINVAL
        with pytest.raises(OSError) as info:
            await call("n2", "lookup")
        assert info.value.errno == errno.EINVAL
        with pytest.raises(OSError) as info:
            await call("n2", "format_disk")
        assert info.value.errno == errno.ENOSYS
        with pytest.raises(OSError) as info:
            await call("n2", "dispatch", "x")  # only op_* methods are operations
        assert info.value.errno == errno.ENOSYS
        assert await call("n2", "read", handle, 0, 3) == b"abc"  # still usable


@trio_test
async def test_open_never_creates_and_checksum(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        call = cluster["n1"].pool.call
        with pytest.raises(FileNotFoundError):
            await call("n3", "open", "/made-up", os.O_WRONLY | os.O_CREAT)
        assert not cluster["n3"].has("/made-up")
        data = os.urandom(3 * 1024 * 1024 + 17)
        cluster["n3"].put("/sum", data)
        assert await call("n3", "checksum", "/sum") == [len(data), hashlib.sha256(data).hexdigest()]


@trio_test
async def test_namespace_changes_on_a_peer(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        call = cluster["n1"].pool.call
        n2 = cluster["n2"]
        assert Attr.from_wire(await call("n2", "mkdir", "/a/b", 0o750)).is_dir
        assert n2.path("/a/b").is_dir()
        assert stat.S_ISLNK(Attr.from_wire(await call("n2", "symlink", "../x", "/a/l")).mode)
        assert await call("n2", "readlink", "/a/l") == "../x"
        n2.put("/a/f", b"0123456789")
        await call("n2", "rename", "/a/f", "/c/d/g")
        assert n2.path("/c/d/g").read_bytes() == b"0123456789"
        assert stat.S_IMODE(Attr.from_wire(await call("n2", "chmod", "/c/d/g", 0o600)).mode) == 0o600
        assert Attr.from_wire(await call("n2", "truncate", "/c/d/g", 4)).size == 4
        assert Attr.from_wire(await call("n2", "utimens", "/c/d/g", None, 42)).mtime_ns == 42
        await call("n2", "setxattr", "/c/d/g", "user.k", b"v")
        assert await call("n2", "getxattr", "/c/d/g", "user.k") == b"v"
        assert "user.k" in await call("n2", "listxattr", "/c/d/g")
        await call("n2", "removexattr", "/c/d/g", "user.k")
        await call("n2", "unlink", "/c/d/g")
        await call("n2", "unlink", "/a/l")
        await call("n2", "rmdir", "/a/b")
        assert not n2.has("/c/d/g") and not n2.has("/a/b")
        with pytest.raises(OSError) as info:
            await call("n2", "rmdir", "/c")
        assert info.value.errno == errno.ENOTEMPTY
        statfs = await call("n2", "statfs")
        assert len(statfs) == 9


@trio_test
async def test_non_utf8_names_can_be_listed_and_opened_from_a_peer(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        raw = b"caf\xe9-latin1.txt"  # not UTF-8
        os.makedirs(cluster["n3"].path("/enc"))
        with open(os.path.join(os.fsencode(cluster["n3"].path("/enc")), raw), "wb") as f:
            f.write(b"bytes named in latin-1")
        listing = await cluster["n1"].pool.call("n3", "listdir", "/enc")
        [(name, _, _)] = listing
        assert os.fsencode(name) == raw
        handle, _ = await cluster["n1"].pool.call("n3", "open", "/enc/" + name, os.O_RDONLY)
        assert await cluster["n1"].pool.call("n3", "read", handle, 0, 100) == b"bytes named in latin-1"
