"""Authenticated, multiplexed request/response over TCP (trio).

One connection carries many requests in flight; replies are matched by id.
Before any request, both ends prove knowledge of the cluster secret with
HMAC-SHA256 over fresh nonces (the secret never crosses the wire):

    server -> client   hello {proto, v, nonce: Ns}
    client -> server   hello {node: C, nonce: Nc, mac: HMAC(k, "client" Ns Nc C)}
    server -> client   hello {node: S, frames, mac: HMAC(k, "server" Nc Ns S frames)}

The server names itself only in its last message, once the client proved the
secret; until then a peer may send only small frames of small values
(wire.PREAUTH_MAX_FRAME, wire.PREAUTH_LIMITS), must finish within
HANDSHAKE_TIMEOUT, and a server holds only a few such connections at once,
from one address and over all (RequestLimits). A connection that fails the
handshake is closed without serving anything.

After it, the connection stays authenticated for its whole life: under TLS
by TLS itself (`frames: "tls"`; mutual: the name the client claims must be in
its certificate), otherwise by a MAC on every frame with a sequence number per
direction (`frames: "chacha20-poly1305"`, see wire.FrameMac), keyed from the
secret and both nonces. A frame that fails its check closes the connection
before anything in it is executed.

A cancelled or timed-out request never takes its connection down: one writer
task per connection sends every frame whole, whatever happens to the caller
that queued it (a caller cancelled before the writer took its frame sends
nothing at all), and a reply nobody waits for any more is dropped -- or, for a
request that made the peer open something (`releases`), undone.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import logging
import os
import random
import ssl
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import trio

from .._trio import open_nursery
from ..errors import AuthenticationFailed, PeerUnavailable, named
from . import wire
from .tls import certificate_name, certificate_names

log = logging.getLogger(__name__)

PROTO = "gmount"
#: A peer has this long from its connect to the end of the handshake (TLS included).
HANDSHAKE_TIMEOUT = 5.0
#: Connections a server keeps in their handshake at once: over all, and from one address.
#: Beyond them a new connection is closed at once, before anything is read or sent.
HANDSHAKES = 128
HANDSHAKES_PER_ADDRESS = 32
#: At most one line a while about refused connections (a flood must not fill the log).
REFUSALS_LOGGED_EVERY = 10.0
RECEIVE_CHUNK = 1 << 18
#: A request served for longer than this is logged: the peer that sent it has likely timed out.
SLOW_REQUEST = 5.0
#: Requests served at once per connection; beyond it the reader stops reading
#: (TCP back-pressure) instead of queueing without bound.
MAX_IN_FLIGHT = 64
#: Requests served at once by one node over all its connections; beyond it a
#: request is answered EAGAIN at once (see RequestLimits).
MAX_IN_FLIGHT_PER_NODE = 1024
#: Requests whose caller gave up, remembered per connection until their reply comes (see `releases`).
ABANDONED_KEPT = 4096
NONCE_SIZE = 32
MAX_NAME = 255
FRAMES_MAC = "chacha20-poly1305"
FRAMES_TLS = "tls"


def _mac(secret: bytes, role: bytes, *parts: bytes) -> bytes:
    """HMAC-SHA256 over length-prefixed parts: no two different part lists give the same input."""
    message = b"".join(len(part).to_bytes(4, "big") + part for part in (role, *parts))
    return hmac.new(secret, message, hashlib.sha256).digest()


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


class BadRequest(OSError):
    """The peer's request is malformed (arguments that do not fit its message type): refused with
    EINVAL, not a bug of this node."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.EINVAL, message)


class RequestTimedOut(PeerUnavailable):
    """No reply within the timeout (ETIMEDOUT). The connection stays up.

    `silent`: nothing at all came from the peer on this connection since the
    request was sent -- the peer itself may be gone, not just this request slow.
    """

    def __init__(self, node: str, reason: str, *, silent: bool) -> None:
        super().__init__(node, reason, errno.ETIMEDOUT)
        self.silent = silent


#: For a request that makes the peer hold something (a handle): the request that lets go of it,
#: given the reply -- sent when that reply comes after its caller gave up. None: nothing to undo.
Release = Callable[[Any], "tuple[str, list[Any]] | None"]


