"""The export watcher against changes made through the mounts (four real nodes, tests/node/harness.py).

A scan lists a directory of its node's export, then tells the directory's home what changed.
An unlink, a rename or a create through any mount may land between the two: the home must
never take such a scan's report over what the mount told it (hand-off rule 4: a removed
name never comes back). Each test forces that interleaving -- the scan's listing is taken,
its report held at the home's door while the mount changes the directory, then let in.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import trio

from gmountpy.node.index import CLAIM_GRACE, DirectoryIndex, ExportWatcher, Homes, IndexLocator
from gmountpy.node.index import watcher as watcher_module
from gmountpy.node.index.entries import Removals
from gmountpy.node.namespace import Namespace
from gmountpy.protocol import messages as msg
from gmountpy.protocol.attr import Attr

from .._trio import elapse, trio_test
from .harness import Cluster, open_cluster
from .test_index import OnePeer, _attr, made_at, sync


@asynccontextmanager
async def sync_held_at(cluster: Cluster, home: str, watcher: ExportWatcher, directory: str) -> AsyncIterator[None]:
    """Run one scan of `watcher` whose report on `directory` (`index_sync`) waits at `home` until
    the block ends: its listing is taken when the block starts, and applied at `home` after it."""
    arrived, let_in = trio.Event(), trio.Event()
    node = cluster[home]
    original = node.service.dispatch

    async def gate(session: Any, op: str, args: list[Any]) -> Any:
        if op == "index_sync" and args[0] == directory and not let_in.is_set():
            arrived.set()
            await let_in.wait()
        return await original(session, op, args)

    node.service.dispatch = gate  # type: ignore[method-assign]
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watcher.scan)
            with trio.fail_after(5):
                await arrived.wait()
            try:
                yield
            finally:
                let_in.set()
    finally:
        node.service.dispatch = original  # type: ignore[method-assign]


async def write_new(namespace: Namespace, path: str, data: bytes) -> None:
    handle = await namespace.create(path, os.O_WRONLY, 0o644)
    await namespace.write(handle, 0, data)
    await namespace.release(handle)


async def listed(namespace: Namespace, directory: str) -> dict[str, int]:
    """Name -> size, as a node that has not looked at `directory` before lists it now."""
    return {entry.name: entry.location.attr.size for entry in (await namespace.merged_listing(directory)).entries}


def _at_creators_site(homes: Homes, directory: str, creator: str) -> str:
    return homes.at_site(directory, homes.site_of.get(creator))


async def watched_directory(cluster: Cluster) -> tuple[str, ExportWatcher]:
    """A directory made through n3's mount, homed at n4 (same site), watched by n3's scans. (A
    directory is homed at its maker now, and owned there; these scans are sent to another node,
    so the home is placed by the rule of n3's site while it is made.)"""
    locator = cluster["n1"].locator
    assert isinstance(locator, IndexLocator)
    with mock.patch.object(Homes, "of_creator", _at_creators_site):
        directory = made_at(locator.homes, "n4", "n3", "/w")
        await cluster["n3"].namespace.mkdir(directory, 0o755)
    watcher = cluster["n3"].watcher
    assert watcher is not None
    return directory, watcher


@trio_test(frozen_clock=True)
async def test_a_scan_that_listed_a_file_before_its_unlink_does_not_bring_it_back(tmp_path: Path) -> None:
    """fsspec's put-then-rm: the scan lists the new file, an unlink through a mount removes it
    and is recorded at the home, then the scan's report arrives."""
    async with open_cluster(tmp_path, lookup="index") as cluster:
        directory, watcher = await watched_directory(cluster)
        await write_new(cluster["n3"].namespace, f"{directory}/f", b"x")
        async with sync_held_at(cluster, "n4", watcher, directory):
            await cluster["n1"].namespace.unlink(f"{directory}/f")
        assert await listed(cluster["n2"].namespace, directory) == {}
        with pytest.raises(FileNotFoundError):
            await cluster["n2"].namespace.lookup(f"{directory}/f")
        assert cluster.holders(f"{directory}/f") == []


@trio_test(frozen_clock=True)
async def test_a_scan_that_listed_a_renamed_file_and_an_overwritten_target_shows_neither(tmp_path: Path) -> None:
    """A rename over an existing name between the scan's listing and its report: the old name
    does not come back, and the new name has the renamed file's attributes, not the old
    target's that the scan listed."""
    async with open_cluster(tmp_path, lookup="index") as cluster:
        directory, watcher = await watched_directory(cluster)
        await write_new(cluster["n3"].namespace, f"{directory}/src", b"1")
        await write_new(cluster["n3"].namespace, f"{directory}/dst", b"old target")
        async with sync_held_at(cluster, "n4", watcher, directory):
            await cluster["n1"].namespace.rename(f"{directory}/src", f"{directory}/dst")
        assert await listed(cluster["n2"].namespace, directory) == {"dst": 1}
        assert (await cluster["n1"].namespace.lookup(f"{directory}/dst")).attr.size == 1


@trio_test(frozen_clock=True)
async def test_a_scan_older_than_an_unlink_and_a_create_makes_no_twin_nor_old_attributes(tmp_path: Path) -> None:
    """The scan listed changed files; through the mounts they are then unlinked and made anew, a
    file on another node, a symlink on their own node: the old copy is no second holder, and
    the symlink is not taken for the old file (the scan's attributes)."""
    async with open_cluster(tmp_path, lookup="index") as cluster:
        directory, watcher = await watched_directory(cluster)
        n3 = cluster["n3"]
        await write_new(n3.namespace, f"{directory}/elsewhere", b"abc")
        await write_new(n3.namespace, f"{directory}/here", b"abc")
        await watcher.scan()  # the home is told both, as they are
        for name in ("elsewhere", "here"):
            with open(n3.path(f"{directory}/{name}"), "ab") as f:
                f.write(b"d")  # outside the mount: only a scan tells the home
        n3.path(f"{directory}/copied").write_bytes(b"")  # (moves the directory's mtime: the scan lists it)
        async with sync_held_at(cluster, "n4", watcher, directory):
            await cluster["n1"].namespace.unlink(f"{directory}/elsewhere")
            await write_new(cluster["n1"].namespace, f"{directory}/elsewhere", b"new")
            await cluster["n1"].namespace.unlink(f"{directory}/here")
            await n3.namespace.symlink("elsewhere", f"{directory}/here")
        n2 = cluster["n2"].namespace
        assert stat.S_ISLNK((await n2.lookup(f"{directory}/here")).attr.mode)
        assert await listed(n2, directory) == {"elsewhere": 3, "here": len("elsewhere"), "copied": 0}
        assert [loc.node for loc in await n2.where(f"{directory}/elsewhere")] == ["n1"]


@trio_test(frozen_clock=True)
async def test_a_change_in_the_same_timestamp_tick_as_a_scan_is_seen_by_the_next_scan(tmp_path: Path) -> None:
    """On file systems whose timestamps are coarse (a kernel tick, a second), a change right
    after a scan's listing can leave the directory's mtime as the scan saw it: a directory
    whose mtime is that recent is listed again at the next scan, not taken as unchanged."""
    async with open_cluster(tmp_path, lookup="index") as cluster:
        directory, watcher = await watched_directory(cluster)
        on_disk = cluster["n3"].path(directory)
        (on_disk / "first").write_bytes(b"1")
        await watcher.scan()
        seen = os.stat(on_disk)
        (on_disk / "second").write_bytes(b"2")  # right after the listing, in the same tick:
        os.utime(on_disk, ns=(seen.st_atime_ns, seen.st_mtime_ns))
        await watcher.scan()
        assert sorted(await listed(cluster["n2"].namespace, directory)) == ["first", "second"]


class WallClock:
    """`time` for the watcher module: the wall clock, moved on by `ahead` nanoseconds."""

    def __init__(self) -> None:
        self.ahead = 0

    def time_ns(self) -> int:
        return time.time_ns() + self.ahead


@trio_test(frozen_clock=True)
async def test_a_change_in_the_tick_of_a_listing_whose_report_was_answered_late_is_seen(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As above, but the home answered the scan's report long after the listing (a busy home, a
    slow link): the directory's mtime was recent as of the listing, and that is what counts --
    not its age when the answer came."""
    clock = WallClock()
    monkeypatch.setattr(watcher_module, "time", clock)
    async with open_cluster(tmp_path, lookup="index") as cluster:
        directory, watcher = await watched_directory(cluster)
        on_disk = cluster["n3"].path(directory)
        (on_disk / "first").write_bytes(b"1")
        seen = os.stat(on_disk)
        async with sync_held_at(cluster, "n4", watcher, directory):  # listed: "first"
            (on_disk / "second").write_bytes(b"2")  # in the listing's tick
            os.utime(on_disk, ns=(seen.st_atime_ns, seen.st_mtime_ns))
            clock.ahead = 2 * watcher_module.SETTLE_NS  # the report is answered this much later
        await watcher.scan()
        assert sorted(await listed(cluster["n2"].namespace, directory)) == ["first", "second"]


@trio_test(frozen_clock=True)
async def test_the_temporary_file_of_a_put_under_way_is_no_name_of_the_namespace(tmp_path: Path) -> None:
    """A put (the API, fsspec) writes a hidden temporary file beside its target and renames it
    into place at put_close. While it is being written, no listing nor lookup shows it -- not
    the home's (fed by the scan), not a node's own listing of its export."""
    async with open_cluster(tmp_path, lookup="index") as cluster:
        directory, watcher = await watched_directory(cluster)
        n1 = cluster["n1"]
        handle = await n1.pool.ask("n3", msg.PutOpen(f"{directory}/put.bin", 0o644))
        temporaries = [p.name for p in cluster["n3"].path(directory).iterdir()]
        assert len(temporaries) == 1 and ".gmount-put-" in temporaries[0]  # on disk, being written
        await watcher.scan()
        assert await listed(cluster["n2"].namespace, directory) == {}
        assert await n1.pool.ask("n3", msg.Listdir(directory)) == []
        with pytest.raises(FileNotFoundError):
            await cluster["n2"].namespace.lookup(f"{directory}/{temporaries[0]}")
        assert await n1.pool.ask("n3", msg.Lookup(f"{directory}/{temporaries[0]}")) is None  # (flood asks so)
        await n1.pool.ask("n3", msg.Write(handle, 0, b"data"))
        await n1.pool.ask("n3", msg.PutClose(handle, 4, hashlib.sha256(b"data").hexdigest()))
        await watcher.scan()
        await elapse(1.0)
        assert await listed(cluster["n2"].namespace, directory) == {"put.bin": 4}


# -- the home's side alone: a scan's report of a name removed through a mount lately ----------


class DiskPeer(OnePeer):
    """OnePeer whose nodes also answer `lookup` of a name, from their listings (their disks)."""

    async def call(self, node: str, op: str, *args: Any, timeout: float | None = None) -> Any:
        if op != "lookup":
            return await super().call(node, op, *args, timeout=timeout)
        self.calls.append((node, op, args))
        directory, _, name = str(args[0]).rpartition("/")
        return next((row[1] for row in self.listings.get(node, {}).get(directory or "/", []) if row[0] == name), None)


@trio_test(autojump=True)
async def test_a_reported_name_removed_lately_is_taken_only_if_its_node_still_holds_it() -> None:
    """Within CLAIM_GRACE of an unlink through a mount, a scan reporting the name is checked with
    the reporting node (one lookup): not there, it is left out; there again (copied back in
    outside the mount), it is taken with the attributes the node answers now. Later reports
    are taken as they come."""
    peer = DiskPeer({"h": {"/d": []}, "x": {"/d": [["a", _attr(size=1)], ["b", _attr(size=1)]]}})
    index = DirectoryIndex(peer, ["h", "x"], lease=10.0)
    assert sorted(row.name for row in (await index.op_list(msg.IndexList("/d", None))).entries) == ["a", "b"]
    await index.op_drop(msg.IndexDrop("/d", "a", None, "y"))
    await index.op_drop(msg.IndexDrop("/d", "b", None, "y"))
    peer.listings["x"]["/d"] = [["b", _attr(size=7)]]  # b copied in again; a gone
    await sync(index, "/d", "x", [["a", _attr(size=1)], ["b", _attr(size=1)], ["c", _attr(size=3)]])
    assert sorted(c[2][0] for c in peer.calls if c[1] == "lookup") == ["/d/a", "/d/b"]  # not c: never removed
    sizes = {row.name: row.holders[0].attr.size for row in (await index.op_list(msg.IndexList("/d", None))).entries}
    assert sizes == {"b": 7, "c": 3}
    await index.op_drop(msg.IndexDrop("/d", "c", None, "y"))
    await trio.sleep(CLAIM_GRACE)
    before = len(peer.calls)
    await sync(index, "/d", "x", [["c", _attr(size=4)]])  # a report so late is no older than the unlink
    assert [c for c in peer.calls[before:] if c[1] == "lookup"] == []
    assert "c" in {row.name for row in (await index.op_list(msg.IndexList("/d", None))).entries}


class HeldLookups(DiskPeer):
    """DiskPeer whose lookups wait for `go` (the home's check of a scan still on its way)."""

    def __init__(self, listings: dict[str, dict[str, list[Any]]]) -> None:
        super().__init__(listings)
        self.asked, self.go = trio.Event(), trio.Event()
        self.fail = False

    async def call(self, node: str, op: str, *args: Any, timeout: float | None = None) -> Any:
        if op == "lookup":
            self.asked.set()
            await self.go.wait()
            if self.fail:
                raise OSError(errno.EIO, "injected")
        return await super().call(node, op, *args, timeout=timeout)


@trio_test(autojump=True)
async def test_a_name_removed_again_while_it_is_checked_is_left_out() -> None:
    """The node answered "still here" for a name unlinked again (through a mount) while the
    question was on its way: the answer may predate that unlink, so the name is left out."""
    peer = HeldLookups({"h": {"/d": []}, "x": {"/d": [["a", _attr()]]}})
    index = DirectoryIndex(peer, ["h", "x"], lease=10.0)
    await index.op_list(msg.IndexList("/d", None))
    await index.op_drop(msg.IndexDrop("/d", "a", None, "y"))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sync, index, "/d", "x", [["a", _attr()]])
        await peer.asked.wait()
        await index.op_claim(msg.IndexClaim("/d", "a", "x", False, True))  # made again through a mount, then
        await index.op_drop(msg.IndexDrop("/d", "a", None, "y"))  # removed again
        peer.go.set()
    assert (await index.op_list(msg.IndexList("/d", None))).entries == ()


@trio_test(autojump=True)
async def test_a_report_whose_check_failed_is_refused_so_the_scan_tells_it_again() -> None:
    peer = HeldLookups({"h": {"/d": []}, "x": {"/d": [["a", _attr()]]}})
    peer.go.set()
    peer.fail = True
    index = DirectoryIndex(peer, ["h", "x"], lease=10.0)
    await index.op_list(msg.IndexList("/d", None))
    await index.op_drop(msg.IndexDrop("/d", "a", None, "y"))
    with pytest.raises(OSError, match="could not ask x whether it still holds a in /d") as caught:
        await sync(index, "/d", "x", [["a", _attr()], ["new", _attr()]])
    assert caught.value.errno == errno.EAGAIN
    taken = (await index.op_list(msg.IndexList("/d", None))).entries
    assert [row.name for row in taken] == ["new"]  # the rest is taken


def test_removals_are_remembered_claim_grace_and_numbered() -> None:
    removals = Removals()
    removals.record("/d", "a", 0.0)
    removals.record("/d", "b", 1.0)
    removals.record("/d", "a", 2.0)
    assert removals.number("/d", "a", 2.0 + CLAIM_GRACE - 0.1) == 3 and removals.number("/d", "c", 0.0) is None
    removals.expire(1.0 + CLAIM_GRACE)  # b's has ended; a's first one too, but not its second
    assert len(removals) == 1 and removals.number("/d", "a", 1.0 + CLAIM_GRACE) == 3
    removals.expire(2.0 + CLAIM_GRACE)
    assert len(removals) == 0 and removals.number("/d", "a", 2.0) is None


@trio_test(autojump=True)
async def test_a_rename_to_a_new_name_costs_no_check_and_the_next_scan_corrects_its_attributes() -> None:
    """A rename to a name the home knew nothing under removes nothing: the scan's attributes fill
    the renamed entry without a lookup. They may be those of a file the rename replaced that
    was copied in outside the mount and listed before the rename: the next scan, which lists
    the renamed file, corrects them (within CLAIM_GRACE too)."""
    peer = DiskPeer({"h": {"/d": []}, "x": {"/d": [["a", _attr(size=1)]]}})
    index = DirectoryIndex(peer, ["h", "x"], lease=10.0)
    await index.op_list(msg.IndexList("/d", None))
    await index.op_rename(msg.IndexRename("/d", "b", "a", ["x"], False, "x"))
    await sync(index, "/d", "x", [["a", None], ["b", _attr(size=9)]])  # listed before the rename
    assert [c for c in peer.calls if c[1] == "lookup"] == []
    await sync(index, "/d", "x", [["b", _attr(size=1)]])
    assert (await index.op_list(msg.IndexList("/d", None))).entries == (
        msg.IndexRow("b", (msg.IndexHolder("x", Attr(*_attr(size=1)), None),), None),)
