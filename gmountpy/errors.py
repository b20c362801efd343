"""Errors shared by every layer.

File-system failures travel as OSError with an errno, because that is what
the FUSE boundary hands to the kernel and what a user's program sees.
"""

from __future__ import annotations

import errno


class GmountError(Exception):
    """A failure a user can act on; the CLI prints its message without a traceback."""


class PeerUnavailable(OSError):
    """A peer could not be reached or did not answer in time.

    An OSError (EHOSTDOWN or ETIMEDOUT) so that a file operation that needed
    the peer fails with an errno instead of hanging.
    """

    def __init__(self, node: str, reason: str, code: int = errno.EHOSTDOWN) -> None:
        super().__init__(code, f"node {node!r} unavailable: {reason}")
        self.node = node
        self.reason = reason


class NodeUnavailable(PeerUnavailable, GmountError):
    """A daemon that did not answer a client outside the cluster (the library, the CLI).

    Its message names the node, its address and what to do; it is both a
    PeerUnavailable (an OSError with an errno) and a GmountError (printed
    plainly by the CLI).
    """


class AuthenticationFailed(GmountError):
    """The peer did not prove knowledge of the cluster secret."""


def named(message: str, node: str) -> str:
    """A peer's error message, naming the node it came from unless it already does."""
    return message if f"node {node}" in message else f"{message} (on node {node})"
