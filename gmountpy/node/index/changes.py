"""Changes made on this node, recorded at the homes of their directories before they return.

A create first claims its name at the directory's home, which prevents twins and
revokes the "not found" handed out for it elsewhere; then the local `open(O_CREAT)`.
A change to a file (chmod, utimens, truncate, unlink, a rename within its directory) is
made on its holder and then recorded at the home. When the home is nearer the holder
than this node (at the holder's site, this node at another), the holder records it
(`recorded`): one round trip across the WAN, not two. A removed directory's own index
is forgotten by its parent's home with the drop. A home that cannot be reached is owed
the change (it lists the directory again when back); a create it missed is told to every
node instead.
"""

from __future__ import annotations

import errno
import logging
from typing import Any

import trio

from ..._trio import open_nursery
from ...errors import PeerUnavailable
from ...protocol import messages as msg
from ...protocol.attr import Attr
from ...protocol.messages import R, Request
from ..locator import Location
from .homes import name_hash, partition_of
from .listings import Listing
from .lookups import Lookups
from .paths import split_parent

log = logging.getLogger(__name__)

#: Changes to a file that its holder records at the directory's home for a far asker (`recorded`).
_RECORDED_OPS = (msg.Chmod, msg.Utimens, msg.Truncate, msg.Unlink, msg.Rename)


