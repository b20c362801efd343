"""Closing a file settles its writes: once close(2) returned without error, every write made
through the descriptor has landed at the holder or never will (docs/failures.md).

A write whose reply does not come within rpc_timeout may still be running on the holder (a
slow disk, a slow network). close(2) then asks the holder to settle the handle: the holder
retires the handle's number, waits for the calls running on it, and refuses (EBADF) any call
on the old number that had not begun. The holder's side is tested here through the RPC layer
(tests/node/harness.py), the whole path through real mounts with a holder whose disk is slow
(tests/node/slowfs.py).
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio

from gmountpy.node import export as export_module
from gmountpy.protocol import messages as msg
from gmountpy.protocol.client import call, run_sync

from .._trio import trio_test
from ..conftest import LocalCluster, fuse_problem, local_cluster, require
from . import slowfs
from .harness import open_cluster

RPC_TIMEOUT = 1.0


async def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    with trio.fail_after(timeout):
        while not condition():
            await trio.sleep(0.005)


def _disk_threads() -> trio.CapacityLimiter:
    try:
        return export_module._disk_limiter.get()
    except LookupError:
        limiter = trio.CapacityLimiter(export_module.DISK_THREADS)
        export_module._disk_limiter.set(limiter)
        return limiter


# --------------------------------------------------------------------------- the holder's side


@trio_test
async def test_settle_answers_only_after_a_write_running_on_the_handle_returned(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(export_module, "_nowait_writes", False)  # every write goes to a disk thread, as on ext4
    async with open_cluster(tmp_path) as cluster:
        cluster["n2"].put("/f")
        connection = await cluster["n1"].pool.connection("n2")
        handle = (await connection.call("open", "/f", os.O_WRONLY))[0]
        limiter = _disk_threads()
        holders = [object() for _ in range(int(limiter.total_tokens))]
        for holder in holders:  # every disk thread busy: the write waits for one, begun but not done
            await limiter.acquire_on_behalf_of(holder)
        order: list[str] = []
        late: list[OSError] = []
        settled: list[int] = []
        async with trio.open_nursery() as nursery:
            async def write() -> None:
                assert await connection.call("write", handle, 0, b"W" * 1000) == 1000
                order.append("write")

            async def settle() -> None:
                settled.append(await connection.call("settle", handle))
                order.append("settle")

            async def write_after_the_settle() -> None:
                with pytest.raises(OSError) as info:
                    await connection.call("write", handle, 1000, b"L" * 10)
                late.append(info.value)

            nursery.start_soon(write)
            await wait_until(lambda: cluster["n2"].served["write"] == 1)
            await trio.sleep(0.05)
            nursery.start_soon(settle)
            await wait_until(lambda: cluster["n2"].served["settle"] == 1)
            nursery.start_soon(write_after_the_settle)  # sent on the retired number: refused
            await wait_until(lambda: bool(late))
            await trio.sleep(0.3)
            assert order == []  # the settle waits for the write still waiting for its disk thread
            for holder in holders:
                limiter.release_on_behalf_of(holder)
        assert order == ["write", "settle"]
        assert late[0].errno == errno.EBADF
        assert cluster["n2"].path("/f").read_bytes() == b"W" * 1000
        renewed = settled[0]
        assert renewed != handle  # the same open file under a new number
        assert await connection.call("write", renewed, 1000, b"N") == 1
        await connection.call("close", renewed)
        assert cluster["n2"].path("/f").read_bytes() == b"W" * 1000 + b"N"
        assert cluster["n2"].service.usage.handles == 0


@trio_test
async def test_a_write_received_before_the_settle_but_not_begun_is_never_carried_out(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        cluster["n2"].put("/f")
        connection = await cluster["n1"].pool.connection("n2")
        handle = (await connection.call("open", "/f", os.O_WRONLY))[0]
        cluster["n2"].delay["write"] = 0.4  # received, then held before the service sees it
        outcome: list[str] = []
        async with trio.open_nursery() as nursery:
            async def write() -> None:
                try:
                    await connection.call("write", handle, 0, b"W" * 1000)
                    outcome.append("written")
                except OSError as exc:
                    outcome.append(errno.errorcode.get(exc.errno or 0, "?"))

            nursery.start_soon(write)
            await wait_until(lambda: cluster["n2"].served["write"] == 1)
            del cluster["n2"].delay["write"]
            renewed = await connection.call("settle", handle)
            assert outcome == []  # the settle answered first: the write had not begun
        assert outcome == ["EBADF"]
        assert cluster["n2"].path("/f").read_bytes() == b""
        await connection.call("close", renewed)


@trio_test
async def test_a_client_handle_survives_a_settle_and_a_call_on_the_old_number_is_sent_again(tmp_path: Path) -> None:
    """The client's handle names the new number after a settle; a write it sent on the old number
    meanwhile was refused (never carried out), so it is sent again and lands once."""
    async with open_cluster(tmp_path) as cluster:
        cluster["n2"].put("/f")
        pool = cluster["n1"].pool
        opened = await pool.ask("n2", msg.Open("/f", os.O_WRONLY))
        cluster["n2"].delay["write"] = 0.3
        async with trio.open_nursery() as nursery:
            wrote: list[int] = []

            async def write() -> None:
                wrote.append(await pool.ask("n2", msg.Write(opened.handle, 0, b"abc")))

            nursery.start_soon(write)
            await wait_until(lambda: cluster["n2"].served["write"] == 1)
            del cluster["n2"].delay["write"]
            assert await pool.ask("n2", msg.Settle(opened.handle)) == opened.handle
        assert wrote == [3] and cluster["n2"].served["write"] == 2
        assert await pool.ask("n2", msg.Write(opened.handle, 3, b"d")) == 1
        await pool.ask("n2", msg.Close(opened.handle))
        assert cluster["n2"].path("/f").read_bytes() == b"abcd"
        assert cluster["n2"].service.usage.handles == 0


# --------------------------------------------------------------------------- through real mounts


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[LocalCluster]:
    require("FUSE", fuse_problem())
    with local_cluster(tmp_path / "c", f"settle-{os.getpid()}-{tmp_path.name[-8:]}", {"here": ["n1", "n2"]}, [],
                       tuning=f"attr_ttl = 0.5\nnegative_ttl = 0.5\nrpc_timeout = {RPC_TIMEOUT}") as cluster:
        yield cluster


@contextmanager
def slow_writes(mountpoint: Path, seconds: float) -> Iterator[Path]:
    """slowfs at `mountpoint` whose writes each take `seconds`; yields its writable file."""
    with slowfs.mounted(mountpoint, 0, 0, seconds):
        yield mountpoint / "slow.out"


def _timed_out_write(path: Path, data: bytes) -> int:
    """Open `path` for writing, write `data` (which must fail: no reply in time); returns the descriptor."""
    fd = os.open(path, os.O_WRONLY)
    started = time.monotonic()
    with pytest.raises(OSError) as info:
        os.write(fd, data)
    assert info.value.errno == errno.EIO, info.value
    assert time.monotonic() - started < RPC_TIMEOUT + 1.0
    return fd


def test_close_after_a_timed_out_write_returns_once_the_write_has_landed(pair: LocalCluster) -> None:
    """The holder's disk takes 1.5 s for the write, the mount gives up after 1 s: the program
    gets EIO. Its close then waits until the write has landed, so the size it reads after the
    close is final: it never changes afterwards."""
    data = os.urandom(65536)
    with slow_writes(pair.export("n2") / "slowdir", 1.5 * RPC_TIMEOUT) as on_disk:
        fd = _timed_out_write(pair.mount("n1") / "slowdir" / "slow.out", data)
        os.close(fd)  # settles: returns only once the write has landed (or never will)
        closed = on_disk.stat().st_size
        time.sleep(2 * RPC_TIMEOUT)  # well past the end of the holder's write
        assert on_disk.stat().st_size == closed
        assert on_disk.read_bytes() in (b"", data)  # all of it or none of it
        assert closed == len(data)  # here: the settle waited for it


def test_close_fails_when_the_timed_out_write_cannot_be_settled(pair: LocalCluster) -> None:
    """The holder's disk takes 4 s: the settle gets no reply within rpc_timeout either, so close
    fails (EIO) -- whether the write landed is unknown -- and n1's log names the node and says so."""
    data = os.urandom(65536)
    with slow_writes(pair.export("n2") / "slowdir", 4 * RPC_TIMEOUT) as on_disk:
        fd = _timed_out_write(pair.mount("n1") / "slowdir" / "slow.out", data)
        with pytest.raises(OSError) as info:
            os.close(fd)
        assert info.value.errno == errno.EIO
        deadline = time.monotonic() + 10
        while on_disk.stat().st_size != len(data) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert on_disk.read_bytes() == data  # it did land later: close said it might
    log = Path(pair.state.nodes["n1"].log).read_text(errors="replace")
    assert "node n2 could not be asked to settle it" in log and "whether that write landed is unknown" in log


