"""The one RPC client: how anything talks to a cluster's daemons.

`ClusterClient` keeps one authenticated connection per node (the cluster
secret, and TLS when the cluster uses it), opened on first use and shared by
every request after it, and turns "the node did not answer" into an error
that names the node, its address and what to do. The library API, the CLI,
the fsspec backend and the launcher open one with `open_client(state)`; a
daemon's `PeerPool` is one too, with its own policy (peers marked down,
message counters) on top.

A request that made a node open something (`open`, `opendir`, `put_open`)
and whose reply came after its caller gave up (a timeout, a cancelled read)
is undone on the same connection (`close`, `closedir`, `put_abort`), so lost
replies leave no descriptor behind on the node (LATE_REPLY_RELEASES).

A node keeps the handles it gave (open files, listings, puts) per connection,
numbered from 1 on each, and lets go of them when that connection closes. So
the client hands its callers handles of its own, unique for its life, and keeps
which connection gave each and the node's number for it: a request on a handle
whose connection has closed since (it broke, or the node was restarted) fails
with EIO saying so. It never reaches the node, where the same number may name
another file by now, opened on the new connection. Letting go of such a handle
(`close`, `closedir`, `put_abort`) succeeds at once: the node did it already.
A `settle` gives the open file a new number on the node; the client's handle
stays the same and names the new number from then on (a request sent on the
old number meanwhile, refused with EBADF, is sent again on the new one).

`call`/`ask` and `run_sync` are the short forms for one request from
synchronous code (a short-lived trio run per call).
"""

from __future__ import annotations

import datetime
import errno
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import trio

from .._trio import open_nursery
from ..cluster.state import ClusterState, load_secret, load_tls, load_tls_ca_key, load_tls_client
from ..errors import GmountError, NodeUnavailable, PeerUnavailable
from . import rpc
from .messages import (
    REQUESTS,
    Close,
    Closedir,
    Open,
    Opendir,
    Ping,
    PingReply,
    PutAbort,
    PutClose,
    PutOpen,
    R,
    Request,
    Settle,
)
from .tls import ClusterCA, NodeCredentials, client_context, expiring

__all__ = ["ClusterClient", "ask", "call", "client_ssl", "open_client", "ping_all", "run_sync"]

T = TypeVar("T")

#: (host, port) a node's daemon listens on.
Address = tuple[str, int]


def _release_open(reply: Any) -> tuple[str, list[Any]]:
    return Close.op, Close(Open("/", 0).reply_codec().decode(reply).handle).to_wire()


def _release_opendir(reply: Any) -> tuple[str, list[Any]] | None:
    opened = Opendir("/").reply_codec().decode(reply)
    return None if opened is None else (Closedir.op, Closedir(opened.handle).to_wire())


def _release_put(reply: Any) -> tuple[str, list[Any]]:
    return PutAbort.op, PutAbort(PutOpen("/", 0).reply_codec().decode(reply)).to_wire()


def _release_settled(reply: Any) -> tuple[str, list[Any]]:
    return Close.op, Close(Settle(0).reply_codec().decode(reply)).to_wire()


#: Requests that leave a handle on the node, and the request that lets go of it when their
#: reply comes too late for its caller.
LATE_REPLY_RELEASES: dict[str, rpc.Release] = {
    Open.op: _release_open, Opendir.op: _release_opendir, PutOpen.op: _release_put, Settle.op: _release_settled,
}


def _handle_of(op: str, reply: Any) -> int | None:
    """The node's handle in a reply to `op` (None: `op` gives none, or this reply has none).

    On the wire an `OpenReply` and an `OpendirReply` are arrays with the handle first, a `put_open` reply is
    the handle itself (protocol/codec.py)."""
    if op == PutOpen.op:
        return reply if type(reply) is int else None
    if op in (Open.op, Opendir.op) and isinstance(reply, list | tuple) and reply and type(reply[0]) is int:
        return reply[0]
    return None


def _with_handle(op: str, reply: Any, handle: int) -> Any:
    """`reply` (in its wire form) with the node's handle replaced by the client's."""
    if op == PutOpen.op:
        return handle
    return [handle, *list(reply)[1:]]


