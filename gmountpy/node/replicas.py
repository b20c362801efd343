"""Staged copies: which files in this export are replicas of a file elsewhere.

A replica remembers its source node and the source's (size, mtime) at copy
time. It may serve reads on this node only while the source still has that
(size, mtime); the locator checks that (see locator.py). The replica's own
(size, mtime) are remembered too: if someone changes the copy directly in
the export, it stops being a replica and is an ordinary file of this node.

The table is small (one entry per staged file) and persisted as JSON so a
restarted daemon still knows its replicas. It is written atomically (a
temporary file, fsync, rename, fsync of the directory) and carries a
checksum of its contents. It also lists the temporary files of stagings in
progress, so that a daemon killed in the middle of one removes them when it
starts again instead of showing them as ordinary files.

A table that exists but cannot be read is *damaged*: the node then serves no
replica, hides every file that is marked as a staged copy (the xattr
`STAGED_XATTR`, set on each copy before it is renamed into place), refuses
new stagings, and never overwrites the damaged file -- so a staged copy is
never mistaken for an original, and reads go to the sources.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import threading
from dataclasses import asdict, dataclass, fields
from typing import Any

from ..protocol.attr import Attr

log = logging.getLogger(__name__)

#: Set on every staged copy: {"source", "size", "mtime_ns"} of the source it was copied from.
STAGED_XATTR = "user.gmount.staged"
#: In the name of every staging copy while it is made (`.NAME<marker>XXXXXXXX` beside NAME): nobody's file yet.
STAGING_MARKER = ".gmount-stage-"
TABLE_VERSION = 2


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


def staged_mark(replica: Replica) -> bytes:
    """The xattr value that marks a file as this staged copy."""
    return json.dumps({"source": replica.source, "size": replica.local_size,
                       "mtime_ns": replica.local_mtime_ns}, sort_keys=True).encode()


def is_marked_copy(mark: bytes, attr: Attr) -> bool:
    """Whether a file carrying `mark` is still, unchanged, the staged copy it marks."""
    try:
        value = json.loads(mark)
        return attr.is_file and (attr.size, attr.mtime_ns) == (value["size"], value["mtime_ns"])
    except (ValueError, TypeError, KeyError):
        return False


class DamagedTable(ValueError):
    pass


class ReplicaTable:
    """The replicas of one node; safe to use from the worker threads that run disk calls."""

    def __init__(self, path: str | None = None) -> None:
        self._path = path
        self._entries: dict[str, Replica] = {}
        self._staging: dict[str, str] = {}  # temporary file -> the path it will become
        self._lock = threading.RLock()
        self.damaged: str | None = None  # why the table could not be read; None when it is sound
        if path is not None:
            self._load()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, path: str) -> Replica | None:
        return self._entries.get(path)

    def is_staging_temporary(self, path: str) -> bool:
        return path in self._staging

    def leftover_temporaries(self) -> list[str]:
        """Temporary files of stagings that a previous daemon did not finish."""
        return list(self._staging)

    def add(self, path: str, replica: Replica) -> None:
        with self._lock:
            self._refuse_if_damaged()
            self._entries[path] = replica
            self._save()

    def forget(self, path: str) -> None:
        with self._lock:
            if self._entries.pop(path, None) is not None:
                self._save()

    def begin_staging(self, temporary: str, path: str) -> None:
        """Record, durably, that `temporary` is a staging copy (removed at start if left over)."""
        with self._lock:
            self._refuse_if_damaged()
            self._staging[temporary] = path
            self._save()

    def commit_staging(self, path: str, replica: Replica) -> None:
        """Record the copy as a replica of `path` -- before it is renamed into place."""
        with self._lock:
            self._refuse_if_damaged()
            self._entries[path] = replica
            self._save()

    def end_staging(self, temporaries: list[str]) -> None:
        with self._lock:
            removed = [t for t in temporaries if self._staging.pop(t, None) is not None]
            if removed:
                self._save()

    def renamed(self, src: str, dst: str) -> None:
        """A rename in this export moves replicas with it (a directory's too)."""
        with self._lock:
            dropped = self._entries.pop(dst, None)
            prefix = src + "/"
            moved = {p: r for p, r in self._entries.items() if p == src or p.startswith(prefix)}
            if not moved and dropped is None:
                return
            for path, replica in moved.items():
                del self._entries[path]
                self._entries[dst + path[len(src):]] = replica
            self._save()

    def _refuse_if_damaged(self) -> None:
        if self.damaged is not None:
            raise OSError(errno.EIO, f"the replica table {self._path} is damaged ({self.damaged}); staging to "
                             "this node is off until it is repaired (see the node's log)")

    # -- persistence ---------------------------------------------------------

    def _load(self) -> None:
        assert self._path is not None
        try:
            with open(self._path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return
        try:
            self._entries, self._staging = _decode(raw)
        except (DamagedTable, ValueError, TypeError, KeyError) as exc:
            self.damaged = str(exc) or type(exc).__name__
            self._entries, self._staging = {}, {}
            log.error("replica table %s is damaged (%s): this node serves none of its staged copies -- "
                      "they are hidden and reads go to their sources -- and refuses new stagings. "
                      "To repair: stop the cluster, delete the staged copies (files with the xattr %s, "
                      "e.g. `getfattr -R -m %s EXPORT`) and then the table, and start again.",
                      self._path, self.damaged, STAGED_XATTR, STAGED_XATTR)

    def _save(self) -> None:
        """tmp + fsync + rename + fsync(dir): after a crash the table is the old or the new one."""
        if self._path is None or self.damaged is not None:
            return  # never overwrite the evidence of a damaged table
        directory = os.path.dirname(self._path)
        os.makedirs(directory, mode=0o700, exist_ok=True)
        tmp = self._path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, _encode(self._entries, self._staging))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, self._path)
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _body(entries: dict[str, Replica], staging: dict[str, str]) -> dict[str, Any]:
    return {"replicas": {path: asdict(r) for path, r in sorted(entries.items())},
            "staging": dict(sorted(staging.items()))}


def _digest(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _encode(entries: dict[str, Replica], staging: dict[str, str]) -> bytes:
    body = _body(entries, staging)
    return json.dumps({"version": TABLE_VERSION, **body, "sha256": _digest(body)}).encode()


def _decode(raw: bytes) -> tuple[dict[str, Replica], dict[str, str]]:
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise DamagedTable("not a JSON object")
    if "version" not in data:  # version 1: a bare {path: replica} mapping, no checksum
        return {path: _replica(path, entry) for path, entry in data.items()}, {}
    if data["version"] != TABLE_VERSION:
        raise DamagedTable(f"unknown table version {data['version']!r}")
    body = {"replicas": data["replicas"], "staging": data["staging"]}
    if _digest(body) != data.get("sha256"):
        raise DamagedTable("checksum mismatch")
    staging = data["staging"]
    if not isinstance(staging, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                for k, v in staging.items()):
        raise DamagedTable("malformed staging list")
    return {path: _replica(path, entry) for path, entry in data["replicas"].items()}, staging


def _replica(path: str, entry: Any) -> Replica:
    if not isinstance(path, str) or not path.startswith("/") or not isinstance(entry, dict) \
            or set(entry) != {f.name for f in fields(Replica)}:
        raise DamagedTable(f"malformed entry for {path!r}")
    return Replica(**entry)