# ---------------------------------------------------------------- client side


class RpcClient:
    """One authenticated connection to a peer; `call` may be used concurrently.

    `run` (started by `connect`) is the connection: a reader that hands replies
    to their callers and a writer that sends queued frames, each whole. A
    caller hands its frame to the writer through an unbuffered channel: if the
    caller is cancelled or times out before the writer took it, nothing was
    sent; once taken, the frame goes out whole whatever the caller does.
    `releases` names the operations whose late replies must be undone (op ->
    the request that lets go of what the reply holds).
    """

    def __init__(self, stream: trio.abc.Stream, peer: str, decoder: wire.FrameDecoder,
                 send_mac: wire.FrameMac | None = None, *, releases: Mapping[str, Release] | None = None) -> None:
        self.peer = peer
        self._stream = stream
        self._decoder = decoder
        self._send_mac = send_mac
        self._releases = dict(releases or {})
        self._outbox, self._writer_inbox = trio.open_memory_channel[bytes](0)
        self._next_id = 1
        self._pending: dict[int, _Pending] = {}
        self._abandoned: dict[int, str] = {}  # id -> op: requests to undo if their reply still comes
        self._closed: str | None = None
        self._scope = trio.CancelScope()
        self._finished = trio.Event()
        self._nursery: trio.Nursery | None = None
        #: trio.current_time() when bytes last came from the peer.
        self.last_received = trio.current_time()
        #: Late replies undone (for tests and stats).
        self.released = 0

    @property
    def closed(self) -> bool:
        return self._closed is not None

    async def call(self, op: str, *args: Any, timeout: float = 5.0) -> Any:
        """Send a request and wait for its reply; remote errors come back as OSError.

        No reply within `timeout` raises RequestTimedOut; the connection stays
        up, and the reply, if it comes, is dropped (or undone, see `releases`).
        """
        if self._closed is not None:
            raise PeerUnavailable(self.peer, self._closed)
        request_id = self._next_id
        self._next_id += 1
        frame = wire.encode_request(request_id, op, list(args))
        pending = _Pending()
        self._pending[request_id] = pending
        sent_at = trio.current_time()
        handed_over = delivered = False
        try:
            with trio.move_on_after(timeout) as scope:
                try:
                    await self._outbox.send(frame)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    raise PeerUnavailable(self.peer, self._closed or "connection closed") from None
                handed_over = True
                await pending.event.wait()
            message = pending.message
            if scope.cancelled_caught and message is None and pending.failure is None:
                silent = self.last_received < sent_at
                waited = f"no reply to {op} within {timeout:g}s" + (
                    "" if handed_over else " (the request still waited to be sent: the connection is busy)")
                raise RequestTimedOut(self.peer, waited, silent=silent)
            if isinstance(message, wire.Reply):
                delivered = True
                return message.result
            if isinstance(message, wire.ErrorReply):
                raise OSError(message.errno, named(message.message, self.peer))
            raise PeerUnavailable(self.peer, pending.failure or "connection lost")
        finally:
            self._pending.pop(request_id, None)
            if not delivered and op in self._releases:
                if isinstance(pending.message, wire.Reply):  # came as the caller was cancelled
                    self._release(op, pending.message.result)
                elif handed_over and pending.message is None and pending.failure is None:
                    self._abandon(request_id, op)

    def _abandon(self, request_id: int, op: str) -> None:
        self._abandoned[request_id] = op
        if len(self._abandoned) > ABANDONED_KEPT:  # a peer that never answers: its session ends with the connection
            del self._abandoned[next(iter(self._abandoned))]

    def _release(self, op: str, result: Any) -> None:
        """A reply came for a caller that gave up: let go of what it made the peer hold."""
        try:
            undo = self._releases[op](result)
        except (TypeError, ValueError, IndexError, OSError):
            log.warning("cannot undo a late %s reply from %s: %r", op, self.peer, result)
            return
        if undo is None or self._nursery is None or self._closed is not None:
            return
        self.released += 1
        self._nursery.start_soon(self._send_release, op, *undo)

    async def _send_release(self, op: str, undo_op: str, args: list[Any]) -> None:
        try:
            await self.call(undo_op, *args, timeout=SLOW_REQUEST)
        except OSError as exc:  # the connection's end releases it anyway
            log.info("%s after a late %s reply from %s failed: %s", undo_op, op, self.peer, exc)

    async def run(self) -> None:
        """The connection's reader and writer, until it ends (peer gone, protocol error, or `aclose`)."""
        reason = "connection closed by peer"
        try:
            with self._scope:
                async with open_nursery() as nursery:
                    self._nursery = nursery
                    nursery.start_soon(self._write_loop)
                    reason = await self._read_loop()
                    nursery.cancel_scope.cancel()
        finally:
            self._fail_all(reason)
            self._writer_inbox.close()  # callers waiting to hand over a frame: BrokenResourceError
            with trio.CancelScope(shield=True):
                await _close_quietly(self._stream)
            self._finished.set()

    async def _write_loop(self) -> None:
        """Send each queued frame whole. Cancelled only when the connection itself ends."""
        try:
            async for frame in self._writer_inbox:
                if self._send_mac is not None:
                    frame = self._send_mac.seal(frame)  # here: sequence numbers follow the wire order
                await self._stream.send_all(frame)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self._fail_all(f"send failed: {exc}")
            self._scope.cancel()

    async def _read_loop(self) -> str:
        """Hand replies to waiting callers; returns why the connection ended."""
        try:
            while True:
                data = await self._stream.receive_some(RECEIVE_CHUNK)
                if not data:
                    return "connection closed by peer"
                self.last_received = trio.current_time()
                for message in self._decoder.feed(data):
                    if not isinstance(message, (wire.Reply, wire.ErrorReply)):
                        raise wire.ProtocolError(f"unexpected {type(message).__name__} from server")
                    pending = self._pending.get(message.id)
                    if pending is not None:
                        pending.message = message
                        pending.event.set()
                    else:
                        op = self._abandoned.pop(message.id, None)
                        if op is not None and isinstance(message, wire.Reply):
                            self._release(op, message.result)
        except wire.ProtocolError as exc:
            reason = f"protocol error: {exc}"
            log.warning("closing connection to %s: %s", self.peer, reason)
            return reason
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            return f"connection lost: {exc}"

    def _fail_all(self, reason: str) -> None:
        if self._closed is None:
            self._closed = reason
        for pending in self._pending.values():
            if pending.message is None:
                pending.failure = reason
                pending.event.set()

    async def aclose(self) -> None:
        """Close the connection (waiting callers get PeerUnavailable); closing a closed one is no error."""
        self._fail_all("closed")
        self._scope.cancel()
        if self._nursery is None:  # never ran: nothing else holds the stream
            self._writer_inbox.close()
            with trio.CancelScope(shield=True):
                await _close_quietly(self._stream)
            return
        with trio.CancelScope(shield=True):
            await self._finished.wait()


