"""Connections from this node to every other node, with timeouts and health.

`call(node, op, ...)` is the one way the node talks to any node, itself
included: a call to itself goes straight to the local service without a
socket, so the layers above need no special case for "local". The
connections themselves are gmountpy.protocol.client's ClusterClient, as for every
other client of the daemons.

A peer that cannot be reached is marked down for `retry_after` seconds, so a
dead node costs one timeout, not one per lookup. Only the peer's own failures
count: a connect that fails, a connection that breaks, or a request that timed
out while nothing at all came from the peer. A request cancelled by its caller
(a closed file's read-ahead) or one slow request on a peer that keeps
answering others never marks it down: the connection stays up for everyone.
"""

from __future__ import annotations

import errno
import logging
import math
import ssl
from dataclasses import dataclass
from typing import Any

import trio

from ..errors import PeerUnavailable
from ..protocol import rpc
from ..protocol.client import ClusterClient
from ..protocol.messages import R, Request
from .service import NodeService

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PeerAddress:
    host: str
    port: int


class PeerPool(ClusterClient):
    """The node's ClusterClient, with the node itself served without a socket and dead peers marked down."""

    def __init__(
        self,
        me: str,
        service: NodeService,
        secret: bytes,
        nursery: trio.Nursery,
        *,
        rpc_timeout: float = 5.0,
        connect_timeout: float = 3.0,
        retry_after: float = 2.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__(nursery, secret, name=me, ssl_context=ssl_context, rpc_timeout=rpc_timeout,
                         connect_timeout=connect_timeout)
        self.me = me
        self._service = service
        self._local_session = rpc.Session(me)
        self.retry_after = retry_after
        self._down_until: dict[str, float] = {}
        self._last_error: dict[str, str] = {}

    def set_peers(self, addresses: dict[str, PeerAddress]) -> None:
        """Install (or replace) the peer table; connections to moved peers are redone."""
        for name, address in addresses.items():
            if name == self.me:
                continue
            self.set_address(name, (address.host, address.port))
            self._down_until.pop(name, None)  # told it is (back) up: try it at once

    @property
    def names(self) -> list[str]:
        return [self.me, *self.nodes]

    def is_down(self, node: str) -> bool:
        return trio.current_time() < self._down_until.get(node, -math.inf)

    async def call(self, node: str, op: str, *args: Any, timeout: float | None = None) -> Any:
        """Run `op` on `node`; raises OSError (PeerUnavailable when unreachable)."""
        if node == self.me:
            return await self._service.dispatch(self._local_session, op, list(args))
        self._service.counters.messages[op] += 1
        return await super().call(node, op, *args, timeout=timeout)

    async def ask(self, node: str, request: Request[R], *, timeout: float | None = None) -> R:
        """`call` with a typed request; to this node itself, the handler's typed reply as it is
        (no wire form either way)."""
        if node == self.me:
            return await self._service.serve(self._local_session, request)
        return await super().ask(node, request, timeout=timeout)

    def _check(self, node: str) -> None:
        self.address(node)  # an unknown node is refused before any down mark
        until = self._down_until.get(node, -math.inf)
        if trio.current_time() < until:
            raise PeerUnavailable(node, f"down ({self._last_error.get(node, '')}); next retry in "
                                        f"{until - trio.current_time():.1f}s")

    def _failed(self, node: str, exc: PeerUnavailable) -> None:
        if node not in self.nodes:
            return
        if isinstance(exc, rpc.RequestTimedOut) and not exc.silent:
            log.info("a request to node %s timed out while it answered others: %s", node, exc.reason)
            return  # a slow request, not a dead peer
        if not self.is_down(node):
            log.warning("node %s is unavailable: %s", node, exc.reason)
        self._down_until[node] = trio.current_time() + self.retry_after
        self._last_error[node] = exc.reason

    def _connected(self, node: str) -> None:
        self._down_until.pop(node, None)

    def _unknown(self, node: str) -> PeerUnavailable:
        return PeerUnavailable(node, "not in this node's peer table", errno.EHOSTUNREACH)

    async def aclose(self) -> None:
        await super().aclose()
        self._local_session.close()
