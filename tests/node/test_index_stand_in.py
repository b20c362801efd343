"""A change while a directory's home does not answer this node: its backup stands in, from a copy.

The backup answers from its own listing of the directory, kept `backup_refresh` seconds and
not told of the changes made at the home meanwhile (node/index/store.py). That is good enough
for a lookup, not for a change: a rename, rmdir or unlink made without a holder the copy
missed leaves that holder's copy behind (a directory split between two names, a removed name
back). Those changes are refused until the home answers again, as the search refuses them
when any node cannot be asked (docs/failures.md). The 30-minute soak found the split: nodes
of one site marked the other site's nodes down while those still reached each other.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from gmountpy.errors import PeerUnavailable
from gmountpy.node.index import IndexLocator
from gmountpy.node.peers import PeerAddress

from .._trio import trio_test
from .harness import open_cluster, read_file
from .test_index import homes_of


@trio_test
async def test_a_change_the_backup_answers_for_is_refused_until_the_home_is_back(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, lookup="index", retry_after=0.3) as cluster:
        top = "/top"
        for node in cluster.nodes.values():
            node.mkdir(top)
        locator = cluster["n1"].locator
        assert isinstance(locator, IndexLocator)
        home = await locator.home_of(top)
        assert home is not None
        backup = homes_of(cluster).backup(top, home)
        asker = next(name for name in cluster.nodes if name not in (home, backup))
        cluster[asker].put(f"{top}/sub/a", b"a")
        cluster[asker].mkdir(f"{top}/empty")
        ns = cluster[asker].namespace
        assert (await ns.lookup(f"{top}/sub")).attr.is_dir  # the asker knows the home of `top` now
        # the asker cannot reach the home any more; the backup still can: it lists `top` from every node
        addresses = cluster.addresses()
        cluster[asker].pool.set_peers({**addresses, home: PeerAddress("127.0.0.1", 9)})
        with pytest.raises(FileNotFoundError):
            await ns.lookup(f"{top}/nothing")
        assert cluster[backup].served["index_backup"] >= 1  # answered by the backup
        # the home makes names the backup's copy does not have yet
        at_home = cluster[home].namespace
        for made in (f"{top}/sub/b", f"{top}/late"):
            await at_home.release(await at_home.create(made, os.O_WRONLY | os.O_EXCL, 0o644))
        cluster[home].path(f"{top}/empty").mkdir()  # a job's, straight into the export
        with pytest.raises(PeerUnavailable, match=home):
            await ns.rename(f"{top}/sub", f"{top}/moved")
        with pytest.raises(PeerUnavailable, match=home):
            await ns.rmdir(f"{top}/empty")
        with pytest.raises(PeerUnavailable, match=home):  # not "no such file"
            await ns.unlink(f"{top}/late")
        assert cluster.holders(f"{top}/sub") == sorted([asker, home]) and cluster.holders(f"{top}/moved") == []
        assert cluster.holders(f"{top}/empty") == sorted([asker, home]) and cluster.holders(f"{top}/late") == [home]
        # the home answers the asker again: the rename is made on both nodes
        cluster[asker].pool.set_peers(addresses)
        await trio.sleep(0.4)  # past `retry_after`
        await ns.rename(f"{top}/sub", f"{top}/moved")
        assert cluster.holders(f"{top}/moved") == sorted([asker, home]) and cluster.holders(f"{top}/sub") == []
        assert await read_file(ns, f"{top}/moved/a") == b"a"
        assert sorted(name for name, _ in await ns.listdir(f"{top}/moved")) == ["a", "b"]
