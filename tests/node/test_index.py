"""The homed directory index (issue 13): home choice, messages per operation, the hand-off over it.

Three layers of proof:
- unit tests of `Homes` (rendezvous hashing, backup, central) and of `DirectoryIndex`;
- four real nodes over RPC without FUSE (tests/node/harness.py, `lookup="index"`), where
  every request a node serves is counted, so messages per operation are exact;
- a hypothesis state machine: creates, writes, unlinks, renames, mkdir and rmdir from
  random nodes over an in-memory network of IndexLocator + DirectoryIndex instances,
  with lost requests, lost replies and node restarts, checked after every step against
  a model of the union namespace;
- real mounts of a local 4-node cluster with `lookup = "index"` (counters from the daemons).
"""

from __future__ import annotations

import errno
import functools
import itertools
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from gmountpy import Cluster as ApiCluster
from gmountpy import launch
from gmountpy.errors import GmountError, PeerUnavailable
from gmountpy.node import service as service_module
from gmountpy.node.export import Export
from gmountpy.node.index import (
    CLAIM_GRACE,
    LIST_AHEAD_AFTER,
    DirectoryIndex,
    ExportWatcher,
    Homes,
    IndexLocator,
    Owners,
    rendezvous_order,
    split_parent,
)
from gmountpy.node.index import lookups as lookups_module
from gmountpy.node.index.paths import under, under_any
from gmountpy.node.locator import AbsentForNow
from gmountpy.node.namespace import Namespace
from gmountpy.node.service import NodeService
from gmountpy.protocol import messages as msg
from gmountpy.protocol import rpc
from gmountpy.protocol.attr import Attr

from .._trio import elapse, elapse_until, trio_test
from ..conftest import (
    FOUR_NODE_LINKS,
    FOUR_NODES,
    LocalCluster,
    fuse_problem,
    local_cluster,
    require,
    wait_for,
)
from .harness import Cluster, open_cluster, read_file
from .owned_create import create_in_owned

NODES = ("n1", "n2", "n3", "n4")
SITE_OF = {"n1": "tsukuba", "n2": "tsukuba", "n3": "hongo", "n4": "hongo"}


def homed_at(homes: Homes, node: str, prefix: str = "/d") -> str:
    """A directory path whose hashed home is `node` (the root's rule)."""
    for i in range(1000):
        candidate = f"{prefix}{i}"
        if homes.home(candidate) == node:
            return candidate
    raise AssertionError(f"no directory homed at {node}")


def found_at(homes: Homes, node: str, holders: list[str], prefix: str = "/d") -> str:
    """A directory path that, found on `holders`' disks, is homed at `node` (Homes.of_holders)."""
    for i in range(1000):
        candidate = f"{prefix}{i}"
        if homes.of_holders(candidate, holders) == node:
            return candidate
    raise AssertionError(f"no directory on {holders} homed at {node}")


def made_at(homes: Homes, node: str, creator: str, prefix: str = "/d") -> str:
    """A directory path that, made by `creator` through the mount, is homed at `node`."""
    for i in range(1000):
        candidate = f"{prefix}{i}"
        if homes.of_creator(candidate, creator) == node:
            return candidate
    raise AssertionError(f"no directory made by {creator} homed at {node}")


# ------------------------------------------------------------------ home choice


def test_home_is_the_first_of_the_rendezvous_order_and_stable() -> None:
    homes = Homes(NODES, SITE_OF)
    for i in range(200):
        directory = f"/dir{i}"
        assert homes.home(directory) == rendezvous_order(directory, NODES)[0]
        assert homes.home(directory) == Homes(tuple(reversed(NODES)), SITE_OF).home(directory)  # order-free
    counts = Counter(homes.home(f"/dir{i}") for i in range(4000))
    assert set(counts) == set(NODES) and min(counts.values()) > 800  # spread over every node


def test_removing_a_node_moves_only_the_directories_it_was_home_of() -> None:
    before = Homes(NODES, SITE_OF)
    after = Homes(("n1", "n2", "n4"), SITE_OF)
    for i in range(1000):
        directory = f"/x/{i}"
        if before.home(directory) != "n3":
            assert after.home(directory) == before.home(directory)
        else:
            assert after.home(directory) == rendezvous_order(directory, NODES)[1]


def test_backup_is_at_the_home_site_when_there_is_one() -> None:
    homes = Homes(NODES, SITE_OF)
    for i in range(100):
        directory = f"/b{i}"
        home, backup = homes.home(directory), homes.backup(directory)
        assert backup is not None and backup != home and SITE_OF[backup] == SITE_OF[home]
    lonely = Homes(("n1", "n3"), {"n1": "a", "n3": "b"})
    assert lonely.backup("/q") == ({"n1", "n3"} - {lonely.home("/q")}).pop()
    assert Homes(("n1",)).backup("/q") is None


def test_central_puts_every_directory_on_one_node() -> None:
    homes = Homes(NODES, SITE_OF, central="n3")
    assert {homes.home(f"/c{i}") for i in range(50)} == {"n3"}
    with pytest.raises(ValueError, match="`central` must be one of the nodes"):
        Homes(NODES, central="n9")
    with pytest.raises(ValueError, match="`nodes` must name at least one node"):
        Homes(())


def test_a_directory_made_through_a_mount_is_homed_at_its_creator_and_backed_up_at_its_site() -> None:
    homes = Homes(NODES, SITE_OF)
    for i in range(200):
        directory = f"/made/{i}"
        for creator in NODES:
            assert homes.of_creator(directory, creator) == creator
            backup = homes.backup(directory, creator)
            assert backup is not None and backup != creator and SITE_OF[backup] == SITE_OF[creator]
            # found again only on its creator's disk (every record of its home lost): at its site
            assert SITE_OF[homes.of_holders(directory, [creator])] == SITE_OF[creator]
        assert homes.of_holders(directory, list(NODES)) == homes.of_holders(directory, list(reversed(NODES)))
    spread = Counter(homes.of_holders(f"/s{i}", ["n3"]) for i in range(400))
    assert set(spread) == {"n3", "n4"} and min(spread.values()) > 120  # found ones: the site's nodes share them
    assert Homes(NODES, SITE_OF, central="n2").of_creator("/x", "n3") == "n2"
    assert homes.of_creator("/x", "elsewhere") == homes.home("/x")
    assert homes.of_holders("/x", []) == homes.home("/x")


def test_a_directory_held_at_several_sites_is_homed_at_the_one_nearest_to_every_node() -> None:
    """Three sites: a - b 5 ms, b - c 10 ms, a - c 30 ms. b is nearest to every node, so a directory
    held at a and b is homed at b, whatever the hash says; held at a and c, at a (35 ms in total
    against c's 40); at one site, there. Without RTTs the hash picks among the holders' sites."""
    sites = {"a": ("a1", "a2"), "b": ("b1", "b2"), "c": ("c1", "c2")}
    site_of = {node: site for site, members in sites.items() for node in members}
    one_way = {("a", "b"): 5.0, ("b", "c"): 10.0, ("a", "c"): 30.0}
    rtt = {(x, y): 0.1 if x == y else one_way.get((x, y), one_way.get((y, x), 0.0)) for x in sites for y in sites}
    homes = Homes(tuple(site_of), site_of, None, rtt)
    hashed = Homes(tuple(site_of), site_of)
    seen = set()
    for i in range(100):
        directory = f"/found/{i}"
        assert site_of[homes.of_holders(directory, ["a1", "b2"])] == "b"
        assert site_of[homes.of_holders(directory, ["c2", "a1", "a2"])] == "a"
        assert site_of[homes.of_holders(directory, ["c1"])] == "c"
        seen.add(site_of[hashed.of_holders(directory, ["a1", "b2"])])
    assert seen == {"a", "b"}


def test_sites_with_equal_total_rtt_are_told_apart_by_their_farthest_node() -> None:
    """s1 and s2 are both 80 ms from every node in total (the WAN benchmark's four sites), but
    s2's farthest node is 20 ms away and s1's 25: a directory held at s1, s2 and s4 is homed at
    s2 whatever the hash says, so the slowest asker (at s4) waits 20 ms, not 25."""
    sites = {f"s{i}": (f"s{i}a", f"s{i}b") for i in range(1, 5)}
    site_of = {node: site for site, members in sites.items() for node in members}
    links = {("s1", "s2"): 5.0, ("s1", "s3"): 10.0, ("s2", "s3"): 15.0, ("s2", "s4"): 20.0,
             ("s3", "s4"): 25.0, ("s1", "s4"): 25.0}
    rtt = {(x, y): 0.15 if x == y else links.get((x, y), links.get((y, x), 0.0)) for x in sites for y in sites}
    homes = Homes(tuple(site_of), site_of, None, rtt)
    for i in range(100):
        assert site_of[homes.of_holders(f"/found/{i}", ["s1a", "s2b", "s4a"])] == "s2"
        assert site_of[homes.of_holders(f"/found/{i}", ["s1a", "s1b", "s3a"])] == "s1"


def test_split_parent() -> None:
    assert split_parent("/a") == ("/", "a")
    assert split_parent("/a/b/c") == ("/a/b", "c")


_PATHS = st.lists(st.sampled_from(["a", "ab", "b", "a.mv", "a-"]), max_size=4).map(lambda parts: "/" + "/".join(parts))


@given(path=_PATHS, prefixes=st.lists(_PATHS, max_size=3))
def test_under_any_is_under_one_of_the_prefixes(path: str, prefixes: list[str]) -> None:
    assert under_any(prefixes)(path) == any(under(path, prefix) for prefix in prefixes)


# ------------------------------------------------------ messages per operation (4 nodes over RPC)


def total(cluster: Cluster) -> int:
    """Requests served by all nodes since the last reset (a node calling itself is not a message)."""
    return sum(sum(node.served.values()) for node in cluster.nodes.values())


def homes_of(cluster: Cluster) -> Homes:
    locator = cluster["n1"].locator
    assert isinstance(locator, IndexLocator)
    return locator.homes


@trio_test
async def test_local_hit_costs_no_message(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, lookup="index") as cluster:
        cluster["n1"].put("/d/mine", b"x")
        cluster.reset_counts()
        assert (await cluster["n1"].namespace.lookup("/d/mine")).node == "n1"
        assert await read_file(cluster["n1"].namespace, "/d/mine") == b"x"
        assert total(cluster) == 0


@trio_test(frozen_clock=True)
async def test_expired_misses_and_homes_leave_the_locators_caches(tmp_path: Path) -> None:
    """The caches hold what their leases cover: a directory removal or rename scans them whole,
    and a daemon that ran for hours had them at max_entries of dead answers (200k)."""
    async with open_cluster(tmp_path, lookup="index") as cluster:
        locator = cluster["n1"].locator
        assert isinstance(locator, IndexLocator)
        ns = cluster["n1"].namespace
        for i in range(3):
            cluster["n2"].mkdir(f"/old{i}")
            with pytest.raises(FileNotFoundError):
                await ns.lookup(f"/old{i}/none")
        assert {f"/old{i}/none" for i in range(3)} <= set(locator._negative)
        assert {f"/old{i}" for i in range(3)} <= set(locator._homes)
        await elapse(2 * locator.home_lease + 1)  # every lease above has run out, homes' twice
        cluster["n2"].mkdir("/new")
        with pytest.raises(FileNotFoundError):
            await ns.lookup("/new/none")
        assert list(locator._negative) == ["/new/none"]
        assert list(locator._homes) == ["/new"]


@trio_test
async def test_remote_hit_and_miss_cost_one_message_to_the_home(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, lookup="index") as cluster:
        directory = found_at(homes_of(cluster), "n2", ["n1", "n3"])
        cluster["n3"].put(f"{directory}/far", b"far away")
        cluster["n1"].mkdir(directory)
        ns = cluster["n1"].namespace
        with pytest.raises(FileNotFoundError):
            await ns.lookup(f"{directory}/warm-up")  # the home lists the directory once (built on demand)
        cluster.reset_counts()
        assert (await ns.lookup(f"{directory}/far")).node == "n3"
        assert total(cluster) == 1 and cluster["n2"].served["index_lookup"] == 1
        cluster.reset_counts()
        with pytest.raises(FileNotFoundError):
            await ns.lookup(f"{directory}/nothing")
        assert total(cluster) == 1 and cluster["n2"].served["index_lookup"] == 1
        cluster.reset_counts()
        with pytest.raises(FileNotFoundError):
            await ns.lookup(f"{directory}/nothing")  # the leased "not found": no message
        assert total(cluster) == 0


@trio_test
async def test_flood_miss_asks_every_other_node(tmp_path: Path) -> None:
    """The baseline the index removes: a miss costs one message to each other node."""
    async with open_cluster(tmp_path, lookup="flood") as cluster:
        cluster.reset_counts()
        with pytest.raises(FileNotFoundError):
            await cluster["n1"].namespace.lookup("/nothing")
        assert total(cluster) == 3


@trio_test
async def test_create_is_one_round_trip_to_the_home_and_stays_local(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, lookup="index") as cluster:
        directory = found_at(homes_of(cluster), "n4", list(NODES))
        for node in NODES:
            cluster[node].mkdir(directory)
        ns = cluster["n1"].namespace
        with pytest.raises(FileNotFoundError):
            await ns.lookup(f"{directory}/warm-up")
        cluster.reset_counts()
        handle = await ns.create(f"{directory}/new", os.O_WRONLY | os.O_EXCL, 0o644)
        assert total(cluster) == 1 and cluster["n4"].served["index_claim"] == 1
        await ns.write(handle, 0, b"data stays here")
        await ns.release(handle)  # the new size goes to the home: one more message
        assert total(cluster) == 2 and cluster["n4"].served["index_set"] == 1
        assert cluster.holders(f"{directory}/new") == ["n1"]
        cluster.reset_counts()
        assert (await cluster["n3"].namespace.lookup(directory)).node == "n3"  # its own: 0 messages
        located = await cluster["n3"].namespace.lookup(f"{directory}/new")
        # n3 learns the directory's home from the root's home first (its own copy told it nothing)
        assert (located.node, located.attr.size) == ("n1", len(b"data stays here"))
        assert total(cluster) == 2
        cluster.reset_counts()
        with pytest.raises(FileNotFoundError):
            await cluster["n3"].namespace.lookup(f"{directory}/other")
        assert total(cluster) == 1  # the home is known now: one round trip


@trio_test
async def test_create_revokes_the_not_found_every_node_was_given(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, lookup="index") as cluster:
        directory = found_at(homes_of(cluster), "n4", ["n3"])
        cluster["n3"].mkdir(directory)
        path = f"{directory}/out"
        for node in ("n1", "n2", "n4"):
            with pytest.raises(FileNotFoundError):
                await cluster[node].namespace.lookup(path)  # leased "not found" (60 s)
        cluster.reset_counts()
        handle = await cluster["n3"].namespace.create(path, os.O_WRONLY, 0o644)
        # n3 -> n4 (claim); n4 -> n1, n2 ("created": the leases n4 handed out); n4 is the home itself
        assert cluster["n4"].served["index_claim"] == 1
        assert cluster.served("created") == {"n1": 1, "n2": 1, "n3": 0, "n4": 0}
        await cluster["n3"].namespace.write(handle, 0, b"made on n3")
        await cluster["n3"].namespace.release(handle)
        for node in ("n1", "n2", "n4"):
            assert (await cluster[node].namespace.lookup(path)).node == "n3"
            assert await read_file(cluster[node].namespace, path) == b"made on n3"


@trio_test
async def test_no_twin_when_the_name_exists_elsewhere(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, lookup="index") as cluster:
        handle = await cluster["n3"].namespace.create("/shared", os.O_WRONLY, 0o644)
        await cluster["n3"].namespace.write(handle, 0, b"n3's")
        await cluster["n3"].namespace.release(handle)
        ns = cluster["n1"].namespace
        with pytest.raises(FileExistsError):
            await ns.create("/shared", os.O_WRONLY | os.O_EXCL, 0o644)
        with pytest.raises(FileExistsError):
            await ns.mkdir("/shared", 0o755)
        handle = await ns.create("/shared", os.O_WRONLY, 0o644)  # O_CREAT alone opens n3's file
        await ns.write(handle, 0, b"N1")
        await ns.release(handle)
        assert cluster.holders("/shared") == ["n3"]
        assert cluster["n3"].path("/shared").read_bytes() == b"N1's"


