"""A directory a node owns, when that node dies: its backup stands in with the names it was copied.

The owner's creates there tell nobody (node/index/owners.py); the names reach the directory's
backup in batches, about every second. After kill -9 of the owner the other nodes must not
answer "no such file" for those names, nor create a second file under one of them, and once
the owner is back every node sees each name once (docs/directory-index.md, "Directories a
node owns"; docs/failures.md).
"""

from __future__ import annotations

import errno
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import trio

from gmountpy import launch
from gmountpy.node.index import Homes
from gmountpy.protocol import client
from gmountpy.protocol import messages as msg

from .._trio import trio_test
from ..conftest import FOUR_NODE_LINKS, FOUR_NODES, LocalCluster, fuse_problem, local_cluster, require, wait_for
from .harness import Cluster, open_cluster

TUNING = ('attr_ttl = 0.5\nnegative_ttl = 0.5\nrpc_timeout = 1.5\nconnect_timeout = 1.0\nlookup = "index"\n'
          "index_rescan = 30.0")


def _kept(cluster: Cluster, backup: str, directory: str) -> dict[str, int]:
    """The names (and sizes) `backup` keeps for the owner of `directory`."""
    index = cluster[backup].index
    assert index is not None
    kept = index._owned_copies.get(directory)
    return {} if kept is None else {name: holder.attr.size for name, holder in kept[1].items() if holder.attr}


def _copies_sent(cluster: Cluster) -> dict[str, int]:
    return {name: node.served["index_owned"] for name, node in cluster.nodes.items() if node.served["index_owned"]}


@trio_test
async def test_an_owned_directorys_names_reach_its_backup_in_batches_one_message_each(tmp_path: Path) -> None:
    """Creates in an owned directory send nothing; the next batch (the daemon's flush, every
    second) sends the backup what changed since the last one, in one message, and nothing when
    nothing changed: a job's file written straight into the export (after the export's scan), a
    create through the mount, an unlink; and again after the owner's index was let go."""
    async with open_cluster(tmp_path, lookup="index") as cluster:
        owner, directory = "n3", "/top"
        ns = cluster[owner].namespace
        await ns.mkdir(directory, 0o755)
        index, locator, watcher = cluster[owner].index, cluster[owner].locator, cluster[owner].watcher
        assert index is not None and index.owns(directory) and watcher is not None
        backup = homes_of_cluster(cluster).backup(directory, owner)
        assert backup == "n4"
        handle = await ns.create(f"{directory}/a", os.O_WRONLY | os.O_EXCL, 0o644)
        await ns.write(handle, 0, b"by the mount")
        await ns.release(handle)
        (cluster[owner].root / "top" / "b").write_bytes(b"by a job, straight")
        cluster.reset_counts()
        await watcher.scan()
        await locator.flush_owed()
        assert _copies_sent(cluster) == {backup: 1}
        assert _kept(cluster, backup, directory) == {"a": len(b"by the mount"), "b": len(b"by a job, straight")}
        cluster.reset_counts()
        await watcher.scan()
        await locator.flush_owed()
        assert _copies_sent(cluster) == {}  # nothing changed: no message
        await ns.unlink(f"{directory}/a")
        await locator.flush_owed()
        assert _copies_sent(cluster) == {backup: 1} and _kept(cluster, backup, directory) == {"b": 18}
        index.forget([directory])  # let go while idle: what the scan reports next is listed from the export
        (cluster[owner].root / "top" / "c").write_bytes(b"c")
        await watcher.scan()
        await locator.flush_owed()
        assert _kept(cluster, backup, directory) == {"b": 18, "c": 1}
        assert index.owns(directory)  # all the while: no other node asked


@trio_test
async def test_a_directory_made_and_removed_before_it_held_a_name_costs_its_backup_no_message(tmp_path: Path) -> None:
    """ParaMark's mkdir then rmdir: the backup never got a name of the new directory, so its removal
    has nothing to empty there. One that held a name has its copy emptied at its removal."""
    async with open_cluster(tmp_path, lookup="index") as cluster:
        owner = "n3"
        ns, locator, watcher = cluster[owner].namespace, cluster[owner].locator, cluster[owner].watcher
        index = cluster[owner].index
        assert index is not None and watcher is not None
        await ns.mkdir("/empty", 0o755)
        await ns.mkdir("/full", 0o755)
        assert index.owns("/empty") and index.owns("/full")
        backup = homes_of_cluster(cluster).backup("/full", owner)
        handle = await ns.create("/full/a", os.O_WRONLY | os.O_EXCL, 0o644)
        await ns.release(handle)
        cluster.reset_counts()
        await watcher.scan()  # (the create's attributes come with the scan)
        await locator.flush_owed()
        assert _copies_sent(cluster) == {backup: 1} and _kept(cluster, backup, "/full") == {"a": 0}
        cluster.reset_counts()
        await ns.rmdir("/empty")
        await locator.flush_owed()
        assert _copies_sent(cluster) == {}
        await ns.unlink("/full/a")
        await ns.rmdir("/full")
        await locator.flush_owed()
        assert _copies_sent(cluster) == {backup: 1} and _kept(cluster, backup, "/full") == {}
        cluster.reset_counts()
        await ns.mkdir("/empty", 0o755)  # made again: a new directory, its backup holds nothing of it
        await ns.rmdir("/empty")
        await locator.flush_owed()
        assert _copies_sent(cluster) == {}