#: Requests whose first argument is a handle a node gave (read, write, close, readdir, put_close, ...).
ON_HANDLE = frozenset(op for op, kind in REQUESTS.items() if list(vars(kind)["__dataclass_fields__"])[:1] == ["handle"])
#: Of those, the ones that let go of it (nothing left to do when the node let go already), and all that end it.
LETS_GO = frozenset({Close.op, Closedir.op, PutAbort.op})
ENDS = LETS_GO | {PutClose.op}


class ClusterClient:
    """Authenticated connections to a cluster's daemons, one per node, opened lazily and shared.

    Requests to one node share its connection (the daemon serves many in
    flight on it); a connection that broke is opened again on the next
    request. With `advice` set, an unreachable node raises NodeUnavailable
    (also a GmountError), its message naming the node, its address and the
    advice; without, the PeerUnavailable of the RPC layer as it is.
    Subclasses add policy through `_check` (before a request) and `_failed`
    (after a node did not answer).
    """

    def __init__(
        self,
        nursery: trio.Nursery,
        secret: bytes,
        *,
        name: str,
        addresses: Mapping[str, Address] | None = None,
        ssl_context: ssl.SSLContext | None = None,
        cluster: str = "",
        rpc_timeout: float = 10.0,
        connect_timeout: float = 3.0,
        advice: str | None = None,
    ) -> None:
        self.name = name
        self.cluster = cluster
        self.rpc_timeout = rpc_timeout
        self.connect_timeout = connect_timeout
        self._nursery = nursery
        self._secret = secret
        self._ssl_context = ssl_context
        self._advice = advice
        self._addresses: dict[str, Address] = dict(addresses or {})
        self._connections: dict[str, rpc.RpcClient] = {}
        self._locks: dict[str, trio.Lock] = {}
        # the client's handle -> (node, the connection that gave it, the node's number for it)
        self._handles: dict[int, tuple[str, rpc.RpcClient, int]] = {}
        self._last_handle = 0

    @property
    def secret(self) -> bytes:
        """The cluster secret this client proves (and names certificates with, see tls.certificate_name)."""
        return self._secret

    # -- the address table -----------------------------------------------------

    @property
    def nodes(self) -> list[str]:
        """The nodes this client can reach, in the order they were given."""
        return list(self._addresses)

    def set_address(self, node: str, address: Address) -> bool:
        """Record where `node` listens; a connection to its old address is closed. True if it moved."""
        if self._addresses.get(node) == tuple(address):
            return False
        self._addresses[node] = (address[0], address[1])
        old = self._connections.pop(node, None)
        if old is not None:
            self._nursery.start_soon(old.aclose)
        return True

    def address(self, node: str) -> Address:
        found = self._addresses.get(node)
        if found is None:
            raise self._unknown(node)
        return found

    # -- requests ----------------------------------------------------------------

    async def call(self, node: str, op: str, *args: Any, timeout: float | None = None) -> Any:
        """Run `op` on `node`; its errors come back as OSError, an unreachable node as PeerUnavailable."""
        connection = await self.connection(node)
        ours = args[0] if op in ON_HANDLE and args and type(args[0]) is int else None
        if ours is None:
            return await self._send(node, connection, op, args, timeout)
        while True:
            found = self._handles.get(ours)
            if found is None or found[0] != node:
                if op in LETS_GO:
                    return None
                raise OSError(errno.EBADF, f"no open handle {ours} on node {node}")
            if found[1] is not connection:  # the node let go of it with that connection
                if op in ENDS:
                    del self._handles[ours]
                if op in LETS_GO:
                    return None
                raise OSError(errno.EIO, f"node {node} no longer holds this open file: the connection it was "
                                         f"opened on closed (the connection broke, or the node was restarted); "
                                         f"open it again")
            again = False
            try:
                reply = await self._send(node, connection, op, (found[2], *args[1:]), timeout)
            except OSError as exc:
                renewed = self._handles.get(ours)
                # sent on the number a settle retired meanwhile: refused, so never carried out
                again = exc.errno == errno.EBADF and renewed is not None and renewed[2] != found[2]
                if not again:
                    raise
                continue
            finally:
                if op in ENDS and not again:
                    self._handles.pop(ours, None)
            if op == Settle.op:
                self._handles[ours] = (node, connection, Settle(0).reply_codec().decode(reply))
                return ours
            return reply

    async def _send(self, node: str, connection: rpc.RpcClient, op: str, args: tuple[Any, ...],
                    timeout: float | None) -> Any:
        """One request on `connection`; a handle in its reply is given one of this client's numbers."""
        try:
            reply = await connection.call(op, *args, timeout=timeout or self.rpc_timeout)
        except PeerUnavailable as exc:
            self._failed(node, exc)
            raise self._translate(node, exc) from None
        theirs = _handle_of(op, reply)
        if theirs is None:
            return reply
        self._last_handle += 1
        self._handles[self._last_handle] = (node, connection, theirs)
        return _with_handle(op, reply, self._last_handle)

    async def ask(self, node: str, request: Request[R], *, timeout: float | None = None) -> R:
        """`call` with a typed request (gmountpy.protocol.messages): the reply comes back checked and typed."""
        return request.decode(await self.call(node, request.op, *request.to_wire(), timeout=timeout))

    async def connection(self, node: str) -> rpc.RpcClient:
        """The open connection to `node`, made now if there is none (one connect at a time per node)."""
        connection = self._connections.get(node)
        if connection is not None and not connection.closed:
            return connection
        self._check(node)
        async with self._locks.setdefault(node, trio.Lock()):  # the others wait for its result
            connection = self._connections.get(node)
            if connection is not None and not connection.closed:
                return connection
            self._check(node)
            host, port = self.address(node)
            try:
                connection = await rpc.connect(self._nursery, host, port, secret=self._secret, name=self.name,
                                               peer=node, timeout=self.connect_timeout,
                                               ssl_context=self._ssl_context, releases=LATE_REPLY_RELEASES)
            except PeerUnavailable as exc:
                self._failed(node, exc)
                raise self._translate(node, exc) from None
            self._connections[node] = connection
            self._connected(node)
            return connection

    async def aclose(self) -> None:
        connections, self._connections = list(self._connections.values()), {}
        for connection in connections:
            await connection.aclose()

    # -- policy hooks and errors ----------------------------------------------------

    def _check(self, node: str) -> None:
        """Raise PeerUnavailable to refuse a request to `node` before trying it (no policy here)."""

    def _failed(self, node: str, exc: PeerUnavailable) -> None:
        """`node` could not be reached, its connection broke, or a request got no reply in time
        (rpc.RequestTimedOut; the connection is still up) -- no policy here."""

    def _connected(self, node: str) -> None:
        """A new connection to `node` is up (no policy here)."""

    def _unknown(self, node: str) -> PeerUnavailable:
        where = f"cluster {self.cluster!r}" if self.cluster else "this client's address table"
        return PeerUnavailable(node, f"not a node of {where}", errno.ENOENT)

    def _translate(self, node: str, exc: PeerUnavailable) -> PeerUnavailable:
        if self._advice is None:
            return exc
        host, port = self.address(node)
        reason = exc.reason if f"{host}:{port}" in exc.reason else f"{exc.reason} (its daemon at {host}:{port})"
        advice = f"; {self._advice}" if self._advice else ""
        return NodeUnavailable(node, reason + advice, exc.errno or errno.EHOSTDOWN)


#: The name clients outside the cluster give in their hello (and their certificates are made for).
CLIENT_NAME = "gmount-client"

#: (cluster, CA certificate, client name, secret given) -> the certificate this process presents.
_client_certificates: dict[tuple[str, str, str, bytes | None], NodeCredentials] = {}


def client_ssl(state: ClusterState, name: str = CLIENT_NAME, secret: bytes | None = None
               ) -> ssl.SSLContext | None:
    """The TLS context for talking to this cluster's daemons as `name` (None when it does not use TLS).

    Daemons ask for a client certificate: this process makes itself one for
    `name`, valid a day, from the CA key the launcher keeps beside the cluster
    state (mode 0600, like the secret); where the launcher gave a certificate
    instead of the key (a remote node running Dask), that one (see client_name).
    """
    if not state.spec.tls:
        return None
    ca_pem, _ = load_tls(state.name)
    key = (state.name, ca_pem, name, secret)
    credentials = _client_certificates.get(key)
    if credentials is None or expiring(credentials.cert, datetime.timedelta(hours=1)):
        ca_key = load_tls_ca_key(state.name)
        kept = load_tls_client(state.name)
        if ca_key is not None:
            credentials = ClusterCA(ca_pem, ca_key).issue_client(
                name, secret=secret if secret is not None else load_secret(state.name))
        elif kept is not None and kept[0] == name:  # given by the launcher to a node without the CA key
            credentials = NodeCredentials(ca_pem, kept[1], kept[2])
        else:
            raise GmountError(f"cluster {state.name!r} uses TLS, but neither the key of its CA nor a client "
                              "certificate is kept in this user's state: a client cannot connect; run "
                              "`gmount down` and `gmount up` again")
        _client_certificates[key] = credentials
    return client_context(ca_pem, credentials)


def status_advice(state: ClusterState) -> str:
    """What to do about a node that does not answer, for people outside the cluster."""
    source = state.spec.source or "CLUSTER.toml"
    return (f"is its daemon running? `gmount status {source}` shows every node of cluster {state.name!r}, "
            f"`gmount up {source}` restarts the ones that stopped")


def client_name(state: ClusterState, name: str) -> str:
    """The name a client gives in its hello: `name`, unless this process can present only the client
    certificate the launcher gave it -- then the name that certificate was made for."""
    if state.spec.tls and load_tls_ca_key(state.name) is None:
        kept = load_tls_client(state.name)
        if kept is not None:
            return kept[0]
    return name


@asynccontextmanager
async def open_client(state: ClusterState, *, name: str = CLIENT_NAME, secret: bytes | None = None,
                      rpc_timeout: float = 10.0, connect_timeout: float = 3.0,
                      advise: bool = True) -> AsyncIterator[ClusterClient]:
    """A ClusterClient for a running cluster, its connections closed on exit.

    `advise=False` leaves the advice out of errors (for `gmount status` itself).
    """
    key = secret if secret is not None else load_secret(state.name)
    name = client_name(state, name)
    async with open_nursery() as nursery:
        client = ClusterClient(nursery, key, name=name, cluster=state.name, ssl_context=client_ssl(state, name, key),
                               addresses={n: (r.host, r.port) for n, r in state.nodes.items()},
                               rpc_timeout=rpc_timeout, connect_timeout=connect_timeout,
                               advice=status_advice(state) if advise else "")
        try:
            yield client
        finally:
            with trio.CancelScope(shield=True):
                await client.aclose()
            nursery.cancel_scope.cancel()  # the connections' readers


def run_sync(func: Callable[..., Awaitable[T]], *args: Any) -> T:
    """Run a trio coroutine function to completion from synchronous code."""
    return trio.run(func, *args)


async def call(state: ClusterState, node: str, op: str, *args: Any, timeout: float = 10.0,
               secret: bytes | None = None) -> Any:
    """One request to one node, on a connection of its own."""
    async with open_client(state, name="gmount-cli", secret=secret) as client:
        return await client.call(node, op, *args, timeout=timeout)


async def ask(state: ClusterState, node: str, request: Request[R], *, timeout: float = 10.0,
              secret: bytes | None = None) -> R:
    """`call` with a typed request (gmountpy.protocol.messages): the reply comes back checked and typed."""
    return request.decode(await call(state, node, request.op, *request.to_wire(), timeout=timeout, secret=secret))


async def ping_all(state: ClusterState, timeout: float = 3.0) -> dict[str, PingReply | str]:
    """Each node's ping answer, or a one-line reason why it did not answer."""
    answers: dict[str, PingReply | str] = {}
    async with open_client(state, name="gmount-cli", advise=False) as client:

        async def ping(node: str) -> None:
            try:
                answers[node] = await client.ask(node, Ping(), timeout=timeout)
            except OSError as exc:
                answers[node] = str(exc)

        async with open_nursery() as nursery:
            for node in state.nodes:
                nursery.start_soon(ping, node)
    return {node: answers[node] for node in state.nodes}
