"""Limits per connection and per node: exceeding each fails clearly, and the node keeps serving."""

from __future__ import annotations

import errno
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import trio

from gmountpy._trio import open_nursery
from gmountpy.cluster.config import SpecError, Tuning, parse_spec
from gmountpy.node import readahead
from gmountpy.node.export import Export
from gmountpy.node.readahead import BLOCK, MemoryBudget, ReadAhead
from gmountpy.node.service import NodeService
from gmountpy.protocol import messages as msg
from gmountpy.protocol import rpc

from .._trio import trio_test

SECRET = b"limits test secret, 32 bytes ..."
SMALL = replace(Tuning(), handles_per_connection=3, handles_per_node=5, listings_per_connection=2,
                listings_per_node=3, requests_per_connection=4, requests_per_node=6)


@dataclass(frozen=True)
class Wait(msg.Request[int]):
    """A test's operation: answers `value` once the test lets it."""

    op = "wait"
    value: int


@asynccontextmanager
async def serving(root: Path, tuning: Tuning = SMALL, slow: trio.Event | None = None
                  ) -> AsyncIterator[tuple[trio.Nursery, int, NodeService]]:
    """A real NodeService on `root` behind a real RPC server with these limits; `slow` ops wait for the event."""
    service = NodeService(Export(str(root)), {"node": "lim"}, tuning=tuning)
    if slow is not None:
        async def wait(request: Wait) -> int:
            await slow.wait()
            return request.value
        service = NodeService(Export(str(root)), {"node": "lim"}, {Wait: wait}, tuning=tuning)
    limits = rpc.RequestLimits(tuning.requests_per_connection, tuning.requests_per_node, "lim")
    async with open_nursery() as nursery:
        listeners = await nursery.start(lambda task_status: rpc.serve(
            "127.0.0.1", 0, service.dispatch, secret=SECRET, name="lim", limits=limits, task_status=task_status))
        yield nursery, listeners[0].socket.getsockname()[1], service
        nursery.cancel_scope.cancel()


async def connect(nursery: trio.Nursery, port: int) -> rpc.RpcClient:
    return await rpc.connect(nursery, "127.0.0.1", port, secret=SECRET, name="t", peer="lim", timeout=5)


def make_files(root: Path, count: int) -> None:
    for i in range(count):
        (root / f"f{i}").write_bytes(b"x" * 10)


@trio_test
async def test_open_handles_per_connection_and_per_node(tmp_path: Path) -> None:
    make_files(tmp_path, 8)
    async with serving(tmp_path) as (nursery, port, service):
        first, second = await connect(nursery, port), await connect(nursery, port)
        handles = [(await first.call("open", f"/f{i}", os.O_RDONLY))[0] for i in range(3)]
        with pytest.raises(OSError, match="tuning.handles_per_connection") as info:
            await first.call("open", "/f3", os.O_RDONLY)
        assert info.value.errno == errno.EMFILE and "node lim" in str(info.value)
        # the other connection still may open, up to the node's limit (5 over both)
        for i in range(2):
            await second.call("open", f"/f{4 + i}", os.O_RDONLY)
        with pytest.raises(OSError, match="tuning.handles_per_node") as info:
            await second.call("open", "/f6", os.O_RDONLY)
        assert info.value.errno == errno.EMFILE
        assert service.usage.handles == 5
        # closing frees room; the refused opens leaked nothing
        await first.call("close", handles[0])
        assert await second.call("read", (await second.call("open", "/f6", os.O_RDONLY))[0], 0, 10) == b"x" * 10
        # a connection that goes away gives its handles back
        await first.aclose()
        with trio.fail_after(5):
            while service.usage.handles != 3:
                await trio.sleep(0.01)
        assert await second.call("ping")


@trio_test
async def test_listing_snapshots_per_connection_and_per_node(tmp_path: Path) -> None:
    make_files(tmp_path, 3)
    async with serving(tmp_path) as (nursery, port, service):
        first, second = await connect(nursery, port), await connect(nursery, port)
        snapshots = [(await first.call("opendir", "/"))[0] for _ in range(2)]
        with pytest.raises(OSError, match="tuning.listings_per_connection") as info:
            await first.call("opendir", "/")
        assert info.value.errno == errno.EMFILE
        await second.call("opendir", "/")
        with pytest.raises(OSError, match="tuning.listings_per_node") as info:
            await second.call("opendir", "/")
        assert info.value.errno == errno.EMFILE
        await first.call("closedir", snapshots[0])
        await first.call("closedir", snapshots[0])  # twice is harmless and frees nothing more
        assert service.usage.listings == 2
        handle, count = await second.call("opendir", "/")
        assert count == 3 and len(await second.call("readdir", handle, 0, 10)) == 3


