"""Giga+ splitting of large directories' indexes (issue 13): the partition map, messages per
operation in a split directory, stale maps corrected by redirects, the state machine with a tiny
split threshold, and real mounts whose one big directory spreads over several partition servers."""

from __future__ import annotations

import os
import threading
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
import trio
from hypothesis import HealthCheck, given, settings

from gmountpy.node.index import Homes, IndexLocator, name_hash, partition_depth, partition_of
from gmountpy.protocol import client
from gmountpy.protocol import messages as msg

from .._trio import trio_test
from ..conftest import FOUR_NODE_LINKS, FOUR_NODES, fuse_problem, local_cluster, require
from .harness import Cluster, open_cluster
from .test_index import NODES, IndexNetwork, total

# ------------------------------------------------------------------ the partition map


@given(st.lists(st.integers(min_value=0, max_value=40), max_size=30), st.lists(st.integers(min_value=0), max_size=50))
def test_every_name_maps_to_the_one_partition_whose_hash_class_holds_it(picks: list[int], hashes: list[int]) -> None:
    """Split random partitions (as their servers do) and check Giga+'s mapping against each
    partition's class: partition i at depth d holds the hashes h with h mod 2**d == i."""
    depths = {0: 0}
    for pick in picks:
        partition = sorted(depths)[pick % len(depths)]
        depth = depths[partition]
        new = partition + (1 << depth)
        if new >= 1 << 12:
            continue
        depths[partition] = depths[new] = depth + 1
    bitmap = set(depths)
    for partition, depth in depths.items():
        assert partition_depth(partition, bitmap) == depth
    for hashed in hashes:
        owners = [p for p, d in depths.items() if hashed & ((1 << d) - 1) == p]
        assert owners == [partition_of(hashed, bitmap)]


def test_partition_servers_spread_and_name_hash_is_stable() -> None:
    homes = Homes(NODES, {"n1": "a", "n2": "a", "n3": "b", "n4": "b"})
    servers = Counter(homes.of_partition("/big", p) for p in range(1, 65))
    assert set(servers) == set(NODES)
    assert name_hash("out-1.fits") == name_hash("out-1.fits") != name_hash("out-2.fits")
    assert partition_of(5, set()) == partition_of(5, {0}) == 0


# ------------------------------------------------- messages per operation (4 nodes over RPC)

SPLIT = 8


def _index_stats(cluster: Cluster) -> dict[str, dict[str, int]]:
    stats = {}
    for name, node in cluster.nodes.items():
        assert node.index is not None
        s = node.index.statistics()
        stats[name] = {"partitions": s.partitions, "entries": s.partition_entries, "splits": s.splits}
    return stats


async def _fill(cluster: Cluster, directory: str, count: int) -> list[str]:
    ns = cluster["n1"].namespace
    await ns.mkdir(directory, 0o755)
    names = [f"f{i:03d}" for i in range(count)]
    for name in names:
        handle = await ns.create(f"{directory}/{name}", os.O_WRONLY | os.O_EXCL, 0o644)
        await ns.write(handle, 0, name.encode())
        await ns.release(handle)
    return names


def _locator(cluster: Cluster, node: str) -> IndexLocator:
    locator = cluster[node].locator
    assert isinstance(locator, IndexLocator)
    return locator


@trio_test
async def test_a_big_directory_splits_over_several_servers_and_a_current_map_costs_one_round_trip(
        tmp_path: Path) -> None:
    async with open_cluster(tmp_path, lookup="index", split_entries=SPLIT) as cluster:
        names = await _fill(cluster, "/big", 60)
        stats = _index_stats(cluster)
        assert sum(row["entries"] for row in stats.values()) == 60  # every name in exactly one partition
        assert sum(row["splits"] for row in stats.values()) >= 60 // SPLIT - 1
        assert len([n for n, row in stats.items() if row["partitions"]]) >= 2  # more than one server
        assert all(row["entries"] <= SPLIT * row["partitions"] for row in stats.values())
        # a reader on another site: listing merges every partition (one round trip per server)
        reader = cluster["n3"].namespace
        listed = await reader.merged_listing("/big")
        assert sorted(e.name for e in listed.entries) == names
        bitmap = _locator(cluster, "n3")._parts["/big"]
        homes = _locator(cluster, "n3").homes
        for name in names:  # with the map current: one round trip to the name's partition server
            cluster.reset_counts()
            location = await _locator(cluster, "n3").find(f"/big/{name}", fresh=True)  # past the caches
            assert location is not None and (location.node, location.attr.size) == ("n1", len(name))
            partition = partition_of(name_hash(name), bitmap)
            home = await _locator(cluster, "n3").home_of("/big")
            server = home if partition == 0 else homes.of_partition("/big", partition)
            assert total(cluster) == (0 if server == "n3" else 1), name
        # a miss is one round trip too (a leased "not found" from the name's partition)
        cluster.reset_counts()
        with pytest.raises(FileNotFoundError):
            await reader.lookup("/big/nothing-here")
        assert total(cluster) <= 1