@trio_test
async def test_unlink_rename_rmdir_keep_the_index_exact(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, lookup="index") as cluster:
        a, b = cluster["n1"].namespace, cluster["n4"].namespace
        await a.mkdir("/top", 0o755)
        handle = await a.create("/top/f", os.O_WRONLY, 0o644)
        await a.release(handle)
        await b.rename("/top/f", "/top/g")
        with pytest.raises(FileNotFoundError):
            await cluster["n3"].namespace.lookup("/top/f")
        assert (await cluster["n3"].namespace.lookup("/top/g")).node == "n1"
        await cluster["n2"].namespace.rename("/top", "/moved")  # a directory: its subtree changes home
        assert (await cluster["n3"].namespace.lookup("/moved/g")).node == "n1"
        with pytest.raises(FileNotFoundError):
            await cluster["n3"].namespace.lookup("/top")
        await b.unlink("/moved/g")
        await b.rmdir("/moved")
        for node in NODES:
            with pytest.raises(FileNotFoundError):
                await cluster[node].namespace.lookup("/moved")
        assert cluster.holders("/moved") == [] and cluster.holders("/top") == []


@trio_test(frozen_clock=True)
async def test_files_put_straight_into_an_export_reach_the_home_at_the_next_scan(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, lookup="index", ttl=1.0) as cluster:
        directory = found_at(homes_of(cluster), "n4", ["n3"])
        cluster["n3"].mkdir(directory)
        for node in ("n1", "n2"):
            with pytest.raises(FileNotFoundError):
                await cluster[node].namespace.lookup(f"{directory}/copied")  # leased "not found"
        (cluster["n3"].path(directory) / "copied").write_bytes(b"cp'd in")  # behind everyone's back
        watcher = cluster["n3"].watcher
        assert watcher is not None
        cluster.reset_counts()
        assert await watcher.scan() == 1  # one directory changed: its listing goes to its home
        assert cluster["n4"].served["index_sync"] == 1
        assert cluster.served("created") == {"n1": 1, "n2": 1, "n3": 0, "n4": 0}  # the leases revoked
        for node in ("n1", "n2"):
            assert (await cluster[node].namespace.lookup(f"{directory}/copied")).node == "n3"
        cluster.reset_counts()
        assert await watcher.scan() == 0 and total(cluster) == 0  # nothing changed: nothing sent
        (cluster["n3"].path(directory) / "copied").unlink()
        assert await watcher.scan() == 1
        await elapse(1.0)  # n1's cached location expires (attr_ttl)
        with pytest.raises(FileNotFoundError):
            await cluster["n1"].namespace.lookup(f"{directory}/copied")


@trio_test(frozen_clock=True)
async def test_a_scan_sends_its_home_only_what_changed_in_a_big_directory(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory that grows by many creates changes its mtime at every scan: the whole listing
    each time would cost the home the directory's size every second (it stalled 100k creates in
    one directory). Only new, changed and gone names are sent."""
    async with open_cluster(tmp_path, lookup="index", ttl=1.0) as cluster:
        directory = found_at(homes_of(cluster), "n4", ["n3"], "/grown")
        for i in range(300):
            cluster["n3"].put(f"{directory}/f{i:03d}", b"x")
        with pytest.raises(FileNotFoundError):
            await cluster["n1"].namespace.lookup(f"{directory}/copied")  # the home lists n3 once
        sent: list[list[Any]] = []
        home = cluster["n4"].service
        original = home.dispatch

        async def spy(session: Any, op: str, args: list[Any]) -> Any:
            if op == "index_sync":
                sent.append(args[2])
            return await original(session, op, args)

        monkeypatch.setattr(home, "dispatch", spy)
        watcher = cluster["n3"].watcher
        assert watcher is not None
        (cluster["n3"].path(directory) / "copied").write_bytes(b"cp'd in")  # behind everyone's back
        (cluster["n3"].path(directory) / "f007").unlink()
        assert await watcher.scan() == 1
        assert sorted(row[0] for row in sent[0]) == ["copied", "f007"]
        assert [row[1] is None for row in sorted(sent[0])] == [False, True]  # f007 is gone
        assert await watcher.scan() == 0 and len(sent) == 1  # nothing changed since
        await elapse(1.0)  # n1's cached "not found" expires
        assert (await cluster["n1"].namespace.lookup(f"{directory}/copied")).node == "n3"
        with pytest.raises(FileNotFoundError):
            await cluster["n1"].namespace.lookup(f"{directory}/f007")
        assert len((await cluster["n2"].namespace.merged_listing(directory)).entries) == 300


@trio_test(frozen_clock=True)
async def test_a_directory_too_big_for_one_listing_is_paged_and_still_watched(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """More entries on one node than one reply carries: the home pages through them, and the node
    watches the directory all the same (files copied in are seen at its next scan)."""
    monkeypatch.setattr(service_module, "LISTDIR_MAX", 10)
    async with open_cluster(tmp_path, lookup="index", ttl=1.0) as cluster:
        directory = found_at(homes_of(cluster), "n4", ["n3"], "/paged")
        for i in range(25):
            cluster["n3"].put(f"{directory}/f{i:02d}", b"x")
        with pytest.raises(FileNotFoundError):
            await cluster["n1"].namespace.lookup(f"{directory}/copied")
        assert cluster["n3"].served["readdir"] >= 3  # the home paged through n3's 25 entries
        assert (await cluster["n1"].namespace.lookup(f"{directory}/f24")).node == "n3"
        (cluster["n3"].path(directory) / "copied").write_bytes(b"cp'd in")
        watcher = cluster["n3"].watcher
        assert watcher is not None
        assert await watcher.scan() == 1
        await elapse(1.0)
        assert (await cluster["n1"].namespace.lookup(f"{directory}/copied")).node == "n3"


@trio_test
async def test_dead_home_and_dead_backup_fall_back_to_asking_every_node(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, lookup="index", retry_after=0.3) as cluster:
        homes = homes_of(cluster)
        directory = found_at(homes, "n4", ["n2", "n3"])
        assert homes.backup(directory, "n4") == "n3"
        cluster["n2"].put(f"{directory}/kept", b"k")
        cluster["n3"].mkdir(directory)
        ns = cluster["n1"].namespace
        assert (await ns.lookup(f"{directory}/kept")).node == "n2"  # n1 knows the home now
        cluster.stop("n4")
        cluster.stop("n3")
        await trio.sleep(0.05)
        cluster["n1"].locator.invalidate(f"{directory}/kept")
        assert (await ns.lookup(f"{directory}/kept")).node == "n2"  # found by the search
        with pytest.raises(AbsentForNow):  # ENOENT that neither daemon nor kernel keeps
            await ns.lookup(f"{directory}/missing")
        handle = await ns.create(f"{directory}/made", os.O_WRONLY, 0o644)  # creates still work
        await ns.release(handle)
        assert (await cluster["n2"].namespace.lookup(f"{directory}/made")).node == "n1"
        locator = cluster["n1"].locator
        assert isinstance(locator, IndexLocator) and locator.fallbacks >= 3


@trio_test
async def test_holder_down_is_eio_at_open_not_absence(tmp_path: Path) -> None:
    """With an index the home answers the lookup; the dead holder's EIO comes at open."""
    async with open_cluster(tmp_path, lookup="index", retry_after=0.3) as cluster:
        directory = found_at(homes_of(cluster), "n4", ["n3"])
        cluster["n3"].put(f"{directory}/held", b"x")
        assert (await cluster["n1"].namespace.lookup(f"{directory}/held")).node == "n3"
        cluster.stop("n3")
        await trio.sleep(0.05)
        cluster["n1"].locator.invalidate(f"{directory}/held")
        assert (await cluster["n1"].namespace.lookup(f"{directory}/held")).node == "n3"
        with pytest.raises(PeerUnavailable):
            await read_file(cluster["n1"].namespace, f"{directory}/held")


@trio_test
async def test_holder_answering_eacces_is_that_error_at_open_and_nothing_is_cached(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, lookup="index") as cluster:
        cluster["n3"].put("/guarded", b"x")
        cluster["n3"].fail["open"] = errno.EACCES
        ns = cluster["n1"].namespace
        assert (await ns.lookup("/guarded")).node == "n3"  # the home answers; n3 is not asked
        with pytest.raises(PermissionError):
            await read_file(ns, "/guarded")
        del cluster["n3"].fail["open"]
        assert await read_file(ns, "/guarded") == b"x"


@trio_test
async def test_central_sends_every_index_request_to_one_node(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, lookup="central") as cluster:
        cluster["n3"].put("/a/one", b"1")
        cluster["n4"].put("/b/two", b"2")
        cluster.reset_counts()
        assert (await cluster["n2"].namespace.lookup("/a/one")).node == "n3"
        assert (await cluster["n2"].namespace.lookup("/b/two")).node == "n4"
        index_requests = {name: sum(n for op, n in node.served.items()  # (every node lists for the home)
                                    if op.startswith("index_") and op != "index_listdir")
                          for name, node in cluster.nodes.items()}
        assert index_requests["n1"] >= 2 and index_requests["n2"] == index_requests["n3"] == 0


async def known_home(cluster: Cluster, node: str, directory: str) -> str | None:
    locator = cluster[node].locator
    assert isinstance(locator, IndexLocator)
    return await locator.home_of(directory)


@trio_test
async def test_mkdir_homes_the_directory_at_its_creator(tmp_path: Path) -> None:
    """A directory made through a node's mount is homed there, and owned while nobody else asks in
    it: the creator's mkdirs, lookups and creates in it cost no message (the record of a new
    subdirectory reaches the backup with the next batch, every second); another node's first
    question ends the ownership and costs that node one round trip."""
    async with open_cluster(tmp_path, lookup="index") as cluster:
        homes = homes_of(cluster)
        ns = cluster["n3"].namespace
        top, sub = "/top", "/top/sub"
        await ns.mkdir(top, 0o755)
        assert homes.backup(top, "n3") == "n4"
        cluster.reset_counts()
        await ns.mkdir(sub, 0o755)
        assert total(cluster) == 0
        locator = cluster["n3"].locator
        assert isinstance(locator, IndexLocator)
        await locator.flush_owed()  # (the daemon's every second): the record copy reaches top's backup
        assert served(cluster) == {"n4": {"index_records": 1}}
        backup = cluster["n4"].index
        assert backup is not None and (await backup.op_records(msg.IndexRecords(top)))["sub"] == "n3"
        cluster.reset_counts()
        with pytest.raises(FileNotFoundError):
            await ns.lookup(f"{sub}/missing")
        handle = await ns.create(f"{sub}/out", os.O_WRONLY | os.O_EXCL, 0o644)
        await ns.write(handle, 0, b"made here")
        await ns.release(handle)
        assert total(cluster) == 0
        index = cluster["n3"].index
        assert index is not None and index.owns(top) and index.owns(sub)
        for node in NODES:  # every node agrees where the homes are (n1 asks top's home for sub's once)
            assert await known_home(cluster, node, top) == "n3"
            assert await known_home(cluster, node, sub) == "n3"
        cluster.reset_counts()
        located = await cluster["n1"].namespace.lookup(f"{sub}/out")
        assert (located.node, located.attr.size) == ("n3", len(b"made here"))
        assert total(cluster) == 1 and cluster["n3"].served["index_lookup"] == 1
        assert not index.owns(sub) and not index.owns(top)
        # a directory n1 makes under n3's is homed at n1: the claim at top's home, the record copy to
        # its backup n4 (top is owned by nobody now: n1 asked in it); n1 seeds its own index
        cluster.reset_counts()
        await cluster["n1"].namespace.mkdir(f"{top}/theirs", 0o755)
        assert served(cluster) == {"n3": {"index_claim": 1}, "n4": {"index_records": 1}}
        for node in NODES:
            assert await known_home(cluster, node, f"{top}/theirs") == "n1"


@trio_test
async def test_a_directory_copied_into_another_export_ends_the_ownership_the_owner_relays(tmp_path: Path) -> None:
    """A directory copied into another node's export under directories the root's home owns: that
    node's scan reaches the root's home, which has the homes of the new subdirectories list them
    there -- itself, both times, so no other node's request ends its ownerships. The names the
    other node holds end them all the same: the owner finds its file, and an rmdir of its
    directory is ENOTEMPTY."""
    async with open_cluster(tmp_path, lookup="index") as cluster:
        owner = homes_of(cluster).home("/")
        ns = cluster[owner].namespace
        other = next(node for node in NODES if node != owner)
        await ns.mkdir("/top", 0o755)
        await ns.mkdir("/top/sub", 0o755)
        index = cluster[owner].index
        assert index is not None and index.owns("/top") and index.owns("/top/sub")
        copied = cluster[other].path("/top/sub/full")
        copied.mkdir(parents=True)
        (copied / "f").write_bytes(b"copied in")  # behind everyone's back
        watcher = cluster[other].watcher
        assert watcher is not None
        assert await watcher.scan() == 1  # the root's listing (the owner lists the rest there itself)
        assert not index.owns("/top") and not index.owns("/top/sub")
        assert (await ns.lookup("/top/sub/full/f")).node == other
        with pytest.raises(OSError) as refused:
            await ns.rmdir("/top/sub/full")
        assert refused.value.errno == errno.ENOTEMPTY


@trio_test(frozen_clock=True)
async def test_an_owned_directory_listed_again_ends_its_ownership_for_a_name_copied_in_elsewhere(
        tmp_path: Path) -> None:
    """A file copied into another node's copy of an owned directory, its scan report never seen
    (the other node did not watch the directory): when the owner's index lists the directory again
    (older than `rescan`, at the owner's next create there), the other node's name ends the ownership."""
    async with open_cluster(tmp_path, lookup="index") as cluster:
        owner, other = "n3", "n1"
        ns = cluster[owner].namespace
        await ns.mkdir("/top", 0o755)
        index = cluster[owner].index
        assert index is not None and index.owns("/top")
        cluster[other].path("/top").mkdir()
        (cluster[other].path("/top") / "far").write_bytes(b"copied in")  # behind everyone's back
        await elapse(index.rescan + 1)
        handle = await ns.create("/top/near", os.O_WRONLY | os.O_EXCL, 0o644)
        await ns.release(handle)
        assert not index.owns("/top")
        assert (await ns.lookup("/top/far")).node == other


@trio_test
async def test_a_directory_made_by_its_parents_backup_costs_the_claim_alone(tmp_path: Path) -> None:
    """The backup of the parent's home keeps the copy of the parent's records itself, and the new
    directory is homed at its creator, which seeds its index itself: the mkdir is one message."""
    async with open_cluster(tmp_path, lookup="index") as cluster:
        homes = homes_of(cluster)
        await cluster["n4"].namespace.mkdir("/top", 0o755)
        assert homes.backup("/top", "n4") == "n3"
        handle = await cluster["n3"].namespace.create("/top/first", os.O_WRONLY | os.O_EXCL, 0o644)
        await cluster["n3"].namespace.release(handle)  # (n3 has /top on its disk now, and knows its home)
        cluster.reset_counts()
        await cluster["n3"].namespace.mkdir("/top/sub", 0o755)
        assert served(cluster) == {"n4": {"index_claim": 1}}
        backup = cluster["n3"].index
        assert backup is not None and (await backup.op_records(msg.IndexRecords("/top")))["sub"] == "n3"
        cluster.reset_counts()
        with pytest.raises(FileNotFoundError):
            await cluster["n3"].namespace.lookup("/top/sub/missing")
        assert total(cluster) == 0  # seeded: nobody listed


