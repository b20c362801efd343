"""Connections from this node to every other node, with timeouts and health.

`call(node, op, ...)` is the one way the node talks to any node, itself
included: a call to itself goes straight to the local service without a
socket, so the layers above need no special case for "local".

A peer that cannot be reached is marked down for `retry_after` seconds, so a
dead node costs one timeout, not one per lookup.
"""

from __future__ import annotations

import errno
import logging
import math
import ssl
from dataclasses import dataclass
from typing import Any

import trio

from .. import rpc
from ..errors import PeerUnavailable
from ..messages import R, Request
from .service import NodeService

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PeerAddress:
    host: str
    port: int


@dataclass
class _Peer:
    address: PeerAddress
    client: rpc.RpcClient | None = None
    lock: trio.Lock | None = None
    down_until: float = -math.inf
    last_error: str = ""


class PeerPool:
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
        self.me = me
        self._ssl_context = ssl_context
        self._service = service
        self._local_session = rpc.Session(me)
        self._secret = secret
        self._nursery = nursery
        self.rpc_timeout = rpc_timeout
        self.connect_timeout = connect_timeout
        self.retry_after = retry_after
        self._peers: dict[str, _Peer] = {}

    def set_peers(self, addresses: dict[str, PeerAddress]) -> None:
        """Install (or replace) the peer table; connections to moved peers are redone."""
        for name, address in addresses.items():
            if name == self.me:
                continue
            current = self._peers.get(name)
            if current is None or current.address != address:
                if current is not None and current.client is not None:
                    self._nursery.start_soon(current.client.aclose)
                self._peers[name] = _Peer(address, lock=trio.Lock())
            else:
                current.down_until = -math.inf  # told it is (back) up: try it at once

    @property
    def names(self) -> list[str]:
        return [self.me, *self._peers]

    def is_down(self, node: str) -> bool:
        peer = self._peers.get(node)
        return peer is not None and trio.current_time() < peer.down_until

    async def call(self, node: str, op: str, *args: Any, timeout: float | None = None) -> Any:
        """Run `op` on `node`; raises OSError (PeerUnavailable when unreachable)."""
        if node == self.me:
            return await self._service.dispatch(self._local_session, op, list(args))
        self._service.counters.messages[op] += 1
        client = await self._client(node)
        try:
            return await client.call(op, *args, timeout=timeout or self.rpc_timeout)
        except PeerUnavailable as exc:
            self._mark_down(node, exc.reason)
            raise

    async def ask(self, node: str, request: Request[R], *, timeout: float | None = None) -> R:
        """`call` with a typed request (gmountpy.messages): the reply comes back checked and typed."""
        return request.decode(await self.call(node, request.op, *request.args(), timeout=timeout))

    async def _client(self, node: str) -> rpc.RpcClient:
        peer = self._peers.get(node)
        if peer is None:
            raise PeerUnavailable(node, "not in this node's peer table", errno.EHOSTUNREACH)
        if trio.current_time() < peer.down_until:
            raise PeerUnavailable(node, f"down ({peer.last_error}); next retry in "
                                        f"{peer.down_until - trio.current_time():.1f}s")
        if peer.client is not None and not peer.client.closed:
            return peer.client
        assert peer.lock is not None
        async with peer.lock:  # one connect at a time; the others wait for its result
            if peer.client is not None and not peer.client.closed:
                return peer.client
            if trio.current_time() < peer.down_until:
                raise PeerUnavailable(node, f"down ({peer.last_error})")
            try:
                peer.client = await rpc.connect(
                    self._nursery, peer.address.host, peer.address.port, secret=self._secret,
                    name=self.me, peer=node, timeout=self.connect_timeout, ssl_context=self._ssl_context)
            except PeerUnavailable as exc:
                self._mark_down(node, exc.reason)
                raise
            peer.down_until = -math.inf
            return peer.client

    def _mark_down(self, node: str, reason: str) -> None:
        peer = self._peers.get(node)
        if peer is None:
            return
        if peer.down_until < trio.current_time():
            log.warning("node %s is unavailable: %s", node, reason)
        peer.down_until = trio.current_time() + self.retry_after
        peer.last_error = reason

    async def aclose(self) -> None:
        for peer in self._peers.values():
            if peer.client is not None:
                await peer.client.aclose()
        self._local_session.close()