@trio_test
async def test_a_stale_map_is_redirected_then_correct(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, lookup="index", split_entries=SPLIT) as cluster:
        names = await _fill(cluster, "/big", 60)
        n4 = _locator(cluster, "n4")
        assert await n4.home_of("/big") is not None  # knows the home, not the partitions
        assert "/big" not in n4._parts
        # a name the home does not serve: home (ESTALE), home (its map), the server: 3 round trips
        home = await n4.home_of("/big")
        full = {p for index in (cluster[n].index for n in NODES) if index is not None
                for d, parts in index._parts.items() if d == "/big" for p in parts.bitmap}
        far = next(n for n in names if partition_of(name_hash(n), full) != 0
                   and n4.homes.of_partition("/big", partition_of(name_hash(n), full)) not in ("n4", home))
        cluster.reset_counts()
        assert (await cluster["n4"].namespace.lookup(f"/big/{far}")).node == "n1"
        assert 1 < total(cluster) <= 3 and n4.redirects >= 1
        assert n4._parts["/big"] >= {0} and partition_of(name_hash(far), n4._parts["/big"]) == \
            partition_of(name_hash(far), full)
        # an old map (the first split only): redirected by the servers that split since, then right
        n4._parts["/big"] = frozenset({0, 1})
        before = n4.redirects
        for name in names:
            assert (await cluster["n4"].namespace.lookup(f"/big/{name}")).attr.size == len(name)
        assert n4.redirects > before
        cluster.reset_counts()
        corrected = n4.redirects
        for name in names:  # corrected: one round trip each (none for partitions n4 serves itself)
            await n4.find(f"/big/{name}", fresh=True)
        assert total(cluster) <= len(names) and n4.redirects == corrected


@trio_test
async def test_a_rename_across_partitions_served_apart_falls_back_to_drop_and_replace(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rename within one directory is one message (index_rename) when one node serves both
    names; with a map too old to tell, the server refuses it (EXDEV) and the renamer sends the
    drop and the replace to their own partitions."""
    async with open_cluster(tmp_path, lookup="index", split_entries=SPLIT) as cluster:
        names = await _fill(cluster, "/big", 60)
        n4 = _locator(cluster, "n4")
        home = await n4.home_of("/big")
        assert home is not None
        full = {p for index in (cluster[n].index for n in NODES) if index is not None
                for d, parts in index._parts.items() if d == "/big" for p in parts.bitmap}

        def server(name: str) -> str:
            partition = partition_of(name_hash(name), full)
            return home if partition == 0 else n4.homes.of_partition("/big", partition)

        src = next(n for n in names if server(n) != home)
        dst = next(f"moved-{i}" for i in range(1000) if server(f"moved-{i}") not in (server(src),))
        one_message = n4._renamed_at_one_home
        answers: list[bool] = []

        async def with_an_old_map(*args: Any) -> bool:
            n4._parts["/big"] = frozenset({0})  # it thinks every name is at the home
            answers.append(await one_message(*args))
            return answers[-1]

        monkeypatch.setattr(n4, "_renamed_at_one_home", with_an_old_map)
        await cluster["n4"].namespace.rename(f"/big/{src}", f"/big/{dst}")
        assert answers == [False]  # refused by a server of one of the names: sent as two
        expected = sorted([dst] + [n for n in names if n != src])
        for node in NODES:
            listed = await cluster[node].namespace.merged_listing("/big")
            assert sorted(e.name for e in listed.entries) == expected, node
            with pytest.raises(FileNotFoundError):
                await cluster[node].namespace.lookup(f"/big/{src}")
            assert (await cluster[node].namespace.lookup(f"/big/{dst}")).attr.size == len(src)


@trio_test
async def test_renames_unlinks_and_rebuilds_keep_a_split_directory_exact(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, lookup="index", split_entries=SPLIT) as cluster:
        names = await _fill(cluster, "/big", 40)
        ns = cluster["n2"].namespace
        for name in names[:10]:  # src and dst hash to partitions anywhere
            await ns.rename(f"/big/{name}", f"/big/renamed-{name}")
        for name in names[10:15]:
            await ns.unlink(f"/big/{name}")
        expected = sorted([f"renamed-{n}" for n in names[:10]] + names[15:])
        for node in NODES:
            listed = await cluster[node].namespace.merged_listing("/big")
            assert sorted(e.name for e in listed.entries) == expected, node
            for name in names[:15]:
                with pytest.raises(FileNotFoundError):
                    await cluster[node].namespace.lookup(f"/big/{name}")
        # soft state: every index forgets everything (a node restarted); it comes back unsplit and
        # splits again as it is used, with the same answers
        for node in NODES:
            index = cluster[node].index
            assert index is not None
            index.forget_all()
            cluster[node].locator.forget_all()
        for node in NODES:
            listed = await cluster[node].namespace.merged_listing("/big")
            assert sorted(e.name for e in listed.entries) == expected, node
            for name in expected:
                assert (await cluster[node].namespace.lookup(f"/big/{name}")).node == "n1"
        handle = await cluster["n3"].namespace.create("/big/after", os.O_WRONLY | os.O_EXCL, 0o644)
        await cluster["n3"].namespace.release(handle)
        stats = _index_stats(cluster)
        assert sum(row["splits"] for row in stats.values()) >= 1  # split again after the rebuild
        for node in NODES:
            assert (await cluster[node].namespace.lookup("/big/after")).node == "n3"


# ------------------------------------------- the state machine, with directories that split at once


class SplittingIndexNetwork(IndexNetwork):
    """The union-namespace state machine of test_index.py with a split threshold of one entry:
    every directory holding two names splits, during random changes, losses and restarts."""

    SPLIT_ENTRIES = 1


SplittingIndexNetwork.TestCase.settings = settings(max_examples=int(os.environ.get("GMOUNT_SM_EXAMPLES", "40")),
                                                   stateful_step_count=25, deadline=None,
                                                   suppress_health_check=[HealthCheck.too_slow])
test_split_index_network_matches_the_union_namespace = SplittingIndexNetwork.TestCase


# ------------------------------------------------------------- real mounts

SPLIT_TUNING = ('attr_ttl = 2.0\nnegative_ttl = 10.0\nrpc_timeout = 3.0\nconnect_timeout = 1.0\nlookup = "index"\n'
                "index_split_entries = 16")


def test_mount_four_writers_into_one_directory_spread_over_partition_servers(tmp_path: Path) -> None:
    require("FUSE", fuse_problem())
    with local_cluster(tmp_path, f"ixsplit-{os.getpid()}", FOUR_NODES, FOUR_NODE_LINKS, SPLIT_TUNING) as cluster:
        rel = f"many-{uuid.uuid4().hex[:6]}"
        (cluster.mount("n1") / rel).mkdir()
        errors: list[str] = []

        def writer(node: str) -> None:
            try:
                for i in range(50):
                    with open(cluster.mount(node) / rel / f"{node}-{i:02d}", "wb") as f:
                        f.write(f"{node} {i}".encode())
            except OSError as exc:
                errors.append(f"{node}: {exc}")

        threads = [threading.Thread(target=writer, args=(node,)) for node in NODES]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        expected = sorted(f"{node}-{i:02d}" for node in NODES for i in range(50))
        for node in NODES:
            assert sorted(os.listdir(cluster.mount(node) / rel)) == expected, node
            for name in expected:
                assert (cluster.mount(node) / rel / name).stat().st_size == len(f"{name[:2]} {int(name[3:])}")
        for node in NODES:
            assert sorted(os.listdir(cluster.export(node) / rel)) == [n for n in expected if n.startswith(node)]

        async def stats() -> dict[str, dict[str, int]]:
            return {node: (await client.ask(cluster.state, node, msg.Stats()))["index"] for node in NODES}

        index = trio.run(stats)
        assert sum(row["splits"] for row in index.values()) >= 1
        serving = [node for node, row in index.items() if row["partitions"] > 0]
        assert len(serving) >= 2, index  # the directory's index spread over more than one node