class Changes(Lookups):
    """`IndexLocator`'s changes (see the module)."""

    async def _ancestors_missing_here(self, path: str) -> list[str]:
        """Parent directories of `path` this export lacks (a create here makes them), top first."""
        missing: list[str] = []
        directory = split_parent(path)[0]
        while directory != "/":
            if await self._peers.ask(self._peers.me, msg.Lookup(directory)) is not None:
                break
            missing.append(directory)
            directory = split_parent(directory)[0]
        return missing[::-1]

    async def claim(self, path: str, *, is_dir: bool = False) -> Location | None:
        """Before a create here: the holder if `path` exists; else the name is this node's at its home
        (one round trip; more only for parent directories this export lacks). A new directory's
        home is at this node's site (`Homes.of_creator`): this node knows it without asking."""
        local = await self._local(path)
        if local is not None:
            return local
        try:
            missing = await self._ancestors_missing_here(path)
            for parent in missing:
                directory, name = split_parent(parent)
                made = await self._dir_call(directory, msg.IndexClaim(directory, name, self._peers.me, True, False))
                await self._keep_record(parent, made)
            directory, name = split_parent(path)
            for _ in range(20):
                try:
                    sent, revoked = trio.current_time(), self._revoked
                    reply, stood_in_for = await self._dir_call_via(
                        directory, msg.IndexClaim(directory, name, self._peers.me, is_dir, True))
                    break
                except OSError as exc:
                    if isinstance(exc, PeerUnavailable) or exc.errno != errno.EAGAIN:
                        raise
                    await trio.sleep(0.05)  # another node is creating it right now
            else:
                raise OSError(errno.EAGAIN, f"{path} is being created on another node; try again")
        except PeerUnavailable as exc:
            return await self._claim_by_search(path, exc)
        others = reply.holders
        if is_dir and not others:
            await self._keep_record(path, reply)
        if others:
            await self._unclaim_parents(missing)  # the create opens the file there: nothing is made here
            found = self._nearest(others) or Location(others[0].node, others[0].attr)
            self.learn(path, found)  # the create opens it next: not from a "not found" cached before
            return found
        if stood_in_for is not None:
            held = await self._check_last_holder(path, stood_in_for)
            if held is not None:
                return held
        if is_dir and self.homes.central is None:
            self._note_home(path, self.homes.of_creator(path, self._peers.me), self.home_lease, sent, revoked)
        for parent in missing:
            await self._watch_here(parent)
        self._claimed.add(path)
        if reply.seeded:
            self._seeded.add(path)
        self.forget_absent(path, is_dir)  # "not found" for it, and for names in it (kept for a missing parent)
        return None

    async def _unclaim_parents(self, missing: list[str]) -> None:
        """The parent directories claimed for a create that will not be made here: this node holds
        none of them after all (a home that thought so would not list them here when they do
        appear, outside the mount)."""
        for parent in reversed(missing):
            await self._drop_claim(parent)

    async def _drop_claim(self, path: str) -> None:
        """Tell the home of `path`'s directory that this node does not hold `path` after all (owed
        to that home when it cannot be told)."""
        directory, name = split_parent(path)
        try:
            await self._dir_call(directory, msg.IndexDrop(directory, name, [self._peers.me]))
        except OSError as exc:
            log.info("could not withdraw the claim on %s at the home of %s: %s", path, directory, exc)
            self._owe_home_of(directory)

    async def _keep_record(self, path: str, reply: msg.IndexClaimReply) -> None:
        """The claim of the new directory `path` was taken by a node whose backup is this one: keep
        the record of its home (at this node's site) here, as that node would have sent it."""
        if not reply.keep:
            return
        directory, name = split_parent(path)
        home = self.homes.of_creator(path, self._peers.me)
        seed = self._peers.me if reply.seeded else None
        await self._peers.ask(self._peers.me, msg.IndexRecords(directory, {name: home}, seed))

    async def _watch_here(self, directory: str) -> None:
        """A create here is about to make `directory` in this export: have this node's
        ExportWatcher send files copied into it later to its home (no home lists it here)."""
        try:
            home = await self._home_node(directory)
            await self._peers.ask(self._peers.me, msg.IndexListdir(directory, home))
        except OSError as exc:
            log.info("%s will not be watched for files copied in: %s", directory, exc)

    async def _check_last_holder(self, path: str, home: str) -> Location | None:
        """A backup stood in for `home` and could not list it: if this node last saw `path` on a
        node that is not the home's stand-in's to see (the dead home itself), ask that node, as
        the search would -- a create must not make a twin of a file that is only out of reach.
        Returns that node's file when it has it (the claim is withdrawn: the create opens it);
        raises PeerUnavailable (EIO) when that node cannot be asked."""
        last = self._flood.last_holder(path)
        if last is None or last == self._peers.me:
            return None
        try:
            held = await self._peers.ask(last, msg.Lookup(path))
        except PeerUnavailable as exc:
            await self.withdraw_claim(path)
            raise PeerUnavailable(last, f"it held {path} when last seen and cannot be asked now (the home "
                                        f"{home} is down too); try again when it is back") from exc
        if held is None:
            return None
        await self.withdraw_claim(path)
        found = Location(last, held)
        self.learn(path, found)
        return found

    async def withdraw_claim(self, path: str) -> None:
        self._claimed.add(path)
        await self.withdraw(path)

    async def _claim_by_search(self, path: str, exc: PeerUnavailable) -> Location | None:
        """A home is unreachable: ask every node, as GMount does; announce the create to all of them."""
        log.info("claiming %s by asking every node: %s", path, exc)
        self._fallbacks += 1
        found = await self._flood.claim(path)
        if found is None:
            self._unclaimed.add(path)
            # the indexes of its directory and of the parents made here miss this create
            for directory in {split_parent(p)[0] for p in [path, *await self._ancestors_missing_here(path)]}:
                self._owe_home_of(directory)
        return found

    async def withdraw(self, path: str) -> None:
        self._unclaimed.discard(path)
        if path not in self._claimed:
            return
        self._claimed.discard(path)
        cached = self._homes.pop(path)
        await self._drop_claim(path)
        if path in self._seeded:  # the mkdir failed here: its seeded index goes (a later one starts anew)
            self._seeded.discard(path)
            own_home = cached if cached is not None else self.homes.central
            if own_home is not None:
                await self._forget_index_at(own_home, path)

    async def announce_created(self, path: str, is_dir: bool = False) -> None:
        """A claimed create needs nothing more (the claim told everyone). A name made here without a
        claim (a put) is recorded at its home now; without a reachable home every node is told."""
        location = self._just_created.pop(path, None)
        if path in self._claimed:
            self._claimed.discard(path)
            seeded = path in self._seeded
            self._seeded.discard(path)
            if is_dir:
                await self._seed(path, told_home=seeded)
                if self._homes.peek(path) == self._peers.me and self.index is not None:
                    await self.index.take_ownership(path, new=True)  # homed here, new: nobody holds a lease in it
            return
        if path in self._unclaimed:
            self._unclaimed.discard(path)
            await self._flood.announce_created(path, is_dir)
            return
        directory, name = split_parent(path)
        try:
            await self._dir_call(directory, msg.IndexSet(directory, name, self._peers.me,
                                                         None if location is None else location.attr, None, is_dir))
        except OSError as exc:
            log.info("could not record %s at the home of %s: %s; telling every node", path, directory, exc)
            self._owe_home_of(directory)
            await self._flood.announce_created(path, is_dir)

    async def _seed(self, directory: str, *, told_home: bool = False) -> None:
        """A mkdir here: tell the new directory's home (at this site) that it starts empty, so
        the first lookup or create in it does not make the home list every node -- unless the
        claim's server did (`told_home`: the home is that node or its backup)."""
        home = self._homes.peek(directory)
        if home is None:
            return
        try:
            # this export's copy is watched like a listed one (files copied into it reach the home)
            await self._peers.ask(self._peers.me, msg.IndexListdir(directory, home))
            if not told_home:
                await self._home_call(home, msg.IndexSeed(directory, self._peers.me))
        except OSError as exc:
            log.info("could not tell %s that the new directory %s is empty: %s", home, directory, exc)

    async def change(self, node: str, path: str, request: Request[R]) -> R:
        """`request` (chmod, utimens, truncate, unlink, a file's rename: `_RECORDED_OPS`) on `node`,
        the one holder of `path`, recorded at its directory's home before this returns. When
        `node` is nearer that home than this node (the home is at the holder's site, this node
        at another), `node` records it (msg.Recorded): one round trip across the WAN, not one
        to the holder and another to the home."""
        directory, name = split_parent(path)
        directories = [directory]
        home = self._relay_home(node, directory)
        if isinstance(request, msg.Rename) and split_parent(request.dst)[0] != directory:
            directories.append(split_parent(request.dst)[0])
            home = None  # two directories, two homes: this node records it
        begun = [self._begin_own_change(d) for d in directories]
        applied = False
        try:
            if home is not None:
                result = await self._peers.ask(node, msg.Recorded(home, self._peers.me, request))
            else:
                result = await self._peers.ask(node, request)
                await self._record(node, path, request, result, self._peers.me, None)
            applied = True
        finally:
            listings = [self._end_own_change(d, listing, generation, applied)
                        for d, (listing, generation) in zip(directories, begun, strict=True)]
        if isinstance(request, msg.Rename):
            holders = listings[0].take(name) if listings[0] is not None else None
            target = listings[-1]
            if target is not None and holders is not None:
                target.put(split_parent(request.dst)[1], holders)
            elif target is not None:
                self._drop_listing(directories[-1])
        elif listings[0] is not None:
            kept = (listings[0].remove(name, node) if isinstance(request, msg.Unlink) else
                    isinstance(result, Attr) and listings[0].set_attr(name, node, result))
            if not kept:
                self._drop_listing(directory)
        return result

    def _begin_own_change(self, directory: str) -> tuple[Listing | None, int]:
        """Before a change here in `directory`: the listing kept of it, and this change's number.
        The home does not revoke this node's listing for its own change: `_end_own_change` applies it."""
        if directory in self._listing_stale:
            self._listing_stale[directory] = True  # a listing under way may predate the change
        counts = self._own_changes.setdefault(directory, [0, 0])
        counts[0] += 1
        counts[1] += 1
        return self._listings.get(directory), counts[0]

    def _end_own_change(self, directory: str, listing: Listing | None, generation: int,
                        applied: bool) -> Listing | None:
        """The listing the change begun as `generation` may be applied to: the one kept when it
        began, still leased, with no other change here begun meanwhile (their records may reach
        the home in another order). Any other listing of `directory` is dropped."""
        if directory in self._listing_stale:
            self._listing_stale[directory] = True  # a listing under way may predate the change too
        counts = self._own_changes[directory]
        alone = counts[0] == generation
        counts[1] -= 1
        if not counts[1]:
            del self._own_changes[directory]
        current = self._listings.get(directory)
        if current is None:
            return None
        if applied and alone and current is listing and current.until > trio.current_time():
            return current
        self._drop_listing(directory)
        return None

    def _relay_home(self, node: str, directory: str) -> str | None:
        """The home `node` should record a change of `directory` at (None: this node records it):
        only a home known here, of a directory not split, nearer `node` than this node."""
        if node == self._peers.me or directory in self._parts:
            return None
        home = self._known_home(directory)
        if home is None or self._distance(node, home) >= self._distance(self._peers.me, home):
            return None
        return home

    def _known_home(self, directory: str) -> str | None:
        """The home of `directory` as known here without a message (None: not known now)."""
        if directory == "/" or self.homes.central is not None:
            return self.homes.home(directory)
        return self._homes.get(directory, trio.current_time())

    def _distance(self, a: str, b: str) -> float:
        """How far a round trip from `a` to `b` goes: none to itself, then within a site, then to
        other sites by the overlay's RTT (unknown: as far as can be)."""
        if a == b:
            return 0.0
        site_a, site_b = self.homes.site_of.get(a), self.homes.site_of.get(b)
        if site_a == site_b:
            return 1.0
        return 2.0 + self.homes.site_rtt.get((str(site_a), str(site_b)), float("inf"))

    async def _record(self, node: str, path: str, request: Request[Any], result: Any, asker: str,
                      home: str | None) -> None:
        """Record `request`, made on `node` with `result`, at the home of the directory of `path`
        (`home`, when an asker told it) as a change `asker` made."""
        directory, name = split_parent(path)
        record: Request[None] | Request[list[str]]
        if isinstance(request, msg.Rename):
            await self._record_renamed(request.src, request.dst, False, [node], asker, home)
            return
        if isinstance(request, msg.Unlink):
            record = msg.IndexDrop(directory, name, [node], asker)
        elif isinstance(result, Attr):
            record = msg.IndexSet(directory, name, node, result, None, result.is_dir, asker)
        else:
            raise TypeError(f"{request.op} is not a change a home records")
        try:
            await self._dir_call_via(directory, record, home)
        except OSError as exc:
            log.info("could not record the change of %s at the home of %s: %s", path, directory, exc)
            self._owe_for(directory, home)

    async def op_recorded(self, recorded: msg.Recorded[Any]) -> Any:
        """The change carried (`request`) to a file this node holds, made here for `asker` and
        recorded at `home` before the reply."""
        request = recorded.request
        if not isinstance(request, _RECORDED_OPS):
            raise OSError(errno.EINVAL, f"node {self._peers.me} does not record {request.op!r} for another node")
        result = await self._peers.ask(self._peers.me, request)
        path = request.src if isinstance(request, msg.Rename) else request.path
        await self._record(self._peers.me, path, request, result, recorded.asker, recorded.home)
        return result

    async def announce_removed(self, path: str, nodes: list[str], is_dir: bool = False) -> None:
        directory, name = split_parent(path)
        own_home: str | None = None
        if is_dir:  # its own index goes too: a directory made again under this name starts empty
            own_home = self._homes.peek(path)
            if own_home is None and self.homes.central is not None:
                own_home = self.homes.home(path)
            self._forget_homes([path])
        self._drop_listing(directory)  # not revoked by the home: this node is the asker
        if own_home == self._peers.me:  # its index here goes here; the others' with the drop
            await self._forget_index_at(own_home, path)
        parent_home = self._known_home(directory)
        keep = is_dir and parent_home is not None and self.homes.backup(directory, parent_home) == self._peers.me
        if keep:  # this node keeps the copy of the parent's records: the home sends none
            await self._peers.ask(self._peers.me, msg.IndexRecords(directory, {name: None}))
        try:
            unreached = await self._dir_call(directory, msg.IndexDrop(directory, name, nodes, self._peers.me,
                                                                      own_home, keep))
        except OSError as exc:
            log.info("could not record the removal of %s at the home of %s: %s", path, directory, exc)
            self._owe_home_of(directory)
            if own_home not in (None, self._peers.me):
                await self._forget_index_at(own_home, path)
        else:
            for home in unreached:
                self._owe(home, path)
        if is_dir:  # again: the parent's home does not revoke here a home of `path` learnt meanwhile
            self._forget_homes([path])

    async def _forget_index_at(self, home: str, directory: str) -> None:
        """`directory` is gone (or was never made): its home drops its index; owed when it does not answer."""
        try:
            await self._home_call(home, msg.IndexForget([directory]))
        except OSError as exc:
            log.info("could not tell %s, the home of %s, that it is gone: %s", home, directory, exc)
            self._owe(home, directory)

    async def announce_renamed(self, src: str, dst: str, is_dir: bool, holders: list[str]) -> None:
        """Drop `src` at its directory's home, record `dst` at its own (revoking "not found"). A
        directory's descendants change path, and so home: every node forgets their homes and indexes."""
        self._drop_listing(split_parent(src)[0])  # not revoked by their homes: this node is the asker
        self._drop_listing(split_parent(dst)[0])
        await self._record_renamed(src, dst, is_dir, holders, self._peers.me, None)

    async def _record_renamed(self, src: str, dst: str, is_dir: bool, holders: list[str], asker: str,
                              home: str | None) -> None:
        """announce_renamed's records, as a rename `asker` made (`home`: of both names' directory,
        as the asker knows it, when the holder records a rename for it)."""
        src_dir, src_name = split_parent(src)
        dst_dir, dst_name = split_parent(dst)
        if not await self._renamed_at_one_home(src, dst, is_dir, holders, asker, home):
            try:
                await self._dir_call_via(src_dir, msg.IndexDrop(src_dir, src_name, None, asker), home)
            except OSError as exc:
                log.info("could not record the rename of %s: %s", src, exc)
                self._owe_for(src_dir, home)
            try:
                await self._dir_call_via(dst_dir, msg.IndexReplace(dst_dir, dst_name, holders, is_dir, asker),
                                         home if dst_dir == src_dir else None)
            except OSError as exc:
                log.info("could not record the rename to %s: %s; telling every node", dst, exc)
                self._owe_for(dst_dir, home if dst_dir == src_dir else None)
                await self._flood.announce_created(dst, is_dir)
        if is_dir:
            await self._forget_everywhere([src, dst])

    async def _renamed_at_one_home(self, src: str, dst: str, is_dir: bool, holders: list[str], asker: str,
                                   home: str | None) -> bool:
        """A rename within one directory, in one message to its home (IndexRename); False when
        the two messages are needed instead: two directories, or names a split directory serves
        on different nodes."""
        directory, src_name = split_parent(src)
        dst_dir, dst_name = split_parent(dst)
        if dst_dir != directory:
            return False
        bitmap = self._parts.get(directory)
        if bitmap is not None and partition_of(name_hash(src_name), bitmap) != partition_of(name_hash(dst_name),
                                                                                             bitmap):
            return False
        try:
            await self._dir_call_via(directory, msg.IndexRename(directory, dst_name, src_name, holders, is_dir,
                                                                asker), home)
        except OSError as exc:
            if not isinstance(exc, PeerUnavailable) and exc.errno == errno.EXDEV:
                return False  # split in partitions this node did not know of yet
            log.info("could not record the rename of %s to %s: %s; telling every node", src, dst, exc)
            self._owe_for(directory, home)
            await self._flood.announce_created(dst, is_dir)
        return True

    async def announce_unsure(self, paths: list[str]) -> None:
        """A change failed half-way: the homes of the paths' directories list them again."""
        for path in paths:
            directory = split_parent(path)[0]
            try:
                home = await self._home_node(directory)
            except PeerUnavailable:
                continue
            try:
                await self._home_call(home, msg.IndexForget([directory]))
            except OSError:
                self._owe(home, directory)
        self._forget_cached(paths)

    async def _forget_everywhere(self, prefixes: list[str]) -> None:
        async def tell(node: str) -> None:
            try:
                if node != self._peers.me:
                    self._remote += 1
                await self._peers.ask(node, msg.IndexUnhome(prefixes, True))
            except OSError as exc:
                log.info("could not tell %s to forget the homes and indexes under %s: %s", node, prefixes, exc)

        async with open_nursery() as nursery:
            for node in self.order:
                nursery.start_soon(tell, node)
