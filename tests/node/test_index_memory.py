"""A home holds what it still promises and what is in use: ended leases go, idle indexes go.

make's implicit-rule probes ask for thousands of names that exist nowhere; every one is a
"not found" a home leases. Those leases end within seconds, and a directory's index is
soft state: neither may pile up for the life of the daemon.
"""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import pytest

from gmountpy.node.index import DirectoryIndex, IndexLocator
from gmountpy.protocol import messages as msg

from .._trio import elapse, trio_test
from .harness import Cluster, open_cluster
from .test_index import found_at, homes_of

MISSES = 20_000
#: How long a home leases a "not found" in the harness (its negative_ttl is 60 s).
LEASE = IndexLocator.lease_for(60.0)


def index_of(cluster: Cluster, node: str) -> DirectoryIndex:
    index = cluster[node].index
    assert index is not None
    return index




@trio_test(frozen_clock=True, timeout=120.0)
async def test_a_home_forgets_the_misses_it_leased_once_the_leases_end(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, lookup="index") as cluster:
        directory = found_at(homes_of(cluster), "n2", ["n1", "n3"])
        cluster["n3"].put(f"{directory}/there", b"x")
        cluster["n1"].mkdir(directory)
        home = index_of(cluster, "n2")
        serve = home.operations()[msg.IndexLookup]

        async def lookup(directory: str, name: str, asker: str) -> msg.IndexLookupReply:
            reply: msg.IndexLookupReply = await serve(msg.IndexLookup(directory, name, asker))
            return reply

        assert (await lookup(directory, "there", "n1")).holders  # built: every node listed once
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for i in range(MISSES):  # as n1's make would ask, name after name
                assert (await lookup(directory, f"probe{i}.c", "n1")).lease > 0
            held = tracemalloc.get_traced_memory()[0] - before
            await elapse(LEASE + 1)
            assert (await lookup(directory, "there", "n1")).holders  # the next request finds them ended
            left = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert held > 100 * MISSES  # what the leases cost while they last (~390 B each)
        # what is left is the index built again and the sockets of that build (~0.2 MB), whatever MISSES
        assert left < held // 5, f"the home still holds {left} of the {held} B its ended leases took"


@trio_test(frozen_clock=True, timeout=60.0)
async def test_misses_over_the_wire_leave_no_lease_behind(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, lookup="index") as cluster:
        directory = found_at(homes_of(cluster), "n2", ["n1", "n3"])
        cluster["n1"].mkdir(directory)
        ns = cluster["n1"].namespace
        for i in range(300):
            with pytest.raises(FileNotFoundError):
                await ns.lookup(f"{directory}/probe{i}.c")
        home = index_of(cluster, "n2")
        assert home.statistics().leases >= 300
        await elapse(LEASE + 1)
        with pytest.raises(FileNotFoundError):
            await ns.lookup(f"{directory}/after")
        assert home.statistics().leases == 1  # the one just handed out


@trio_test(frozen_clock=True, timeout=60.0)
async def test_an_idle_index_is_let_go_and_built_again_with_the_right_answers(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, lookup="index") as cluster:
        directory = found_at(homes_of(cluster), "n2", ["n1", "n3"])
        cluster["n3"].put(f"{directory}/far", b"far")
        cluster["n1"].put(f"{directory}/near", b"near")
        other = found_at(homes_of(cluster), "n2", ["n1", "n3"], prefix="/other")
        cluster["n1"].mkdir(other)
        n1, n4 = cluster["n1"].namespace, cluster["n4"].namespace
        assert (await n1.lookup(f"{directory}/far")).node == "n3"
        with pytest.raises(FileNotFoundError):
            await n1.lookup(f"{directory}/none")
        home = index_of(cluster, "n2")
        built, builds = home.statistics().directories, home.statistics().builds
        await elapse(LEASE + 1)  # its leases ended, nobody asked since (longer than keep_idle: 120 s)
        with pytest.raises(FileNotFoundError):
            await n1.lookup(f"{other}/none")  # any request to the home lets idle indexes go
        assert home.statistics().directories < built + 1  # `other` came, `directory` went
        assert (await n4.lookup(f"{directory}/far")).node == "n3"
        assert (await n4.lookup(f"{directory}/near")).node == "n1"
        with pytest.raises(FileNotFoundError):
            await n4.lookup(f"{directory}/none")
        assert home.statistics().builds >= builds + 2  # `other`, and `directory` again
        handle = await cluster["n3"].namespace.create(f"{directory}/none", os.O_WRONLY, 0o644)
        await cluster["n3"].namespace.release(handle)
        assert (await n4.lookup(f"{directory}/none")).node == "n3"  # n4's "not found" was revoked


