"""Writing whole files into a node's export from outside the mount: put_open / write / put_close."""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path

import pytest
import trio

from gmountpy.node.peers import PeerPool
from gmountpy.node.service import MAX_IO
from gmountpy.protocol.attr import Attr

from .._trio import trio_test
from .harness import SECRET, open_cluster


def leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.rglob("*gmount-put*"))


@trio_test
async def test_put_writes_a_verified_file_renamed_into_place(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        call = cluster["n1"].pool.call
        data = os.urandom(MAX_IO + 12345)
        handle = await call("n3", "put_open", "/new/dir/f.bin", 0o640)
        assert not cluster["n3"].path("/new/dir/f.bin").exists()  # nothing visible under the name yet
        await call("n3", "write", handle, MAX_IO, data[MAX_IO:])   # any order
        await call("n3", "write", handle, 0, data[:MAX_IO])
        attr = Attr.from_wire(await call("n3", "put_close", handle, len(data), hashlib.sha256(data).hexdigest()))
        written = cluster["n3"].path("/new/dir/f.bin")
        assert written.read_bytes() == data and attr.size == len(data) and attr.mode & 0o777 == 0o640
        assert leftovers(cluster["n3"].root) == []
        # the writer's node sees it at once (its locator was told), no stale "no such file"
        found = await cluster["n3"].locator.find("/new/dir/f.bin")
        assert found is not None and found.node == "n3"


@trio_test
async def test_put_replaces_atomically_and_refuses_a_bad_checksum(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        call = cluster["n1"].pool.call
        cluster["n2"].put("/f", b"old contents")
        handle = await call("n2", "put_open", "/f", 0o644)
        await call("n2", "write", handle, 0, b"new")
        with pytest.raises(OSError) as info:
            await call("n2", "put_close", handle, 3, hashlib.sha256(b"other").hexdigest())
        assert info.value.errno == errno.EIO and "/f" in str(info.value) and "write it again" in str(info.value)
        assert cluster["n2"].path("/f").read_bytes() == b"old contents"  # untouched
        assert leftovers(cluster["n2"].root) == []
        handle = await call("n2", "put_open", "/f", 0o644)
        await call("n2", "write", handle, 0, b"new")
        await call("n2", "put_close", handle, 3, hashlib.sha256(b"new").hexdigest())
        assert cluster["n2"].path("/f").read_bytes() == b"new"


@trio_test
async def test_abort_and_a_dropped_connection_leave_nothing(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        call = cluster["n1"].pool.call
        handle = await call("n4", "put_open", "/gone", 0o644)
        await call("n4", "write", handle, 0, b"partial")
        await call("n4", "put_abort", handle)
        assert leftovers(cluster["n4"].root) == [] and not cluster["n4"].path("/gone").exists()
        with pytest.raises(OSError) as info:
            await call("n4", "put_close", handle, 0, "")
        assert info.value.errno == errno.EBADF

        pool = PeerPool("n1", cluster["n1"].service, SECRET, cluster.nursery)
        pool.set_peers(cluster.addresses())
        handle = await pool.call("n4", "put_open", "/dropped", 0o644)
        await pool.call("n4", "write", handle, 0, b"half")
        assert len(leftovers(cluster["n4"].root)) == 1
        await pool.aclose()
        with trio.fail_after(2):
            while leftovers(cluster["n4"].root):
                await trio.sleep(0.01)
        assert not cluster["n4"].path("/dropped").exists()


@trio_test
async def test_put_refuses_paths_outside_the_export(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        call = cluster["n1"].pool.call
        for bad in ("/../escape", "relative", "/a/../b"):
            with pytest.raises(OSError) as info:
                await call("n2", "put_open", bad, 0o644)
            assert info.value.errno == errno.EINVAL
