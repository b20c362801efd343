"""The hand-off contract below FUSE: four real nodes over RPC (tests/node/harness.py).

Caches are long here (60 s), so a "not found" that is wrongly kept shows at once.
The same rules are tested through real mounts in test_handoff.py.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import trio
import trio.testing

from gmountpy.errors import PeerUnavailable
from gmountpy.node.locator import AbsentForNow

from .._trio import elapse, elapse_until, trio_test
from ..conftest import LOOKUPS
from .harness import open_cluster, read_file


@pytest.fixture(autouse=True, params=LOOKUPS)
def _lookup(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test once per locator (a test that names its locator keeps it)."""
    monkeypatch.setenv("GMOUNT_TEST_LOOKUP", request.param)


@trio_test
async def test_handoff_create_tells_every_node_to_forget_not_found(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        for node in ("n1", "n2", "n4"):
            with pytest.raises(FileNotFoundError):
                await cluster[node].namespace.lookup("/d/out")
        handle = await cluster["n3"].namespace.create("/d/out", os.O_WRONLY, 0o644)
        await cluster["n3"].namespace.write(handle, 0, b"made on n3")
        await cluster["n3"].namespace.release(handle)
        for node in ("n1", "n2", "n4"):
            assert (await cluster[node].namespace.lookup("/d")).node == "n3"  # parents too
            assert await read_file(cluster[node].namespace, "/d/out") == b"made on n3"


@trio_test
async def test_handoff_search_racing_a_create_keeps_no_not_found(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        cluster["n4"].delay["locate@n1"] = 0.5  # n1's search is still waiting for n4 ...
        results: list[object] = []

        async def search() -> None:
            results.append(await cluster["n1"].locator.find("/raced"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(search)
            await trio.sleep(0.2)  # ... when n2 (already asked: "not here") creates the name
            handle = await cluster["n2"].namespace.create("/raced", os.O_WRONLY, 0o644)
            await cluster["n2"].namespace.release(handle)
        assert results == [None]  # that search began before the create: "not found" was true then
        del cluster["n4"].delay["locate@n1"]
        assert (await cluster["n1"].namespace.lookup("/raced")).node == "n2"  # but it was not kept


@trio_test
async def test_handoff_create_opens_a_remote_file_instead_of_a_twin(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        ns = cluster["n1"].namespace
        with pytest.raises(FileNotFoundError):
            await ns.lookup("/out")  # cached as absent for 60 s
        cluster["n3"].put("/out", b"old bytes")  # appears behind n1's cache
        with pytest.raises(FileExistsError):
            await ns.create("/out", os.O_WRONLY | os.O_EXCL, 0o644)
        handle = await ns.create("/out", os.O_WRONLY | os.O_TRUNC, 0o644)
        await ns.write(handle, 0, b"new")
        await ns.release(handle)
        assert cluster.holders("/out") == ["n3"]
        assert cluster["n3"].path("/out").read_bytes() == b"new"
        cluster["n4"].mkdir("/dir")
        with pytest.raises(FileExistsError):
            await ns.mkdir("/dir", 0o755)
        with pytest.raises(FileExistsError):
            await ns.symlink("x", "/out")


@trio_test
async def test_handoff_holder_answering_eacces_is_not_absence(tmp_path: Path) -> None:
    # GMount's search asks holders at lookup (`locate`); the index does not: there the holder's
    # error comes at open (test_index: test_holder_answering_eacces_is_that_error_at_open...)
    async with open_cluster(tmp_path, lookup="flood") as cluster:
        cluster["n3"].put("/guarded", b"x")
        cluster["n3"].fail["locate"] = errno.EACCES
        with pytest.raises(PermissionError):
            await cluster["n1"].namespace.lookup("/guarded")
        cluster["n3"].fail["locate"] = errno.EIO
        with pytest.raises(OSError) as info:
            await cluster["n1"].namespace.lookup("/guarded")
        assert info.value.errno == errno.EIO and "n3" in str(info.value)
        del cluster["n3"].fail["locate"]
        assert (await cluster["n1"].namespace.lookup("/guarded")).node == "n3"  # nothing was cached


@trio_test(mock_clock=True)  # at real speed: the timeout is a real request's
async def test_handoff_holder_timing_out_is_eio_and_not_cached(tmp_path: Path) -> None:
    # the search's `locate` times out (flood); under the index see test_holder_down_is_eio_at_open...
    async with open_cluster(tmp_path, lookup="flood", rpc_timeout=0.3, retry_after=0.3) as cluster:
        cluster["n4"].put("/slow", b"x")
        cluster["n4"].delay["locate"] = 5
        with pytest.raises(PeerUnavailable) as info:
            await cluster["n1"].namespace.lookup("/slow")
        assert info.value.errno == errno.ETIMEDOUT  # EIO at the FUSE boundary
        timed_out_at = trio.current_time()
        assert cluster["n1"].pool.is_down("n4")
        del cluster["n4"].delay["locate"]
        await elapse_until(timed_out_at + 0.3)  # retry_after: n4 is asked again
        assert not cluster["n1"].pool.is_down("n4")
        assert (await cluster["n1"].namespace.lookup("/slow")).node == "n4"


@trio_test(frozen_clock=True)
async def test_handoff_dead_known_holder_is_eio_unknown_name_is_uncached_enoent(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, ttl=60.0, retry_after=0.3) as cluster:
        cluster["n3"].put("/known", b"x")
        ns = cluster["n1"].namespace
        assert (await ns.lookup("/known")).node == "n3"
        cluster.stop("n3")
        await trio.testing.wait_all_tasks_blocked()  # n3's listener and connections are closed
        await elapse(60.0)  # the cached location expires (ttl): n1 asks again
        with pytest.raises(PeerUnavailable):
            await ns.lookup("/known")
        with pytest.raises(AbsentForNow):  # ENOENT, but neither daemon nor kernel keeps it
            await ns.lookup("/never-seen")
        cluster["n2"].put("/never-seen", b"y")
        assert (await ns.lookup("/never-seen")).node == "n2"


@trio_test
async def test_handoff_unlink_and_rename_refuse_while_a_node_is_down(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        for node in ("n1", "n3"):
            cluster[node].put("/dup", b"copy")
        cluster["n1"].put("/src", b"new")
        cluster.stop("n3")
        await trio.sleep(0.05)
        ns = cluster["n1"].namespace
        with pytest.raises(PeerUnavailable) as info:
            await ns.unlink("/dup")
        assert "n3" in str(info.value)
        with pytest.raises(PeerUnavailable):
            await ns.rename("/src", "/dup")
        assert cluster.holders("/dup") == ["n1", "n3"] and cluster.holders("/src") == ["n1"]
        assert [loc.node for loc in await ns.where("/dup")] == ["n1"]  # `where` still answers