def test_a_close_without_a_timed_out_write_sends_nothing_more(pair: LocalCluster) -> None:
    """The fast path: closing a remote file written without trouble adds no request."""
    (pair.export("n2") / "plain.txt").write_bytes(b"")
    pair.rescan("n2")
    path = pair.mount("n1") / "plain.txt"
    with open(path, "r+b") as f:
        f.write(b"x" * 1000)
    counters = run_sync(call, pair.state, "n1", "counters")
    assert counters.get("messages.write", 0) >= 1 and counters.get("messages.settle", 0) == 0
    assert path.read_bytes() == b"x" * 1000


def test_fsync_after_a_timed_out_write_settles_it_first(pair: LocalCluster) -> None:
    """fsync returning covers the write that got no reply: it has landed by then, and stays."""
    data = os.urandom(65536)
    with slow_writes(pair.export("n2") / "slowdir", 1.5 * RPC_TIMEOUT) as on_disk:
        fd = _timed_out_write(pair.mount("n1") / "slowdir" / "slow.out", data)
        try:
            os.fsync(fd)
            assert on_disk.read_bytes() == data
        finally:
            os.close(fd)  # settled already: nothing more to send
    counters = run_sync(call, pair.state, "n1", "counters")
    assert counters.get("messages.settle", 0) == 1