@trio_test
async def test_requests_per_connection_wait_and_per_node_get_eagain(tmp_path: Path) -> None:
    release = trio.Event()
    async with serving(tmp_path, slow=release) as (nursery, port, _):
        first, second = await connect(nursery, port), await connect(nursery, port)
        outcomes: list[Any] = []

        async def call(client: rpc.RpcClient, i: int) -> None:
            try:
                outcomes.append(await client.call("wait", i, timeout=10))
            except OSError as exc:
                outcomes.append(exc)

        async with open_nursery() as calls:
            for i in range(6):  # 4 run, 2 wait unread behind them (back-pressure on that connection)
                calls.start_soon(call, first, i)
            await trio.sleep(0.3)
            assert outcomes == []
            for i in range(4):  # the node runs 4 of 6: two more fit, the other two are refused at once
                calls.start_soon(call, second, 10 + i)
            with trio.fail_after(5):
                while len(outcomes) < 2:
                    await trio.sleep(0.01)
            refused = [o for o in outcomes if isinstance(o, OSError)]
            assert len(refused) == 2 and all(o.errno == errno.EAGAIN for o in refused)
            assert "tuning.requests_per_node" in str(refused[0]) and "node lim is busy" in str(refused[0])
            release.set()
        served = sorted(o for o in outcomes if not isinstance(o, OSError))
        assert len(served) == 8 and set(range(6)) <= set(served)
        assert await first.call("ping") and await second.call("ping")


@trio_test
async def test_read_ahead_stays_within_its_memory_budget(tmp_path: Path) -> None:
    data = os.urandom(12 * BLOCK + 1234)
    fetched: list[tuple[int, int]] = []

    async def fetch(offset: int, size: int) -> bytes:
        fetched.append((offset, size))
        await trio.sleep(0.001)
        return data[offset:offset + size]

    budget = MemoryBudget(3 * BLOCK)
    peak = 0
    async with open_nursery() as nursery:
        readers = [ReadAhead(fetch, nursery, budget) for _ in range(3)]
        results = [bytearray() for _ in readers]
        for offset in range(0, len(data), 128 * 1024):  # three sequential readers side by side
            for reader, result in zip(readers, results, strict=True):
                result += await reader.read(offset, 128 * 1024)
                peak = max(peak, budget.used)
        assert all(bytes(r) == data for r in results)
        assert peak <= budget.limit and budget.refused > 0
        for reader in readers:
            reader.close()
        await trio.sleep(0.05)  # cancelled prefetches hand their blocks back
        assert budget.used == 0


def test_the_node_budget_is_what_readers_use_by_default() -> None:
    async def main() -> None:
        async def fetch(offset: int, size: int) -> bytes:
            return b""

        async with open_nursery() as nursery:
            assert ReadAhead(fetch, nursery)._budget is readahead.NODE_BUDGET

    trio.run(main)


def test_limits_are_tuning_keys_checked_at_load() -> None:
    base = {"name": "c", "defaults": {"export": "/e/{node}", "mountpoint": "/m/{node}"},
            "sites": {"s": {"nodes": ["n1"]}}}
    spec = parse_spec({**base, "tuning": {"handles_per_connection": 10, "readahead_mib": 0}})
    assert spec.tuning.handles_per_connection == 10 and spec.tuning.readahead_mib == 0
    assert spec.tuning.requests_per_node == Tuning().requests_per_node
    for key, value, message in [("handles_per_node", 0, "must be >= 1"),
                                ("listings_per_node", 2.5, "must be an integer"),
                                ("readahead_mib", -1, "must be >= 0"),
                                ("requests_per_connection", True, "must be an integer")]:
        with pytest.raises(SpecError, match=f"tuning.{key}: {message}"):
            parse_spec({**base, "tuning": {key: value}})


def test_a_state_file_without_the_limits_still_loads() -> None:
    from gmountpy.cluster.config import ClusterSpec

    spec = parse_spec({"name": "c", "defaults": {"export": "/e/{node}", "mountpoint": "/m/{node}"},
                       "sites": {"s": {"nodes": ["n1"]}}})
    data = spec.to_dict()
    for key in ("handles_per_node", "readahead_mib"):
        del data["tuning"][key]
    del data["nodes"]["n1"]["create_export"]
    assert ClusterSpec.from_dict(data) == spec



@trio_test
async def test_a_burst_in_one_packet_cannot_slip_past_the_node_limit(tmp_path: Path) -> None:
    from ..test_rpc import raw_handshake

    release = trio.Event()
    tuning = replace(SMALL, requests_per_connection=10)
    async with serving(tmp_path, tuning, slow=release) as (_, port, _):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        decoder, mac = await raw_handshake(stream, SECRET)
        await stream.send_all(b"".join(mac.seal(rpc.wire.encode_request(i, "wait", [i])) for i in range(10)))
        received: list[Any] = []
        while len(received) < 4:  # the four beyond the node's six come back at once
            received += decoder.feed(await stream.receive_some(65536))
        assert len(received) == 4 and all(m.errno == errno.EAGAIN for m in received)
        release.set()
        while len(received) < 10:
            received += decoder.feed(await stream.receive_some(65536))
        assert sorted(m.id for m in received[4:]) == list(range(6))
        await stream.aclose()