@dataclass
class _Pending:
    event: trio.Event = field(default_factory=trio.Event)
    message: wire.Message | None = None
    failure: str | None = None


def _field(fields: dict[str, Any], key: str, kind: type[str] | type[bytes], low: int = 1,
           high: int = MAX_NAME) -> Any:
    """A handshake field of the right type and size, or ProtocolError."""
    value = fields.get(key)
    if not isinstance(value, kind) or not low <= len(value) <= high:
        raise wire.ProtocolError(f"hello without a usable {key!r}")
    return value


class _ClosedAtOnce(Exception):
    """The daemon closed the connection before saying anything: most likely over its handshake limits."""




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
    releases: Mapping[str, Release] | None = None,
) -> RpcClient:
    """Open and authenticate a connection; its reader and writer run in `nursery`.

    With `ssl_context` the connection is TLS, and the peer's certificate must
    name `peer` and be signed by the cluster CA. Without, the daemon must call
    itself `peer` once it proved the secret. A daemon that closes the
    connection before saying anything (busy with other handshakes) is tried
    again after a short random pause, until `timeout`. `releases`: see RpcClient.
    """
    deadline = trio.current_time() + timeout
    attempt = 0
    while True:
        attempt += 1
        try:
            with trio.fail_at(deadline):
                stream, decoder, send_mac = await _open(host, port, secret, name, peer, ssl_context)
            break
        except _ClosedAtOnce as closed:
            pause = random.uniform(0.05, 0.2) * min(attempt, 5)
            if trio.current_time() + pause >= deadline:
                raise PeerUnavailable(peer, f"cannot connect to {host}:{port}: the daemon closed the connection "
                                            f"at once, {attempt} times ({closed}): it is busy with other "
                                            "handshakes, or stopping") from None
            await trio.sleep(pause)
        except trio.TooSlowError:
            raise PeerUnavailable(peer, f"no answer from {host}:{port} within {timeout:g}s",
                                  errno.ETIMEDOUT) from None
        except AuthenticationFailed as exc:
            raise PeerUnavailable(peer, str(exc), errno.EACCES) from None
        except (OSError, wire.ProtocolError, trio.BrokenResourceError) as exc:
            certificate = _certificate_problem(exc, peer, host, port)
            if certificate is not None:
                raise PeerUnavailable(peer, certificate, errno.EACCES) from None
            raise PeerUnavailable(peer, f"cannot connect to {host}:{port}: {exc}") from None
    client = RpcClient(stream, peer, decoder, send_mac, releases=releases)
    nursery.start_soon(client.run)
    return client