@trio_test(frozen_clock=True, timeout=60.0)
async def test_an_index_whose_not_found_is_still_leased_is_kept(tmp_path: Path) -> None:
    """The index is what tells a home that a file copied straight into an export is new: the
    "not found" it leased for that name must be revoked, so it stays while such a lease lives."""
    async with open_cluster(tmp_path, lookup="index") as cluster:
        directory = found_at(homes_of(cluster), "n2", ["n1", "n3"])
        cluster["n1"].mkdir(directory)
        cluster["n3"].mkdir(directory)
        other = found_at(homes_of(cluster), "n2", ["n1", "n3"], prefix="/other")
        cluster["n1"].mkdir(other)
        n1 = cluster["n1"].namespace
        with pytest.raises(FileNotFoundError):
            await n1.lookup(f"{directory}/late")  # leased to n1 for LEASE seconds
        home = index_of(cluster, "n2")
        home.keep_idle = 1.0
        await elapse(10.0)
        with pytest.raises(FileNotFoundError):
            await n1.lookup(f"{other}/none")  # the home sweeps: `directory` is idle, but leased
        cluster["n3"].path(f"{directory}/late").write_bytes(b"copied in")  # outside the mount
        watcher = cluster["n3"].watcher
        assert watcher is not None and await watcher.scan() == 1
        assert (await n1.lookup(f"{directory}/late")).node == "n3"  # revoked: the home saw it was new
        assert home.statistics().evictions == 0


@trio_test(frozen_clock=True, timeout=60.0)
async def test_a_subdirectory_removed_after_its_parents_index_went_loses_its_home(tmp_path: Path) -> None:
    """The homes of subdirectories outlive their parent's index: a removal the home hears of
    while that index is let go still revokes the removed one's home wherever it was told."""
    async with open_cluster(tmp_path, lookup="index") as cluster:
        parent = found_at(homes_of(cluster), "n2", ["n1", "n3"])
        cluster["n3"].mkdir(f"{parent}/sub")
        cluster["n1"].mkdir(parent)
        other = found_at(homes_of(cluster), "n2", ["n1", "n3"], prefix="/other")
        cluster["n1"].mkdir(other)
        n1 = cluster["n1"].namespace
        with pytest.raises(FileNotFoundError):
            await n1.lookup(f"{parent}/sub/none")  # n1 learns the home of `sub`, leased for minutes
        locator = cluster["n1"].locator
        assert isinstance(locator, IndexLocator) and f"{parent}/sub" in locator._homes
        home = index_of(cluster, "n2")
        home.keep_idle = 1.0
        await elapse(LEASE + 1)  # the "not found" ended; the home lease has not
        with pytest.raises(FileNotFoundError):
            await n1.lookup(f"{other}/none")
        assert home.statistics().evictions >= 1
        os.rmdir(cluster["n3"].path(f"{parent}/sub"))
        await home.operations()[msg.IndexDrop](msg.IndexDrop(parent, "sub", ["n3"], "n3"))  # as n3's rmdir records it
        assert f"{parent}/sub" not in locator._homes  # revoked: a new `sub` may be homed elsewhere
