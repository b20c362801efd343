"""Parent directories a node makes for a create or a rename: copies of the namespace's directory.

A create happens on the node whose mount is used, and a rename on the node that holds the
file, so either may have to make the parent directories its export lacks. Each is made as
the namespace shows that directory -- its mode (sticky and set-gid bits included) and, where
the daemon may give it away, its owner -- because a merged directory shows the attributes of
its nearest copy, against which the kernel checks permissions: a copy made 0755 by a root
daemon would refuse other users what the directory allows them. A rename also tells the
locator that the node holds them now (a create's claim has told it already): otherwise a
later rename or rmdir of such a directory would miss that copy.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Awaitable, Callable

from ..protocol import messages as msg
from ..protocol.attr import Attr
from .export import Export, off_loop
from .locator import Location, Locator
from .peers import PeerPool

log = logging.getLogger(__name__)

#: A parent missing everywhere (a create through the API with new parents): as exports made them before.
DEFAULT_MODE = stat.S_IFDIR | 0o755


def _parent(path: str) -> str:
    return path.rsplit("/", 1)[0] or "/"


class Parents:
    """The parents a node lacks, as the namespace shows them, and making them on that node."""

    def __init__(self, me: str, export: Export, peers: PeerPool, locator: Locator,
                 lookup: Callable[[str], Awaitable[Location]]) -> None:
        self.me = me
        self.export = export
        self.peers = peers
        self.locator = locator
        self.lookup = lookup

    async def missing_on(self, node: str, path: str) -> list[tuple[str, Attr]]:
        """The parent directories of `path` that `node`'s export lacks, top first, each with the
        attributes of the directory the namespace shows. Asked before a create claims its name (a
        lookup of a name being claimed would ask its claimant)."""
        missing: list[str] = []
        directory = _parent(path)
        while directory != "/" and await self._lacks(node, directory):
            missing.append(directory)
            directory = _parent(directory)
        parents = []
        for directory in reversed(missing):
            try:
                shown = (await self.lookup(directory)).attr
            except OSError as exc:  # new everywhere, or cannot be asked: made as before
                log.info("%s, if made on %s, is made 0755: it cannot be looked up: %s", directory, node, exc)
                shown = Attr(DEFAULT_MODE, 2, os.geteuid(), os.getegid(), 0, 0, 0, 0, 0, 0, 0, 0, 0)
            parents.append((directory, shown))
        return parents

    async def make(self, node: str, parents: list[tuple[str, Attr]], *, record: bool = False) -> None:
        """Make `parents` (`missing_on`) in `node`'s export; `record`: tell the locator `node` holds them."""
        for directory, shown in parents:
            if node == self.me:
                attr = await off_loop(self.export.make_directory_like, directory, shown.mode, shown.uid, shown.gid)
            else:
                attr = await self._make_on(node, directory, shown)
            if record:
                await self.locator.announce_changed(directory, Location(node, attr))

    async def make_for_rename(self, node: str, src: str, dst: str) -> None:
        """Before `node` renames `src` to `dst` in another directory: the parents of `dst` it lacks."""
        if _parent(dst) not in ("/", _parent(src)):
            await self.make(node, await self.missing_on(node, dst), record=True)

    async def _lacks(self, node: str, directory: str) -> bool:
        if node == self.me:
            try:
                self.export.lstat(directory)
            except FileNotFoundError:
                return True
            return False
        return await self.peers.ask(node, msg.Lookup(directory)) is None

    async def _make_on(self, node: str, directory: str, shown: Attr) -> Attr:
        """`Export.make_directory_like` on another node, with the requests every node answers."""
        mode = stat.S_IMODE(shown.mode)
        try:
            attr = await self.peers.ask(node, msg.Mkdir(directory, mode))
        except FileExistsError:
            made = await self.peers.ask(node, msg.Lookup(directory))
            if made is None:
                raise
            return made
        if (attr.uid, attr.gid) != (shown.uid, shown.gid):
            try:
                attr = await self.peers.ask(node, msg.Chown(directory, shown.uid, shown.gid))
            except PermissionError:
                pass  # a daemon that is not root keeps its own files there
        if stat.S_IMODE(attr.mode) != mode:
            attr = await self.peers.ask(node, msg.Chmod(directory, mode))
        return attr