async def _open(host: str, port: int, secret: bytes, name: str, peer: str, ssl_context: ssl.SSLContext | None
                ) -> tuple[trio.abc.Stream, wire.FrameDecoder, wire.FrameMac | None]:
    """One attempt: TCP (and TLS), then the client's half of the handshake. The stream is closed on failure."""
    tcp = await trio.open_tcp_stream(host, port)
    stream: trio.abc.Stream = tcp
    try:
        decoder = wire.FrameDecoder(preauth=True)
        early: list[wire.Message] = []
        if ssl_context is not None:
            stream = trio.SSLStream(tcp, ssl_context, server_hostname=certificate_name(peer, secret),
                                    https_compatible=False)
            try:
                await stream.do_handshake()
            except trio.BrokenResourceError as exc:
                if isinstance(exc.__cause__, (ssl.SSLEOFError, ConnectionResetError)):
                    raise _ClosedAtOnce(exc.__cause__) from None
                raise
        else:
            try:
                first = await tcp.receive_some(4096)
            except (trio.BrokenResourceError, ConnectionResetError) as exc:
                raise _ClosedAtOnce(exc.__cause__ or exc) from None
            if not first:
                raise _ClosedAtOnce("end of stream")
            early = decoder.feed(first)
        hello = await _first_message(stream, decoder, early)
        if not isinstance(hello, wire.Hello) or hello.fields.get("proto") != PROTO:
            raise wire.ProtocolError("peer is not a gmount daemon")
        if hello.fields.get("v") != wire.VERSION:
            raise wire.ProtocolError(f"peer speaks gmount protocol version {hello.fields.get('v')!r}, "
                                     f"this node {wire.VERSION}: run the same gmountpy on every node")
        server_nonce = _field(hello.fields, "nonce", bytes, NONCE_SIZE, NONCE_SIZE)
        client_nonce = os.urandom(NONCE_SIZE)
        await stream.send_all(wire.encode_hello({
            "node": name,
            "nonce": client_nonce,
            "mac": _mac(secret, b"client", server_nonce, client_nonce, name.encode()),
        }))
        answer = await _receive_message(stream, decoder)
        if isinstance(answer, wire.ErrorReply):
            raise AuthenticationFailed(f"node {peer!r} refused us: {answer.message}")
        if not isinstance(answer, wire.Hello):
            raise wire.ProtocolError(f"unexpected {type(answer).__name__} in the handshake")
        server_name, frames_offered, mac = (answer.fields.get(k) for k in ("node", "frames", "mac"))
        if not (isinstance(server_name, str) and isinstance(frames_offered, str) and isinstance(mac, bytes)
                and hmac.compare_digest(mac, _mac(secret, b"server", client_nonce, server_nonce,
                                                  server_name.encode(), frames_offered.encode()))):
            raise AuthenticationFailed(f"node {peer!r} at {host}:{port} does not know the cluster secret")
        frames = FRAMES_TLS if ssl_context is not None else FRAMES_MAC
        if frames_offered != frames:
            raise wire.ProtocolError(f"peer does not protect frames with {frames} (it offers {frames_offered!r}): "
                                     "is it a cluster with another tls setting?")
        if server_name != peer:
            raise AuthenticationFailed(f"the daemon at {host}:{port} is node {server_name!r}, not {peer!r} "
                                       "(is the peer table out of date?)")
        if ssl_context is not None:
            decoder.authenticate(None)
            return stream, decoder, None
        to_server, to_client = wire.frame_keys(secret, server_nonce, client_nonce, name)
        decoder.authenticate(wire.FrameMac(to_client))
        return stream, decoder, wire.FrameMac(to_server)
    except BaseException:
        with trio.CancelScope(shield=True):
            await _close_quietly(stream)
        raise


