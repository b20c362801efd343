"""A node's own export, watched for entries that appear or vanish outside the mount.

Files copied straight into an export (not through the mount) reach their directory's
home at this node's next scan, about a second later, with the revocations of hand-off
rule 1; at the latest when the home lists the directory again (`rescan`).
"""

from __future__ import annotations

import errno
import logging
from collections import OrderedDict

import trio

from ...protocol import messages as msg
from ...protocol.messages import DirEntry, SyncEntry
from .homes import Homes
from .peers import Peers, list_whole

log = logging.getLogger(__name__)


class ExportWatcher:
    """Tells homes of entries that appear in (or vanish from) this node's export outside the mount.

    A home lists a directory from every node through `index_listdir`, which also
    starts watching that directory here. `scan()` (every second, from the daemon)
    compares each watched directory's mtime with the one seen at its last listing;
    a directory that changed is listed again here and only what differs from what
    its home was last told (names added or changed, names gone) is sent
    (`index_sync`): one message per changed directory per scan, whatever changed
    it -- the mount's own creates included, which the home knows already and
    keeps. Sending the difference keeps a directory that grows by many creates
    from costing its whole listing every second. So files copied straight into an
    export are seen by every node within about a second, with the hand-off rule 1
    revocations. A changed *file* (same name, new size) does not change its
    directory's mtime: its size is corrected by the next write through the mount,
    an open (which asks the holder), or the home's rescan.
    """

    def __init__(self, peers: Peers, homes: Homes, *, max_directories: int = 10_000) -> None:
        self._peers = peers
        self.homes = homes
        self._max = max_directories
        self._seen: OrderedDict[str, int | None] = OrderedDict()  # directory -> mtime_ns at the last listing
        self._asked_by: dict[str, str] = {}  # directory -> the home that listed it last
        self._told: dict[str, dict[str, _Told]] = {}  # directory -> name -> what its home was told of it
        self._scanning = trio.Lock()  # the daemon's scan every second, and `rescan` asked for
        self.syncs = 0

    def operations(self) -> msg.Operations:
        return msg.operations(self.op_listdir, self.op_rescan)

    async def _mtime(self, directory: str) -> int | None:
        try:
            attr = await self._peers.ask(self._peers.me, msg.Lookup(directory))
        except OSError:
            return None
        return None if attr is None else attr.mtime_ns

    async def op_listdir(self, request: msg.IndexListdir) -> list[DirEntry] | None:
        """This node's listing of `directory` for its home, which is watched from now on (EFBIG
        when it needs paging: the home pages through it, and it is watched all the same).
        Changes go to `home`, the node that asked (homes other than the root's are not computable)."""
        directory, home = request.directory, request.home
        mtime = await self._mtime(directory)  # before listing: a change meanwhile shows at the next scan
        try:
            listing = await self._peers.ask(self._peers.me, msg.Listdir(directory))
        except OSError as exc:
            if exc.errno != errno.EFBIG:
                raise
            self._watch(directory, mtime, await list_whole(self._peers, self._peers.me, directory), home)
            raise
        self._watch(directory, mtime, listing, home)
        return listing

    def _watch(self, directory: str, mtime: int | None, listing: list[DirEntry] | None, home: str | None) -> None:
        """Watch `directory` from here on: its home was told `listing`, as of `mtime`."""
        self._seen[directory] = mtime
        self._seen.move_to_end(directory)
        self._told[directory] = _told(listing or [])
        if home is not None:
            self._asked_by[directory] = home
        if len(self._seen) > self._max:
            dropped, _ = self._seen.popitem(last=False)
            self._asked_by.pop(dropped, None)
            self._told.pop(dropped, None)

    async def op_rescan(self, request: msg.Rescan) -> int:
        """`rescan`: a user who copied files into the export need not wait for the next scan."""
        return await self.scan()

    async def scan(self) -> int:
        """Send what changed in every watched directory whose mtime changed; returns how many were sent."""
        async with self._scanning:
            return await self._scan()

    async def _scan(self) -> int:
        sent = 0
        for directory, seen in list(self._seen.items()):
            mtime = await self._mtime(directory)
            if mtime == seen:
                continue
            home = self._asked_by.get(directory) or self.homes.home(directory)
            try:
                listing = [] if mtime is None else await list_whole(self._peers, self._peers.me, directory)
            except OSError as exc:
                log.info("cannot list %s to tell its home of a change: %s", directory, exc)
                continue
            listed = _told(listing or [])
            before = self._told.get(directory, {})
            changes = ([SyncEntry(*entry) for entry in listing or [] if before.get(entry.name) != listed[entry.name]]
                       + [SyncEntry(name, None) for name in before if name not in listed])
            if changes:
                try:
                    await self._peers.ask(home, msg.IndexSync(directory, self._peers.me, changes))
                except OSError as exc:
                    log.info("could not tell home %s of changes in %s: %s", home, directory, exc)
                    continue  # tried again at the next scan
                sent += 1
                self.syncs += 1
            if mtime is None or listing is None:  # gone from this export: no longer watched
                self._seen.pop(directory, None)
                self._asked_by.pop(directory, None)
                self._told.pop(directory, None)
            elif directory in self._seen:
                self._seen[directory] = mtime
                self._told[directory] = listed
        return sent


#: What a watcher told a home of one entry: its attributes but the access time, and the
#: source node when it is a staged replica.
_Told = tuple[tuple[int, ...], str | None]


def _told(listing: list[DirEntry]) -> dict[str, _Told]:
    result: dict[str, _Told] = {}
    for entry in listing:
        attr = entry.attr
        result[entry.name] = (attr[:5] + attr[6:], entry.replica_of)
    return result
