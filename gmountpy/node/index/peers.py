"""What the index needs of the peer pool, and a node's whole listing of one directory.

The home's index and the export watcher both list directories of a node's export; a
listing too large for one reply is read through a directory handle, page by page.
"""

from __future__ import annotations

import errno
from typing import Protocol

from ...protocol import messages as msg
from ...protocol.messages import DirEntry, R, Request

#: Entries in one listdir reply before a home pages through a snapshot (service.LISTDIR_MAX).
PAGE = 50_000


class Peers(Protocol):
    """What the index needs of the peer pool (PeerPool, or a test's in-memory network): `ask` with
    the typed requests of gmountpy.protocol.messages."""

    me: str

    async def ask(self, node: str, request: Request[R], *, timeout: float | None = None) -> R: ...
    def is_down(self, node: str) -> bool: ...


async def list_whole(peers: Peers, node: str, directory: str) -> list[DirEntry] | None:
    """`node`'s entries of `directory` (None: it has no such directory), in pages when too many
    for one reply."""
    try:
        return await peers.ask(node, msg.Listdir(directory))
    except OSError as exc:
        if exc.errno != errno.EFBIG:
            raise
    return await list_in_pages(peers, node, directory)


async def list_in_pages(peers: Peers, node: str, directory: str) -> list[DirEntry] | None:
    opened = await peers.ask(node, msg.Opendir(directory))
    if opened is None:
        return None
    entries: list[DirEntry] = []
    try:
        while len(entries) < opened.count:
            page = await peers.ask(node, msg.Readdir(opened.handle, len(entries), PAGE))
            if not page:
                break
            entries.extend(page)
    finally:
        await peers.ask(node, msg.Closedir(opened.handle))
    return entries