def homes_of_cluster(cluster: Cluster) -> Homes:
    locator = cluster["n1"].locator
    homes = getattr(locator, "homes", None)
    assert isinstance(homes, Homes)
    return homes


def _index_stats(cluster: LocalCluster, node: str) -> dict[str, Any]:
    async def ask() -> dict[str, Any]:
        return dict((await client.ask(cluster.state, node, msg.Stats()))["index"])

    return trio.run(ask)


def _create_new(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _made(path: Path, data: bytes) -> bool:
    """`_create_new`; False on EIO (see the caller)."""
    try:
        _create_new(path, data)
    except OSError as exc:
        if exc.errno != errno.EIO:
            raise
        return False
    return True


@pytest.mark.parametrize("owner", ["n2", "n1"])
def test_a_dead_owners_outputs_stay_known_at_the_backup_and_no_twin_is_made(tmp_path: Path, owner: str) -> None:
    """kill -9 of the node that made and owns a directory (n1: also the root's home, whose backup
    then answers for the directory's own name): its outputs are not "no such file" elsewhere,
    none gets a second file, new names are made; after `gmount up` every node sees each once."""
    require("FUSE", fuse_problem())
    with local_cluster(tmp_path, f"ixown-{os.getpid()}", FOUR_NODES, FOUR_NODE_LINKS, TUNING) as cluster:
        rel = "outputs"
        homes = Homes(tuple(cluster.spec.nodes), {n: s.site for n, s in cluster.spec.nodes.items()})
        assert (homes.home("/") == owner) == (owner == "n1")
        backup = homes.backup(f"/{rel}", owner)
        assert backup is not None and backup != owner
        (cluster.mount(owner) / rel).mkdir()  # homed at its maker, owned by it: nobody else asked there
        outputs = {f"out-{i}": f"output {i}".encode() for i in range(5)}
        for name, data in outputs.items():  # through n2's mount: no message to any other node
            _create_new(cluster.mount(owner) / rel / name, data)
        outputs["straight"] = b"written into the export, as a job's create through the bypass is"
        (cluster.export(owner) / rel / "straight").write_bytes(outputs["straight"])
        assert _index_stats(cluster, owner)["owned"] >= 1
        # the next batch (the export's scan, then the copy to the backup, about a second each)
        assert wait_for(lambda: _index_stats(cluster, backup)["names_kept"] >= len(outputs), timeout=15), \
            _index_stats(cluster, backup)

        os.kill(cluster.state.nodes[owner].pid, signal.SIGKILL)
        askers = [node for node in cluster.nodes if node != owner]
        for node in askers:
            for name, data in outputs.items():
                path = cluster.mount(node) / rel / name
                try:  # held by n2, which is down: its attributes, or EIO -- never "no such file"
                    assert path.stat().st_size == len(data), (node, name)
                except OSError as exc:
                    assert exc.errno == errno.EIO, (node, name, exc)
                try:
                    _create_new(path, b"a twin")
                except OSError as exc:  # it exists (EEXIST), or its holder is down (EIO)
                    assert exc.errno in (errno.EEXIST, errno.EIO), (node, name, exc)
                else:
                    raise AssertionError(f"{node} made a second {rel}/{name} while {owner}, its holder, was down")
        made = []
        for node in askers:  # a new name is made as ever, through the stand-in -- once the directory
            # can be entered: while the asker counts its only holder as down (2 s after a failed
            # request, docs/failures.md) a lookup of it is EIO; and when the dead owner was the
            # parent's home too, it is EIO all along (a directory only a dead node holds)
            path, data = cluster.mount(node) / rel / f"new-{node}", node.encode()
            if wait_for(lambda path=path, data=data: _made(path, data), timeout=10 if owner != "n1" else 1):
                made.append(path.name)
            assert owner == "n1" or path.name in made, (node, path)
        for name in made:
            assert (cluster.mount(askers[-1]) / rel / name).read_bytes() == name[4:].encode()
        launch.up(cluster.spec)  # the owner comes back, its index empty
        assert wait_for(lambda: os.path.isdir(cluster.mount(owner) / rel), timeout=10)
        expected = sorted([*outputs, *made])
        for node in cluster.nodes:
            assert sorted(os.listdir(cluster.mount(node) / rel)) == expected, node
            for name, data in outputs.items():
                assert (cluster.mount(node) / rel / name).read_bytes() == data, (node, name)
        for name in outputs:  # one file each, on n2 only: no twin anywhere
            held = [node for node in cluster.nodes if (cluster.export(node) / rel / name).exists()]
            assert held == [owner], (name, held)