async def _first_message(stream: trio.abc.Stream, decoder: wire.FrameDecoder,
                         early: list[wire.Message]) -> wire.Message:
    """The server's hello: decoded from the first bytes already (`early`), or still to be read."""
    if not early:
        return await _receive_message(stream, decoder)
    if len(early) > 1 or decoder.pending:
        raise wire.ProtocolError("unexpected data during handshake")
    return early[0]


async def _close_quietly(stream: trio.abc.AsyncResource) -> None:
    """Close without waiting on the peer (no TLS close_notify to a peer that may not read); never raises."""
    try:
        await trio.aclose_forcefully(stream)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass


_CLOSED_IN_HANDSHAKE = ("closed the connection in the TLS handshake: it refused this client's certificate "
                        "(none, or not from this cluster's CA: does this client use the cluster's current "
                        "certificates? `gmount up` makes them)")
#: TLS errors with which a daemon refuses the certificate this client presented (or its absence).
_REFUSED_OUR_CERTIFICATE = {
    "UNEXPECTED_EOF_WHILE_READING": _CLOSED_IN_HANDSHAKE,
    "TLSV13_ALERT_CERTIFICATE_REQUIRED": "asks for a client certificate and this client presented none",
    "TLSV1_ALERT_UNKNOWN_CA": "does not know the CA of this client's certificate (another cluster's?)",
    "SSLV3_ALERT_CERTIFICATE_EXPIRED": "found this client's certificate expired",
    "SSLV3_ALERT_BAD_CERTIFICATE": "refused this client's certificate",
    "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE": "refused this client's certificate (not made for a client)",
}