@trio_test
async def test_rmdir_revokes_the_home_at_every_node_that_learnt_it_but_the_remover(tmp_path: Path) -> None:
    """The remover forgets the directory's home itself, before and after the drop: its parent's
    home tells only the others (one nested round trip less per rmdir)."""
    async with open_cluster(tmp_path, lookup="index") as cluster:
        homes = homes_of(cluster)
        top = made_at(homes, "n4", "n4", "/top")
        await cluster["n4"].namespace.mkdir(top, 0o755)
        sub = made_at(homes, "n3", "n3", f"{top}/sub")
        await cluster["n3"].namespace.mkdir(sub, 0o755)  # n3 holds a lease on sub's home, from n4
        assert await known_home(cluster, "n1", sub) == "n3"  # so does n1
        cluster.reset_counts()
        await cluster["n3"].namespace.rmdir(sub)
        assert cluster.served("index_unhome") == {"n1": 1, "n2": 0, "n3": 0, "n4": 0}
        for node in NODES:
            assert await known_home(cluster, node, sub) is None


@trio_test
async def test_a_far_change_is_recorded_by_the_holder_near_the_home(tmp_path: Path) -> None:
    """chmod, utime, rename and unlink of a file held at the home's site, from another site: one
    message from the asker (`recorded`, to the holder), which records the change at the home from
    there; a third node sees it at once. A home at the asker's site is told by the asker, as before."""
    async with open_cluster(tmp_path, lookup="index") as cluster:
        far, near = "/far", "/near"  # homed at n4, the holder n3's site-mate; at n2, the asker n1's
        for directory, maker in ((far, "n4"), (near, "n2")):
            await cluster[maker].namespace.mkdir(directory, 0o755)
            handle = await cluster["n3"].namespace.create(f"{directory}/f", os.O_WRONLY | os.O_EXCL, 0o644)
            await cluster["n3"].namespace.release(handle)
        ns = cluster["n1"].namespace
        for directory, asked in ((far, {"n3": {"recorded": 1}, "n4": {"index_set": 1}}),
                                 (near, {"n3": {"chmod": 1}, "n2": {"index_set": 1}})):
            assert (await ns.lookup(f"{directory}/f")).node == "n3"  # (the kernel's lookup before a chmod)
            cluster.reset_counts()
            attr = await ns.setattr(f"{directory}/f", mode=0o600)
            assert stat.S_IMODE(attr.mode) == 0o600
            assert {n: dict(c.served) for n, c in cluster.nodes.items() if c.served} == asked, directory
            assert stat.S_IMODE((await cluster["n2"].namespace.lookup(f"{directory}/f")).attr.mode) == 0o600
        cluster.reset_counts()
        attr = await ns.setattr(f"{far}/f", mtime_ns=10**18)
        assert attr.mtime_ns == 10**18 and total(cluster) == 2 and cluster["n3"].served["recorded"] == 1
        assert (await cluster["n4"].namespace.lookup(f"{far}/f")).attr.mtime_ns == 10**18
        cluster.reset_counts()
        await ns.rename(f"{far}/f", f"{far}/g")  # both names asked for at once, then renamed and recorded
        assert {n: dict(c.served) for n, c in cluster.nodes.items() if c.served} == \
            {"n3": {"recorded": 1}, "n4": {"index_lookup": 2, "index_rename": 1}}
        assert (await cluster["n2"].namespace.lookup(f"{far}/g")).node == "n3"
        cluster.reset_counts()
        await ns.unlink(f"{far}/g")
        assert {n: dict(c.served) for n, c in cluster.nodes.items() if c.served} == \
            {"n3": {"recorded": 1}, "n4": {"index_lookup": 1, "index_drop": 1}}  # (every holder, asked first)
        assert cluster.holders(f"{far}/f") == [] and cluster.holders(f"{far}/g") == []
        for node in ("n4", "n2"):
            for name in ("f", "g"):
                cluster[node].locator.invalidate(f"{far}/{name}")  # (their locations from above: kept for attr_ttl)
                with pytest.raises(FileNotFoundError):
                    await cluster[node].namespace.lookup(f"{far}/{name}")  # the home knows


def served(cluster: Cluster) -> dict[str, dict[str, int]]:
    return {n: dict(c.served) for n, c in cluster.nodes.items() if c.served}


async def made_with_files(cluster: Cluster, directory: str, maker: str, names: str, *, home: str | None = None) -> None:
    """`directory` made through `home`'s mount (its home; default `maker`), its files through `maker`'s."""
    await cluster[home or maker].namespace.mkdir(directory, 0o755)
    for name in names:
        handle = await cluster[maker].namespace.create(f"{directory}/{name}", os.O_WRONLY | os.O_EXCL, 0o644)
        await cluster[maker].namespace.release(handle)


async def listed_modes(cluster: Cluster, node: str, directory: str) -> dict[str, int]:
    return {e.name: stat.S_IMODE(e.location.attr.mode)
            for e in (await cluster[node].namespace.merged_listing(directory)).entries}


@trio_test
async def test_a_node_keeps_its_listing_through_its_own_changes(tmp_path: Path) -> None:
    """A chmod, utime or unlink this node makes in a directory it holds a listing of is applied to
    that listing, and its home does not revoke it: a job working through its own directory goes
    on answering lookups, and every holder before an unlink, from the listing, with no message
    (it dropped its copy, and asked the home for every name for LIST_AHEAD_QUIET seconds). The
    home still revokes it when another node changes the directory."""
    async with open_cluster(tmp_path, lookup="index") as cluster:
        directory = "/own"  # homed at n4, held at n3 (the far site)
        await made_with_files(cluster, directory, "n3", "abcde", home="n4")
        assert await listed_modes(cluster, "n1", directory) == dict.fromkeys("abcde", 0o644)
        ns = cluster["n1"].namespace
        cluster.reset_counts()
        assert (await ns.lookup(f"{directory}/a")).node == "n3"  # (the kernel's lookup before a chmod)
        await ns.setattr(f"{directory}/a", mode=0o600)
        await ns.setattr(f"{directory}/b", mtime_ns=10**18)
        assert served(cluster) == {"n3": {"recorded": 2}, "n4": {"index_set": 2}}
        cluster.reset_counts()
        assert (await ns.lookup(f"{directory}/e")).node == "n3"
        assert await listed_modes(cluster, "n1", directory) == {**dict.fromkeys("bcde", 0o644), "a": 0o600}
        assert total(cluster) == 0
        await ns.unlink(f"{directory}/c")  # every holder from the listing too
        assert served(cluster) == {"n3": {"recorded": 1}, "n4": {"index_drop": 1}}
        cluster.reset_counts()
        assert sorted(await listed_modes(cluster, "n1", directory)) == list("abde") and total(cluster) == 0
        assert (await ns.lookup(f"{directory}/b")).attr.mtime_ns == 10**18
        with pytest.raises(FileNotFoundError):
            await ns.lookup(f"{directory}/c")  # a "not found" is the home's (leased per name), never a listing's
        assert served(cluster) == {"n4": {"index_lookup": 1}}
        # another node's change: the home revokes this node's listing before the change returns
        cluster.reset_counts()
        await cluster["n2"].namespace.setattr(f"{directory}/e", mode=0o640)
        assert cluster["n1"].served["index_unlist"] == 1
        assert (await listed_modes(cluster, "n1", directory))["e"] == 0o640
        assert cluster["n4"].served["index_list"] == 1


@trio_test
async def test_a_node_asks_the_home_for_a_name_it_renamed_and_drops_its_listing_after_changes_at_once(
        tmp_path: Path) -> None:
    """A rename keeps the listing too, but the new name's attributes only its holder knows (the
    rename changed its ctime): that name, and a readdir, are asked of the home. Two changes here
    under way at once may reach the home in either order: the listing goes, and the home answers."""
    async with open_cluster(tmp_path, lookup="index") as cluster:
        directory = "/moved"
        await made_with_files(cluster, directory, "n3", "abcd", home="n4")
        assert sorted(await listed_modes(cluster, "n1", directory)) == list("abcd")
        ns = cluster["n1"].namespace
        cluster.reset_counts()
        await ns.rename(f"{directory}/a", f"{directory}/a2")
        assert served(cluster) == {"n3": {"recorded": 1}, "n4": {"index_lookup": 1, "index_rename": 1}}  # (a2)
        cluster.reset_counts()
        assert (await ns.lookup(f"{directory}/b")).node == "n3" and total(cluster) == 0
        assert (await ns.lookup(f"{directory}/a2")).node == "n3"
        assert served(cluster) == {"n4": {"index_lookup": 1}, "n3": {"lookup": 1}}  # (the home asks the holder)
        assert sorted(await listed_modes(cluster, "n1", directory)) == ["a2", "b", "c", "d"]
        assert cluster["n4"].served["index_list"] == 1
        cluster.reset_counts()
        async with trio.open_nursery() as nursery:
            for name, mode in (("b", 0o600), ("c", 0o640)):
                nursery.start_soon(functools.partial(ns.setattr, f"{directory}/{name}", mode=mode))
        assert await listed_modes(cluster, "n1", directory) == {"a2": 0o644, "b": 0o600, "c": 0o640, "d": 0o644}
        assert cluster["n4"].served["index_list"] == 1  # not kept through two changes at once


@trio_test
async def test_a_home_asks_the_holders_of_renamed_names_at_once_to_list_them(tmp_path: Path) -> None:
    """A home records a rename without the file's attributes (the rename changed its ctime): to
    list the directory it asks the holders of the renamed names for them, all at once -- a listing
    where a job renamed its outputs costs one round trip to their holders, not one per name."""
    async with open_cluster(tmp_path, lookup="index") as cluster:
        directory = "/renamed"
        await made_with_files(cluster, directory, "n3", "abcd", home="n4")
        for name in "abcd":
            await cluster["n3"].namespace.rename(f"{directory}/{name}", f"{directory}/{name}2")
        service = cluster["n3"].service
        serve = service.dispatch
        in_flight = peak = 0
        renamed = [f"{directory}/{name}2" for name in "abcd"]

        async def counting(session: rpc.Session, op: str, args: list[Any]) -> Any:
            nonlocal in_flight, peak
            if op != "lookup" or args[0] not in renamed:
                return await serve(session, op, args)
            in_flight += 1
            peak = max(peak, in_flight)
            try:
                await trio.sleep(0.05)  # (long enough for the home's other asks to arrive meanwhile)
                return await serve(session, op, args)
            finally:
                in_flight -= 1

        service.dispatch = counting  # type: ignore[method-assign]
        assert sorted(await listed_modes(cluster, "n1", directory)) == ["a2", "b2", "c2", "d2"]
        assert peak == 4


@trio_test
async def test_a_holder_records_a_far_change_at_the_backup_when_the_home_is_down(tmp_path: Path) -> None:
    """`recorded` with the home cut off: the holder records through the home's backup (here the
    holder itself), and owes the home a rebuild, which the home gets when it answers again (its
    index, kept through the cut, still has the old mode)."""
    async with open_cluster(tmp_path, lookup="index", retry_after=30.0) as cluster:
        homes = homes_of(cluster)
        far = "/far"  # homed at n4; its backup is n3, the holder
        assert homes.backup(far, "n4") == "n3"
        await cluster["n4"].namespace.mkdir(far, 0o755)
        handle = await cluster["n3"].namespace.create(f"{far}/f", os.O_WRONLY | os.O_EXCL, 0o644)
        await cluster["n3"].namespace.release(handle)
        ns = cluster["n1"].namespace
        assert (await ns.lookup(f"{far}/f")).node == "n3"
        cluster.stop("n4")  # its server only: a network cut, not a crash
        attr = await ns.setattr(f"{far}/f", mode=0o600)
        assert stat.S_IMODE(attr.mode) == 0o600 and cluster["n3"].served["recorded"] == 1
        cluster["n2"].locator.invalidate(f"{far}/f")
        assert stat.S_IMODE((await cluster["n2"].namespace.lookup(f"{far}/f")).attr.mode) == 0o600  # the stand-in
        await cluster.restart("n4")
        for node in NODES:
            cluster[node].pool.set_peers(cluster.addresses())
        holder = cluster["n3"].locator
        assert isinstance(holder, IndexLocator)
        await holder.flush_owed()  # the change n4 missed: it lists the directory again
        cluster["n2"].locator.invalidate(f"{far}/f")
        found = await cluster["n2"].namespace.lookup(f"{far}/f")
        assert found.node == "n3" and stat.S_IMODE(found.attr.mode) == 0o600
        assert cluster["n4"].served["index_lookup"] >= 1


@trio_test
async def test_rmdir_forgets_the_directorys_index_at_its_home_with_the_drop(tmp_path: Path) -> None:
    """The parent's home has the removed directory's index forgotten where it is homed: itself,
    in the record copy it sends its backup anyway, or in one message of its own -- the remover
    sends the drop and nothing after it (it did: an IndexForget of its own, a round trip more)."""
    async with open_cluster(tmp_path, lookup="index") as cluster:
        homes = homes_of(cluster)
        top = made_at(homes, "n4", "n4", "/top")  # top's backup is n3
        await cluster["n4"].namespace.mkdir(top, 0o755)
        # (its home, who makes and removes it, messages the removal sends, IndexForgets served)
        cases = [("n3", "n4", 1, {}),  # n4 drops it itself; the record copy to n3 forgets it
                 ("n4", "n3", 1, {}),  # the drop; n4 forgets it itself, n3 (the backup) drops its copy itself
                 ("n2", "n1", 3, {"n2": 1})]  # drop, record copy, and n4 tells n2
        for home, remover, messages, forgets in cases:
            sub = f"{top}/sub-{home}"
            await cluster[home].namespace.mkdir(sub, 0o755)
            with pytest.raises(FileNotFoundError):
                await cluster[remover].namespace.lookup(f"{sub}/missing")
            index = cluster[home].index
            assert index is not None
            built = index.statistics().directories
            cluster.reset_counts()
            await cluster[remover].namespace.rmdir(sub)
            removal = {op: sum(cluster.served(op).values()) for op in ("index_drop", "index_records", "index_forget")}
            assert sum(removal.values()) == messages, (home, remover, removal)  # (the lookups before it aside)
            assert {n: c for n, c in cluster.served("index_forget").items() if c} == forgets, (home, remover)
            assert index.statistics().directories == built - 1, (home, remover)
            backup = cluster["n3"].index
            assert backup is not None and sub.rsplit("/", 1)[1] not in await backup.op_records(msg.IndexRecords(top))
            cluster[home].put(f"{sub}/made-outside", b"x")  # the name again, made on its home's disk directly
            assert (await cluster[remover].namespace.lookup(f"{sub}/made-outside")).node == home
        # a home that does not answer is owed the forget by the remover (the reply names it): a
        # directory found on n1's disk, homed at n2
        sub = found_at(homes, "n2", ["n1"], f"{top}/unreached-")
        cluster["n1"].mkdir(sub)
        with pytest.raises(FileNotFoundError):
            await cluster["n1"].namespace.lookup(f"{sub}/missing")
        index = cluster["n2"].index
        assert index is not None
        built = index.statistics().directories
        cluster.stop("n2")  # its server only: the index it keeps stays (a network cut, not a crash)
        await cluster["n1"].namespace.rmdir(sub)
        assert index.statistics().directories == built
        await cluster.restart("n2")
        for node in NODES:
            cluster[node].pool.set_peers(cluster.addresses())
        locator = cluster["n1"].locator
        assert isinstance(locator, IndexLocator)
        await locator.flush_owed()
        assert index.statistics().directories == built - 1


