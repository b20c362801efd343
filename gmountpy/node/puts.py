"""The puts in progress on this node: their temporary files, hidden while they run and removed after a crash.

A put (a whole-file write from outside the mounts: the API, fsspec, Snakemake
storage) writes a hidden temporary beside its destination and renames it into
place once verified (node/service.py). While it runs the temporary is nobody's
file: lookups and listings leave it out, so neither a mount nor a directory
index ever shows it. When the put ends -- finished, given up, or its connection
closed -- the temporary goes. A daemon that is killed mid-put runs none of that,
so each put in progress is also written down here, one small file per put in
the node's state directory, and a daemon starting up removes the temporaries
its last run left (`leftovers`).

The notes are written without fsync: they outlive a daemon's crash (the kernel
keeps them), not the machine's; a temporary left by a machine's crash is a
hidden `.NAME.gmount-put-XXXXXXXX` file in the export, safe to delete.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading

log = logging.getLogger(__name__)

#: Every put's temporary has this in its name (export.temporary_name(path, "put")).
MARK = ".gmount-put-"


class PutJournal:
    """The temporaries of the puts in progress (export paths), kept in `directory` when it is given."""

    def __init__(self, directory: str | None = None) -> None:
        self._directory = directory
        self._running: set[str] = set()
        self._lock = threading.Lock()  # puts begin and end in worker threads

    def __contains__(self, path: object) -> bool:
        return path in self._running

    def __len__(self) -> int:
        return len(self._running)

    def begin(self, temporary: str) -> None:
        """A put starts writing `temporary` (before the file is made: a crash in between leaves a note only)."""
        if MARK not in temporary.rpartition("/")[2]:
            raise ValueError(f"{temporary!r} is not a put's temporary file")
        with self._lock:
            self._running.add(temporary)
        if self._directory is not None:
            os.makedirs(self._directory, mode=0o700, exist_ok=True)
            with open(self._note(temporary), "wb") as note:
                note.write(temporary.encode("utf-8", "surrogateescape"))

    def end(self, temporary: str) -> None:
        """The put of `temporary` is over: the file was renamed into place or removed."""
        with self._lock:
            self._running.discard(temporary)
        if self._directory is not None:
            try:
                os.unlink(self._note(temporary))
            except FileNotFoundError:
                pass

    def leftovers(self) -> list[str]:
        """The temporaries of the puts a previous run of this node left unfinished (a crash)."""
        if self._directory is None:
            return []
        try:
            names = os.listdir(self._directory)
        except FileNotFoundError:
            return []
        found = []
        for name in sorted(names):
            try:
                with open(os.path.join(self._directory, name), "rb") as note:
                    temporary = note.read().decode("utf-8", "surrogateescape")
            except OSError as exc:
                log.warning("cannot read %s, the note of an unfinished put: %s", name, exc)
                continue
            if temporary.startswith("/") and MARK in temporary.rpartition("/")[2]:
                found.append(temporary)
            else:  # never remove a file the note does not name as a put's temporary
                log.warning("ignoring %s in %s: it names no put's temporary file (%r)", name, self._directory,
                            temporary[:200])
                self._forget_note(name)
        return found

    def forget(self, leftovers: list[str]) -> None:
        """The leftovers were dealt with: drop their notes."""
        for temporary in leftovers:
            self.end(temporary)

    def _note(self, temporary: str) -> str:
        assert self._directory is not None
        digest = hashlib.sha256(temporary.encode("utf-8", "surrogateescape")).hexdigest()[:32]
        return os.path.join(self._directory, digest)

    def _forget_note(self, name: str) -> None:
        assert self._directory is not None
        try:
            os.unlink(os.path.join(self._directory, name))
        except OSError:
            pass