def _certificate_problem(exc: BaseException, peer: str, host: str, port: int) -> str | None:
    """A refused TLS certificate, said plainly: expired, foreign, or made for another node -- ours or theirs."""
    error = exc
    if isinstance(exc, trio.BrokenResourceError) and isinstance(exc.__cause__, ssl.SSLError):
        error = exc.__cause__
    where = f"{host}:{port}"
    if isinstance(error, ssl.SSLError) and not isinstance(error, ssl.SSLCertVerificationError):
        refusal = _REFUSED_OUR_CERTIFICATE.get(getattr(error, "reason", None) or "")
        if refusal is None:
            return None
        if refusal == _CLOSED_IN_HANDSHAKE:
            return f"node {peer!r} at {where} {refusal}"
        return (f"node {peer!r} at {where} {refusal}: refused; run `gmount up` again for this cluster "
                "if its certificates changed")
    if not isinstance(error, ssl.SSLCertVerificationError):
        return None
    code = getattr(error, "verify_code", None)
    if code == 10:  # X509_V_ERR_CERT_HAS_EXPIRED
        return (f"node {peer!r} at {where} presented an expired certificate: refused; "
                "run `gmount up` again for this cluster to renew its certificates")
    if code == 9:  # X509_V_ERR_CERT_NOT_YET_VALID
        return f"node {peer!r} at {where} presented a certificate that is not valid yet (clock skew?): refused"
    if code in (2, 7, 18, 19, 20, 21):  # unknown issuer, bad signature, self-signed, not signed by our CA
        return (f"node {peer!r} at {where} presented a certificate not issued by this cluster's CA "
                "(a foreign certificate: another cluster or another program at that address?): refused")
    if code == 62:  # X509_V_ERR_HOSTNAME_MISMATCH
        return (f"node {peer!r} at {where} presented a certificate of this cluster made for another node: "
                "refused (is the peer table out of date, or is this client's secret another cluster's?)")
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
    """What a server takes on at once: requests per connection and over all connections, and handshakes.

    Per connection the reader stops reading at the limit (back-pressure on
    that peer only); over the whole node a request beyond the limit is
    answered EAGAIN at once, so many connections cannot pile up work either.
    Connections still in their handshake are limited per source address and
    over all (`handshakes`, `handshakes_per_address`): beyond them a new one
    is closed at once. One instance is shared by every connection of a server.
    """

    def __init__(self, per_connection: int = MAX_IN_FLIGHT, per_node: int = MAX_IN_FLIGHT_PER_NODE,
                 node: str = "this node", *, handshakes: int = HANDSHAKES,
                 handshakes_per_address: int = HANDSHAKES_PER_ADDRESS) -> None:
        if min(per_connection, per_node, handshakes, handshakes_per_address) < 1:
            raise ValueError("request limits must be at least 1")
        self.per_connection = per_connection
        self.per_node = per_node
        self.node = node
        self.in_progress = 0
        self.refused = 0
        self.handshakes = handshakes
        self.handshakes_per_address = handshakes_per_address
        self.handshaking: Counter[str] = Counter()
        #: Connections closed unauthenticated: over the limits, failed or too slow handshakes.
        self.refused_connections = 0
        self._refusals_unlogged = 0
        self._refusal_logged_at = -REFUSALS_LOGGED_EVERY

    def admit(self, host: str) -> bool:
        """Count in a connection about to shake hands, or refuse it (False) over the limits."""
        if self.handshaking.total() >= self.handshakes or self.handshaking[host] >= self.handshakes_per_address:
            return False
        self.handshaking[host] += 1
        return True

    def done(self, host: str) -> None:
        """A connection counted in by `admit` ended its handshake (either way)."""
        self.handshaking[host] -= 1
        if self.handshaking[host] <= 0:
            del self.handshaking[host]

    def note_refused(self, address: str, why: str) -> None:
        """Log a refused connection -- one line per REFUSALS_LOGGED_EVERY at most, with the count in between."""
        self.refused_connections += 1
        now = trio.current_time()
        if now - self._refusal_logged_at < REFUSALS_LOGGED_EVERY:
            self._refusals_unlogged += 1
            return
        more = (f" ({self._refusals_unlogged} more refused in the last {now - self._refusal_logged_at:.0f} s)"
                if self._refusals_unlogged else "")
        log.warning("node %s refused a connection from %s: %s%s", self.node, address, why, more)
        self._refusal_logged_at = now
        self._refusals_unlogged = 0


async def _authenticate(stream: trio.abc.Stream, secret: bytes, name: str, tls: bool,
                        certificate: list[str] | None = None) -> tuple[str, wire.FrameDecoder, wire.FrameMac | None]:
    """The server's half of the handshake: (the peer's name, its decoder, our frame MAC).

    Nothing about this node goes out before the peer proved the secret. Under
    TLS, `certificate` holds the names of the client's certificate: the name
    its hello claims must be one of them.
    """
    decoder = wire.FrameDecoder(preauth=True)
    server_nonce = os.urandom(NONCE_SIZE)
    await stream.send_all(wire.encode_hello({"proto": PROTO, "v": wire.VERSION, "nonce": server_nonce}))
    hello = await _receive_message(stream, decoder)
    if not isinstance(hello, wire.Hello):
        raise AuthenticationFailed("first message was not a hello")
    try:
        client_nonce = _field(hello.fields, "nonce", bytes, NONCE_SIZE, NONCE_SIZE)
        mac = _field(hello.fields, "mac", bytes, 32, 32)
        peer = _field(hello.fields, "node", str)
    except wire.ProtocolError:
        raise AuthenticationFailed("hello lacks node, nonce or mac") from None
    if not hmac.compare_digest(mac, _mac(secret, b"client", server_nonce, client_nonce, peer.encode())):
        await stream.send_all(wire.encode_error(0, errno.EACCES, "authentication failed"))
        raise AuthenticationFailed(f"peer calling itself {peer!r} does not know the cluster secret")
    if certificate is not None and certificate_name(peer, secret) not in certificate:
        await stream.send_all(wire.encode_error(0, errno.EACCES, "authentication failed: the name in the hello "
                                                "is not the one in the certificate"))
        raise AuthenticationFailed(f"peer calling itself {peer!r} presented a certificate made for another name")
    frames = FRAMES_TLS if tls else FRAMES_MAC
    await stream.send_all(wire.encode_hello({
        "node": name, "frames": frames,
        "mac": _mac(secret, b"server", client_nonce, server_nonce, name.encode(), frames.encode())}))
    if tls:
        decoder.authenticate(None)
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
            await _close_quietly(stream)