@trio_test
async def test_a_mkdir_that_fails_after_its_claim_leaves_no_seeded_index(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The parent's home seeds the new directory during the claim, before it exists on disk:
    when the mkdir then fails, that index goes, so the name made again later is listed anew."""
    async with open_cluster(tmp_path, lookup="index") as cluster:
        top, sub = "/top", "/top/sub"  # both homed at n4, which makes them
        await cluster["n4"].namespace.mkdir(top, 0o755)
        index = cluster["n4"].index
        assert index is not None
        built = index.statistics().directories

        def disk_full(path: str, mode: int) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(cluster["n4"].export, "mkdir", disk_full)
        with pytest.raises(OSError) as failed:
            await cluster["n4"].namespace.mkdir(sub, 0o755)
        assert failed.value.errno == errno.ENOSPC
        assert index.statistics().directories == built  # seeded by the claim, forgotten at the withdrawal
        assert not index.owns(sub)
        cluster["n1"].put(f"{sub}/copied-in", b"made outside the mount")  # the name, made on n1 directly
        assert (await cluster["n4"].namespace.lookup(f"{sub}/copied-in")).node == "n1"


@trio_test
async def test_directory_found_in_exports_is_homed_over_its_holders(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, lookup="index") as cluster:
        homes = homes_of(cluster)
        directory = found_at(homes, "n3", ["n3", "n4"], "/found")
        cluster["n3"].put(f"{directory}/a", b"a")
        cluster["n4"].put(f"{directory}/b", b"b")
        for node in NODES:
            assert await known_home(cluster, node, directory) == "n3"
        with pytest.raises(FileNotFoundError):
            await cluster["n2"].namespace.lookup(f"{directory}/warm-up")  # n3 lists it from every node once
        cluster.reset_counts()
        assert (await cluster["n1"].namespace.lookup(f"{directory}/b")).node == "n4"
        assert total(cluster) == 1 and cluster["n3"].served["index_lookup"] == 1
        assert await known_home(cluster, "n1", f"{directory}/a") is None  # a file has no home


@trio_test
async def test_readdir_is_one_message_to_the_home_then_none_under_the_lease(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, lookup="index") as cluster:
        homes = homes_of(cluster)
        directory = found_at(homes, "n2", ["n1", "n3", "n4"], "/listed")
        cluster["n1"].put(f"{directory}/one", b"1")
        cluster["n3"].put(f"{directory}/three", b"333")
        cluster["n4"].put(f"{directory}/four", b"4444")
        cluster["n4"].put(f"{directory}/one", b"twin on n4")
        cluster["n3"].mkdir(f"{directory}/sub")
        ns = cluster["n1"].namespace
        assert await known_home(cluster, "n1", directory) == "n2"
        with pytest.raises(FileNotFoundError):
            await cluster["n4"].namespace.lookup(f"{directory}/warm-up")  # n2 lists it from every node once
        cluster.reset_counts()
        listing = await ns.merged_listing(directory)
        assert total(cluster) == 1 and cluster["n2"].served["index_list"] == 1
        got = {e.name: (e.location.node, e.location.attr.size, e.holders) for e in listing.entries}
        assert {name: (node, holders) for name, (node, _, holders) in got.items()} == {
            "one": ("n1", ("n1", "n4")), "three": ("n3", ("n3",)), "four": ("n4", ("n4",)), "sub": ("n3", ("n3",))}
        assert got["four"][1] == 4 and listing.unreachable == []
        cluster.reset_counts()
        assert [e.name for e in (await ns.merged_listing(directory)).entries] == [e.name for e in listing.entries]
        assert total(cluster) == 0  # under the listing lease
        # the subdirectory's home came with the listing: a lookup in it asks that home only
        # (plus, this once, that home listing the subdirectory from every node)
        with pytest.raises(FileNotFoundError):
            await ns.lookup(f"{directory}/sub/missing")
        assert sum(cluster.served("index_lookup").values()) == 1 and cluster["n2"].served["index_lookup"] == 0
        # a create elsewhere revokes the lease before it returns; the next listing shows it
        cluster.reset_counts()
        handle = await cluster["n4"].namespace.create(f"{directory}/new", os.O_WRONLY | os.O_EXCL, 0o644)
        await cluster["n4"].namespace.release(handle)
        assert cluster["n1"].served["index_unlist"] == 1
        cluster.reset_counts()
        assert "new" in [e.name for e in (await ns.merged_listing(directory)).entries]
        assert total(cluster) == 1
        # a change made here drops this node's own copy (no message needed for that)
        handle = await ns.create(f"{directory}/mine", os.O_WRONLY | os.O_EXCL, 0o644)
        await ns.release(handle)
        assert "mine" in [e.name for e in (await ns.merged_listing(directory)).entries]


def files_at_n3_seen_from_n1(cluster: Cluster, prefix: str, count: int) -> str:
    """A directory homed at n2 with files f0, f1, ... (of i bytes) on n3, which n1 has too (empty)."""
    directory = found_at(homes_of(cluster), "n2", ["n1", "n3"], prefix)
    for i in range(count):
        cluster["n3"].put(f"{directory}/f{i}", b"x" * i)
    cluster["n1"].mkdir(directory)
    return directory


@trio_test
async def test_names_found_in_a_row_bring_the_listing_and_later_names_cost_no_message(tmp_path: Path) -> None:
    """IndexFS-style directory leases for lookups: after LIST_AHEAD_AFTER names found in a row,
    the next lookup asks for the whole listing with the name (still one message); the names
    after it are answered from that listing while its lease lasts. A change elsewhere revokes
    it before the change returns, and the directory, which changes, is then asked one name at a
    time for LIST_AHEAD_QUIET seconds; a miss is still one message (its "not found" is leased per
    name, never from a listing). A change made here is not revoked here."""
    async with open_cluster(tmp_path, lookup="index") as cluster:
        directory = files_at_n3_seen_from_n1(cluster, "/ahead", 12)
        ns = cluster["n1"].namespace
        with pytest.raises(FileNotFoundError):
            await ns.lookup(f"{directory}/warm-up")  # the home lists the directory once
        cluster.reset_counts()
        for i in range(LIST_AHEAD_AFTER):
            assert (await ns.lookup(f"{directory}/f{i}")).node == "n3"
        assert total(cluster) == LIST_AHEAD_AFTER and cluster["n2"].served["index_list"] == 0
        cluster.reset_counts()
        assert (await ns.lookup(f"{directory}/f{LIST_AHEAD_AFTER}")).attr.size == LIST_AHEAD_AFTER
        assert total(cluster) == 1 and cluster["n2"].served["index_lookup"] == 1
        assert cluster["n1"].locator.lists_ahead == 1  # type: ignore[attr-defined]
        cluster.reset_counts()
        for i in range(LIST_AHEAD_AFTER + 1, 8):
            assert (await ns.lookup(f"{directory}/f{i}")).attr.size == i
        assert total(cluster) == 0  # from the listing, under its lease
        with pytest.raises(FileNotFoundError):
            await ns.lookup(f"{directory}/nowhere")
        assert total(cluster) == 1  # a miss asks the home: its "not found" is leased per name
        assert cluster["n1"].locator.lists_ahead == 1  # type: ignore[attr-defined]  # (it keeps a listing)
        # an unlink elsewhere revokes the listing before it returns: the name is gone here at once
        cluster.reset_counts()
        await cluster["n3"].namespace.unlink(f"{directory}/f5")
        assert cluster["n1"].served["index_unlist"] == 1
        with pytest.raises(FileNotFoundError):
            await ns.lookup(f"{directory}/f5")
        # a change made here: the home does not revoke this node (see test_a_node_keeps_its_listing_...)
        assert (await ns.lookup(f"{directory}/f6")).node == "n3"  # one name: the directory is quiet
        assert cluster["n1"].locator.lists_ahead == 1  # type: ignore[attr-defined]
        cluster.reset_counts()
        await ns.unlink(f"{directory}/f6")
        assert cluster["n1"].served["index_unlist"] == 0 and cluster["n2"].served["index_drop"] == 1
        with pytest.raises(FileNotFoundError):
            await ns.lookup(f"{directory}/f6")
        # ... and the directory is still asked one name at a time
        cluster.reset_counts()
        for i in (8, 9, 10, 11):  # names not looked up yet (none in the short positive cache)
            assert (await ns.lookup(f"{directory}/f{i}")).node == "n3"
        assert total(cluster) == 4 and cluster["n1"].locator.lists_ahead == 1  # type: ignore[attr-defined]


@trio_test
async def test_misses_between_names_found_do_not_end_their_streak(tmp_path: Path) -> None:
    """A rename looks its new name up too: names found with misses between them still bring the
    listing (with the next lookup, here a miss), and the names after it cost no message."""
    async with open_cluster(tmp_path, lookup="index") as cluster:
        directory = files_at_n3_seen_from_n1(cluster, "/renames", 6)
        ns = cluster["n1"].namespace
        for i in range(LIST_AHEAD_AFTER):
            assert (await ns.lookup(f"{directory}/f{i}")).node == "n3"
            with pytest.raises(FileNotFoundError):
                await ns.lookup(f"{directory}/f{i}.mv")
        assert cluster["n1"].locator.lists_ahead == 1  # type: ignore[attr-defined]  # (with the last miss)
        cluster.reset_counts()
        for i in range(LIST_AHEAD_AFTER, 6):
            assert (await ns.lookup(f"{directory}/f{i}")).node == "n3"
        assert total(cluster) == 0


@trio_test(frozen_clock=True)
async def test_a_hard_linked_file_takes_its_attributes_from_its_holder(tmp_path: Path) -> None:
    """A file with several names changes through any of them, and the home of one name hears
    only of changes made through that name: its attributes come from the holder (one more
    round trip, for such files only; never from a listing), and a stale record is corrected."""
    async with open_cluster(tmp_path, lookup="index", ttl=1.0) as cluster:
        directory = found_at(homes_of(cluster), "n4", ["n3"], "/linked")
        cluster["n3"].put(f"{directory}/a", b"one inode")
        n3 = cluster["n3"].namespace
        await n3.link(f"{directory}/a", f"{directory}/b")
        ns = cluster["n1"].namespace
        cluster.reset_counts()
        assert (await ns.lookup(f"{directory}/a")).attr.nlink == 2
        assert total(cluster) == 2 and cluster["n4"].served["index_lookup"] == 1
        assert cluster["n3"].served["lookup"] == 1
        await n3.unlink(f"{directory}/b")  # a's home hears nothing of it
        await elapse(1.0)  # n1's cached location expires (attr_ttl)
        cluster.reset_counts()
        assert (await ns.lookup(f"{directory}/a")).attr.nlink == 1
        assert cluster["n3"].served["lookup"] == 1 and cluster["n4"].served["index_set"] == 1  # corrected
        await elapse(1.0)
        cluster.reset_counts()
        assert (await ns.lookup(f"{directory}/a")).attr.nlink == 1
        assert total(cluster) == 1 and cluster["n4"].served["index_lookup"] == 1  # one name again: the home


@trio_test
async def test_a_node_keeps_at_most_listings_kept_listings(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, lookup="index") as cluster:
        for i in range(3):
            cluster["n3"].put(f"/kept{i}/f", b"x")
        locator = cluster["n1"].locator
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(lookups_module, "LISTINGS_KEPT", 2)
            for i in range(3):
                assert [e.name for e in (await cluster["n1"].namespace.merged_listing(f"/kept{i}")).entries] == ["f"]
        assert sorted(locator._listings) == ["/kept1", "/kept2"]  # type: ignore[attr-defined]


@trio_test
async def test_a_big_directory_is_never_listed_ahead(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, lookup="index") as cluster:
        directory = files_at_n3_seen_from_n1(cluster, "/big", 6)
        ns = cluster["n1"].namespace
        with pytest.raises(FileNotFoundError):
            await ns.lookup(f"{directory}/warm-up")
        cluster.reset_counts()
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(lookups_module, "LIST_AHEAD_MAX", 5)
            for i in range(6):
                assert (await ns.lookup(f"{directory}/f{i}")).node == "n3"
        assert total(cluster) == 6 and cluster["n2"].served["index_list"] == 0
        assert cluster["n1"].locator.lists_ahead == 0  # type: ignore[attr-defined]


@trio_test
async def test_flood_readdir_asks_every_node(tmp_path: Path) -> None:
    """The baseline: every listing asks each other node."""
    async with open_cluster(tmp_path, lookup="flood") as cluster:
        cluster["n3"].put("/listed/x", b"x")
        cluster.reset_counts()
        await cluster["n1"].namespace.merged_listing("/listed")
        await cluster["n1"].namespace.merged_listing("/listed")
        assert total(cluster) == 6


@trio_test
async def test_verify_misses_asks_the_directorys_holders_so_a_copied_in_file_is_no_twin(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, lookup="index") as cluster:
        directory = found_at(homes_of(cluster), "n4", ["n3", "n4"], "/verified")
        cluster["n3"].put(f"{directory}/old", b"o")
        cluster["n4"].mkdir(directory)
        ns = cluster["n1"].namespace
        for path in ("copied", "fresh", "fresh-too"):
            with pytest.raises(FileNotFoundError):
                await ns.lookup(f"{directory}/{path}")
        (cluster["n3"].path(directory) / "copied").write_bytes(b"copied in")  # no scan has run yet
        # by default (until n3's next scan) the home does not know it: the create makes a twin
        handle = await ns.create(f"{directory}/copied", os.O_WRONLY | os.O_EXCL, 0o644)
        await ns.release(handle)
        assert cluster.holders(f"{directory}/copied") == ["n1", "n3"]
        index = cluster["n4"].index
        assert index is not None
        index.verify_misses = True
        handle = await ns.create(f"{directory}/fresh", os.O_WRONLY | os.O_EXCL, 0o644)
        await ns.release(handle)
        (cluster["n3"].path(directory) / "fresh-too").write_bytes(b"copied in too")
        cluster.reset_counts()
        with pytest.raises(FileExistsError):
            await ns.create(f"{directory}/fresh-too", os.O_WRONLY | os.O_EXCL, 0o644)
        # the claim at n4, and n4 asking n3 (the other node holding the directory; n4 looks itself)
        assert total(cluster) == 2 and cluster["n3"].served["lookup"] == 1
        assert cluster.holders(f"{directory}/fresh-too") == ["n3"]
        assert (await cluster["n2"].namespace.lookup(f"{directory}/fresh-too")).node == "n3"
        # a lookup miss is checked the same way: the file copied in is found at once
        (cluster["n3"].path(directory) / "seen-at-once").write_bytes(b"s")
        cluster.reset_counts()
        assert (await cluster["n2"].namespace.lookup(f"{directory}/seen-at-once")).node == "n3"
        # n4 (the home) asks n3 and n1 -- n1 holds the directory too since its creates there
        assert total(cluster) == 3 and cluster.served("lookup") == {"n1": 1, "n2": 0, "n3": 1, "n4": 0}
        cluster.reset_counts()
        with pytest.raises(FileNotFoundError) as info:
            await cluster["n2"].namespace.lookup(f"{directory}/nowhere")
        assert not isinstance(info.value, AbsentForNow) and total(cluster) == 3  # checked, then leased
        cluster.reset_counts()
        with pytest.raises(FileNotFoundError):
            await cluster["n2"].namespace.lookup(f"{directory}/nowhere")
        assert total(cluster) == 0


def fresh_index(cluster: Cluster, name: str) -> DirectoryIndex:
    """A restarted daemon's index: empty (its records and leases died with the process)."""
    node = cluster[name]
    old = node.index
    assert old is not None and old.homes is not None
    node.index = DirectoryIndex(node.pool, old.order, lease=old.lease, homes=old.homes)
    node.extra.update(node.index.operations())
    locator = node.locator
    assert isinstance(locator, IndexLocator)
    locator.index = node.index
    return node.index


@trio_test
async def test_home_killed_the_backup_at_its_site_takes_over_and_the_home_converges_after_restart(
        tmp_path: Path) -> None:
    async with open_cluster(tmp_path, lookup="index", retry_after=30.0) as cluster:
        homes = homes_of(cluster)
        directory = found_at(homes, "n4", ["n2", "n3"], "/failover")
        assert homes.backup(directory, "n4") == "n3"
        cluster["n2"].put(f"{directory}/kept", b"kept on n2")
        cluster["n3"].mkdir(directory)
        ns = cluster["n1"].namespace
        assert (await ns.lookup(f"{directory}/kept")).node == "n2"  # n1 knows the home n4
        assert cluster["n3"].index is not None
        cluster["n3"].index.backup_refresh = 60.0  # no re-listing in the middle of the counted steps
        cluster.stop("n4")  # kill -9: its port refuses, its index is gone
        fresh_index(cluster, "n4")
        await trio.sleep(0.05)
        with pytest.raises(AbsentForNow):  # the miss is answered (by the backup), not kept anywhere
            await ns.lookup(f"{directory}/missing")
        assert cluster["n3"].served["index_backup"] == 1
        cluster.reset_counts()
        with pytest.raises(AbsentForNow):
            await ns.lookup(f"{directory}/missing-too")
        assert total(cluster) == 1 and cluster["n3"].served["index_backup"] == 1  # n4 known down: straight to n3
        cluster.reset_counts()
        ns_locator = cluster["n1"].locator
        ns_locator.invalidate(f"{directory}/kept")
        assert (await ns.lookup(f"{directory}/kept")).node == "n2"
        assert total(cluster) == 1 and cluster["n3"].served["index_backup"] == 1
        cluster.reset_counts()
        handle = await ns.create(f"{directory}/made", os.O_WRONLY | os.O_EXCL, 0o644)
        await ns.write(handle, 0, b"made during the outage")
        await ns.release(handle)
        # claim and close, each one round trip to the stand-in, which tells every node of the create
        # (it cannot know whom the dead home had told "not found")
        assert cluster["n3"].served["index_backup"] == 2 and cluster["n2"].served["created"] == 1
        await ns.mkdir(f"{directory}/sub", 0o755)
        assert isinstance(ns_locator, IndexLocator) and ns_locator.fallbacks == 0
        for node in ("n2", "n3"):
            found = await cluster[node].namespace.lookup(f"{directory}/made")
            assert (found.node, found.attr.size) == ("n1", len(b"made during the outage"))
        # n4 comes back with an empty index: it lists the directory again, takes the subdirectory's
        # home from its backup, and hands out leases again
        await cluster.restart("n4")
        for node in NODES:
            cluster[node].pool.set_peers(cluster.addresses())
            cluster[node].locator.forget_all()
        await ns_locator.flush_owed()
        cluster.reset_counts()
        assert (await cluster["n2"].namespace.lookup(f"{directory}/made")).node == "n1"
        assert cluster["n4"].served["index_lookup"] >= 1 and cluster["n3"].served["index_backup"] == 0
        with pytest.raises(FileNotFoundError) as info:
            await cluster["n2"].namespace.lookup(f"{directory}/still-missing")
        assert not isinstance(info.value, AbsentForNow)  # leased again
        assert await known_home(cluster, "n2", f"{directory}/sub") == homes.of_creator(f"{directory}/sub", "n1")
        names = {e.name for e in (await cluster["n2"].namespace.merged_listing(directory)).entries}
        assert names == {"kept", "made", "sub"}


# ------------------------------------------------- DirectoryIndex alone (a fake network of one home)


async def sync(index: DirectoryIndex, directory: str, node: str, changes: list[Any]) -> None:
    """`index_sync` as a node's export scan sends it: changes as on the wire ([name, attr], [name, None])."""
    await index.op_sync(msg.IndexSync.from_wire([directory, node, changes]))


def _created(namespace: Namespace) -> Callable[[msg.Created], Awaitable[None]]:
    """The daemon's `created` operation (another node created a path), as node.control serves it."""
    async def created(request: msg.Created) -> None:
        await namespace.created_elsewhere(request.path, request.is_dir)
    return created


class OnePeer:
    """The home itself and listings it is given: enough to drive DirectoryIndex directly."""

    def __init__(self, listings: dict[str, dict[str, list[Any]]]) -> None:
        self.me = "h"
        self.listings = listings
        self.calls: list[tuple[str, str, tuple[Any, ...]]] = []

    async def call(self, node: str, op: str, *args: Any, timeout: float | None = None) -> Any:
        self.calls.append((node, op, args))
        if op in ("listdir", "index_listdir"):
            return self.listings.get(node, {}).get(args[0])
        if op == "created":
            return None
        raise OSError(errno.ENOSYS, op)

    async def ask(self, node: str, request: msg.Request[msg.R], *, timeout: float | None = None) -> msg.R:
        return request.decode(await self.call(node, request.op, *request.to_wire(), timeout=timeout))

    def is_down(self, node: str) -> bool:
        return False


def _attr(mode: int = stat.S_IFREG | 0o644, size: int = 1) -> list[int]:
    return list(Attr(mode, 1, 0, 0, size, 0, 0, 0, 0, 4096, 0, 0, 0))


@trio_test(autojump=True)
async def test_directory_index_builds_once_then_rescans() -> None:
    peer = OnePeer({"h": {"/d": [["a", _attr()]]}, "x": {"/d": [["b", _attr(stat.S_IFDIR | 0o755)]]}})
    index = DirectoryIndex(peer, ["h", "x"], lease=10.0, rescan=30.0)
    built_at = trio.current_time()
    reply = await index.op_lookup(msg.IndexLookup("/d", "a", "x"))
    assert [h[0] for h in reply.holders] == ["h"] and reply.complete
    assert (await index.op_lookup(msg.IndexLookup("/d", "nope", "x"))).lease == 10.0
    assert [c[1] for c in peer.calls].count("index_listdir") == 2  # one listing per node, once
    await elapse_until(built_at + 30.0 - 0.001)
    await index.op_lookup(msg.IndexLookup("/d", "a", None))
    assert [c[1] for c in peer.calls].count("index_listdir") == 2  # younger than `rescan`: not listed again
    await elapse_until(built_at + 30.0)
    await index.op_lookup(msg.IndexLookup("/d", "a", None))
    assert [c[1] for c in peer.calls].count("index_listdir") == 4
    assert index.statistics().builds == 2


@trio_test(autojump=True)
async def test_directory_index_revokes_only_leases_still_running() -> None:
    """A "not found" is revoked (the asker told of the create) while its lease runs, and only then."""
    peer = OnePeer({"h": {"/d": []}})
    index = DirectoryIndex(peer, ["h", "x", "y"], lease=10.0)
    assert (await index.op_lookup(msg.IndexLookup("/d", "early", "x"))).lease == 10.0
    assert (await index.op_lookup(msg.IndexLookup("/d", "late", "x"))).lease == 10.0
    leased_at = trio.current_time()
    await elapse_until(leased_at + 10.0 - 0.001)
    assert await index.op_claim(msg.IndexClaim("/d", "early", "y", False, True)) == msg.IndexClaimReply(())
    assert [(c[0], c[1], c[2][0]) for c in peer.calls if c[1] == "created"] == [("x", "created", "/d/early")]
    await elapse_until(leased_at + 10.0)  # the lease on "late" has run out: x may no longer keep it
    assert await index.op_claim(msg.IndexClaim("/d", "late", "y", False, True)) == msg.IndexClaimReply(())
    assert [c[2][0] for c in peer.calls if c[1] == "created"] == ["/d/early"]
    assert index.statistics().revocations == 1


@trio_test(autojump=True)
async def test_directory_index_sync_revokes_listings_only_when_something_shows_changed() -> None:
    """A node's export scan sends what changed in a directory whose mtime moved -- the mount's own
    creates and renames too, which the home knows already. Such a sync revokes no listing; a new
    name, a gone one, or new attributes (but not a new atime: a read) do."""
    peer = OnePeer({"h": {"/d": []}, "x": {"/d": [["a", _attr(size=1)]]}})
    index = DirectoryIndex(peer, ["h", "x", "y"], lease=10.0)

    async def unlists_after(listing: list[Any]) -> int:
        await index.op_list(msg.IndexList("/d", "y"))  # y holds a listing lease
        before = [c[1] for c in peer.calls].count("index_unlist")
        await sync(index, "/d", "x", listing)
        return [c[1] for c in peer.calls].count("index_unlist") - before

    read = _attr(size=1)
    read[5] = 123  # atime only
    assert await unlists_after([["a", _attr(size=1)]]) == 0
    assert await unlists_after([["a", read]]) == 0
    assert await unlists_after([["a", _attr(size=2)]]) == 1
    assert await unlists_after([["a", _attr(size=2)], ["b", _attr()]]) == 1
    assert await unlists_after([["a", None]]) == 1
    assert await unlists_after([["a", None]]) == 0  # gone already
    assert [e[0] for e in (await index.op_list(msg.IndexList("/d", None))).entries] == ["b"]
    await index.op_rename(msg.IndexRename("/d", "b2", "b", ["x"], False, "x"))  # recorded without b2's attributes
    assert await unlists_after([["b", None], ["b2", _attr(size=2)]]) == 0  # the mount's rename, seen by the scan
    assert (await index.op_list(msg.IndexList("/d", None))).entries == (
        msg.IndexRow("b2", (msg.IndexHolder("x", Attr(*_attr(size=2)), None),), None),)


class SlowPeer(OnePeer):
    """Listings take `seconds` (a directory of many entries on a busy node)."""

    def __init__(self, listings: dict[str, dict[str, list[Any]]], seconds: float) -> None:
        super().__init__(listings)
        self.seconds = seconds

    async def call(self, node: str, op: str, *args: Any, timeout: float | None = None) -> Any:
        if op in ("listdir", "index_listdir"):
            await trio.sleep(self.seconds)
        return await super().call(node, op, *args, timeout=timeout)


@trio_test(autojump=True)
async def test_directory_index_sync_during_a_build_is_applied_to_it_and_the_build_kept() -> None:
    """Syncs arrive every second from a node whose directory keeps changing; a build that takes
    longer than that must still be kept (thrown away, every request built again: 100k creates
    in one directory slowed to tens per second). The sync's changes apply after its listings."""
    peer = SlowPeer({"h": {"/d": [["a", _attr()]]}, "x": {"/d": [["b", _attr()], ["c", _attr()]]}}, 3.0)
    index = DirectoryIndex(peer, ["h", "x"], lease=10.0, rescan=30.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(index.op_lookup, msg.IndexLookup("/d", "a", None))  # the first build: 3 s of listing
        await trio.sleep(1.0)
        await sync(index, "/d", "x", [["d", _attr()], ["c", None]])  # listed before these changes
        await trio.sleep(1.0)
        await sync(index, "/d", "x", [["e", _attr(size=5)]])
    assert index.statistics().builds == 1
    assert sorted(e[0] for e in (await index.op_list(msg.IndexList("/d", None))).entries) == ["a", "b", "d", "e"]
    assert index.statistics().builds == 1  # kept: not listed again
    built_at = trio.current_time()
    async with trio.open_nursery() as nursery:  # a rescan's build, with the old index still there
        await elapse_until(built_at + 30.0)
        nursery.start_soon(index.op_lookup, msg.IndexLookup("/d", "a", None))
        await trio.sleep(1.0)
        await sync(index, "/d", "x", [["f", _attr()], ["b", None]])
    assert index.statistics().builds == 2
    assert sorted(e[0] for e in (await index.op_list(msg.IndexList("/d", None))).entries) == ["a", "c", "f"]
    assert index.statistics().builds == 2


@trio_test(autojump=True)
async def test_directory_index_sync_older_than_a_create_does_not_remove_it() -> None:
    """x's export scan lists the directory and finds "new" gone (or older), x creates "new" through
    its mount (claim, close), then the scan's sync arrives: the home keeps "new" as the claim and
    the close told it (a listing never beats what they told it within CLAIM_GRACE). A sync after
    that grace -- "new" deleted outside the mount -- removes it."""
    peer = OnePeer({"h": {"/d": []}, "x": {"/d": [["old", _attr(size=1)]]}})
    index = DirectoryIndex(peer, ["h", "x"], lease=10.0)
    assert await index.op_claim(msg.IndexClaim("/d", "new", "x", False, True)) == msg.IndexClaimReply(())
    await index.op_set(msg.IndexSet("/d", "new", "x", Attr(*_attr(size=7))))
    await sync(index, "/d", "x", [["new", None]])  # listed before "new" was made
    names = {e[0]: e[1][0][1][4] for e in (await index.op_list(msg.IndexList("/d", None))).entries}
    assert names == {"old": 1, "new": 7}
    await sync(index, "/d", "x", [["new", _attr(size=3)]])  # older size
    assert {e[0]: e[1][0][1][4] for e in (await index.op_list(msg.IndexList("/d", None))).entries}["new"] == 7
    await trio.sleep(CLAIM_GRACE)
    await sync(index, "/d", "x", [["new", None]])  # "new" deleted outside the mount
    assert [e[0] for e in (await index.op_list(msg.IndexList("/d", None))).entries] == ["old"]


@trio_test(mock_clock=True)
async def test_directory_index_claim_revokes_leases_and_refuses_taken_names() -> None:
    peer = OnePeer({"h": {"/d": [["a", _attr()]]}})
    index = DirectoryIndex(peer, ["h", "x", "y"], lease=10.0)
    await index.op_lookup(msg.IndexLookup("/d", "new", "x"))
    await index.op_lookup(msg.IndexLookup("/d", "new", "y"))
    assert await index.op_claim(msg.IndexClaim("/d", "new", "y", False, True)) == msg.IndexClaimReply(())
    assert [(c[0], c[1]) for c in peer.calls if c[1] == "created"] == [("x", "created")]  # not the claimer
    taken = await index.op_claim(msg.IndexClaim("/d", "a", "x", False, True))
    assert taken.holders[0].node == "h" and not taken.seeded and not taken.keep
    merged = await index.op_claim(msg.IndexClaim("/d", "a", "x", True, False))  # parent-making merges (no error)
    assert merged == msg.IndexClaimReply(())


@trio_test(mock_clock=True)
async def test_directory_index_rename_revokes_every_lease_but_the_renamers() -> None:
    """The renaming node holds the directory's lock in its kernel until the rename returns: a
    "created" sent to it would block there (0.5 s per rename, measured), and its kernel moves
    the entry itself."""
    peer = OnePeer({"h": {"/d": [["a", _attr()]]}})
    index = DirectoryIndex(peer, ["h", "x", "y"], lease=10.0)
    await index.op_lookup(msg.IndexLookup("/d", "b", "x"))
    await index.op_lookup(msg.IndexLookup("/d", "b", "y"))
    await index.op_drop(msg.IndexDrop("/d", "a", None))
    await index.op_replace(msg.IndexReplace("/d", "b", ["h"], False, "y"))
    assert [(c[0], c[1], c[2][0]) for c in peer.calls if c[1] == "created"] == [("x", "created", "/d/b")]


def test_lease_outlives_what_the_kernel_may_keep() -> None:
    assert IndexLocator.lease_for(0) == 0
    assert IndexLocator.lease_for(10.0) >= 2 * 10.0 + 1.5


def test_bad_index_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="`lease` must be non-negative"):
        DirectoryIndex(OnePeer({}), ["h"], lease=-1)
    with pytest.raises(ValueError, match="`rescan` must be non-negative"):
        DirectoryIndex(OnePeer({}), ["h"], lease=1, rescan=-1)


# ------------------------------------------- the state machine: an in-memory network of index nodes


class FakeNet:
    """Nodes' services by name; one node may be cut off: its requests, or its replies, are lost."""

    def __init__(self) -> None:
        self.services: dict[str, NodeService] = {}
        self.cut: str | None = None
        self.lose_replies = False
        self.sent: Counter[str] = Counter()


class FakePeers:
    """PeerPool's surface over FakeNet: calls another node's service directly."""

    def __init__(self, me: str, net: FakeNet) -> None:
        self.me = me
        self.net = net
        self.sessions: dict[str, rpc.Session] = {}

    async def call(self, node: str, op: str, *args: Any, timeout: float | None = None) -> Any:
        remote = node != self.me
        lost = remote and self.net.cut in (node, self.me)
        if remote:
            self.net.sent[op] += 1
        if lost and not self.net.lose_replies:
            raise PeerUnavailable(node, f"request {op} lost (test)")
        session = self.sessions.setdefault(node, rpc.Session(self.me))
        result = await self.net.services[node].dispatch(session, op, list(args))
        if lost:
            raise PeerUnavailable(node, f"reply to {op} lost (test)")
        return result

    async def ask(self, node: str, request: msg.Request[msg.R], *, timeout: float | None = None) -> msg.R:
        return request.decode(await self.call(node, request.op, *request.to_wire(), timeout=timeout))

    def is_down(self, node: str) -> bool:
        return False  # every call is tried (and may be lost)

    def close(self) -> None:
        for session in self.sessions.values():
            session.close()


TTL, NEGATIVE_TTL = 0.0, 5.0  # no positive caching (a stale positive is allowed for attr_ttl); long negatives
PATHS = ("/a", "/b", "/d", "/d/a", "/d/b", "/e", "/e/a")
FAULTS = st.one_of(st.just(None), st.just(None), st.just(None),
                   st.tuples(st.sampled_from(NODES), st.booleans()))


def _parent(path: str) -> str:
    return split_parent(path)[0]


class IndexNetwork(RuleBasedStateMachine):
    """Random namespace changes from random nodes; the model is the union namespace."""

    #: DirectoryIndex's `split_entries` (0: directories never split; see test_index_split.py)
    SPLIT_ENTRIES = 0
    OWNERS = os.environ.get("GMOUNT_SM_OWNERS", "1") != "0"  # (0: the create path without owned directories)

    def __init__(self) -> None:
        super().__init__()
        self.base = Path(tempfile.mkdtemp(prefix="gmount-index-sm-"))
        self.clock = trio.testing.MockClock(autojump_threshold=0)
        self.net = FakeNet()
        self.exports: dict[str, Export] = {}
        self.extras: dict[str, msg.Operations] = {}
        self.peers: dict[str, FakePeers] = {}
        self.indexes: dict[str, DirectoryIndex] = {}
        self.locators: dict[str, IndexLocator] = {}
        self.watchers: dict[str, ExportWatcher] = {}
        self.namespaces: dict[str, Namespace] = {}
        self.ever_held: dict[str, set[str]] = {}  # path -> every node that held it after some step
        self.straight = 0  # creates a job made straight in its export (an owned directory)
        for node in NODES:
            root = self.base / node
            root.mkdir()
            self.exports[node] = Export(str(root))
            self.extras[node] = {}  # NodeService keeps this very dict (see _start)
            info = {"node": node, "site": SITE_OF[node]}
            self.net.services[node] = NodeService(self.exports[node], info, self.extras[node])
            self._start(node)
        self.files: dict[str, bytes] = {}
        self.dirs: set[str] = set()
        self.faulty = False

    def _start(self, node: str) -> None:
        """A (re)started daemon: empty index, empty caches (the export is what survives)."""
        if node in self.peers:
            self.peers[node].close()
        peers = self.peers[node] = FakePeers(node, self.net)
        order = [node] + [n for n in NODES if n != node and SITE_OF[n] == SITE_OF[node]] + \
                [n for n in NODES if SITE_OF[n] != SITE_OF[node]]
        tiers = [(node,), tuple(order[1:2]), tuple(order[2:])]
        # rescan 0: never list again by age, so only the owed rebuilds can repair what a lost message missed
        self.indexes[node] = DirectoryIndex(peers, order, lease=IndexLocator.lease_for(NEGATIVE_TTL), rescan=0,
                                            homes=Homes(NODES, SITE_OF), split_entries=self.SPLIT_ENTRIES,
                                            owners=Owners(self.exports[node]) if self.OWNERS else None)
        self.locators[node] = IndexLocator(peers, tiers, Homes(NODES, SITE_OF), ttl=TTL, negative_ttl=NEGATIVE_TTL,
                                           index=self.indexes[node])
        self.watchers[node] = ExportWatcher(peers, Homes(NODES, SITE_OF))
        namespace = self.namespaces[node] = Namespace(node, SITE_OF, self.exports[node], peers,  # type: ignore[arg-type]
                                                      self.locators[node])
        self.extras[node].clear()
        self.extras[node].update(self.indexes[node].operations())
        self.extras[node].update(self.watchers[node].operations())
        self.extras[node].update(self.locators[node].operations())
        self.extras[node][msg.Created] = _created(namespace)

    def teardown(self) -> None:
        for peers in self.peers.values():
            peers.close()
        for export in self.exports.values():
            export.close()
        shutil.rmtree(self.base, ignore_errors=True)

    # -- running a step ---------------------------------------------------------

    def _run(self, fault: tuple[str, bool] | None, step: Any) -> Any:
        """Run one change with the fault; returns the exception it raised (None if none)."""
        self.net.cut, self.net.lose_replies = (fault if fault is not None else (None, False))
        outcome: list[BaseException | None] = [None]

        async def main() -> None:
            try:
                await step()
            except OSError as exc:
                outcome[0] = exc

        try:
            trio.run(main, clock=self.clock)
        finally:
            self.net.cut, self.net.lose_replies = None, False
        if fault is not None:
            self.faulty = True
            self._model_from_disk()  # what a lossy change did is what the disks say
        return outcome[0]

    def _expect(self, error: BaseException | None, expected: type[OSError] | None) -> None:
        if self.faulty and self.net.cut is None and error is not None and expected is None:
            return
        if expected is None:
            assert error is None, f"unexpected {error!r}"
        else:
            assert isinstance(error, expected), f"expected {expected.__name__}, got {error!r}"

    def _model_from_disk(self) -> None:
        holders, dirs = self._disk()
        self.files = {path: (self.base / nodes[0] / path.lstrip("/")).read_bytes() for path, nodes in holders.items()}
        self.dirs = dirs

    def _disk(self) -> tuple[dict[str, list[str]], set[str]]:
        holders: dict[str, list[str]] = {}
        dirs: set[str] = set()
        for node in NODES:
            root = self.base / node
            for current, subdirs, names in os.walk(root):
                rel = "/" + os.path.relpath(current, root).lstrip(".").strip("/")
                for sub in subdirs:
                    dirs.add(f"{rel.rstrip('/')}/{sub}")
                for name in names:
                    holders.setdefault(f"{rel.rstrip('/')}/{name}", []).append(node)
        return holders, dirs

    def _parent_ok(self, path: str) -> bool:
        parent = _parent(path)
        return (parent == "/" or parent in self.dirs) and parent not in self.files

    def _children(self, path: str) -> list[str]:
        return [p for p in [*self.files, *self.dirs] if p.startswith(path + "/")]

    # -- rules ------------------------------------------------------------------

    @rule(node=st.sampled_from(NODES), path=st.sampled_from(PATHS), data=st.binary(max_size=20), fault=FAULTS)
    def create(self, node: str, path: str, data: bytes, fault: tuple[str, bool] | None) -> None:
        if not self._parent_ok(path):
            return
        ns = self.namespaces[node]

        async def step() -> None:
            handle = await ns.create(path, os.O_WRONLY | os.O_EXCL, 0o644)
            try:
                await ns.write(handle, 0, data)
            finally:
                await ns.release(handle)

        exists = path in self.files or path in self.dirs
        error = self._run(fault, step)
        if fault is None:
            self._expect(error, FileExistsError if exists else None)
            if not exists:
                self.files[path] = data

    @rule(node=st.sampled_from(NODES), path=st.sampled_from(PATHS), data=st.binary(max_size=20), fault=FAULTS)
    def rewrite(self, node: str, path: str, data: bytes, fault: tuple[str, bool] | None) -> None:
        if path not in self.files:
            return
        ns = self.namespaces[node]

        async def step() -> None:
            handle = await ns.create(path, os.O_WRONLY | os.O_TRUNC, 0o644)  # opens the existing file
            try:
                await ns.write(handle, 0, data)
            finally:
                await ns.release(handle)

        error = self._run(fault, step)
        if fault is None:
            self._expect(error, None)
            self.files[path] = data

    @rule(node=st.sampled_from(NODES), path=st.sampled_from(PATHS), size=st.integers(0, 24), fault=FAULTS)
    def truncate(self, node: str, path: str, size: int, fault: tuple[str, bool] | None) -> None:
        """`truncate -s` by path: a change made on the holder and recorded at the home, which the
        node applies to its own listing of the directory (the sizes every node sees are checked)."""
        if path not in self.files:
            return
        error = self._run(fault, lambda: self.namespaces[node].setattr(path, size=size))
        if fault is None:
            self._expect(error, None)
            data = self.files[path]
            self.files[path] = data[:size] + b"\0" * (size - len(data))

    @rule(node=st.sampled_from(NODES), path=st.sampled_from(PATHS), fault=FAULTS)
    def mkdir(self, node: str, path: str, fault: tuple[str, bool] | None) -> None:
        if not self._parent_ok(path):
            return
        exists = path in self.files or path in self.dirs
        error = self._run(fault, lambda: self.namespaces[node].mkdir(path, 0o755))
        if fault is None:
            self._expect(error, FileExistsError if exists else None)
            if not exists:
                self.dirs.add(path)

    @rule(node=st.sampled_from(NODES), path=st.sampled_from(PATHS), fault=FAULTS)
    def unlink(self, node: str, path: str, fault: tuple[str, bool] | None) -> None:
        expected: type[OSError] | None = (None if path in self.files else
                                          IsADirectoryError if path in self.dirs else FileNotFoundError)
        error = self._run(fault, lambda: self.namespaces[node].unlink(path))
        if fault is None:
            self._expect(error, expected)
            self.files.pop(path, None)

    @rule(node=st.sampled_from(NODES), path=st.sampled_from(PATHS), fault=FAULTS)
    def rmdir(self, node: str, path: str, fault: tuple[str, bool] | None) -> None:
        if path not in self.dirs or self._children(path):
            return
        error = self._run(fault, lambda: self.namespaces[node].rmdir(path))
        if fault is None:
            self._expect(error, None)
            self.dirs.discard(path)

    @rule(node=st.sampled_from(NODES), src=st.sampled_from(PATHS), dst=st.sampled_from(PATHS), fault=FAULTS)
    def rename(self, node: str, src: str, dst: str, fault: tuple[str, bool] | None) -> None:
        if src == dst or not self._parent_ok(dst) or dst.startswith(src + "/") or src.startswith(dst + "/"):
            return
        file_over_file_or_new = src in self.files and dst not in self.dirs
        dir_to_new_name = src in self.dirs and dst not in self.files and dst not in self.dirs
        if not (file_over_file_or_new or dir_to_new_name):
            return
        error = self._run(fault, lambda: self.namespaces[node].rename(src, dst))
        if fault is None:
            self._expect(error, None)
            if src in self.files:
                self.files[dst] = self.files.pop(src)
            else:
                moved = [src, *self._children(src)]
                for old in moved:
                    new = dst + old[len(src):]
                    if old in self.files:
                        self.files[new] = self.files.pop(old)
                    else:
                        self.dirs.discard(old)
                        self.dirs.add(new)

    async def _job_create(self, node: str, path: str, data: bytes, pauses: int) -> bool:
        """A job on `node` makes `path` (O_CREAT | O_EXCL) as the preload library does: straight in
        the export, telling nobody, when the directory is owned there; else through the mount.
        True when it went straight to the export."""
        owners = self.indexes[node].owners

        async def pause() -> None:
            for _ in range(pauses):
                await trio.sleep(0)

        fd = None if owners is None else await create_in_owned(self.exports[node].root, owners.token, path,
                                                               os.O_WRONLY | os.O_EXCL, 0o644, pause)
        self.straight += fd is not None
        if fd is None:
            ns = self.namespaces[node]
            handle = await ns.create(path, os.O_WRONLY | os.O_EXCL, 0o644)
            try:
                await ns.write(handle, 0, data)
            finally:
                await ns.release(handle)
            return False
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        return True

    @rule(node=st.sampled_from(NODES), path=st.sampled_from(PATHS), data=st.binary(max_size=20),
          pauses=st.integers(0, 2))
    def job_create(self, node: str, path: str, data: bytes, pauses: int) -> None:
        """A job's create through the bypass: in a directory its node made (and so owns), nobody
        hears of it -- until another node asks there (the invariant's lookups: hand-off rule 1)."""
        if not self._parent_ok(path):
            return
        exists = path in self.files or path in self.dirs
        error = self._run(None, lambda: self._job_create(node, path, data, pauses))
        self._expect(error, FileExistsError if exists else None)
        if not exists:
            self.files[path] = data

    @rule(job=st.sampled_from(NODES), other=st.sampled_from(NODES), path=st.sampled_from(PATHS),
          pauses=st.integers(0, 3), looks=st.booleans())
    def race_create(self, job: str, other: str, path: str, pauses: int, looks: bool) -> None:
        """A job's create (straight into an owned directory, or through the mount) and another node's
        create of the same new name -- or its lookup -- at once: one file, never two (rule 3); a
        lookup that started after the job's create returned sees it (rule 1)."""
        if not self._parent_ok(path) or path in self.files or path in self.dirs:
            return
        outcome: dict[str, BaseException | None] = {}
        seen: list[bool] = []

        async def step() -> None:
            job_done = trio.Event()

            async def by_job() -> None:
                try:
                    await self._job_create(job, path, b"job", pauses)
                    outcome["job"] = None
                except OSError as exc:
                    outcome["job"] = exc
                job_done.set()

            async def by_other() -> None:
                ns = self.namespaces[other]
                if looks:
                    for _ in range(pauses + 1):
                        after = job_done.is_set()
                        try:
                            await ns.lookup(path)
                            seen.append(True)
                        except FileNotFoundError:
                            assert not after, f"{other} does not see {path}, made by a job on {job} before it asked"
                        await trio.sleep(0)
                    return
                try:
                    handle = await ns.create(path, os.O_WRONLY | os.O_EXCL, 0o644)
                    try:
                        await ns.write(handle, 0, b"other")
                    finally:
                        await ns.release(handle)
                    outcome["other"] = None
                except OSError as exc:
                    outcome["other"] = exc

            async with trio.open_nursery() as nursery:
                nursery.start_soon(by_job)
                nursery.start_soon(by_other)

        assert self._run(None, step) is None
        winners = [who for who, error in outcome.items() if error is None]
        assert len(winners) == 1, f"{path} by {job} (job) and {other}: {outcome}"
        for who, error in outcome.items():
            if error is not None:  # the loser: the name exists (or is being made: EAGAIN)
                assert isinstance(error, FileExistsError) or error.errno == errno.EAGAIN, (who, error)
        self.files[path] = b"job" if winners == ["job"] else b"other"

    @rule(node=st.sampled_from(NODES), directory=st.sampled_from(("/d", "/e")), other=st.sampled_from(NODES),
          pauses=st.integers(0, 3), looks=st.booleans(),
          then=st.sampled_from([None, "rewrite", "truncate", "unlink", "rename"]))
    def job_makes_its_outputs(self, node: str, directory: str, other: str, pauses: int, looks: bool,
                              then: str | None = None) -> None:
        """What a job does: make a directory, then its outputs in it -- the first one straight in
        the export (the node owns the directory: nobody asked in it yet), which the job may then
        change through the mount, still owning the directory; the second racing another node's
        create or lookup of that name. The invariant's lookups from every node then end the
        ownership, and must see every output (rule 1), each once (rule 3)."""
        if not self._parent_ok(directory) or directory in self.files or directory in self.dirs:
            return
        self.mkdir(node=node, path=directory, fault=None)
        first = f"{directory}/a"
        self.job_create(node=node, path=first, data=b"output", pauses=pauses)
        if then == "rewrite":
            self.rewrite(node=node, path=first, data=b"longer output", fault=None)
        elif then == "truncate":
            self.truncate(node=node, path=first, size=3, fault=None)
        elif then == "unlink":
            self.unlink(node=node, path=first, fault=None)
        elif then == "rename":
            self.rename(node=node, src=first, dst=f"{directory}/b", fault=None)
        self.race_create(job=node, other=other, path=f"{directory}/b", pauses=pauses, looks=looks)

    @rule(seconds=st.sampled_from([1.0, 15.0]))
    def let_time_pass(self, seconds: float) -> None:
        """The leases handed out expire: a node may own the directories it made again."""
        self.clock.jump(seconds)

    @rule(node=st.sampled_from(NODES), path=st.sampled_from(PATHS))
    def look(self, node: str, path: str) -> None:
        """A lookup in between (make checking outputs): leaves a leased "not found" behind."""
        async def step() -> None:
            await self._check_one(node, path)
        assert self._run(None, step) is None

    @rule(node=st.sampled_from(NODES), path=st.sampled_from(PATHS), data=st.binary(max_size=20))
    def write_straight_into_an_export(self, node: str, path: str, data: bytes) -> None:
        """A file copied into one node's export outside the mount (parents made there too):
        every node sees it once that node's watcher has scanned (the daemon scans every second)."""
        if not self._parent_ok(path) or path in self.files or path in self.dirs:
            return
        target = self.base / node / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)

        async def scan() -> None:
            for watcher in self.watchers.values():
                await watcher.scan()

        assert self._run(None, scan) is None
        self.files[path] = data

    @rule(node=st.sampled_from(NODES))
    def restart(self, node: str) -> None:
        """kill -9 and `gmount up`: the node's index and caches are gone; every node is told
        (set_peers) and forgets its caches and built directories, as the daemon does."""
        self._start(node)
        for other in NODES:
            self.locators[other].forget_all()
            self.indexes[other].forget_all()

    @rule(down=st.sampled_from(NODES), node=st.sampled_from(NODES), path=st.sampled_from(PATHS),
          data=st.binary(max_size=20), make_dir=st.booleans())
    def crash_for_a_while_then_restart(self, down: str, node: str, path: str, data: bytes, make_dir: bool) -> None:
        """kill -9 of a node -- a home, a backup, a holder -- for a while: a create (or mkdir) of a
        new name from another node still works (through the backup, else by asking every node),
        every lookup from it is answered (misses included) for what live nodes hold; then the node
        comes back with an empty index and caches, and everything converges (the invariant)."""
        if node == down:
            return
        holders, _ = self._disk()
        creatable = self._parent_ok(path) and path not in self.files and path not in self.dirs
        ns = self.namespaces[node]
        outcome: list[BaseException | None] = [None]

        async def outage() -> None:
            if creatable:
                try:
                    if make_dir:
                        await ns.mkdir(path, 0o755)
                    else:
                        handle = await ns.create(path, os.O_WRONLY | os.O_EXCL, 0o644)
                        try:
                            await ns.write(handle, 0, data)
                        finally:
                            await ns.release(handle)
                except OSError as exc:
                    outcome[0] = exc
            live_files = {p for p, nodes in holders.items() if any(n != down for n in nodes)}
            if creatable and outcome[0] is None and not make_dir:
                live_files.add(path)
            for other in PATHS:
                try:
                    location = await ns.lookup(other)
                except FileNotFoundError:
                    assert other not in live_files, f"{node} does not see {other} while {down} is down"
                    continue
                except OSError as exc:  # EIO: held by the node that is down, and only by it
                    assert other not in live_files, f"{node}: {other} is on a live node, yet {exc!r}"
                    continue
                if other in live_files:
                    assert location.attr.is_file, (node, other, location)

        self.net.cut, self.net.lose_replies = down, False
        try:
            trio.run(outage, clock=self.clock)
        finally:
            self.net.cut = None
        error = outcome[0]
        if isinstance(error, PeerUnavailable) and error.node == down and down in self.ever_held.get(path, ()):
            error = None  # `node` last saw the name on `down`, which cannot say it is gone: EIO, not a twin
        assert error is None, f"{node} could not make {path} (new everywhere) while {down} was down: {error!r}"
        self.restart(down)
        self.faulty = True
        self._model_from_disk()  # what the create did is what the disks say

    @rule(owner=st.sampled_from(NODES), other=st.sampled_from(NODES), directory=st.sampled_from(("/d", "/e")),
          data=st.binary(max_size=20), looked=st.booleans(), again=st.booleans())
    def owner_dies_after_a_batch(self, owner: str, other: str, directory: str, data: bytes, looked: bool,
                                 again: bool) -> None:
        """A job's output in a directory its node owns reaches the directory's backup with the next
        batch (the export's scan, then the daemon's flush every second) -- also after another node
        looked there (`looked`: the ownership ended, the names stay copied). The node then dies: from
        another node the output is there but out of reach (the node that is down, or EIO; never
        "not found"), and a create of it fails instead of making a second file; a new name is made
        (`again`). After the node comes back every node sees each output once (the invariant)."""
        if not self.OWNERS or self.SPLIT_ENTRIES or other == owner or not self._parent_ok(directory):
            return  # (split: the parent's partitions on the dead node have no stand-in, docs/directory-index.md)
        if directory in self.files or directory in self.dirs:
            return
        self.mkdir(node=owner, path=directory, fault=None)
        if not self.indexes[owner].owns(directory):
            return  # not owned (a lease of another node in it still ran): nothing is copied
        path, new = f"{directory}/a", f"{directory}/b"
        self.job_create(node=owner, path=path, data=data, pauses=0)
        if looked:
            self.look(node=other, path=new)

        async def batch() -> None:
            await self.watchers[owner].scan()
            await self.locators[owner].flush_owed()  # (as the daemon, every second)

        assert self._run(None, batch) is None
        outcome: dict[str, BaseException | None] = {}

        async def outage() -> None:
            ns = self.namespaces[other]
            try:
                location = await ns.lookup(path)
                assert location.node == owner and location.attr.is_file, (other, path, location)
            except PeerUnavailable as exc:
                assert exc.node == owner, (other, path, exc)
            try:
                handle = await ns.create(path, os.O_WRONLY | os.O_EXCL, 0o644)
                await ns.release(handle)
                outcome["create"] = None
            except OSError as exc:
                outcome["create"] = exc
            if again:
                handle = await ns.create(new, os.O_WRONLY | os.O_EXCL, 0o644)
                await ns.release(handle)

        self.net.cut, self.net.lose_replies = owner, False
        try:
            trio.run(outage, clock=self.clock)
        finally:
            self.net.cut = None
        error = outcome["create"]
        assert isinstance(error, FileExistsError) or (isinstance(error, PeerUnavailable) and error.node == owner), \
            f"{other} created {path}, held by {owner} that is down: {error!r}"
        self.restart(owner)
        self.faulty = True
        self._model_from_disk()

    # -- the check ------------------------------------------------------------------

    async def _check_one(self, node: str, path: str) -> None:
        ns = self.namespaces[node]
        try:
            location = await ns.lookup(path)
        except FileNotFoundError as exc:
            owned_here = self.indexes[node].owns(split_parent(path)[0])  # (a job may make it any moment)
            assert owned_here or not isinstance(exc, AbsentForNow), \
                f"{node}: {path}: an uncertain answer with every node up: {exc}"
            assert path not in self.files and path not in self.dirs, f"{node} does not see {path}: {exc}"
            return
        if path in self.files:
            assert location.attr.is_file and location.attr.size == len(self.files[path]), (node, path, location)
            assert await read_file(ns, path) == self.files[path]
        else:
            assert path in self.dirs and location.attr.is_dir, f"{node} sees {path} ({location}) that is gone"

    @invariant()
    def union_namespace_matches_the_model(self) -> None:
        holders, dirs = self._disk()
        for path, nodes in holders.items():
            self.ever_held.setdefault(path, set()).update(nodes)
        for path in dirs:
            self.ever_held.setdefault(path, set()).update(
                n for n in NODES if (self.base / n / path.lstrip("/")).is_dir())
        twins = {path: nodes for path, nodes in holders.items() if len(nodes) > 1}
        assert not twins, f"files on two nodes: {twins}"
        assert not set(holders) & dirs, "a name is a file on one node and a directory on another"
        assert set(holders) == set(self.files) and dirs == self.dirs, (sorted(holders), sorted(dirs),
                                                                        sorted(self.files), sorted(self.dirs))

        async def check() -> None:
            if self.faulty:  # converge: owed rebuilds reach the homes, leases given out meanwhile expire
                for locator in self.locators.values():
                    await locator.flush_owed()
                self.clock.jump(max(IndexLocator.lease_for(NEGATIVE_TTL), CLAIM_GRACE) + 1)
                self.faulty = False
            for node in NODES:
                for path in PATHS:
                    await self._check_one(node, path)

        trio.run(check, clock=self.clock)


