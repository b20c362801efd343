"""Answers kept for a while: what a node caches, and what a home has promised.

Every "keep this until" of the lookup layer is one of two small types:

- `TtlCache`: answers a node was given (a holder, a "not found", a directory's home, the
  node last seen holding a path), each valid until its expiry, the least recently set
  dropped first beyond `max_entries`. A cache sets its entries with one lease length, so
  the oldest expire first: they are dropped from that end as new ones come, and the cache
  holds what its leases cover, not `max_entries` dead entries that every directory removal
  would scan. An entry with no expiry (`math.inf`) makes it a plain LRU map.
- `Leases`: what a home promised, per directory and name (who was told "not found", who
  was told a subdirectory's home, who holds the whole listing), to be revoked before a
  change makes the promise untrue. A lease that has ended is forgotten (`expire`): a home
  holds what it still promises, however many names were ever asked for.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

#: The name under which `Leases` holds a lease on a directory as a whole (its listing).
WHOLE = ""


class TtlCache(Generic[K, V]):
    """A bounded map of answers that expire: key -> (value, until).

    `max_entries`: the bound (the least recently set entry goes first). `keep_for`: how
    long an expired entry is kept before it is dropped, for callers that still need it
    after its lease (the last known home of a directory a change is owed to).
    """

    def __init__(self, max_entries: int, *, keep_for: float = 0.0) -> None:
        if max_entries < 0:
            raise ValueError(f"`max_entries` must be non-negative, got {max_entries!r}")
        self.max_entries = max_entries
        self.keep_for = keep_for
        self._entries: OrderedDict[K, tuple[V, float]] = OrderedDict()

    def put(self, key: K, value: V, until: float, now: float) -> None:
        """Keep `value` for `key` until `until`; entries expired by `now` go from the oldest end."""
        self._entries[key] = (value, until)
        self._entries.move_to_end(key)
        while self._entries:
            _, oldest = next(iter(self._entries.values()))
            if oldest + self.keep_for > now:
                break
            self._entries.popitem(last=False)
        if len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def get(self, key: K, now: float) -> V | None:
        """The value while it is valid (None: absent or expired)."""
        entry = self._entries.get(key)
        return entry[0] if entry is not None and entry[1] > now else None

    def peek(self, key: K) -> V | None:
        """The value, expired or not, while it is kept."""
        entry = self._entries.get(key)
        return entry[0] if entry is not None else None

    def entry(self, key: K) -> tuple[V, float] | None:
        """(value, until), expired or not, while it is kept."""
        return self._entries.get(key)

    def until(self, key: K) -> float | None:
        """When the entry for `key` expires (None: no entry)."""
        entry = self._entries.get(key)
        return entry[1] if entry is not None else None

    def pop(self, key: K) -> V | None:
        """Drop the entry for `key`; its value, expired or not."""
        entry = self._entries.pop(key, None)
        return entry[0] if entry is not None else None

    def discard_where(self, matches: Callable[[K], bool]) -> None:
        """Drop every entry whose key `matches` (a subtree that moved or went)."""
        for key in [key for key in self._entries if matches(key)]:
            del self._entries[key]

    def clear(self) -> None:
        self._entries.clear()

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[K]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


class Leases:
    """Leases a home handed out: directory -> name -> holder -> until.

    `grant` records one; `revoke` takes every holder of a name (to be told before the
    change), `expire` forgets the ones that ended. The name `WHOLE` stands for the
    directory as a whole (a lease on its listing).
    """

    def __init__(self) -> None:
        self._held: dict[str, dict[str, dict[str, float]]] = {}
        self._ends: list[tuple[float, str, str, str]] = []  # (until, directory, name, holder): a heap

    def grant(self, directory: str, name: str, holder: str, until: float) -> None:
        """`holder` is promised `name` of `directory` until `until` (replacing what it held)."""
        self._held.setdefault(directory, {}).setdefault(name, {})[holder] = until
        heapq.heappush(self._ends, (until, directory, name, holder))

    def holders(self, directory: str, name: str) -> dict[str, float]:
        """Who holds a lease on `name` (expired or not, until `expire`), and until when."""
        return dict(self._held.get(directory, {}).get(name, {}))

    def names(self, directory: str) -> list[str]:
        """The names of `directory` someone holds a lease on."""
        return list(self._held.get(directory, {}))

    def revoke(self, directory: str, name: str) -> dict[str, float]:
        """Take every lease on `name`: its holders, to be told (those still within theirs)."""
        names = self._held.get(directory)
        if names is None:
            return {}
        holders = names.pop(name, None) or {}
        if not names:
            del self._held[directory]
        return holders

    def expire(self, now: float) -> None:
        """Forget every lease that ended by `now`."""
        while self._ends and self._ends[0][0] <= now:
            until, directory, name, holder = heapq.heappop(self._ends)
            holders = self._held.get(directory, {}).get(name)
            if holders is None or holders.get(holder) != until:
                continue  # revoked, or granted again for longer
            del holders[holder]
            if not holders:
                names = self._held[directory]
                del names[name]
                if not names:
                    del self._held[directory]

    def __len__(self) -> int:
        """How many leases are held (one per holder and name)."""
        return sum(len(holders) for names in self._held.values() for holders in names.values())
