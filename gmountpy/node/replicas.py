"""Staged copies: which files in this export are replicas of a file elsewhere.

A replica remembers its source node and the source's (size, mtime) at copy
time. It may serve reads on this node only while the source still has that
(size, mtime); the locator checks that (see locator.py). The replica's own
(size, mtime) are remembered too: if someone changes the copy directly in
the export, it stops being a replica and is an ordinary file of this node.

The table is small (one entry per staged file) and persisted as JSON so a
restarted daemon still knows its replicas.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass

from .export import Attr

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Replica:
    source: str
    source_size: int
    source_mtime_ns: int
    local_size: int
    local_mtime_ns: int
    sha256: str

    def matches_local(self, attr: Attr) -> bool:
        return attr.is_file and (attr.size, attr.mtime_ns) == (self.local_size, self.local_mtime_ns)

    def matches_source(self, attr: Attr | None) -> bool:
        return attr is not None and (attr.size, attr.mtime_ns) == (self.source_size, self.source_mtime_ns)


class ReplicaTable:
    def __init__(self, path: str | None = None) -> None:
        self._path = path
        self._entries: dict[str, Replica] = {}
        if path is not None:
            self._load()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, path: str) -> Replica | None:
        return self._entries.get(path)

    def add(self, path: str, replica: Replica) -> None:
        self._entries[path] = replica
        self._save()

    def forget(self, path: str) -> None:
        if self._entries.pop(path, None) is not None:
            self._save()

    def renamed(self, src: str, dst: str) -> None:
        """A rename in this export moves replicas with it (a directory's too)."""
        self._entries.pop(dst, None)
        prefix = src + "/"
        moved = {p: r for p, r in self._entries.items() if p == src or p.startswith(prefix)}
        if not moved:
            return
        for path, replica in moved.items():
            del self._entries[path]
            self._entries[dst + path[len(src):]] = replica
        self._save()

    def _load(self) -> None:
        assert self._path is not None
        try:
            with open(self._path) as f:
                raw = json.load(f)
            self._entries = {path: Replica(**entry) for path, entry in raw.items()}
        except FileNotFoundError:
            pass
        except (ValueError, TypeError) as exc:
            log.warning("ignoring damaged replica table %s: %s", self._path, exc)

    def _save(self) -> None:
        if self._path is None:
            return
        os.makedirs(os.path.dirname(self._path), mode=0o700, exist_ok=True)
        tmp = self._path + ".tmp"
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            json.dump({path: asdict(r) for path, r in self._entries.items()}, f)
        os.replace(tmp, self._path)