IndexNetwork.TestCase.settings = settings(max_examples=int(os.environ.get("GMOUNT_SM_EXAMPLES", "40")),
                                          stateful_step_count=25, deadline=None,
                                          suppress_health_check=[HealthCheck.too_slow])
test_index_network_matches_the_union_namespace = IndexNetwork.TestCase


def test_index_network_rename_over_a_file_written_straight_into_the_renamers_export() -> None:
    """Found by the state machine: n1's own export holds /a (no scan told its home yet), and n1
    renames n2's /b over it while every reply to n1 is lost. The rename's target holders include
    n1's own export, and the rename lost on n2 still removes n1's /a: no twin."""
    machine = IndexNetwork()
    try:
        machine.union_namespace_matches_the_model()
        machine.write_straight_into_an_export(data=b"", node="n1", path="/a")
        machine.union_namespace_matches_the_model()
        machine.create(data=b"", fault=None, node="n2", path="/b")
        machine.union_namespace_matches_the_model()
        machine.rename(dst="/a", fault=("n1", True), node="n1", src="/b")
        machine.union_namespace_matches_the_model()
    finally:
        machine.teardown()


def test_index_network_two_creates_of_one_name_on_one_node_keep_the_winners_claim() -> None:
    """Found by the state machine: two processes of a node create /a (O_EXCL) at once through the
    mount. Their claims at the home are one; the loser's EEXIST must not withdraw it -- the
    home would forget that the node holds /a, and every other node answer "not found". (The two
    interleave differently from run to run: each node, four interleavings, twice.)"""
    for node, pauses, _ in itertools.product(NODES, range(4), range(2)):
        machine = IndexNetwork()
        try:
            machine.race_create(job=node, other=node, path="/a", pauses=pauses, looks=False)
            machine.union_namespace_matches_the_model()
        finally:
            machine.teardown()


