"""Writing whole files into a node's export from outside the mount: put_open / write / put_close."""

from __future__ import annotations

import errno
import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from gmountpy.node import export as export_module
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


@trio_test
async def test_a_write_waiting_for_a_disk_thread_never_lands_in_a_file_opened_after_an_abort(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The client sends writes in parallel and aborts on any error: a write still queued for a
    disk thread when the abort closes the put must land in the put's own (discarded) file --
    never in whatever file the next open gets under the same descriptor number."""
    monkeypatch.setattr(export_module, "_nowait_writes", False)  # every write goes to a disk thread, as on ext4
    async with open_cluster(tmp_path) as cluster:
        call = cluster["n1"].pool.call
        cluster["n2"].put("/victim", b"v" * 100)
        handle = await call("n2", "put_open", "/upload", 0o644)
        try:
            limiter = export_module._disk_limiter.get()
        except LookupError:
            limiter = trio.CapacityLimiter(export_module.DISK_THREADS)
            export_module._disk_limiter.set(limiter)
        holders = [object() for _ in range(int(limiter.total_tokens))]
        for holder in holders:  # every disk thread busy: the write waits for one
            await limiter.acquire_on_behalf_of(holder)
        async with trio.open_nursery() as nursery:
            wrote: list[int] = []

            async def write() -> None:
                wrote.append(await call("n2", "write", handle, 0, b"U" * 50))

            nursery.start_soon(write)
            await wait_until(lambda: cluster["n2"].served["write"] == 1)
            await trio.sleep(0.05)
            nursery.start_soon(call, "n2", "put_abort", handle)  # its unlink waits for a disk thread too
            await wait_until(lambda: cluster["n2"].served["put_abort"] == 1)
            await trio.sleep(0.05)
            opened, _ = await call("n2", "open", "/victim", os.O_RDWR)  # opened on the event loop, now
            for holder in holders:
                limiter.release_on_behalf_of(holder)
        assert wrote == [50]
        await call("n2", "close", opened)
        assert cluster["n2"].path("/victim").read_bytes() == b"v" * 100  # untouched
        assert leftovers(cluster["n2"].root) == [] and not cluster["n2"].has("/upload")


async def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    with trio.fail_after(timeout):
        while not condition():
            await trio.sleep(0.005)


@trio_test
async def test_put_opens_closes_and_aborts_in_worker_threads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A slow disk under put_open (create, mkdir -p), put_close (rename) and put_abort (unlink)
    delays only that put: the node keeps answering everyone else meanwhile."""
    slow = 1.0

    def slowly(real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            time.sleep(slow)  # a disk that takes its time (blocks whichever thread calls it)
            return real(*args, **kwargs)
        return call

    async with open_cluster(tmp_path) as cluster:
        call = cluster["n1"].pool.call
        node = cluster["n3"].export
        monkeypatch.setattr(node, "create", slowly(node.create))
        monkeypatch.setattr(node, "rename", slowly(node.rename))
        monkeypatch.setattr(node, "unlink", slowly(node.unlink))

        async def pings_while(op: str, *args: Any) -> float:
            """The slowest of the pings answered by n3 while `op` runs there."""
            slowest = 0.0
            async with trio.open_nursery() as nursery:
                result: list[Any] = []

                async def run() -> None:
                    result.append(await call("n3", op, *args))
                    nursery.cancel_scope.cancel()

                nursery.start_soon(run)
                await wait_until(lambda: cluster["n3"].served[op] >= 1)
                while True:
                    started = trio.current_time()
                    await call("n3", "ping")
                    slowest = max(slowest, trio.current_time() - started)
                    await trio.sleep(0.05)
            cluster["n3"].served.clear()
            pinged.append(slowest)
            return result[0] if result else None

        pinged: list[float] = []
        handle = await pings_while("put_open", "/deep/new/f", 0o644)
        await call("n3", "write", handle, 0, b"data")
        await pings_while("put_close", handle, 4, hashlib.sha256(b"data").hexdigest())
        assert cluster["n3"].path("/deep/new/f").read_bytes() == b"data"
        handle = await pings_while("put_open", "/deep/other", 0o644)
        await pings_while("put_abort", handle)
        assert not cluster["n3"].has("/deep/other") and leftovers(cluster["n3"].root) == []
        assert max(pinged) < slow / 2, pinged


@trio_test
async def test_a_finished_put_is_durable_file_directory_and_the_directories_made_for_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """put_close answers only once the file's data, its name in its directory and the names of
    the directories put_open made are on disk (fsync of the file and of each parent)."""
    synced: list[tuple[int, int]] = []  # (st_dev, st_ino) of every descriptor fsynced
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        st = os.fstat(fd)
        synced.append((st.st_dev, st.st_ino))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    async with open_cluster(tmp_path) as cluster:
        call = cluster["n1"].pool.call
        cluster["n4"].mkdir("/old")
        handle = await call("n4", "put_open", "/old/made/also/f.bin", 0o644)
        await call("n4", "write", handle, 0, b"durable")
        assert synced == []
        await call("n4", "put_close", handle, 7, hashlib.sha256(b"durable").hexdigest())
        root = cluster["n4"].root

        def key(path: Path) -> tuple[int, int]:
            st = path.stat()
            return st.st_dev, st.st_ino

        wanted = [root / "old/made/also/f.bin", root / "old/made/also", root / "old/made", root / "old"]
        assert [key(p) for p in wanted if key(p) not in synced] == [], (wanted, synced)


@trio_test
async def test_put_takes_names_up_to_255_bytes(tmp_path: Path) -> None:
    """The temporary beside a long name is cut to fit NAME_MAX: any name the disk takes, a put takes."""
    async with open_cluster(tmp_path) as cluster:
        call = cluster["n1"].pool.call
        for name in ("a" * 255, "é" * 127 + "x", "b" * 234, "c" * 235):
            assert len(name.encode()) <= 255
            handle = await call("n2", "put_open", f"/long/{name}", 0o644)
            await call("n2", "write", handle, 0, name.encode())
            await call("n2", "put_close", handle, len(name.encode()), hashlib.sha256(name.encode()).hexdigest())
            assert cluster["n2"].path(f"/long/{name}").read_bytes() == name.encode()
        assert leftovers(cluster["n2"].root) == []
