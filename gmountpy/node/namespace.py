"""The union namespace, by path: what every file operation means across nodes.

This is where the semantics of docs/design.md live, so that the FUSE layer only maps
inodes to paths. In short:

- a path resolves to its nearest holder (the locator decides);
- a directory lists the merge of that directory on every reachable node;
- creates (file, directory, symlink) happen on this node, parents made here,
  but only after asking every reachable node (past the caches) that the name
  is new: an existing file is opened instead (no twin), O_EXCL and mkdir fail
  with EEXIST. A create then tells every reachable node, before it returns,
  to drop its "not found" for the name (docs/design.md, the hand-off contract);
- unlink, rmdir and rename refuse (EIO, naming the node) while a node cannot
  be asked: a holder we did not see would bring the old name back later;
- unlink removes the file from every node that holds it, so it is gone;
- chmod/truncate/utimens/xattrs act on the nearest holder (the file you see);
- rename of a file or symlink is its holder's rename(2) (atomic on that node);
  other holders of the source or destination are then removed from, so the
  destination shows the renamed file. A directory is renamed on every node
  that has it; if the destination directory exists on a node that lacks the
  source the rename fails with EXDEV (`mv` then copies) -- `renames`.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

import trio

from .._trio import open_nursery
from ..errors import PeerUnavailable
from ..protocol import messages as msg
from ..protocol.attr import Attr
from ..protocol.messages import DirEntry
from .export import Export, off_loop, pread, pwrite, split_path
from .locator import Location, Locator
from .parents import Parents
from .peers import PeerPool
from .readahead import ReadAhead
from .renames import Renames, enoent
from .service import LISTDIR_MAX, MAX_IO

XATTR_PREFIX = "user.gmount."
VIRTUAL_XATTRS = ("user.gmount.node", "user.gmount.site", "user.gmount.where", "user.gmount.local_path")

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class FileHandle:
    """An open file, bound at open time to one holder (close-to-open)."""

    path: str
    node: str
    attr: Attr
    fd: int | None = None        # when the holder is this node
    remote: int | None = None    # the holder's handle id otherwise
    wrote: bool = False
    reader: ReadAhead | None = None  # sequential read-ahead, remote handles only
    created: bool = False        # made by this open (O_CREAT of a new name), not an existing file
    unsettled: str | None = None  # a write sent to the holder whose outcome is not known: which, and why
    dirty: bool = False          # written through this handle since its last announcement (remote handles)
    announced: tuple[int, int, int] | None = None  # the version its directory's home was last told of

    @property
    def remote_handle(self) -> int:
        """The holder's handle id, for a file open on another node."""
        if self.remote is None:
            raise OSError(errno.EBADF, f"{self.path} is open on this node ({self.node}), not through a peer")
        return self.remote


@dataclass(frozen=True)
class ListingEntry:
    name: str
    location: Location          # the nearest holder: what the mount shows
    holders: tuple[str, ...]    # every node listing it, nearest first


@dataclass(frozen=True)
class MergedListing:
    entries: list[ListingEntry]
    unreachable: list[str]      # nodes that did not answer: their entries are missing


def join(parent: str, name: str) -> str:
    return "/" + name if parent == "/" else f"{parent}/{name}"