def test_index_network_a_job_makes_its_outputs_straight_in_an_owned_directory() -> None:
    """The state machine's job: a directory made on a node, an output made straight in its export,
    a second one racing another node's create or lookup -- every node sees each output once.
    (Checks the rule reaches the owned path: the random runs do not count it.)"""
    for node, other, looks, then in itertools.product(("n1", "n3"), ("n1", "n4"), (False, True),
                                                      (None, "rewrite", "truncate", "unlink", "rename")):
        machine = IndexNetwork()
        try:
            machine.job_makes_its_outputs(node=node, directory="/d", other=other, pauses=1, looks=looks, then=then)
            assert machine.straight >= 1, "the job's first output was not made straight in the export"
            machine.union_namespace_matches_the_model()
            assert not machine.indexes[node].owns("/d")  # the other nodes' lookups ended the ownership
        finally:
            machine.teardown()


def test_index_network_a_file_rewritten_in_a_directory_owned_again_shows_its_new_size() -> None:
    """Found by the state machine: n1 owns /e again after the leases of the others ended, and
    rewrites /e/a through its mount -- the truncation is recorded at the home (n1), the close is
    told to nobody. n2's lookup ends the ownership: the export's listing, taken after that close,
    is newer than what the truncation recorded, and n2 sees the new size."""
    machine = IndexNetwork()
    try:
        machine.job_makes_its_outputs(directory="/e", looks=False, node="n1", other="n1", pauses=0)
        machine.union_namespace_matches_the_model()
        machine.let_time_pass(seconds=1.0)
        machine.union_namespace_matches_the_model()
        machine.rewrite(data=b"\x00", fault=None, node="n1", path="/e/a")
        assert machine.indexes["n1"].owns("/e")
        machine.union_namespace_matches_the_model()
    finally:
        machine.teardown()


