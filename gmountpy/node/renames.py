"""Renames across the union: a file's is its holder's rename(2), a directory's is made on every node.

A rename of a file or symlink is made by its holder (atomic on that node); other holders of
the source or of the destination are then removed from, so the destination shows the
renamed file and never two files. A directory is renamed on every node that has it, each in
turn, and renamed back on the nodes done when one refuses (docs/failures.md); a destination
directory on a node that lacks the source fails with EXDEV (`mv` then copies). The parents
the holder lacks for the destination are made first (`parents`).
"""

from __future__ import annotations

import errno
import logging

import trio

from .._trio import open_nursery
from ..errors import PeerUnavailable
from ..protocol import messages as msg
from .locator import Location, Locator
from .parents import Parents
from .peers import PeerPool

RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2

log = logging.getLogger(__name__)


def enoent(path: str) -> OSError:
    return FileNotFoundError(errno.ENOENT, f"no node holds {path}")


class Renames:
    """What `Namespace.rename` does (see the module)."""

    def __init__(self, peers: PeerPool, locator: Locator, parents: Parents) -> None:
        self.peers = peers
        self.locator = locator
        self.parents = parents

    async def _holders_of_both(self, src: str, dst: str) -> tuple[list[Location], list[Location]]:
        """`_all_holders` of both names of a rename, asked at once (one round trip, not two, when
        they are in one remote directory); `src`'s error first."""
        found: dict[str, list[Location] | OSError] = {}

        async def holders(path: str) -> None:
            try:
                found[path] = await self.locator.find_all(path, strict=True)
            except OSError as exc:
                found[path] = exc

        async with open_nursery() as nursery:
            nursery.start_soon(holders, src)
            nursery.start_soon(holders, dst)
        sources, targets = found[src], found[dst]
        if isinstance(sources, OSError):
            raise sources
        if isinstance(targets, OSError):
            raise targets
        return sources, targets

    async def rename(self, src: str, dst: str, flags: int = 0) -> bool:
        """Rename; returns whether `src` was a directory (its children moved with it)."""
        if flags & RENAME_EXCHANGE:
            raise OSError(errno.EINVAL, "RENAME_EXCHANGE is not supported across a union")
        sources, targets = await self._holders_of_both(src, dst)
        if not sources:
            raise enoent(src)
        if targets and flags & RENAME_NOREPLACE:
            raise FileExistsError(errno.EEXIST, f"{dst} exists")
        is_dir = sources[0].attr.is_dir
        holder = sources[0].node
        if await self._one_file(holder, src, dst, sources, targets):
            return is_dir  # two names of one file: rename(2) does nothing, both stay
        # the common case, a file on one node and no other `dst` anywhere: renamed and announced in one step
        one_step = (not is_dir and len(sources) == 1 and sources[0].replica_of is None
                    and all(target.node == holder and not target.attr.is_dir for target in targets))
        try:
            if is_dir:
                await self._rename_dir(src, dst, sources, targets)
            elif one_step:
                await self.parents.make_for_rename(holder, src, dst)
                await self.locator.change(holder, src, msg.Rename(src, dst))
            else:
                await self._rename_file(src, dst, sources, targets)
        except BaseException:
            with trio.CancelScope(shield=True):
                await self.locator.announce_unsure([src, dst])
            raise
        finally:
            self.locator.note_renamed(src, dst, is_dir)
        if not one_step:
            moved = ([loc.node for loc in sources if loc.attr.is_dir] if is_dir else
                     [next(loc.node for loc in sources if loc.replica_of is None)])
            await self.locator.announce_renamed(src, dst, is_dir, moved)  # no node may say "not found" for dst
        return is_dir

    async def _one_file(self, holder: str, src: str, dst: str, sources: list[Location],
                        targets: list[Location]) -> bool:
        """Whether `src` and `dst` are two hard links of one file of `holder` (asked of it when the
        attributes known say so: they may be older than a change that replaced one of them)."""
        if sources[0].replica_of is not None or not any(
                t.node == holder and t.replica_of is None and t.attr.same_file(sources[0].attr) for t in targets):
            return False
        both = [await self.peers.ask(holder, msg.Lookup(path)) for path in (src, dst)]
        return both[0] is not None and both[1] is not None and both[0].same_file(both[1])

    async def _rename_file(self, src: str, dst: str, sources: list[Location], targets: list[Location]) -> None:
        originals = [loc for loc in sources if loc.replica_of is None]
        if not originals:
            raise enoent(src)
        holder = originals[0].node
        sources = originals + [loc for loc in sources if loc.replica_of is not None]
        for target in targets:
            if target.attr.is_dir:
                raise IsADirectoryError(errno.EISDIR, f"{dst} is a directory (on node {target.node})")
        others = [location for location in targets if location.node != holder]
        await self.parents.make_for_rename(holder, src, dst)
        try:
            await self.peers.ask(holder, msg.Rename(src, dst))
        except PeerUnavailable:
            # Its reply is lost: the rename may have happened. The old `dst` elsewhere goes anyway,
            # so the worst left behind is `src` with no `dst`, never two files called `dst`.
            for location in others:
                try:
                    await self.peers.ask(location.node, msg.Unlink(dst))
                except OSError as exc:
                    log.info("could not remove the old %s on %s after a rename lost on %s: %s",
                             dst, location.node, holder, exc)
            raise
        for location in sources[1:]:
            if not location.attr.is_dir:
                await self.peers.ask(location.node, msg.Unlink(src))
        for location in others:
            await self.peers.ask(location.node, msg.Unlink(dst))

    async def _rename_dir(self, src: str, dst: str, sources: list[Location], targets: list[Location]) -> None:
        source_nodes = {loc.node for loc in sources if loc.attr.is_dir}
        for target in targets:
            if not target.attr.is_dir:
                raise NotADirectoryError(errno.ENOTDIR, f"{dst} is not a directory (on node {target.node})")
            if target.node not in source_nodes:
                raise OSError(errno.EXDEV, f"{dst} exists on node {target.node}, which lacks {src}")
        for target in targets:  # rename(2) semantics: check everywhere first, then change anything
            if await self.peers.ask(target.node, msg.Listdir(dst)):
                raise OSError(errno.ENOTEMPTY, f"{dst} is not empty (on node {target.node})")
        renamed: list[str] = []
        for node in [loc.node for loc in sources if loc.attr.is_dir]:
            try:
                await self.parents.make_for_rename(node, src, dst)
                await self.peers.ask(node, msg.Rename(src, dst))
            except BaseException as exc:
                with trio.CancelScope(shield=True):
                    await self._undo_dir_rename(src, dst, node, renamed, exc)
                raise
            renamed.append(node)

    async def _undo_dir_rename(self, src: str, dst: str, failed: str, renamed: list[str], why: BaseException) -> None:
        """A directory rename failed on node `failed` after it succeeded on `renamed`: rename those
        back, so the directory keeps one name (the old one). If one cannot be renamed back, the
        error says which nodes hold which name (docs/failures.md)."""
        split: list[str] = []
        for node in reversed(renamed):
            try:
                await self.peers.ask(node, msg.Rename(dst, src))
            except OSError as exc:
                log.warning("could not rename %s back to %s on node %s after the rename failed on %s: %s",
                            dst, src, node, failed, exc)
                split.append(node)
        if split:
            raise OSError(errno.EIO, f"renaming directory {src} to {dst} failed on node {failed} ({why}) and could "
                                     f"not be undone on {', '.join(split)}: the directory is {dst} there and {src} "
                                     f"on the other nodes; rename it in the exports of those nodes by hand "
                                     f"(see docs/failures.md)") from None
