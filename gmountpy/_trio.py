"""trio helpers shared by every layer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio


@asynccontextmanager
async def open_nursery() -> AsyncIterator[trio.Nursery]:
    """A nursery whose lone failure propagates as itself, not wrapped in an ExceptionGroup.

    trio >= 0.25 always wraps errors from nurseries in groups. Our nurseries
    run helper tasks that report their own errors, so one failing task means
    one error, and callers (and the FUSE boundary) catch OSError directly.
    Several simultaneous failures still arrive as a group.
    """
    try:
        async with trio.open_nursery() as nursery:
            yield nursery
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise
