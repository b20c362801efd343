"""Authenticated, multiplexed request/response over TCP (trio).

One connection carries many requests in flight; replies are matched by id.
Before any request, both ends prove knowledge of the cluster secret with
HMAC-SHA256 over fresh nonces (the secret never crosses the wire):

    server -> client   hello {proto, v, node, nonce: Ns, frames}
    client -> server   hello {node, nonce: Nc, mac: HMAC(k, "client" Ns Nc)}
    server -> client   hello {mac: HMAC(k, "server" Nc Ns)}

A connection that fails the handshake is closed without serving anything.
After it, the connection stays authenticated for its whole life: under TLS
by TLS itself (`frames: "tls"`), otherwise by a MAC on every frame with a
sequence number per direction (`frames: "chacha20-poly1305"`, see wire.FrameMac),
keyed from the secret and both nonces. A frame that fails its check closes
the connection before anything in it is executed.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import logging
import os
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from .._trio import open_nursery
from ..errors import AuthenticationFailed, PeerUnavailable
from . import wire

log = logging.getLogger(__name__)

PROTO = "gmount"
HANDSHAKE_TIMEOUT = 5.0
RECEIVE_CHUNK = 1 << 18
#: A request served for longer than this is logged: the peer that sent it has likely timed out.
SLOW_REQUEST = 5.0
#: Requests served at once per connection; beyond it the reader stops reading
#: (TCP back-pressure) instead of queueing without bound.
MAX_IN_FLIGHT = 64
#: Requests served at once by one node over all its connections; beyond it a
#: request is answered EAGAIN at once (see RequestLimits).
MAX_IN_FLIGHT_PER_NODE = 1024
FRAMES_MAC = "chacha20-poly1305"
FRAMES_TLS = "tls"


def _mac(secret: bytes, role: bytes, first: bytes, second: bytes) -> bytes:
    return hmac.new(secret, role + first + second, hashlib.sha256).digest()


async def _receive_message(stream: trio.abc.Stream, decoder: wire.FrameDecoder) -> wire.Message:
    """Read exactly one message during the handshake (no pipelining yet)."""
    while True:
        data = await stream.receive_some(4096)
        if not data:
            raise wire.ProtocolError("connection closed during handshake")
        messages = decoder.feed(data)
        if messages:
            if len(messages) > 1 or decoder.pending:
                raise wire.ProtocolError("unexpected data during handshake")
            return messages[0]


# ---------------------------------------------------------------- client side


class RpcClient:
    """One authenticated connection to a peer; `call` may be used concurrently."""

    def __init__(self, stream: trio.abc.Stream, peer: str, decoder: wire.FrameDecoder,
                 send_mac: wire.FrameMac | None = None) -> None:
        self.peer = peer
        self._stream = stream
        self._decoder = decoder
        self._send_mac = send_mac
        self._send_lock = trio.Lock()
        self._next_id = 1
        self._pending: dict[int, _Pending] = {}
        self._closed: str | None = None

    @property
    def closed(self) -> bool:
        return self._closed is not None

    async def call(self, op: str, *args: Any, timeout: float = 5.0) -> Any:
        """Send a request and wait for its reply; remote errors come back as OSError."""
        if self._closed is not None:
            raise PeerUnavailable(self.peer, self._closed)
        request_id = self._next_id
        self._next_id += 1
        pending = _Pending()
        self._pending[request_id] = pending
        try:
            with trio.move_on_after(timeout) as scope:
                try:
                    async with self._send_lock:
                        await self._send_frame(wire.encode_request(request_id, op, list(args)))
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                    self._fail_all(f"send failed: {exc}")
                    raise PeerUnavailable(self.peer, f"send failed: {exc}") from None
                await pending.event.wait()
            if scope.cancelled_caught:
                raise PeerUnavailable(self.peer, f"no reply to {op} within {timeout:g}s", errno.ETIMEDOUT)
        finally:
            self._pending.pop(request_id, None)
        message = pending.message
        if isinstance(message, wire.Reply):
            return message.result
        if isinstance(message, wire.ErrorReply):
            raise OSError(message.errno, message.message)
        raise PeerUnavailable(self.peer, pending.failure or "connection lost")

    async def _send_frame(self, frame: bytes) -> None:
        """Send a whole frame or give the connection up.

        A send cut short (by a timeout or a cancelled caller) leaves part of a
        frame on the wire; the peer would read the next request as the rest of
        it -- and might execute a corrupted request. So the connection closes.
        """
        if self._send_mac is not None:
            frame = self._send_mac.seal(frame)  # under the send lock: numbers follow the wire order
        try:
            await self._stream.send_all(frame)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            raise  # the connection is gone already; the caller reports it
        except BaseException:
            self._fail_all("a request was interrupted while being sent")
            with trio.CancelScope(shield=True):
                await self._stream.aclose()
            raise

    async def receive_loop(self) -> None:
        """Dispatch replies to waiting callers until the connection ends."""
        reason = "connection closed by peer"
        try:
            while True:
                data = await self._stream.receive_some(RECEIVE_CHUNK)
                if not data:
                    break
                for message in self._decoder.feed(data):
                    if isinstance(message, (wire.Reply, wire.ErrorReply)):
                        pending = self._pending.get(message.id)
                        if pending is not None:
                            pending.message = message
                            pending.event.set()
                    else:
                        raise wire.ProtocolError(f"unexpected {type(message).__name__} from server")
        except wire.ProtocolError as exc:
            reason = f"protocol error: {exc}"
            log.warning("closing connection to %s: %s", self.peer, reason)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            reason = f"connection lost: {exc}"
        finally:
            self._fail_all(reason)
            with trio.CancelScope(shield=True):
                await self._stream.aclose()

    def _fail_all(self, reason: str) -> None:
        if self._closed is None:
            self._closed = reason
        for pending in self._pending.values():
            pending.failure = reason
            pending.event.set()

    async def aclose(self) -> None:
        """Close the connection; one the peer (or the reader) is closing at the same moment is no error."""
        self._fail_all("closed")
        try:
            await self._stream.aclose()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # a TLS close_notify to a peer that just went away


@dataclass
class _Pending:
    event: trio.Event = field(default_factory=trio.Event)
    message: wire.Message | None = None
    failure: str | None = None


async def connect(
    nursery: trio.Nursery,
    host: str,
    port: int,
    *,
    secret: bytes,
    name: str,
    peer: str,
    timeout: float = 3.0,
    ssl_context: ssl.SSLContext | None = None,
) -> RpcClient:
    """Open and authenticate a connection; its reader runs in `nursery`.

    With `ssl_context` the connection is TLS, and the peer's certificate must
    name `peer` and be signed by the cluster CA.
    """
    stream: trio.abc.Stream | None = None
    try:
        with trio.fail_after(timeout):
            stream = await trio.open_tcp_stream(host, port)
            if ssl_context is not None:
                stream = trio.SSLStream(stream, ssl_context, server_hostname=peer, https_compatible=False)
                await stream.do_handshake()
            decoder = wire.FrameDecoder()
            hello = await _receive_message(stream, decoder)
            if not isinstance(hello, wire.Hello) or hello.fields.get("proto") != PROTO:
                raise wire.ProtocolError("peer is not a gmount daemon")
            server_nonce = hello.fields.get("nonce")
            if not isinstance(server_nonce, bytes) or len(server_nonce) < 16:
                raise wire.ProtocolError("peer sent no usable nonce")
            client_nonce = os.urandom(32)
            await stream.send_all(wire.encode_hello({
                "node": name,
                "nonce": client_nonce,
                "mac": _mac(secret, b"client", server_nonce, client_nonce),
            }))
            answer = await _receive_message(stream, decoder)
            if isinstance(answer, wire.ErrorReply):
                raise AuthenticationFailed(f"node {peer!r} refused us: {answer.message}")
            expected = _mac(secret, b"server", client_nonce, server_nonce)
            if not isinstance(answer, wire.Hello) or not hmac.compare_digest(
                    answer.fields.get("mac", b"") if isinstance(answer.fields.get("mac"), bytes) else b"", expected):
                raise AuthenticationFailed(f"node {peer!r} at {host}:{port} does not know the cluster secret")
            frames = FRAMES_TLS if ssl_context is not None else FRAMES_MAC
            if hello.fields.get("frames") != frames:
                raise wire.ProtocolError(f"peer does not protect frames with {frames} "
                                         f"(it offers {hello.fields.get('frames')!r}): "
                                         "is it an older gmount, or a cluster with another tls setting?")
            send_mac = None
            if ssl_context is None:
                to_server, to_client = wire.frame_keys(secret, server_nonce, client_nonce, name)
                send_mac = wire.FrameMac(to_server)
                decoder.authenticate(wire.FrameMac(to_client))
    except trio.TooSlowError:
        if stream is not None:
            await stream.aclose()
        raise PeerUnavailable(peer, f"no answer from {host}:{port} within {timeout:g}s", errno.ETIMEDOUT) from None
    except (OSError, wire.ProtocolError, AuthenticationFailed, trio.BrokenResourceError) as exc:
        if stream is not None:
            await stream.aclose()
        if isinstance(exc, AuthenticationFailed):
            raise PeerUnavailable(peer, str(exc), errno.EACCES) from None
        certificate = _certificate_problem(exc, peer, host, port)
        if certificate is not None:
            raise PeerUnavailable(peer, certificate, errno.EACCES) from None
        raise PeerUnavailable(peer, f"cannot connect to {host}:{port}: {exc}") from None
    client = RpcClient(stream, peer, decoder, send_mac)
    nursery.start_soon(client.receive_loop)
    return client


def _certificate_problem(exc: BaseException, peer: str, host: str, port: int) -> str | None:
    """A refused TLS certificate, said plainly: expired, foreign, or made for another node."""
    error = exc
    if isinstance(exc, trio.BrokenResourceError) and isinstance(exc.__cause__, ssl.SSLCertVerificationError):
        error = exc.__cause__
    if not isinstance(error, ssl.SSLCertVerificationError):
        return None
    where = f"{host}:{port}"
    code = getattr(error, "verify_code", None)
    if code == 10:  # X509_V_ERR_CERT_HAS_EXPIRED
        return (f"node {peer!r} at {where} presented an expired certificate: refused; "
                "run `gmount up` again for this cluster to renew its certificates")
    if code == 9:  # X509_V_ERR_CERT_NOT_YET_VALID
        return f"node {peer!r} at {where} presented a certificate that is not valid yet (clock skew?): refused"
    if code in (2, 18, 19, 20, 21):  # unknown issuer, self-signed, not signed by our CA
        return (f"node {peer!r} at {where} presented a certificate not issued by this cluster's CA "
                "(a foreign certificate: another cluster or another program at that address?): refused")
    if code == 62:  # X509_V_ERR_HOSTNAME_MISMATCH
        return (f"node {peer!r} at {where} presented a certificate of this cluster made for another node: "
                "refused (is the peer table out of date?)")
    return f"node {peer!r} at {where} presented a certificate that was refused: {error.verify_message}"


# ---------------------------------------------------------------- server side


@dataclass
class Session:
    """Per-connection state a service may attach things to (e.g. open handles)."""

    peer: str
    cleanups: list[Callable[[], None]] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    def close(self) -> None:
        for cleanup in reversed(self.cleanups):
            try:
                cleanup()
            except Exception:  # cleanup of one handle must not skip the others
                log.exception("cleanup failed for session of %s", self.peer)
        self.cleanups.clear()


Dispatch = Callable[[Session, str, list[Any]], Awaitable[Any]]


class RequestLimits:
    """How many requests a server runs at once, per connection and over all its connections.

    Per connection the reader stops reading at the limit (back-pressure on
    that peer only); over the whole node a request beyond the limit is
    answered EAGAIN at once, so many connections cannot pile up work either.
    One instance is shared by every connection of a server.
    """

    def __init__(self, per_connection: int = MAX_IN_FLIGHT, per_node: int = MAX_IN_FLIGHT_PER_NODE,
                 node: str = "this node") -> None:
        if per_connection < 1 or per_node < 1:
            raise ValueError("request limits must be at least 1")
        self.per_connection = per_connection
        self.per_node = per_node
        self.node = node
        self.in_progress = 0
        self.refused = 0


async def _authenticate(stream: trio.abc.Stream, secret: bytes, name: str,
                        tls: bool) -> tuple[str, wire.FrameDecoder, wire.FrameMac | None]:
    decoder = wire.FrameDecoder()
    server_nonce = os.urandom(32)
    await stream.send_all(wire.encode_hello({"proto": PROTO, "v": wire.VERSION, "node": name, "nonce": server_nonce,
                                             "frames": FRAMES_TLS if tls else FRAMES_MAC}))
    hello = await _receive_message(stream, decoder)
    if not isinstance(hello, wire.Hello):
        raise AuthenticationFailed("first message was not a hello")
    client_nonce, mac, peer = hello.fields.get("nonce"), hello.fields.get("mac"), hello.fields.get("node")
    if not (isinstance(client_nonce, bytes) and len(client_nonce) >= 16 and isinstance(mac, bytes)
            and isinstance(peer, str)):
        raise AuthenticationFailed("hello lacks node, nonce or mac")
    if not hmac.compare_digest(mac, _mac(secret, b"client", server_nonce, client_nonce)):
        await stream.send_all(wire.encode_error(0, errno.EACCES, "authentication failed"))
        raise AuthenticationFailed(f"peer calling itself {peer!r} does not know the cluster secret")
    await stream.send_all(wire.encode_hello({"mac": _mac(secret, b"server", client_nonce, server_nonce)}))
    if tls:
        return peer, decoder, None
    to_server, to_client = wire.frame_keys(secret, server_nonce, client_nonce, peer)
    decoder.authenticate(wire.FrameMac(to_server))
    return peer, decoder, wire.FrameMac(to_client)


async def handle_connection(stream: trio.SocketStream, dispatch: Dispatch, *, secret: bytes, name: str,
                            ssl_context: ssl.SSLContext | None = None, limits: RequestLimits | None = None) -> None:
    """Serve one connection: authenticate, then run each request in its own task.

    Nothing that happens on one connection may take the daemon down.
    """
    try:
        await _handle_connection(stream, dispatch, secret=secret, name=name, ssl_context=ssl_context,
                                 limits=limits or RequestLimits(node=name))
    except Exception:
        log.exception("connection handler failed; connection closed")
        with trio.CancelScope(shield=True):
            await stream.aclose()


async def _handle_connection(tcp: trio.SocketStream, dispatch: Dispatch, *, secret: bytes, name: str,
                             ssl_context: ssl.SSLContext | None, limits: RequestLimits) -> None:
    address = _remote_address(tcp)
    stream: trio.abc.Stream = tcp
    try:
        with trio.fail_after(HANDSHAKE_TIMEOUT):
            if ssl_context is not None:
                stream = trio.SSLStream(tcp, ssl_context, server_side=True, https_compatible=False)
                await stream.do_handshake()
            peer, decoder, send_mac = await _authenticate(stream, secret, name, ssl_context is not None)
    except (trio.TooSlowError, wire.ProtocolError, AuthenticationFailed,
            trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
        log.warning("refused connection from %s: %s", address, exc or type(exc).__name__)
        await stream.aclose()
        return

    session = Session(peer)
    send_lock = trio.Lock()
    in_flight = trio.Semaphore(limits.per_connection)

    async def send(frame: bytes) -> None:
        async with send_lock:
            if send_mac is not None:
                frame = send_mac.seal(frame)  # under the lock: numbers follow the wire order
            await stream.send_all(frame)

    async def refuse_busy(request: wire.Request) -> None:
        try:
            await send(wire.encode_error(
                request.id, errno.EAGAIN,
                f"node {limits.node} is busy: {limits.in_progress} requests in progress, the limit of "
                f"tuning.requests_per_node ({limits.per_node}); retry later"))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            in_flight.release()

    async def serve_one(request: wire.Request) -> None:
        started = trio.current_time()
        try:  # counted in by the reader, before this task started: a burst cannot slip past the limit
            try:
                result = await dispatch(session, request.op, request.args)
                frame = wire.encode_reply(request.id, result)
            except OSError as exc:
                frame = wire.encode_error(request.id, exc.errno or errno.EIO, exc.strerror or str(exc))
            except (TypeError, ValueError) as exc:
                frame = wire.encode_error(request.id, errno.EINVAL, f"bad arguments to {request.op!r}: {exc}")
            except Exception as exc:
                log.exception("request %s from %s failed", request.op, peer)
                frame = wire.encode_error(request.id, errno.EIO, f"internal error in {request.op}: {exc}")
            await send(frame)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            limits.in_progress -= 1
            in_flight.release()
            took = trio.current_time() - started
            if took > SLOW_REQUEST:  # its caller has likely given up: say what held it
                log.warning("request %s from %s took %.1f s on node %s", request.op, peer, took, limits.node)

    window_full_reported = False
    try:
        async with open_nursery() as nursery:
            try:
                while True:
                    data = await stream.receive_some(RECEIVE_CHUNK)
                    if not data:
                        break
                    for message in decoder.feed(data):
                        if not isinstance(message, wire.Request):
                            raise wire.ProtocolError(f"unexpected {type(message).__name__} from client")
                        if in_flight.value == 0 and not window_full_reported:
                            window_full_reported = True
                            log.warning("connection from %s has %d requests in progress on node %s (the limit of "
                                        "tuning.requests_per_connection): further requests wait", peer,
                                        limits.per_connection, limits.node)
                        await in_flight.acquire()
                        if limits.in_progress >= limits.per_node:
                            if not limits.refused:
                                log.warning("node %s is at tuning.requests_per_node (%d): refusing requests "
                                            "with EAGAIN", limits.node, limits.per_node)
                            limits.refused += 1
                            nursery.start_soon(refuse_busy, message)
                        else:
                            limits.in_progress += 1
                            nursery.start_soon(serve_one, message)
            except wire.ProtocolError as exc:
                log.warning("closing connection from %s (%s): %s", peer, address, exc)
                with trio.move_on_after(1):
                    await send(wire.encode_error(0, errno.EPROTO, f"protocol error: {exc}"))
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass
            nursery.cancel_scope.cancel()
    finally:
        session.close()
        with trio.CancelScope(shield=True):
            await stream.aclose()


def _remote_address(stream: trio.SocketStream) -> str:
    try:
        host, port = stream.socket.getpeername()[:2]
        return f"{host}:{port}"
    except OSError:
        return "?"


async def serve(
    host: str,
    port: int,
    dispatch: Dispatch,
    *,
    secret: bytes,
    name: str,
    ssl_context: ssl.SSLContext | None = None,
    limits: RequestLimits | None = None,
    task_status: trio.TaskStatus[list[trio.SocketListener]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Listen on host:port (only there) and serve connections forever."""
    shared = limits or RequestLimits(node=name)

    async def handler(stream: trio.SocketStream) -> None:
        await handle_connection(stream, dispatch, secret=secret, name=name, ssl_context=ssl_context,
                                limits=shared)

    await trio.serve_tcp(handler, port, host=host, task_status=task_status)
