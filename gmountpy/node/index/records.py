"""The homes of subdirectories, as a directory's home records them and leases them out.

Only the root's home can be computed from its path (`Homes.home`). A directory made
through the mount is homed at its creator's site; one found in the exports at a site
that holds it (`Homes.of_holders`). The parent's home records that choice, returns it
with a lookup or listing of the subdirectory, and leases it to the asker (`home_lease`,
a minute; revoked by `index_unhome` when the subdirectory is removed or renamed). The
records are copied to the parent home's backup, so a home that restarts or a backup
that stands in keeps every subdirectory where it was.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence

import trio

from ...protocol import messages as msg
from .entries import BuiltDirectory, Entries
from .partitions import Partitioned
from .paths import join

log = logging.getLogger(__name__)


class SubdirectoryHomes(Partitioned):
    """The home's index, with the homes of its subdirectories recorded (see the module)."""

    def _backup_node(self, directory: str) -> str | None:
        """This directory's backup, when this node is its home (a stand-in has none to copy to).
        The servers of a split directory's partitions copy to its home's backup: one node keeps
        the homes of all its subdirectories."""
        if self.homes is None or directory in self._backing:
            return None
        parts = self._parts.get(directory)
        backup = self.homes.backup(directory, parts.home if parts is not None else self._peers.me)
        return None if backup == self._peers.me else backup

    async def _settle_homes(self, directory: str, entries: Entries) -> None:
        """After a build: every subdirectory has a recorded home. Records this node lacks (it
        restarted, or its backup took a mkdir while it was away) come from the backup first;
        the rest follow `Homes.of_holders` and are copied to the backup. Records of names that
        are gone are dropped (and their leases revoked)."""
        if self.homes is None:
            return
        records = self._child_homes.setdefault(directory, {})
        subdirs = {name: holders for name, holders in entries.items()
                   if any(holder.is_dir for holder in holders.values())}
        for name in [name for name in records if name not in subdirs and self._mine(directory, name)]:
            await self._drop_home(directory, name)
        records = self._child_homes.setdefault(directory, {})  # (dropped when it became empty)
        lacking = [name for name in subdirs if name not in records]
        backup = self._backup_node(directory)
        if lacking and backup is not None:
            try:
                theirs = await self._peers.ask(backup, msg.IndexRecords(directory, None), timeout=self.ask_timeout)
            except OSError as exc:
                log.info("backup %s could not give the homes recorded under %s: %s", backup, directory, exc)
            else:
                records = self._child_homes.setdefault(directory, {})
                for name in lacking:
                    if name in theirs and name not in records:
                        records[name] = theirs[name]
        derived = {name: self.homes.of_holders(join(directory, name), sorted(subdirs[name]))
                   for name in subdirs if name not in records}
        records.update(derived)
        if not records:
            self._child_homes.pop(directory, None)
        if derived:
            await self._copy_records(directory, dict(derived))

    async def _copy_records(self, directory: str, updates: dict[str, str | None], *,
                            seed: str | None = None) -> str | None:
        """Copy `updates` to this directory's backup (with `seed`, see IndexRecords); the backup
        they reached, None when there is none or it did not answer."""
        backup = self._backup_node(directory)
        if backup is None:
            return None
        try:
            await self._peers.ask(backup, msg.IndexRecords(directory, updates, seed), timeout=self.ask_timeout)
        except OSError as exc:
            log.info("could not copy the homes under %s to the backup %s: %s", directory, backup, exc)
            return None
        return backup

    def _child_home(self, directory: str, name: str, holders: Sequence[str]) -> str | None:
        if self.homes is None:
            return None
        records = self._child_homes.setdefault(directory, {})
        if name not in records:  # not built yet (a claim before any build): the rule for found ones
            records[name] = self.homes.of_holders(join(directory, name), sorted(holders))
        return records[name]

    def _lease_home(self, directory: str, name: str, asker: str | None) -> float:
        if asker is None or self.home_lease <= 0:
            return 0.0
        self._home_leases.grant(directory, name, str(asker), trio.current_time() + self.home_lease)
        return self.home_lease

    async def _drop_home(self, directory: str, name: str, *, forgotten_by: str | None = None,
                         index_home: str | None = None, kept: bool = False) -> list[str]:
        """Subdirectory `name` is gone: forget its home; whoever was told it forgets it too (a
        directory made again under that name may be homed elsewhere) -- but `forgotten_by`, the
        node that removed it through its mount, which forgets it itself before and after. Its
        index goes at its home (and at `index_home`, where the remover saw it homed): here, with
        the records copy at the backup, or in one message. `kept`: the remover is the backup and
        drops its copy of the record itself. The homes that did not answer."""
        records = self._child_homes.get(directory)
        home = records.pop(name, None) if records is not None else None
        homes = {node for node in (home, index_home) if node is not None}
        if index_home is not None and index_home == forgotten_by:
            homes.discard(index_home)  # the remover is the home: it forgot the index itself
        if home is None:
            return await self._forget_gone(join(directory, name), homes)
        if records is not None and not records:
            self._child_homes.pop(directory, None)
        if kept and forgotten_by is not None and self._backup_node(directory) == forgotten_by:
            backup: str | None = forgotten_by
        else:
            backup = await self._copy_records(directory, {name: None})  # the backup forgets its index too
        leases = self._home_leases.revoke(directory, name)
        await self._tell(leases, msg.IndexUnhome([join(directory, name)]), but=forgotten_by)
        return await self._forget_gone(join(directory, name), homes - {backup})

    async def _forget_gone(self, path: str, homes: Collection[str]) -> list[str]:
        """Directory `path` is gone: `homes` drop their index of it; the ones that did not answer."""
        unreached: list[str] = []
        for home in sorted(homes):
            if home == self._peers.me:
                await self.op_forget(msg.IndexForget([path]))
                continue
            try:
                await self._peers.ask(home, msg.IndexForget([path]), timeout=self.ask_timeout)
            except OSError as exc:
                log.info("could not tell %s, the home of %s, that it is gone: %s", home, path, exc)
                unreached.append(home)
        return unreached

    async def op_seed(self, request: msg.IndexSeed) -> None:
        """`directory` was just made by a mkdir through the mount (its name was new everywhere):
        its index starts empty and complete, instead of listing every node at the first lookup.
        Ignored when the index is built already (a create in it came first)."""
        directory, node = request.directory, request.node
        if directory in self._dirs or directory in self._building or directory in self._backing:
            return
        self._dirs[directory] = BuiltDirectory({}, trio.current_time(), (), holders={node} if node else set())

    async def op_records(self, request: msg.IndexRecords) -> dict[str, str]:
        """The copy of a directory's subdirectory homes that its home keeps here, as its backup:
        `updates` applied (None: removed) and nothing returned, or, without `updates`, all of
        them (a home that restarted takes them back) -- a mkdir's copy must not cost a reply
        that grows with the directory. `seed`: the creator of the new subdirectories in
        `updates`; those homed here start empty (op_seed)."""
        directory, updates, seed = request.directory, request.updates or {}, request.seed
        records = self._child_homes.setdefault(directory, {})
        for name, home in updates.items():
            if home is None:
                records.pop(name, None)
                self.forget([join(directory, name)])
            else:
                records[name] = home
        if not records:
            self._child_homes.pop(directory, None)
        if seed is not None:
            for name, home in updates.items():
                if home == self._peers.me:
                    await self.op_seed(msg.IndexSeed(join(directory, name), seed))
        return {} if updates else dict(self._child_homes.get(directory, {}))