class Namespace:
    def __init__(self, me: str, sites: dict[str, str], export: Export, peers: PeerPool,
                 locator: Locator, nursery: trio.Nursery | None = None) -> None:
        self.me = me
        self._nursery = nursery  # for read-ahead tasks; None disables read-ahead
        self.site_of = sites
        self.export = export
        self.peers = peers
        self.locator = locator
        self.parents = Parents(me, export, peers, locator, self.lookup)  # those a create or rename makes
        self.renames = Renames(peers, locator, self.parents)
        #: Called when another node created a path (the FUSE layer drops the kernel's
        #: negative entries there).
        self.on_created_elsewhere: Callable[[str, bool], Awaitable[None]] | None = None
        #: path -> set when the close of a handle that wrote it has told the locator its final
        #: attributes (see `release`)
        self._releasing: dict[str, trio.Event] = {}

    # -- finding -------------------------------------------------------------

    async def lookup(self, path: str) -> Location:
        if path == "/":
            return Location(self.me, self.export.lstat("/"))
        releasing = self._releasing.get(path)
        if releasing is not None:  # written here and being closed: its new attributes first
            await releasing.wait()
        location = await self.locator.find(path)
        if location is None:
            raise enoent(path)
        return location

    def forget_attributes(self, paths: Iterable[str]) -> None:
        """These names' attributes changed without a change through them (another name of the same
        file went): the next lookup asks again."""
        for path in paths:
            self.locator.invalidate(path)

    async def where(self, path: str) -> list[Location]:
        return await self.locator.find_all(path)

    async def listdir(self, path: str) -> list[tuple[str, Location]]:
        """Merged listing: every reachable node's entries, the nearest holder winning."""
        return [(entry.name, entry.location) for entry in (await self.merged_listing(path)).entries]

    async def merged_listing(self, path: str) -> MergedListing:
        """The merged listing with, for each name, every node that holds it, and who did not answer.

        A locator that knows whole directories (the homed index) answers in one round trip to
        the directory's home, or none under its lease; otherwise every node is asked."""
        indexed = await self.locator.listing(path)
        if indexed is not None:
            entries = []
            for name, locations in indexed:
                if locations[0].replica_of is None:
                    self.locator.learn(join(path, name), locations[0])
                entries.append(ListingEntry(name, locations[0], tuple(loc.node for loc in locations)))
            return MergedListing(entries, [])
        listings: dict[str, list[DirEntry]] = {}
        unreachable: list[str] = []

        async def fetch(node: str) -> None:
            try:
                try:
                    entries = await self.peers.ask(node, msg.Listdir(path))
                except OSError as exc:
                    if exc.errno != errno.EFBIG:
                        raise
                    entries = await self._listdir_in_pages(node, path)
            except PeerUnavailable:
                unreachable.append(node)
                return
            except OSError as exc:
                if exc.errno not in (errno.ENOENT, errno.ENOTDIR):
                    raise
                return
            if entries is not None:
                listings[node] = entries

        async with open_nursery() as nursery:
            for node in self.locator.order:
                if self.peers.is_down(node):
                    unreachable.append(node)
                else:
                    nursery.start_soon(fetch, node)
        if not listings:
            raise enoent(path)
        merged: dict[str, Location] = {}
        holders: dict[str, list[str]] = {}
        for node in self.locator.order:
            for entry in listings.get(node, ()):
                name = entry.name
                if entry.replica_of is not None and node != self.me:
                    continue  # a staged replica serves only its own node
                holders.setdefault(name, []).append(node)
                if name in merged:
                    continue
                if entry.replica_of is not None:
                    merged[name] = Location(node, entry.attr, replica_of=entry.replica_of)
                    continue
                merged[name] = Location(node, entry.attr)
                self.locator.learn(join(path, name), merged[name])
        entries = [ListingEntry(name, location, tuple(holders[name])) for name, location in merged.items()]
        return MergedListing(entries, sorted(unreachable, key=self.locator.rank))

    async def _listdir_in_pages(self, node: str, path: str) -> list[DirEntry] | None:
        """A directory too big for one reply: page through a snapshot the holder keeps for us."""
        opened = await self.peers.ask(node, msg.Opendir(path))
        if opened is None:
            return None
        entries: list[DirEntry] = []
        try:
            while len(entries) < opened.count:
                page = await self.peers.ask(node, msg.Readdir(opened.handle, len(entries), LISTDIR_MAX))
                if not page:
                    break
                entries.extend(page)
        finally:
            await self.peers.ask(node, msg.Closedir(opened.handle))
        return entries

    async def readlink(self, path: str) -> str:
        location = await self.lookup(path)
        return await self.peers.ask(location.node, msg.Readlink(path))

    async def statfs(self) -> tuple[int, ...]:
        """This node's export: creates land here, so its free space is what a writer has."""
        return self.export.statfs()

    # -- file data -----------------------------------------------------------

    async def _original(self, path: str) -> Location:
        """The holder a change must go to: the nearest holder, or a replica's source."""
        location = await self.lookup(path)
        if location.replica_of is None:
            return location
        attr = await self.peers.ask(location.replica_of, msg.Lookup(path))
        if attr is None:
            self.locator.invalidate(path)
            raise enoent(path)
        return Location(location.replica_of, attr)

    async def open(self, path: str, flags: int) -> FileHandle:
        """Open at the holder; the handle's attributes are the holder's, fresh (close-to-open)."""
        writing = flags & os.O_ACCMODE != os.O_RDONLY or flags & os.O_TRUNC
        location = await (self._original(path) if writing else self.lookup(path))
        if location.replica_of is not None and not await self.locator.confirm_replica(path):
            self.locator.invalidate(path)  # its source changed since the lookup: read the source
            location = await self.lookup(path)
        try:
            return await self._open_at(location, path, flags)
        except PeerUnavailable:
            if flags & os.O_TRUNC:  # the holder may have truncated it before its reply was lost
                with trio.CancelScope(shield=True):
                    await self.locator.announce_unsure([path])
            raise
        except FileNotFoundError:
            # The cached holder no longer has it (moved, replaced, removed): ask again
            # past the caches before answering "no such file".
            self.locator.invalidate(path)
            await self.locator.announce_unsure([path])  # an index that named that holder is wrong
            location = await (self._original(path) if writing else self.lookup(path))
            return await self._open_at(location, path, flags)

    async def _open_at(self, location: Location, path: str, flags: int) -> FileHandle:
        if location.node == self.me:
            # An open walks the path like a lookup (kept on the event loop, see service.INLINE_OPS);
            # only a truncating open, which may free a large file's blocks, goes to a thread.
            fd = (await off_loop(self.export.open, path, flags) if flags & os.O_TRUNC
                  else self.export.open(path, flags))
            opened = FileHandle(path, self.me, self.export.attr(os.fstat(fd)), fd=fd)
        else:
            reply = await self.peers.ask(location.node, msg.Open(path, flags))
            opened = FileHandle(path, location.node, reply.attr, remote=reply.handle)
            if self._nursery is not None:
                reader = opened
                opened.reader = ReadAhead(lambda off, size: self._read_remote(reader, off, size), self._nursery,
                                          size=reply.attr.size)
        if flags & os.O_TRUNC:  # the size cached before the open is wrong now
            self.locator.learn(path, Location(opened.node, opened.attr))
            await self.locator.announce_changed(path, Location(opened.node, opened.attr))
        elif _content_version(opened.attr) != _content_version(location.attr):
            # The holder has changed the file since it was looked up here. The FUSE layer drops the
            # kernel's attributes at this open; drop ours too, or the kernel's next getattr (a `stat`
            # after this read) would be given the old size again until attr_ttl ran out.
            self.locator.invalidate(path)
        return opened

    async def create(self, path: str, flags: int, mode: int,
                     check_existing: Callable[[Attr], None] | None = None) -> FileHandle:
        """open(O_CREAT): the existing file if any reachable node has it, else a new one here.
        `check_existing` may refuse to open an existing file (the caller's permission, which the
        kernel checked for a create of a new name only)."""
        parents = await self.parents.missing_on(self.me, path)
        existing = await self._find_everywhere(path)
        if existing is not None:
            if flags & os.O_EXCL:
                raise FileExistsError(errno.EEXIST, f"{path} exists (on node {existing.node})")
            if existing.attr.is_dir:
                raise IsADirectoryError(errno.EISDIR, f"{path} is a directory (on node {existing.node})")
            if check_existing is not None:
                check_existing(existing.attr)
            return await self.open(path, flags & ~(os.O_CREAT | os.O_EXCL))
        fd = await self._made_here(path, lambda: off_loop(self.export.create, path, flags, mode), parents)
        attr = self.export.attr(os.fstat(fd))
        self.locator.note_created(path, Location(self.me, attr))
        handle = FileHandle(path, self.me, attr, fd=fd, wrote=True, created=True)
        await self._announce_created(path)
        return handle

    async def _find_everywhere(self, path: str, is_dir: bool = False) -> Location | None:
        """Does `path` exist anywhere reachable, now (no cache)? If not, it is claimed for this node
        (the create must follow, or be withdrawn: `_made_here`)."""
        return await self.locator.claim(path, is_dir=is_dir)

    async def _made_here(self, path: str, make: Callable[[], Awaitable[T]],
                         parents: list[tuple[str, Attr]]) -> T:
        """Make the claimed `path` in this export, its missing `parents` first (`Parents.missing_on`);
        a failure withdraws the claim -- unless another create here made the name meanwhile (two
        processes of this node creating one name: their claims are one, and it is the winner's)."""
        try:
            await self.parents.make(self.me, parents)
            return await make()
        except BaseException as exc:
            with trio.CancelScope(shield=True):
                if not (isinstance(exc, FileExistsError) and self._held_here(path)):
                    await self.locator.withdraw(path)
            raise

    def _held_here(self, path: str) -> bool:
        try:
            self.export.lstat(path)
            return True
        except OSError:
            return False

    async def _announce_created(self, path: str, is_dir: bool = False) -> None:
        """Every node that must know of the new `path` knows when this returns (hand-off rule 1)."""
        await self.locator.announce_created(path, is_dir)

    async def created_by_put(self, path: str, attr: Attr) -> None:
        """A put from outside the mount (API, fsspec, Snakemake storage) made `path` in this export:
        the same hand-off as a create through the mount -- this node's kernel and every node hear of it."""
        self.locator.note_created(path, Location(self.me, attr))
        if self.on_created_elsewhere is not None:
            await self.on_created_elsewhere(path, attr.is_dir)
        await self._announce_created(path, attr.is_dir)

    async def created_elsewhere(self, path: str, is_dir: bool = False) -> None:
        """Another node created `path` (or renamed something to it): forget "not found" for it."""
        split_path(path)  # a peer's request: refuse anything that is not a namespace path
        if path == "/":
            return
        self.locator.forget_absent(path, bool(is_dir))
        if self.on_created_elsewhere is not None:
            await self.on_created_elsewhere(path, bool(is_dir))

    async def read(self, handle: FileHandle, offset: int, size: int) -> bytes:
        if handle.fd is not None:
            return await pread(handle.fd, size, offset)
        if handle.reader is not None:
            return await handle.reader.read(offset, size)
        return await self._read_remote(handle, offset, size)

    async def _read_remote(self, handle: FileHandle, offset: int, size: int) -> bytes:
        """Read from the holder at exactly this offset (one RPC per MAX_IO)."""
        if size <= MAX_IO:
            return await self.peers.ask(handle.node, msg.Read(handle.remote_handle, offset, size))
        chunks = []
        for start in range(offset, offset + size, MAX_IO):
            piece = msg.Read(handle.remote_handle, start, min(MAX_IO, offset + size - start))
            chunk = await self.peers.ask(handle.node, piece)
            chunks.append(chunk)
            if len(chunk) < MAX_IO:
                break
        return b"".join(chunks)

    def drop_read_ahead(self, handles: Iterable[FileHandle]) -> None:
        """The file was written through another handle of this node: read-ahead may be stale."""
        for handle in handles:
            if handle.reader is not None:
                handle.reader.invalidate()

    async def write(self, handle: FileHandle, offset: int, data: bytes) -> int:
        handle.wrote = handle.dirty = True
        if handle.reader is not None:
            handle.reader.invalidate()
        self.locator.invalidate(handle.path)  # release() learns the final attributes
        if handle.fd is not None:
            return await pwrite(handle.fd, data, offset)
        written = 0
        view = memoryview(data)
        while written < len(data):
            piece = bytes(view[written:written + MAX_IO])
            answered = False
            try:
                wrote = await self.peers.ask(handle.node, msg.Write(handle.remote_handle, offset + written, piece))
                answered = True
            except OSError as exc:
                answered = not isinstance(exc, PeerUnavailable)  # the holder's own error: nothing pending
                if written:
                    return written  # a short write (POSIX): what landed, not an error -- a retry must not repeat it
                raise
            finally:
                if not answered:  # no reply (timed out, connection lost, cancelled): it may land later
                    handle.unsettled = (f"a write of {len(piece)} B at offset {offset + written} of {handle.path} "
                                        f"got no reply from node {handle.node}")
            written += wrote
            if wrote < len(piece):
                break  # the holder wrote less (a full disk): say so, as write(2) would
        return written

    async def flush(self, handle: FileHandle, call: str = "close", *, named: bool = True) -> None:
        """close(2) of a descriptor (and fsync): when it returns, every write made through the handle has
        landed at the holder or never will (docs/failures.md), and a file written through it has been
        announced to its directory's home (close-to-open: the home vouches for staged replicas of it).
        Free for a handle that wrote nothing. A write that got no reply makes the holder settle the
        handle first (one round trip); if it cannot be asked, this fails with EIO. `named`: False
        when the file was unlinked or renamed over while open (its name is another file's now)."""
        await self._settle(handle, call)
        if call == "close" and handle.wrote and named:
            await self._announce_written(handle)

    async def _settle(self, handle: FileHandle, call: str) -> None:
        if handle.unsettled is None or handle.fd is not None:
            return
        try:
            await self.peers.ask(handle.node, msg.Settle(handle.remote_handle))
        except OSError as exc:
            message = (f"{call} of {handle.path}: {handle.unsettled}, and node {handle.node} could not be asked to "
                       f"settle it ({exc.strerror or exc}): whether that write landed is unknown, and it may "
                       "still land later; check the file once the node answers")
            log.warning("%s", message)
            raise OSError(errno.EIO, message) from None
        handle.unsettled = None

    async def _announce_written(self, handle: FileHandle) -> None:
        """Tell the directory's home of the file's new version, if it changed since the last time.

        A handle of this node's file is checked by its fstat (the kernel's passthrough writes it
        unseen here); another node's file only if written through this handle since."""
        if handle.fd is not None:
            attr = self.export.attr(os.fstat(handle.fd))
        elif handle.dirty:
            try:
                attr = await self.peers.ask(handle.node, msg.Fstat(handle.remote_handle))
            except OSError as exc:  # the release tells the home it is unsure of the file
                log.info("could not learn the size of %s from node %s at its close: %s", handle.path, handle.node, exc)
                return
        else:
            return
        handle.dirty = False
        version = _content_version(attr)
        if version == (handle.announced or _content_version(handle.attr)):
            return
        self.locator.invalidate(handle.path)
        await self.locator.announce_changed(handle.path, Location(handle.node, attr))
        handle.announced = version

    async def fsync(self, handle: FileHandle, datasync: bool) -> None:
        if handle.fd is not None:
            await off_loop(os.fdatasync if datasync else os.fsync, handle.fd)
        else:
            await self._settle(handle, "fsync")  # a write without reply lands (or never will) before the sync
            await self.peers.ask(handle.node, msg.Fsync(handle.remote_handle, datasync))

    async def fstat(self, handle: FileHandle) -> Attr:
        if handle.fd is not None:
            return self.export.attr(os.fstat(handle.fd))
        return await self.peers.ask(handle.node, msg.Fstat(handle.remote_handle))

    async def release(self, handle: FileHandle, *, named: bool = True) -> Attr | None:
        """Close the handle; if it wrote, return the file's final attributes (None if unknown).

        `named` is False when the file was unlinked or renamed over while open. Nothing
        is learnt under any name: the name may have changed on another node, and an old
        name must not come back.
        """
        path = handle.path if named else None
        if path is None or not handle.wrote:
            return await self._release(handle, path)
        # The kernel sends the release after close(2) has returned, and a `stat` right after the
        # close must not be answered from what this node's locator, or the directory's home,
        # knew before the writes: a lookup of `path` here waits until this has told them.
        self._releasing[path] = done = trio.Event()
        try:
            return await self._release(handle, path)
        finally:
            done.set()
            if self._releasing.get(path) is done:
                del self._releasing[path]

    async def _release(self, handle: FileHandle, path: str | None) -> Attr | None:
        final: Attr | None = None
        if handle.fd is not None:
            if handle.wrote:
                final = self.export.attr(os.fstat(handle.fd))
                if path is not None:
                    self.locator.invalidate(path)
            os.close(handle.fd)
            if path is not None and final is not None and _content_version(final) != handle.announced:
                await self.locator.announce_changed(path, Location(handle.node, final))
            return final
        if handle.reader is not None:
            handle.reader.close()
        try:
            if handle.wrote:
                final = await self.peers.ask(handle.node, msg.Fstat(handle.remote_handle))
                if path is not None:
                    self.locator.invalidate(path)
            await self.peers.ask(handle.node, msg.Close(handle.remote_handle))
        except OSError:
            pass  # the holder is gone; its side closed with the connection
        if path is not None and final is not None:
            if _content_version(final) != handle.announced:
                await self.locator.announce_changed(path, Location(handle.node, final))
        elif path is not None and handle.wrote:  # written, but its final size is not known here
            await self.locator.announce_unsure([path])
        return final

    # -- namespace changes ---------------------------------------------------

    async def mkdir(self, path: str, mode: int) -> Attr:
        parents = await self._refuse_existing(path, is_dir=True)
        attr = await self._made_here(path, lambda: off_loop(self.export.mkdir, path, mode), parents)
        self.locator.note_created(path, Location(self.me, attr))
        await self._announce_created(path, is_dir=True)
        return attr

    async def symlink(self, target: str, path: str) -> Attr:
        parents = await self._refuse_existing(path)
        attr = await self._made_here(path, lambda: off_loop(self.export.symlink, target, path), parents)
        self.locator.note_created(path, Location(self.me, attr))
        await self._announce_created(path)
        return attr

    async def _refuse_existing(self, path: str, is_dir: bool = False) -> list[tuple[str, Attr]]:
        """Claim `path` for a create here, EEXIST if it exists; the parents the create makes first."""
        parents = await self.parents.missing_on(self.me, path)
        existing = await self._find_everywhere(path, is_dir)
        if existing is not None:
            raise FileExistsError(errno.EEXIST, f"{path} exists (on node {existing.node})")
        return parents

    async def _all_holders(self, path: str) -> list[Location]:
        """Every holder, for a change that must reach all of them (EIO if a node cannot be asked)."""
        return await self.locator.find_all(path, strict=True)

    async def unlink(self, path: str) -> None:
        holders = await self._all_holders(path)
        if not holders:
            raise enoent(path)
        if holders[0].attr.is_dir:
            raise IsADirectoryError(errno.EISDIR, f"{path} is a directory")
        files = [location.node for location in holders if not location.attr.is_dir]
        try:
            if len(holders) == 1:  # the common case: removed and announced as one step
                await self.locator.change(files[0], path, msg.Unlink(path))
            else:
                for node in files:
                    await self.peers.ask(node, msg.Unlink(path))
                await self.locator.announce_removed(path, files)
        except BaseException:
            with trio.CancelScope(shield=True):
                await self.locator.announce_unsure([path])
            raise
        finally:
            if any(location.attr.is_dir for location in holders):
                self.locator.invalidate(path)  # a directory of that name remains elsewhere
            else:
                self.locator.note_removed(path)

    async def rmdir(self, path: str) -> None:
        holders = [loc for loc in await self._all_holders(path) if loc.attr.is_dir]
        if not holders:
            raise enoent(path)
        try:
            for location in holders:
                try:
                    await self.peers.ask(location.node, msg.Rmdir(path))
                except PeerUnavailable:
                    raise
                except OSError as exc:
                    raise type(exc)(exc.errno, f"cannot remove {path} on node {location.node}: "
                                               f"{exc.strerror or exc}") from None
        except BaseException:
            with trio.CancelScope(shield=True):
                await self.locator.announce_unsure([path])
            raise
        else:
            await self.locator.announce_removed(path, [loc.node for loc in holders], is_dir=True)
        finally:
            self.locator.note_removed(path)

    async def rename(self, src: str, dst: str, flags: int = 0) -> bool:
        """Rename; returns whether `src` was a directory (its children moved with it): `renames`."""
        return await self.renames.rename(src, dst, flags)

    async def setattr(self, path: str, *, mode: int | None = None, size: int | None = None,
                      atime_ns: int | None = None, mtime_ns: int | None = None,
                      handle: FileHandle | None = None) -> Attr:
        node = handle.node if handle is not None else (await self._original(path)).node
        attr: Attr | None = None
        changes: list[msg.Request[Attr]] = []  # by path, on `node`: the last one is announced with it
        if size is not None:
            if handle is not None and handle.fd is not None:
                await off_loop(os.ftruncate, handle.fd, size)
                attr = self.export.attr(os.fstat(handle.fd))
            elif handle is not None:
                attr = await self.peers.ask(node, msg.Ftruncate(handle.remote_handle, size))
                if handle.reader is not None:
                    handle.reader.invalidate()
            else:
                changes.append(msg.Truncate(path, size))
        if mode is not None:
            changes.append(msg.Chmod(path, stat.S_IMODE(mode)))
        if atime_ns is not None or mtime_ns is not None:
            changes.append(msg.Utimens(path, atime_ns, mtime_ns))
        if changes:
            final = await self._change_by_path(node, path, changes)
        else:
            final = attr if attr is not None else (await self.lookup(path)).attr
            await self.locator.announce_changed(path, Location(node, final))
        self.locator.learn(path, Location(node, final))
        return final

    async def _change_by_path(self, node: str, path: str, changes: list[msg.Request[Attr]]) -> Attr:
        """`changes` on `node`, the last one recorded with the home. A reply lost on the way (the
        change may have been made) has the home list the directory again."""
        try:
            for request in changes[:-1]:
                await self.peers.ask(node, request)
            return await self.locator.change(node, path, changes[-1])
        except BaseException as exc:
            if isinstance(exc, PeerUnavailable) or not isinstance(exc, OSError):
                with trio.CancelScope(shield=True):
                    await self.locator.announce_unsure([path])
            raise

    # -- extended attributes ---------------------------------------------------

    async def getxattr(self, path: str, name: str) -> bytes:
        if name in VIRTUAL_XATTRS:
            return await self._virtual_xattr(path, name)
        location = await self.lookup(path)
        return await self.peers.ask(location.node, msg.Getxattr(path, name))

    async def _virtual_xattr(self, path: str, name: str) -> bytes:
        if name == "user.gmount.where":
            holders = await self.where(path)
            if not holders:
                raise enoent(path)
            return "\n".join(loc.node for loc in holders).encode()
        location = await self.lookup(path)
        if name == "user.gmount.node":
            return location.node.encode()
        if name == "user.gmount.site":
            return self.site_of[location.node].encode()
        # local_path: only when this node holds the file, so a job may bypass FUSE
        if location.node != self.me:
            raise OSError(errno.ENODATA, f"{path} is not on this node ({self.me}); it is on {location.node}")
        return self.export.local_path(path).encode()

    async def listxattr(self, path: str) -> list[str]:
        location = await self.lookup(path)
        try:
            names = await self.peers.ask(location.node, msg.Listxattr(path))
        except OSError as exc:
            if exc.errno != errno.EOPNOTSUPP:
                raise  # a holder's error is no empty list: `getfattr`, `cp -a` must hear of it
            names = []  # the holder's file system keeps no extended attributes
        virtual = [n for n in VIRTUAL_XATTRS if n != "user.gmount.local_path" or location.node == self.me]
        return virtual + [n for n in names if not n.startswith(XATTR_PREFIX)]

    async def setxattr(self, path: str, name: str, value: bytes) -> None:
        if name.startswith(XATTR_PREFIX):
            raise PermissionError(errno.EPERM, f"{name} is maintained by gmount and read-only")
        location = await self._original(path)
        await self.peers.ask(location.node, msg.Setxattr(path, name, value))

    async def removexattr(self, path: str, name: str) -> None:
        if name.startswith(XATTR_PREFIX):
            raise PermissionError(errno.EPERM, f"{name} is maintained by gmount and read-only")
        location = await self._original(path)
        await self.peers.ask(location.node, msg.Removexattr(path, name))

    # -- special files, hard links, owners (additive: kept apart from the handlers above) ----------

    async def mknod(self, path: str, mode: int, rdev: int) -> Attr:
        """A FIFO, socket or device node, created on this node like any create.

        Opening a FIFO through the mount never reaches the daemon: the kernel of the
        node whose mount is used makes the pipe, so a writer and a reader on one node
        talk through it; processes on different nodes each get their own node's pipe.
        """
        parents = await self._refuse_existing(path)
        attr = await self._made_here(path, lambda: off_loop(self.export.mknod, path, mode, rdev), parents)
        self.locator.note_created(path, Location(self.me, attr))
        await self._announce_created(path)
        return attr

    async def link(self, src: str, dst: str) -> Attr:
        """A hard link is link(2) on this node: its source must be a file of this node's export.

        Creates land on the local node, and a hard link can only share an inode on one
        disk, so a source held by another node answers EXDEV (`ln` reports it, `cp -l`
        and `mv` fall back to copying) -- never EPERM.
        """
        location = await self._original(src)
        if location.node != self.me:
            raise OSError(errno.EXDEV, f"cannot hard-link {src}: it is held by node {location.node}, "
                                       f"and links are made on this node ({self.me})")
        if location.attr.is_dir:
            raise PermissionError(errno.EPERM, f"{src} is a directory")
        parents = await self._refuse_existing(dst)
        attr = await self._made_here(dst, lambda: off_loop(self.export.link, src, dst), parents)
        self.locator.note_created(dst, Location(self.me, attr))
        self.locator.learn(src, Location(self.me, attr))  # same inode: nlink changed for both names
        await self._announce_created(dst)
        await self.locator.announce_changed(src, Location(self.me, attr))  # its home keeps attributes
        return attr

    async def chown(self, path: str, uid: int, gid: int) -> Attr:
        """lchown on the file's holder (a replica's source); -1 keeps an id. The holder's
        file system decides: root daemons may, others only as its rules allow (EPERM)."""
        location = await self._original(path)
        attr = await self.peers.ask(location.node, msg.Chown(path, uid, gid))
        self.locator.learn(path, Location(location.node, attr))
        await self.locator.announce_changed(path, Location(location.node, attr))
        return attr


def _content_version(attr: Attr) -> tuple[int, int, int]:
    """What tells one content of a file from another (as the FUSE layer's page-cache check)."""
    return attr.size, attr.mtime_ns, attr.ctime_ns