def test_index_network_a_create_that_opens_a_file_elsewhere_leaves_no_claim_of_its_parent() -> None:
    """Found by the state machine: n1 creates /e/b, which exists on n2 only -- the claims of the
    parent /e (n1 lacks it) and of /e/b are refused or moot, and n1 makes nothing. A file copied
    into n1's export at /e/a later (the directory too) is seen everywhere after n1's scan: the
    homes did not take n1 for a holder of /e, so /e's home lists n1 when the scan reports it."""
    machine = IndexNetwork()
    try:
        machine.mkdir(node="n2", path="/e", fault=None)
        machine.create(node="n2", path="/e/b", data=b"made on n2", fault=None)
        machine.create(node="n1", path="/e/b", data=b"exists", fault=None)  # EEXIST
        machine.union_namespace_matches_the_model()
        machine.write_straight_into_an_export(data=b"", node="n1", path="/e/a")
        machine.union_namespace_matches_the_model()
    finally:
        machine.teardown()


def test_index_network_a_name_found_in_a_listing_is_remembered_for_a_claim_that_must_search() -> None:
    """Found by the state machine: n4 saw the directory /b (on n1) only in its listing of /, then
    made /b a file while every reply to it was lost -- its claim fell back to the search, which
    could ask no node. A name found in a listing is learnt like one found at its home: the search
    knows n1 held /b and says EIO, not "no such file" (a twin of a directory)."""
    machine = IndexNetwork()
    try:
        for step in (lambda: machine.look(node="n1", path="/d/a"), lambda: machine.look(node="n3", path="/a"),
                     lambda: machine.mkdir(fault=None, node="n1", path="/a"),
                     lambda: machine.look(node="n1", path="/d/b"), lambda: machine.look(node="n4", path="/d/a"),
                     lambda: machine.mkdir(fault=None, node="n4", path="/e/a"),
                     lambda: machine.mkdir(fault=("n1", False), node="n4", path="/e"),
                     lambda: machine.look(node="n2", path="/d/a"), lambda: machine.look(node="n4", path="/d"),
                     lambda: machine.look(node="n4", path="/d/a"),
                     lambda: machine.mkdir(fault=None, node="n1", path="/d/a"),
                     lambda: machine.create(data=b"x" * 8, fault=("n4", False), node="n2", path="/d/a"),
                     lambda: machine.mkdir(fault=None, node="n4", path="/e/a"),
                     lambda: machine.mkdir(fault=("n3", False), node="n1", path="/b"),
                     lambda: machine.create(data=b"y", fault=("n4", True), node="n4", path="/b")):
            step()
            machine.union_namespace_matches_the_model()
    finally:
        machine.teardown()


def test_index_network_a_truncate_whose_reply_was_lost_is_listed_again() -> None:
    """Found by the state machine: n3 truncated n4's /b, and n4's reply was lost (the truncate was
    made, n3 cannot know). Its home lists the directory again, as after any change whose outcome
    is unsure; before, every node kept seeing the old size (a scan sees names, not sizes)."""
    machine = IndexNetwork()
    try:
        machine.union_namespace_matches_the_model()
        machine.write_straight_into_an_export(data=b"12345", node="n4", path="/b")
        machine.union_namespace_matches_the_model()
        machine.truncate(fault=("n4", True), node="n3", path="/b", size=8)
        machine.union_namespace_matches_the_model()
    finally:
        machine.teardown()


def test_index_network_a_directory_renamed_into_a_directory_its_holder_lacked_is_renamed_with_it() -> None:
    """Found by the state machine: n2 holds /a, n1 holds /d; n1 renames /a to /d/a, which makes /d
    on n2 -- recorded at the root's home as n2's too (before, the home never heard of n2's /d),
    so renaming /d to /a then moves n2's /d and /d/a as well as n1's /d."""
    machine = IndexNetwork()
    try:
        for step in (lambda: machine.mkdir(node="n2", path="/a", fault=None),
                     lambda: machine.mkdir(node="n1", path="/a", fault=None),  # EEXIST: n2 has it
                     lambda: machine.mkdir(node="n1", path="/d", fault=None),
                     lambda: machine.rename(node="n1", src="/a", dst="/d/a", fault=None),
                     lambda: machine.rename(node="n1", src="/d", dst="/a", fault=None)):
            step()
            machine.union_namespace_matches_the_model()
    finally:
        machine.teardown()


