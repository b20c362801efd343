"""Talking to running daemons from outside the mount (CLI, library, tests).

A short-lived trio run per call keeps this usable from plain synchronous
code; it authenticates with the cluster secret like any peer.
"""

from __future__ import annotations

import errno
import ssl
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio

from . import rpc
from ._trio import open_nursery
from .errors import PeerUnavailable
from .messages import Ping, PingReply, R, Request
from .state import ClusterState, load_secret, load_tls
from .tls import client_context

T = TypeVar("T")


def run_sync(func: Callable[..., Awaitable[T]], *args: Any) -> T:
    """Run a trio coroutine function to completion from synchronous code."""
    return trio.run(func, *args)


def client_ssl(state: ClusterState) -> ssl.SSLContext | None:
    """The TLS context for talking to this cluster's daemons (None when it does not use TLS)."""
    if not state.spec.tls:
        return None
    ca_pem, _ = load_tls(state.name)
    return client_context(ca_pem)


async def call(state: ClusterState, node: str, op: str, *args: Any, timeout: float = 10.0,
               secret: bytes | None = None) -> Any:
    record = state.nodes.get(node)
    if record is None:
        raise PeerUnavailable(node, f"not a node of cluster {state.name!r}", errno.ENOENT)
    key = secret if secret is not None else load_secret(state.name)
    async with open_nursery() as nursery:
        client = await rpc.connect(nursery, record.host, record.port, secret=key, name="gmount-cli",
                                   peer=node, timeout=min(timeout, 3.0), ssl_context=client_ssl(state))
        try:
            return await client.call(op, *args, timeout=timeout)
        finally:
            await client.aclose()


async def ask(state: ClusterState, node: str, request: Request[R], *, timeout: float = 10.0,
              secret: bytes | None = None) -> R:
    """`call` with a typed request (gmountpy.messages): the reply comes back checked and typed."""
    return request.decode(await call(state, node, request.op, *request.args(), timeout=timeout, secret=secret))


async def ping_all(state: ClusterState, timeout: float = 3.0) -> dict[str, PingReply | str]:
    """Each node's ping answer, or a one-line reason why it did not answer."""
    secret = load_secret(state.name)
    answers: dict[str, PingReply | str] = {}

    async def ping(node: str) -> None:
        try:
            answers[node] = await ask(state, node, Ping(), timeout=timeout, secret=secret)
        except OSError as exc:
            answers[node] = str(exc)

    async with open_nursery() as nursery:
        for node in state.nodes:
            nursery.start_soon(ping, node)
    return {node: answers[node] for node in state.nodes}
