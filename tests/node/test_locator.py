"""GMount's locality-aware search (`lookup = "flood"`, whatever GMOUNT_TEST_LOOKUP says) over four
real nodes: nearest first, caches, singleflight, dead peers."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import trio

from gmountpy._trio import open_nursery
from gmountpy.node.locator import FloodLocator, Location, LocatorStatistics
from gmountpy.protocol.attr import Attr

from .._trio import elapse_until, trio_test
from .harness import Cluster, open_cluster


def nodes_of(locations: list[Location]) -> list[str]:
    return [loc.node for loc in locations]


def remote_lookups(cluster: Cluster) -> dict[str, int]:
    """How many times each node was asked by another whether it holds a path."""
    return cluster.served("locate")


# ---------------------------------------------------------------- lookup order


@trio_test
async def test_tiers_come_from_the_overlay(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, lookup="flood") as cluster:
        assert cluster["n1"].locator.tiers == [("n1",), ("n2",), ("n3", "n4")]
        assert cluster["n4"].locator.tiers == [("n4",), ("n3",), ("n1", "n2")]
        assert cluster["n3"].locator.order == ["n3", "n4", "n1", "n2"]
        assert cluster["n1"].locator.rank("n3") == 2 and cluster["n1"].locator.rank("zz") == 4


@trio_test
async def test_nearest_holder_wins(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, lookup="flood") as cluster:
        cluster["n2"].put("/near/f", b"on n2")
        cluster["n3"].put("/near/f", b"on n3, longer")
        assert (await cluster["n1"].locator.find("/near/f")).node == "n2"  # type: ignore[union-attr]
        assert (await cluster["n4"].locator.find("/near/f")).node == "n3"  # type: ignore[union-attr]
        assert (await cluster["n2"].locator.find("/near/f")).node == "n2"  # type: ignore[union-attr]
        assert (await cluster["n3"].locator.find("/near/f")).node == "n3"  # type: ignore[union-attr]


@trio_test
async def test_the_reply_carries_the_holders_attributes(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, lookup="flood") as cluster:
        path = cluster["n3"].put("/attrs/f", b"x" * 1234)
        location = await cluster["n1"].locator.find("/attrs/f")
        assert location is not None and location.node == "n3"
        assert isinstance(location.attr, Attr) and location.attr.size == 1234
        assert location.attr.mtime_ns == path.stat().st_mtime_ns


@trio_test
async def test_own_export_first_without_asking_anyone(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, lookup="flood") as cluster:
        for name in cluster.nodes:
            cluster[name].put("/everywhere", name.encode())
        for name in cluster.nodes:
            location = await cluster[name].locator.find("/everywhere")
            assert location is not None and location.node == name
        assert sum(remote_lookups(cluster).values()) == 0


@trio_test
async def test_search_stops_at_the_first_tier_with_a_holder(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, lookup="flood") as cluster:
        cluster["n2"].put("/tier/f")
        cluster["n3"].put("/tier/f")
        assert (await cluster["n1"].locator.find("/tier/f")).node == "n2"  # type: ignore[union-attr]
        assert remote_lookups(cluster) == {"n1": 0, "n2": 1, "n3": 0, "n4": 0}


@trio_test
async def test_within_a_tier_the_overlay_order_breaks_ties(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, lookup="flood") as cluster:
        cluster["n3"].put("/tie/f")
        cluster["n4"].put("/tie/f")
        assert (await cluster["n1"].locator.find("/tie/f")).node == "n3"  # type: ignore[union-attr]
        # the whole remote site is asked at once
        assert remote_lookups(cluster) == {"n1": 0, "n2": 1, "n3": 1, "n4": 1}


@trio_test
async def test_find_all_lists_every_holder_nearest_first(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, lookup="flood") as cluster:
        for name, size in (("n4", 4), ("n1", 1), ("n3", 3)):
            cluster[name].put("/all/f", b"x" * size)
        found = await cluster["n2"].locator.find_all("/all/f")
        assert nodes_of(found) == ["n1", "n3", "n4"]
        assert [loc.attr.size for loc in found] == [1, 3, 4]
        assert nodes_of(await cluster["n3"].locator.find_all("/all/f")) == ["n3", "n4", "n1"]
        assert await cluster["n2"].locator.find_all("/all/missing") == []
        # an empty answer is remembered as a negative
        cluster.reset_counts()
        assert await cluster["n2"].locator.find("/all/missing") is None
        assert sum(remote_lookups(cluster).values()) == 0


@trio_test
async def test_directories_are_found_like_files(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, lookup="flood") as cluster:
        cluster["n4"].mkdir("/only/on/n4")
        location = await cluster["n1"].locator.find("/only/on")
        assert location is not None and location.node == "n4" and location.attr.is_dir
        # a path below a file is simply absent (ENOTDIR on the holder is a 'no')
        cluster["n2"].put("/plain")
        assert await cluster["n1"].locator.find("/plain/below") is None


# ---------------------------------------------------------------- caches


@trio_test(frozen_clock=True)
async def test_negative_cache_until_its_ttl_expires(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, lookup="flood", ttl=1.0, negative_ttl=1.0) as cluster:
        locator = cluster["n1"].locator
        assert await locator.find("/later") is None
        cached_at = trio.current_time()
        assert remote_lookups(cluster) == {"n1": 0, "n2": 1, "n3": 1, "n4": 1}
        cluster["n3"].put("/later", b"arrived")
        assert await locator.find("/later") is None  # still the cached negative
        await elapse_until(cached_at + 1.0 - 0.001)
        assert await locator.find("/later") is None  # ... until the very end of negative_ttl
        assert remote_lookups(cluster) == {"n1": 0, "n2": 1, "n3": 1, "n4": 1}
        stats = locator.statistics()
        assert (stats.misses, stats.negative_hits, stats.remote_queries) == (1, 2, 3)
        await elapse_until(cached_at + 1.0)  # exactly negative_ttl after the search
        location = await locator.find("/later")
        assert location is not None and location.node == "n3"


@trio_test(frozen_clock=True)
async def test_positive_cache_until_its_ttl_expires(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, lookup="flood", ttl=1.0, negative_ttl=1.0) as cluster:
        locator = cluster["n1"].locator
        cluster["n2"].put("/moving", b"a")
        assert (await locator.find("/moving")).node == "n2"  # type: ignore[union-attr]
        cached_at = trio.current_time()
        cluster["n2"].path("/moving").unlink()
        cluster["n4"].put("/moving", b"b")
        assert (await locator.find("/moving")).node == "n2"  # type: ignore[union-attr]
        assert locator.statistics().hits == 1
        await elapse_until(cached_at + 1.0 - 0.001)
        assert (await locator.find("/moving")).node == "n2"  # type: ignore[union-attr]
        await elapse_until(cached_at + 1.0)  # exactly ttl after the search
        assert (await locator.find("/moving")).node == "n4"  # type: ignore[union-attr]
        assert locator.statistics().cached == 1


@trio_test
async def test_zero_ttls_disable_caching(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, lookup="flood", ttl=0, negative_ttl=0) as cluster:
        locator = cluster["n1"].locator
        assert await locator.find("/z") is None
        cluster["n2"].put("/z")
        assert (await locator.find("/z")).node == "n2"  # type: ignore[union-attr]
        cluster["n2"].path("/z").unlink()
        assert await locator.find("/z") is None
        assert locator.statistics().hits == locator.statistics().negative_hits == 0


@trio_test
async def test_caches_are_bounded(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, lookup="flood") as cluster:
        locator = FloodLocator(cluster["n1"].pool, cluster["n1"].locator.tiers, max_entries=3)
        for i in range(6):
            cluster["n1"].put(f"/many/{i}")
            assert await locator.find(f"/many/{i}") is not None
            assert await locator.find(f"/none/{i}") is None
        assert len(locator._positive) == 3 and len(locator._negative) == 3
        assert list(locator._positive) == ["/many/3", "/many/4", "/many/5"]


@trio_test(frozen_clock=True)
async def test_expired_answers_leave_the_caches(tmp_path: Path) -> None:
    """A cache holds what its TTL covers, not max_entries of dead answers (a directory create or
    rename scans it whole)."""
    async with open_cluster(tmp_path, lookup="flood", ttl=1.0, negative_ttl=1.0) as cluster:
        locator = cluster["n1"].locator
        assert isinstance(locator, FloodLocator)
        for i in range(5):
            cluster["n2"].put(f"/old/{i}")
            assert await locator.find(f"/old/{i}") is not None
            assert await locator.find(f"/gone/{i}") is None
        assert (len(locator._positive), len(locator._negative)) == (5, 5)
        await elapse_until(trio.current_time() + 1.0)  # every answer above has expired
        cluster["n2"].put("/new/f")
        assert await locator.find("/new/f") is not None
        assert await locator.find("/new/none") is None
        assert list(locator._positive) == ["/new/f"] and list(locator._negative) == ["/new/none"]
        assert locator.statistics().cached == 1


# ---------------------------------------------------------------- singleflight


@trio_test
async def test_concurrent_finds_of_a_missing_path_ask_each_node_once(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, lookup="flood") as cluster:
        locator = cluster["n1"].locator
        results: list[Location | None] = []

        async def find() -> None:
            results.append(await locator.find("/nobody/has/this"))

        async with open_nursery() as nursery:
            for _ in range(25):
                nursery.start_soon(find)
        assert results == [None] * 25
        assert remote_lookups(cluster) == {"n1": 0, "n2": 1, "n3": 1, "n4": 1}
        stats = locator.statistics()
        assert (stats.misses, stats.remote_queries) == (1, 3)


@trio_test
async def test_concurrent_finds_of_a_far_file_share_one_search(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, lookup="flood") as cluster:
        cluster["n4"].put("/far")
        cluster["n3"].delay["locate"] = 0.1  # keep the search in flight while the others arrive
        locator = cluster["n1"].locator
        results: list[Location | None] = []

        async def find() -> None:
            results.append(await locator.find("/far"))

        async with open_nursery() as nursery:
            for _ in range(10):
                nursery.start_soon(find)
        assert {loc.node for loc in results if loc is not None} == {"n4"} and len(results) == 10
        assert remote_lookups(cluster) == {"n1": 0, "n2": 1, "n3": 1, "n4": 1}


@trio_test
async def test_a_cancelled_search_does_not_answer_its_followers_with_not_found(tmp_path: Path) -> None:
    """The task that leads a shared search may be cancelled (an interrupted `ls`);
    the tasks waiting on it must not conclude that the file does not exist."""
    async with open_cluster(tmp_path, lookup="flood") as cluster:
        cluster["n3"].put("/shared", b"here")
        cluster["n3"].delay["locate"] = 0.2
        locator = cluster["n1"].locator
        followers: list[Location | None] = []

        async def leader(task_status: trio.TaskStatus[trio.CancelScope] = trio.TASK_STATUS_IGNORED) -> None:
            with trio.CancelScope() as scope:
                task_status.started(scope)
                await locator.find("/shared")

        async def follower() -> None:
            followers.append(await locator.find("/shared"))

        async with open_nursery() as nursery:
            scope = await nursery.start(leader)
            await trio.sleep(0.05)
            nursery.start_soon(follower)
            await trio.sleep(0.05)
            scope.cancel()
        assert len(followers) == 1 and followers[0] is not None and followers[0].node == "n3"
        # and no negative was cached from the cancelled search
        assert "/shared" not in locator._negative


# ---------------------------------------------------------------- unreachable peers


@trio_test
async def test_a_stopped_peer_is_skipped_quickly(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, lookup="flood", retry_after=30) as cluster:
        cluster["n2"].put("/both")
        cluster["n3"].put("/both")
        locator = cluster["n1"].locator
        assert (await locator.find("/both")).node == "n2"  # type: ignore[union-attr]
        cluster.stop("n2")
        await trio.sleep(0.05)
        locator.invalidate("/both")
        with trio.fail_after(1):
            location = await locator.find("/both")
        assert location is not None and location.node == "n3"
        assert cluster["n1"].pool.is_down("n2")
        assert not cluster["n1"].pool.is_down("n3") and not cluster["n1"].pool.is_down("n1")
        with trio.fail_after(1):
            assert nodes_of(await locator.find_all("/both")) == ["n3"]


@trio_test
async def test_a_peer_that_does_not_answer_costs_one_timeout(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, lookup="flood", rpc_timeout=0.3, retry_after=30) as cluster:
        cluster["n3"].put("/slow")
        cluster["n4"].put("/slow")
        cluster["n3"].delay["locate"] = 10
        locator = cluster["n1"].locator
        start = trio.current_time()
        location = await locator.find("/slow")
        assert location is not None and location.node == "n4"
        assert trio.current_time() - start < 2.0  # one rpc_timeout (0.3 s), not n3's 10 s
        assert cluster["n1"].pool.is_down("n3")
        # while it is down nobody waits for it again
        locator.invalidate("/slow")
        assert (await locator.find("/slow")).node == "n4"  # type: ignore[union-attr]
        assert cluster["n3"].served["locate"] == 1


# ---------------------------------------------------------------- being told


def attr_of(size: int) -> Attr:
    return Attr(0o100644, 1, 0, 0, size, 0, 0, 0, 0, 4096, 0, 0, 0)


@trio_test
async def test_note_created_is_served_from_the_cache(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, lookup="flood") as cluster:
        locator = cluster["n1"].locator
        assert await locator.find("/new") is None
        cluster.reset_counts()
        locator.note_created("/new", Location("n1", attr_of(5)))
        assert await locator.find("/new") == Location("n1", attr_of(5))
        assert sum(remote_lookups(cluster).values()) == 0


@trio_test
async def test_note_removed_caches_a_negative(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, lookup="flood") as cluster:
        locator = cluster["n1"].locator
        cluster["n2"].put("/gone")
        assert await locator.find("/gone") is not None
        cluster.reset_counts()
        locator.note_removed("/gone")
        assert await locator.find("/gone") is None
        assert sum(remote_lookups(cluster).values()) == 0


@trio_test
async def test_note_renamed_forgets_both_names_and_for_a_directory_what_is_below(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, lookup="flood") as cluster:
        locator = cluster["n1"].locator
        for path in ("/a", "/a/x", "/a/x/y", "/ab", "/b/old"):
            locator.learn(path, Location("n2", attr_of(1)))
        locator._remember_negative("/b")
        locator._remember_negative("/b/z")
        locator.note_renamed("/a", "/b", is_dir=True)
        assert set(locator._positive) == {"/ab"}
        assert set(locator._negative) == set()
        locator.learn("/f", Location("n2", attr_of(1)))
        locator.learn("/f/not-a-child-of-a-file", Location("n2", attr_of(1)))
        locator._remember_negative("/g")
        locator.note_renamed("/f", "/g", is_dir=False)
        assert set(locator._positive) == {"/ab", "/f/not-a-child-of-a-file"}
        assert set(locator._negative) == set()


@trio_test
async def test_after_note_renamed_the_next_find_asks_again(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, lookup="flood") as cluster:
        locator = cluster["n1"].locator
        cluster["n3"].put("/src")
        assert (await locator.find("/src")).node == "n3"  # type: ignore[union-attr]
        assert await locator.find("/dst") is None
        cluster["n3"].path("/src").rename(cluster["n3"].path("/dst"))
        locator.note_renamed("/src", "/dst", is_dir=False)
        assert await locator.find("/src") is None
        assert (await locator.find("/dst")).node == "n3"  # type: ignore[union-attr]


@trio_test
async def test_learn_overrides_a_negative_and_invalidate_forgets(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, lookup="flood") as cluster:
        locator = cluster["n1"].locator
        assert await locator.find("/l") is None
        locator.learn("/l", Location("n4", attr_of(9)))
        assert (await locator.find("/l")).node == "n4"  # type: ignore[union-attr]
        locator.invalidate("/l")
        assert await locator.find("/l") is None


def test_statistics_are_frozen() -> None:
    stats = LocatorStatistics(1, 2, 3, 4, 5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.hits = 9  # type: ignore[misc]