def test_index_network_create_after_a_removal_the_creator_never_heard_of() -> None:
    """Found by the state machine: n2 saw /a on n1, n1 removed it (only its home n1 heard), then
    n1 died. n2 cannot tell "removed" from "out of reach": its create is EIO, never a twin."""
    machine = IndexNetwork()
    try:
        machine.mkdir(node="n1", path="/a", fault=None)
        machine.union_namespace_matches_the_model()
        machine.rmdir(node="n1", path="/a", fault=None)
        machine.union_namespace_matches_the_model()
        machine.crash_for_a_while_then_restart(down="n1", node="n2", path="/a", data=b"", make_dir=False)
        machine.union_namespace_matches_the_model()
    finally:
        machine.teardown()


# ------------------------------------------------------------- real mounts, lookup = "index"

INDEX_TUNING = 'attr_ttl = 2.0\nnegative_ttl = 10.0\nrpc_timeout = 1.5\nconnect_timeout = 1.0\nlookup = "index"'


@pytest.fixture(scope="module")
def mounted(tmp_path_factory: pytest.TempPathFactory) -> Any:
    require("FUSE", fuse_problem())
    base = tmp_path_factory.mktemp("index-mounts")
    with local_cluster(base, f"ix-{os.getpid()}", FOUR_NODES, FOUR_NODE_LINKS, INDEX_TUNING) as running:
        yield running


def sent_by(after: dict[str, dict[str, int]], before: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """Messages each node sent between two counter snapshots, by operation (nodes that sent none left out)."""
    result: dict[str, dict[str, int]] = {}
    for node, row in after.items():
        ops = {key.split(".", 1)[1]: value - before[node].get(key, 0) for key, value in row.items()
               if key.startswith("messages.") and value != before[node].get(key, 0)
               and key not in ("messages.index_sync", "messages.index_owned")}  # background: a scan of the
        # export, a batch of an owned directory's names to its backup -- not part of any operation
        if ops:
            result[node] = ops
    return result


def _write(cluster: LocalCluster, node: str, rel: str, data: bytes) -> None:
    with open(cluster.mount(node) / rel, "wb") as f:
        f.write(data)


def _settled(api: ApiCluster, quiet: float = 0.5, timeout: float = 10.0) -> dict[str, dict[str, int]]:
    """The counters once no node has sent anything for `quiet` seconds.

    close(2) returns before the kernel sends RELEASE, and the new size reaches the
    home (`index_set`, which revokes listing leases) at release: on a loaded machine
    that can land after the next step of a test began, and be counted there.
    """
    def sending(counters: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
        # requests_served counts this very poll: it never settles
        return {node: {k: v for k, v in row.items() if k != "requests_served"} for node, row in counters.items()}

    deadline = time.monotonic() + timeout
    last = api.counters()
    while time.monotonic() < deadline:
        time.sleep(quiet)
        now = api.counters()
        if sending(now) == sending(last):
            return now
        last = now
    raise AssertionError(f"the nodes kept sending messages for {timeout} s: {last}")


def test_mount_lookup_mode_is_index(mounted: LocalCluster) -> None:
    assert mounted.spec.tuning.lookup == "index"
    counters = ApiCluster.open(mounted.spec.name).counters()
    assert set(counters) == set(NODES) and all("messages_sent" in row for row in counters.values())


def test_mount_create_after_a_miss_is_visible_at_once(mounted: LocalCluster) -> None:
    top = f"miss-then-create-{uuid.uuid4().hex[:8]}"
    (mounted.mount("n1") / top).mkdir()
    invisible = []
    for i in range(40):
        consumer, producer = (("n1", "n3"), ("n4", "n2"), ("n2", "n4"), ("n3", "n1"))[i % 4]
        rel = f"{top}/out-{i}"
        assert not (mounted.mount(consumer) / rel).exists()  # the kernel and the daemon keep "absent"
        _write(mounted, producer, rel, f"output {i}".encode())
        try:
            if (mounted.mount(consumer) / rel).read_bytes() != f"output {i}".encode():
                invisible.append(f"{i}: wrong bytes")
        except FileNotFoundError:
            invisible.append(f"{i}: {producer}->{consumer} ENOENT")
    assert invisible == []


def test_mount_rotating_writers_make_no_twins(mounted: LocalCluster) -> None:
    rel = f"rotating-{uuid.uuid4().hex[:8]}"
    for node in NODES:
        assert not (mounted.mount(node) / rel).exists()
    wrong = []
    for i in range(40):
        writer, reader = NODES[i % 4], NODES[(i + 2) % 4]
        _write(mounted, writer, rel, f"version {i}".encode())
        got = (mounted.mount(reader) / rel).read_bytes()
        if got != f"version {i}".encode():
            wrong.append(f"{i}: {writer}->{reader}: {got!r}")
    assert wrong == []
    assert [n for n in NODES if (mounted.export(n) / rel).exists()] == ["n1"]  # the first writer's file
    with pytest.raises(FileExistsError):
        os.open(mounted.mount("n3") / rel, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)


def test_mount_miss_remote_hit_and_create_cost_at_most_one_message(mounted: LocalCluster) -> None:
    directory = f"/counted-{uuid.uuid4().hex[:6]}"
    (mounted.mount("n2") / directory.lstrip("/")).mkdir()  # homed at its maker n2
    top = mounted.mount("n1") / directory.lstrip("/")
    _write(mounted, "n3", f"{directory.lstrip('/')}/far", b"held by n3")
    assert not (top / "warm-up").exists()

    api = ApiCluster.open(mounted.spec.name)
    before = api.counters()
    assert not (top / "missing").exists()
    after_miss = api.counters()
    assert sent_by(after_miss, before) == {"n1": {"index_lookup": 1}}  # one request, to the home n2
    assert not (top / "missing").exists()  # again: the kernel's negative entry (leased), nothing sent
    assert sent_by(api.counters(), after_miss) == {}

    hit = api.counters()
    assert (top / "far").stat().st_size == len(b"held by n3")
    assert sent_by(api.counters(), hit) == {"n1": {"index_lookup": 1}}

    counted = api.counters()
    fd = os.open(top / "new", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    created = api.counters()
    try:
        os.write(fd, b"stays on n1")
    finally:
        os.close(fd)
    closed = api.counters()
    # the kernel's LOOKUP (a miss: one request to the home) then CREATE (the claim at the home)
    assert sent_by(created, counted) == {"n1": {"index_lookup": 1, "index_claim": 1}}
    assert sent_by(closed, created) == {"n1": {"index_set": 1}}  # the new size, to the home
    assert [n for n in NODES if (mounted.export(n) / directory.lstrip("/") / "new").exists()] == ["n1"]
    assert (mounted.mount("n4") / directory.lstrip("/") / "new").read_bytes() == b"stays on n1"


def test_mount_stats_of_many_remote_files_in_one_directory_list_it_once(mounted: LocalCluster) -> None:
    """stat(2) of 12 files n3 holds, through n1's mount: LIST_AHEAD_AFTER lookups one name at a
    time, the next one brings the listing, the rest cost nothing. A file n4 makes in the
    directory revokes n1's listing (the home tells n1 before n4's create returns)."""
    rel = f"stats-{uuid.uuid4().hex[:6]}"
    (mounted.mount("n2") / rel).mkdir()  # homed at its maker n2
    top = mounted.mount("n1") / rel
    for i in range(12):
        _write(mounted, "n3", f"{rel}/f{i}", b"x" * i)
    assert top.is_dir()  # (n1 learns the directory itself, made on n2, before the count)
    api = ApiCluster.open(mounted.spec.name)
    before = _settled(api)
    assert [(top / f"f{i}").stat().st_size for i in range(12)] == list(range(12))
    listed = api.counters()
    assert sent_by(listed, before) == {"n1": {"index_lookup": LIST_AHEAD_AFTER + 1}}
    (mounted.mount("n4") / rel / "new").write_bytes(b"made on n4")
    assert sent_by(api.counters(), listed)["n2"] == {"index_unlist": 1}
    assert (top / "new").read_bytes() == b"made on n4"


def test_mount_rescan_makes_a_file_copied_into_an_export_visible_everywhere_at_once(mounted: LocalCluster) -> None:
    """Files copied straight into an export reach the home at the node's next scan (here every
    2 s); `Cluster.rescan` / `gmount rescan` tells the homes now, so the next lookup anywhere
    finds them."""
    rel = f"rescan-{uuid.uuid4().hex[:6]}"
    (mounted.mount("n2") / rel).mkdir()  # homed at its maker n2
    _write(mounted, "n3", f"{rel}/through-the-mount", b"n3 holds the directory now")
    api = ApiCluster.open(mounted.spec.name)
    assert sorted(api.rescan()) == sorted(NODES)
    assert not (mounted.mount("n1") / rel / "copied-0").exists()  # a leased "not found" at n1
    for i in range(3):
        (mounted.export("n3") / rel / f"copied-{i}").write_bytes(b"copied in")
        if i < 2:
            assert set(api.rescan(["n3"])) == {"n3"}
        else:  # the same through the command line
            done = subprocess.run([sys.executable, "-m", "gmountpy", "rescan", str(Path(mounted.base, "cluster.toml")),
                                   "--node", "n3", "--json"], capture_output=True, text=True, timeout=60)
            assert done.returncode == 0 and set(json.loads(done.stdout)) == {"n3"}, done.stderr
        assert (mounted.mount("n1") / rel / f"copied-{i}").read_bytes() == b"copied in"
        assert (mounted.mount("n4") / rel / f"copied-{i}").read_bytes() == b"copied in"
    with pytest.raises(GmountError, match="no node 'n9'"):
        api.rescan(["n9"])


def test_mount_rename_costs_three_messages_to_the_home(mounted: LocalCluster) -> None:
    """rename(2) of a file n1 holds, in a directory homed at n2: the kernel's lookup of the
    target (a miss, leased), the lookup of the source's holders, then the drop of the old name
    and the new name's holders at the home, in one message. The target's holders come from
    the lease, not from a second lookup."""
    directory = f"/renamed-{uuid.uuid4().hex[:6]}"
    (mounted.mount("n2") / directory.lstrip("/")).mkdir()  # homed at its maker n2
    top = mounted.mount("n1") / directory.lstrip("/")
    (top / "a").write_bytes(b"on n1")
    api = ApiCluster.open(mounted.spec.name)
    before = _settled(api)
    (top / "a").rename(top / "b")
    assert sent_by(api.counters(), before) == {"n1": {"index_lookup": 2, "index_rename": 1}}
    assert (mounted.mount("n3") / directory.lstrip("/") / "b").read_bytes() == b"on n1"
    assert not (mounted.mount("n4") / directory.lstrip("/") / "a").exists()


def _sites(cluster: LocalCluster) -> Homes:
    return Homes(tuple(cluster.spec.nodes), {n: s.site for n, s in cluster.spec.nodes.items()})


def test_mount_readdir_is_one_message_to_the_home_then_none_under_the_lease(mounted: LocalCluster) -> None:
    rel = f"listed-{uuid.uuid4().hex[:6]}"
    (mounted.mount("n2") / rel).mkdir()  # homed at its maker n2
    for node in NODES:
        _write(mounted, node, f"{rel}/from-{node}", node.encode())
    expected = sorted(f"from-{node}" for node in NODES)
    api = ApiCluster.open(mounted.spec.name)
    _settled(api)  # the writes' releases have reached the home
    assert sorted(os.listdir(mounted.mount("n3") / rel)) == expected  # n3 learns the home (another site)
    before = api.counters()
    assert sorted(os.listdir(mounted.mount("n1") / rel)) == expected
    after = api.counters()
    assert sent_by(after, before) == {"n1": {"index_list": 1}}  # the whole listing from the home n2
    # again, within the listing lease (about a second): nothing is sent. Under a loaded machine
    # the lease may run out between two listings, so a few tries are allowed.
    quiet = []
    for _ in range(5):
        start = api.counters()
        assert sorted(os.listdir(mounted.mount("n1") / rel)) == expected
        quiet.append(sent_by(api.counters(), start))
        if quiet[-1] == {}:
            break
    assert quiet[-1] == {}, quiet
    # a create elsewhere revokes the lease at once: the next listing shows it
    _write(mounted, "n4", f"{rel}/late", b"late")
    assert "late" in os.listdir(mounted.mount("n1") / rel)


def test_mount_directory_made_through_a_mount_is_homed_at_its_creator(mounted: LocalCluster) -> None:
    rel = f"own-{uuid.uuid4().hex[:6]}"  # homed at n1, its maker
    (mounted.mount("n1") / rel).mkdir()
    api = ApiCluster.open(mounted.spec.name)
    before = api.counters()
    assert not (mounted.mount("n1") / rel / "missing").exists()
    _write(mounted, "n1", f"{rel}/made-here", b"x")  # lookup, claim, closing size: all at home, here
    assert sorted(os.listdir(mounted.mount("n1") / rel)) == ["made-here"]
    assert sent_by(api.counters(), before) == {}  # a site's own directory: no message at all
    # a site-mate learns the home once, then a miss is one intra-site message to n1
    assert not (mounted.mount("n2") / rel / "first").exists()
    again = api.counters()
    assert not (mounted.mount("n2") / rel / "second").exists()
    assert sent_by(api.counters(), again) == {"n2": {"index_lookup": 1}}


INDEX_KILL_TUNING = INDEX_TUNING + "\nindex_rescan = 30.0"


def test_mount_home_killed_backup_takes_over_and_the_home_converges_after_restart(tmp_path: Path) -> None:
    """kill -9 of a directory's home daemon (2 sites x 2 nodes): its backup at the same site
    answers lookups, misses and creates from both sites; after `gmount up` restarts it, every
    node sees everything through the home again."""
    require("FUSE", fuse_problem())
    with local_cluster(tmp_path, f"ixkill-{os.getpid()}", FOUR_NODES, FOUR_NODE_LINKS, INDEX_KILL_TUNING) as cluster:
        directory = "/work"  # homed at its maker n2; its backup is n1
        assert _sites(cluster).backup(directory, "n2") == "n1"
        rel = directory.lstrip("/")
        (cluster.mount("n2") / rel).mkdir()
        _write(cluster, "n1", f"{rel}/a", b"from n1")
        _write(cluster, "n3", f"{rel}/b", b"from n3")
        assert sorted(os.listdir(cluster.mount("n4") / rel)) == ["a", "b"]
        os.kill(cluster.state.nodes["n2"].pid, signal.SIGKILL)
        for node in ("n1", "n3", "n4"):
            assert (cluster.mount(node) / rel / "b").read_bytes() == b"from n3"
            assert (cluster.mount(node) / rel / "a").read_bytes() == b"from n1"
            assert not (cluster.mount(node) / rel / f"missing-{node}").exists()  # answered, not EIO
        _write(cluster, "n4", f"{rel}/c", b"made while n2 was down")
        _write(cluster, "n1", f"{rel}/d", b"also")
        for node in ("n1", "n3", "n4"):  # hand-off rule 1 holds through the stand-in
            assert (cluster.mount(node) / rel / "c").read_bytes() == b"made while n2 was down"
            assert sorted(os.listdir(cluster.mount(node) / rel)) == ["a", "b", "c", "d"]
        launch.up(cluster.spec)  # n2 comes back, its index empty
        assert wait_for(lambda: os.path.isdir(cluster.mount("n2") / rel), timeout=10)
        for node in NODES:
            assert sorted(os.listdir(cluster.mount(node) / rel)) == ["a", "b", "c", "d"]
            assert (cluster.mount(node) / rel / "c").read_bytes() == b"made while n2 was down"
        api = ApiCluster.open(cluster.spec.name)
        counters = api.counters()
        assert sum(row.get("messages.index_backup", 0) for row in counters.values()) > 0  # the stand-in served
        before = api.counters()
        assert not (cluster.mount("n3") / rel / "missing-after").exists()
        _write(cluster, "n3", f"{rel}/e", b"after")
        assert (cluster.mount("n1") / rel / "e").read_bytes() == b"after"
        sent = sent_by(api.counters(), before)
        assert all("index_backup" not in ops for ops in sent.values()), sent  # the home answers again
