"""The peer pool: one connection per peer, the local node without a socket, dead peers marked down."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import trio
import trio.testing

from gmountpy._trio import open_nursery
from gmountpy.errors import PeerUnavailable
from gmountpy.node.peers import PeerPool

from .._trio import elapse_until, trio_test
from .harness import open_cluster


@trio_test
async def test_a_call_to_itself_needs_no_socket(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        info = await cluster["n1"].pool.call("n1", "ping")
        assert info["node"] == "n1" and info["site"] == "tsukuba"
        assert sum(node.served["ping"] for node in cluster.nodes.values()) == 0
        assert cluster["n1"].pool.names == ["n1", "n2", "n3", "n4"]


@trio_test
async def test_calls_to_a_peer_share_one_connection(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        pool = cluster["n1"].pool
        async with open_nursery() as nursery:
            for _ in range(20):  # all before the first connection is up: they wait for it
                nursery.start_soon(pool.call, "n3", "ping")
        assert (await pool.call("n3", "ping"))["node"] == "n3"
        assert cluster["n3"].served["ping"] == 21
        assert len(cluster["n3"].sessions) == 1


@trio_test
async def test_unknown_node(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        with pytest.raises(PeerUnavailable, match="not in this node's peer table") as info:
            await cluster["n1"].pool.call("n9", "ping")
        assert info.value.errno == errno.EHOSTUNREACH


@trio_test(frozen_clock=True)
async def test_a_stopped_peer_is_marked_down_and_retried_after_a_while(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, retry_after=2.0) as cluster:
        pool = cluster["n1"].pool
        assert (await pool.call("n2", "ping"))["node"] == "n2"
        cluster.stop("n2")
        await trio.testing.wait_all_tasks_blocked()  # n2's listener and connections are closed
        with pytest.raises(PeerUnavailable):
            await pool.call("n2", "ping")
        marked_at = trio.current_time()
        assert pool.is_down("n2")
        with pytest.raises(PeerUnavailable, match="down"):  # refused without a new attempt
            await pool.call("n2", "ping")
        await elapse_until(marked_at + 2.0 - 0.001)
        assert pool.is_down("n2")  # for all of retry_after ...
        with pytest.raises(PeerUnavailable, match="down"):
            await pool.call("n2", "ping")
        await elapse_until(marked_at + 2.0)  # ... and not a moment longer
        assert not pool.is_down("n2")
        with pytest.raises(PeerUnavailable, match="cannot connect"):  # tried again: still refused
            await pool.call("n2", "ping")
        assert pool.is_down("n2")


@trio_test
async def test_set_peers_with_a_new_address_brings_a_restarted_peer_back_at_once(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, retry_after=60) as cluster:
        pool = cluster["n1"].pool
        cluster.stop("n2")
        await trio.sleep(0.05)
        with pytest.raises(PeerUnavailable):
            await pool.call("n2", "ping")
        assert pool.is_down("n2")
        await cluster.restart("n2")
        pool.set_peers(cluster.addresses())
        assert not pool.is_down("n2")
        assert (await pool.call("n2", "ping"))["node"] == "n2"


@trio_test
async def test_a_peer_with_another_secret_is_refused(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        stranger = PeerPool("n1", cluster["n1"].service, b"some other cluster's secret.....", cluster.nursery,
                            connect_timeout=1.0)
        stranger.set_peers(cluster.addresses())
        with pytest.raises(PeerUnavailable) as info:
            await stranger.call("n2", "ping")
        assert info.value.errno == errno.EACCES
        assert stranger.is_down("n2")
        assert cluster["n2"].served["ping"] == 0
        await stranger.aclose()


@trio_test
async def test_a_timed_out_call_is_etimedout(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, rpc_timeout=0.2) as cluster:
        cluster["n4"].delay["ping"] = 5
        with trio.fail_after(1):
            with pytest.raises(PeerUnavailable) as info:
                await cluster["n1"].pool.call("n4", "ping")
        assert info.value.errno == errno.ETIMEDOUT
        # a longer timeout may be asked for one call
        cluster["n4"].delay["ping"] = 0.3
        cluster["n1"].pool.set_peers(cluster.addresses())  # clears the down mark
        assert (await cluster["n1"].pool.call("n4", "ping", timeout=2))["node"] == "n4"



@trio_test
async def test_a_cancelled_call_neither_marks_the_peer_down_nor_closes_its_connection(tmp_path: Path) -> None:
    """Closing a file cancels its read-ahead in flight: the holder stays up for everyone else."""
    async with open_cluster(tmp_path) as cluster:
        pool = cluster["n1"].pool
        assert (await pool.call("n2", "ping"))["node"] == "n2"
        cluster["n2"].delay["ping"] = 0.5
        for _ in range(10):
            with trio.move_on_after(0.02):
                await pool.call("n2", "ping")
        async with open_nursery() as nursery:  # and many at once, cancelled together
            for _ in range(50):
                nursery.start_soon(pool.call, "n2", "ping")
            await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
        del cluster["n2"].delay["ping"]
        assert not pool.is_down("n2")
        assert (await pool.call("n2", "ping"))["node"] == "n2"
        assert len(cluster["n2"].sessions) == 1  # the one connection, never redone


@trio_test
async def test_a_slow_request_to_a_peer_that_answers_others_does_not_mark_it_down(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, rpc_timeout=0.3) as cluster:
        pool = cluster["n1"].pool
        cluster["n3"].delay["statfs"] = 2  # one slow disk call on n3; n3 answers everything else

        async def others() -> None:
            for _ in range(10):
                assert (await pool.call("n3", "ping"))["node"] == "n3"
                await trio.sleep(0.05)

        async with open_nursery() as nursery:
            nursery.start_soon(others)
            with pytest.raises(PeerUnavailable) as info:
                await pool.call("n3", "statfs", "/")
        assert info.value.errno == errno.ETIMEDOUT
        assert not pool.is_down("n3")
        assert (await pool.call("n3", "ping"))["node"] == "n3"