async def _shake_hands(tcp: trio.SocketStream, secret: bytes, name: str, ssl_context: ssl.SSLContext | None,
                       limits: RequestLimits, address: str
                       ) -> tuple[trio.abc.Stream, str, wire.FrameDecoder, wire.FrameMac | None] | None:
    """TLS (if any) and the HMAC handshake within HANDSHAKE_TIMEOUT; None (connection closed) if refused."""
    host = address.rpartition(":")[0]
    if not limits.admit(host):
        limits.note_refused(address, f"{limits.handshaking.total()} connections in their handshake "
                                     f"({limits.handshaking[host]} from this address): closed at once")
        await _close_quietly(tcp)
        return None
    stream: trio.abc.Stream = tcp
    try:
        with trio.fail_after(HANDSHAKE_TIMEOUT):
            certificate = None
            if ssl_context is not None:
                stream = trio.SSLStream(tcp, ssl_context, server_side=True, https_compatible=False)
                await stream.do_handshake()
                certificate = certificate_names(stream.getpeercert())
            peer, decoder, send_mac = await _authenticate(stream, secret, name, ssl_context is not None, certificate)
        return stream, peer, decoder, send_mac
    except (trio.TooSlowError, wire.ProtocolError, AuthenticationFailed,
            trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
        why = "no handshake within the deadline" if isinstance(exc, trio.TooSlowError) else str(exc)
        if isinstance(exc, trio.BrokenResourceError) and exc.__cause__ is not None:
            why = str(exc.__cause__)
        limits.note_refused(address, why or type(exc).__name__)
        await _close_quietly(stream)
        return None
    finally:
        limits.done(host)


async def _handle_connection(tcp: trio.SocketStream, dispatch: Dispatch, *, secret: bytes, name: str,
                             ssl_context: ssl.SSLContext | None, limits: RequestLimits) -> None:
    address = _remote_address(tcp)
    shaken = await _shake_hands(tcp, secret, name, ssl_context, limits, address)
    if shaken is None:
        return
    stream, peer, decoder, send_mac = shaken
    session = Session(peer)
    send_lock = trio.Lock()
    in_flight = trio.Semaphore(limits.per_connection)

    async def send(frame: bytes) -> None:
        # Replies are cancelled only when the connection ends: a frame cut short then harms nobody.
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

    def answer(request: wire.Request, result: Any) -> bytes:
        try:
            return wire.encode_reply(request.id, result)
        except (TypeError, ValueError) as exc:  # unencodable or too large: this node's bug, not the peer's
            log.exception("node %s cannot send its answer to %s from %s", limits.node, request.op, peer)
            return wire.encode_error(request.id, errno.EIO, f"node {limits.node} could not send its answer to "
                                                            f"{request.op}: {exc} (a bug; its log has details)")

    async def serve_one(request: wire.Request) -> None:
        started = trio.current_time()
        try:  # counted in by the reader, before this task started: a burst cannot slip past the limit
            try:
                frame = answer(request, await dispatch(session, request.op, request.args))
            except OSError as exc:  # the operation's own failure, or a refused request (BadRequest)
                frame = wire.encode_error(request.id, exc.errno or errno.EIO, exc.strerror or str(exc))
            except Exception as exc:  # a bug here: said as one, never as the caller's fault
                log.exception("request %s from %s failed on node %s", request.op, peer, limits.node)
                frame = wire.encode_error(request.id, errno.EIO,
                                          f"internal error on node {limits.node} in {request.op}: "
                                          f"{type(exc).__name__}: {exc} (a bug; its log has the traceback)")
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
            await _close_quietly(stream)


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
