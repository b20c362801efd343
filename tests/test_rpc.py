"""Authenticated RPC over real TCP on 127.0.0.1: calls, errors, timeouts, hostile clients, cleanup."""

from __future__ import annotations

import errno
import functools
import logging
import os
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio

from gmountpy._trio import open_nursery
from gmountpy.errors import PeerUnavailable
from gmountpy.protocol import rpc, wire

from ._trio import trio_test

SECRET = b"correct horse battery staple 123"


@dataclass
class Backend:
    """A dispatch function that records what it was asked to do."""

    calls: list[str] = field(default_factory=list)
    cleaned: list[str] = field(default_factory=list)
    started: trio.Event = field(default_factory=trio.Event)
    running: int = 0
    max_running: int = 0

    async def dispatch(self, session: rpc.Session, op: str, args: list[Any]) -> Any:
        self.calls.append(op)
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        try:
            return await self._run(session, op, args)
        finally:
            self.running -= 1

    async def _run(self, session: rpc.Session, op: str, args: list[Any]) -> Any:
        if op == "echo":
            return args
        if op == "sleep":
            await trio.sleep(args[0])
            return args[1]
        if op == "forever":
            self.started.set()
            await trio.sleep_forever()
        if op == "fail":
            raise OSError(*args)
        if op == "type":
            raise TypeError("wrong type")
        if op == "refuse":
            raise rpc.BadRequest(f"bad arguments to {op!r}: the first must be an integer")
        if op == "crash":
            raise RuntimeError("kaput")
        if op == "unencodable":
            return object()
        if op == "peer":
            return session.peer
        if op == "hold":
            tag = args[0]

            def cleanup() -> None:
                self.cleaned.append(tag)
                if tag == "bad":
                    raise RuntimeError("cleanup failed")

            session.cleanups.append(cleanup)
            return tag
        raise OSError(errno.ENOSYS, f"unknown operation {op!r}")


@dataclass
class Server:
    port: int
    scope: trio.CancelScope


@asynccontextmanager
async def serving(backend: Backend, *, secret: bytes = SECRET, name: str = "srv") -> AsyncIterator[
        tuple[trio.Nursery, Server]]:
    """A server in its own cancel scope (so a test can stop it) and a nursery for clients."""
    async with open_nursery() as nursery:
        scope = trio.CancelScope()

        async def run(task_status: trio.TaskStatus[list[trio.SocketListener]] = trio.TASK_STATUS_IGNORED) -> None:
            with scope:
                await rpc.serve("127.0.0.1", 0, backend.dispatch, secret=secret, name=name,
                                task_status=task_status)

        listeners = await nursery.start(run)
        yield nursery, Server(listeners[0].socket.getsockname()[1], scope)
        nursery.cancel_scope.cancel()


async def connect(nursery: trio.Nursery, port: int, *, secret: bytes = SECRET, timeout: float = 2.0) -> rpc.RpcClient:
    return await rpc.connect(nursery, "127.0.0.1", port, secret=secret, name="cli", peer="srv", timeout=timeout)


async def raw_handshake(stream: trio.SocketStream, secret: bytes = SECRET) -> tuple[wire.FrameDecoder, wire.FrameMac]:
    """The client half of the handshake, by hand, so a test can misbehave after it.

    Returns the decoder (checking the server's frame MACs) and the MAC to seal our own frames with.
    """
    decoder = wire.FrameDecoder(preauth=True)
    hello = await rpc._receive_message(stream, decoder)
    assert isinstance(hello, wire.Hello) and hello.fields["proto"] == rpc.PROTO
    assert set(hello.fields) == {"proto", "v", "nonce"}  # nothing about the node before we proved the secret
    nonce = os.urandom(32)
    await stream.send_all(wire.encode_hello({
        "node": "raw", "nonce": nonce, "mac": rpc._mac(secret, b"client", hello.fields["nonce"], nonce, b"raw")}))
    answer = await rpc._receive_message(stream, decoder)
    assert isinstance(answer, wire.Hello) and answer.fields["frames"] == rpc.FRAMES_MAC
    to_server, to_client = wire.frame_keys(secret, hello.fields["nonce"], nonce, "raw")
    decoder.authenticate(wire.FrameMac(to_client))
    return decoder, wire.FrameMac(to_server)


async def read_until_closed(stream: trio.SocketStream, decoder: wire.FrameDecoder | None = None) -> list[wire.Message]:
    """Everything the server says until it closes the connection (the test's deadline catches a hang)."""
    decoder = decoder or wire.FrameDecoder()
    received: list[wire.Message] = []
    while True:
        try:
            data = await stream.receive_some(65536)
        except trio.BrokenResourceError:
            return received
        if not data:
            return received
        received += decoder.feed(data)


async def free_port() -> int:
    sock = trio.socket.socket()
    await sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


# ---------------------------------------------------------------- calls


@trio_test
async def test_call_and_reply() -> None:
    backend = Backend()
    async with serving(backend) as (nursery, server):
        client = await connect(nursery, server.port)
        assert await client.call("echo", 1, "two", b"three", [4, {"five": None}]) == [1, "two", b"three",
                                                                                     [4, {"five": None}]]
        assert await client.call("peer") == "cli"
        assert backend.calls == ["echo", "peer"]
        await client.aclose()


@trio_test
async def test_many_concurrent_calls_on_one_connection_get_their_own_replies() -> None:
    backend = Backend()
    results: dict[int, Any] = {}
    rng = random.Random(7)
    async with serving(backend) as (nursery, server):
        client = await connect(nursery, server.port)

        async def one(i: int, delay: float) -> None:
            results[i] = await client.call("sleep", delay, {"i": i, "blob": bytes([i % 256]) * i})

        async with open_nursery() as calls:
            for i in range(300):
                calls.start_soon(one, i, rng.random() * 0.02)
        assert results == {i: {"i": i, "blob": bytes([i % 256]) * i} for i in range(300)}
        assert 1 < backend.max_running <= rpc.MAX_IN_FLIGHT
        await client.aclose()


@trio_test
async def test_remote_oserror_comes_back_with_its_errno() -> None:
    backend = Backend()
    async with serving(backend) as (nursery, server):
        client = await connect(nursery, server.port)
        with pytest.raises(FileNotFoundError) as info:
            await client.call("fail", errno.ENOENT, "no such thing")
        assert info.value.errno == errno.ENOENT and info.value.strerror == "no such thing (on node srv)"
        with pytest.raises(OSError) as info:
            await client.call("fail", errno.EXDEV, "across nodes")
        assert info.value.errno == errno.EXDEV
        with pytest.raises(OSError) as info:
            await client.call("fail", "an OSError without errno")
        assert info.value.errno == errno.EIO
        with pytest.raises(OSError) as info:
            await client.call("nope")
        assert info.value.errno == errno.ENOSYS
        # The connection survives every one of them.
        assert await client.call("echo", 1) == [1]


@trio_test
async def test_server_side_bugs_become_errors_not_dead_connections(caplog: pytest.LogCaptureFixture) -> None:
    """A refused request (EINVAL, the caller's fault) and a bug of the server (EIO, naming the node,
    its traceback in the log) are told apart; neither takes the connection down."""
    backend = Backend()
    async with serving(backend) as (nursery, server):
        client = await connect(nursery, server.port)
        with pytest.raises(OSError, match="bad arguments to 'refuse'") as info:
            await client.call("refuse")
        assert info.value.errno == errno.EINVAL
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # the caller's fault: no traceback
        with pytest.raises(OSError, match="internal error on node srv in type: TypeError: wrong type") as info:
            await client.call("type")
        assert info.value.errno == errno.EIO
        with pytest.raises(OSError, match="internal error on node srv in crash: RuntimeError: kaput") as info:
            await client.call("crash")
        assert info.value.errno == errno.EIO
        with pytest.raises(OSError, match="node srv could not send its answer to unencodable") as info:
            await client.call("unencodable")
        assert info.value.errno == errno.EIO
        assert await client.call("echo", "still here") == ["still here"]
    bugs = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(bugs) == 3 and all(r.exc_info for r in bugs)  # each with its traceback
    assert "wrong type" in caplog.text and "kaput" in caplog.text


# ---------------------------------------------------------------- authentication


@trio_test
async def test_wrong_secret_is_refused_and_nothing_is_served() -> None:
    backend = Backend()
    async with serving(backend) as (nursery, server):
        with pytest.raises(PeerUnavailable) as info:
            await connect(nursery, server.port, secret=b"not the cluster secret at all!!!")
        assert info.value.errno == errno.EACCES
        assert "srv" in str(info.value)
        assert backend.calls == []
        # The server is not disturbed by it.
        client = await connect(nursery, server.port)
        assert await client.call("echo") == []


@trio_test
async def test_a_bad_mac_with_a_request_pipelined_behind_it_is_not_served() -> None:
    backend = Backend()
    async with serving(backend) as (_, server):
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        decoder = wire.FrameDecoder()
        hello = await rpc._receive_message(stream, decoder)
        assert isinstance(hello, wire.Hello)
        await stream.send_all(wire.encode_hello({"node": "x", "nonce": os.urandom(32), "mac": b"\0" * 32})
                              + wire.encode_request(1, "echo", [1]))
        await read_until_closed(stream, decoder)
        await stream.aclose()
        assert backend.calls == []


@trio_test
async def test_client_refuses_a_server_that_does_not_know_the_secret() -> None:
    """Authentication is mutual: a server echoing a wrong MAC is not trusted."""

    async def impostor(stream: trio.SocketStream) -> None:
        decoder = wire.FrameDecoder()
        await stream.send_all(wire.encode_hello({"proto": rpc.PROTO, "v": wire.VERSION, "nonce": os.urandom(32)}))
        await rpc._receive_message(stream, decoder)
        await stream.send_all(wire.encode_hello({"node": "srv", "frames": rpc.FRAMES_MAC, "mac": os.urandom(32)}))
        await trio.sleep_forever()

    async with open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, impostor, 0)
        port = listeners[0].socket.getsockname()[1]
        with pytest.raises(PeerUnavailable, match="does not know the cluster secret") as info:
            await connect(nursery, port)
        assert info.value.errno == errno.EACCES
        nursery.cancel_scope.cancel()


@trio_test
async def test_connecting_to_something_that_is_not_a_gmount_daemon() -> None:
    async def other(stream: trio.SocketStream) -> None:
        await stream.send_all(wire.encode_hello({"proto": "http", "nonce": os.urandom(32)}))
        await trio.sleep_forever()

    async def garbage(stream: trio.SocketStream) -> None:
        await stream.send_all(b"SSH-2.0-OpenSSH_9.2\r\n")
        await trio.sleep_forever()

    async with open_nursery() as nursery:
        for handler in (other, garbage):
            listeners = await nursery.start(trio.serve_tcp, handler, 0)
            port = listeners[0].socket.getsockname()[1]
            with pytest.raises(PeerUnavailable, match="cannot connect") as info:
                await connect(nursery, port)
            assert info.value.errno == errno.EHOSTDOWN
        nursery.cancel_scope.cancel()


@trio_test
async def test_connect_to_a_closed_port_fails_fast() -> None:
    port = await free_port()
    async with open_nursery() as nursery:
        with trio.fail_after(2):
            with pytest.raises(PeerUnavailable, match="cannot connect") as info:
                await connect(nursery, port)
        assert info.value.errno == errno.EHOSTDOWN


@trio_test
async def test_connect_to_a_silent_server_times_out() -> None:
    async def silent(stream: trio.SocketStream) -> None:
        await trio.sleep_forever()

    async with open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, silent, 0)
        port = listeners[0].socket.getsockname()[1]
        with trio.fail_after(2):
            with pytest.raises(PeerUnavailable, match="within 0.2s") as info:
                await connect(nursery, port, timeout=0.2)
        assert info.value.errno == errno.ETIMEDOUT
        nursery.cancel_scope.cancel()


# ---------------------------------------------------------------- hostile clients


async def still_serves(nursery: trio.Nursery, port: int) -> None:
    client = await connect(nursery, port)
    assert await client.call("echo", "ok") == ["ok"]
    await client.aclose()


@pytest.mark.parametrize("junk", [
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    wire.HEADER.pack(7, 3) + b"\x93\x03\x80\x00",          # wrong version
    wire.HEADER.pack(wire.VERSION, wire.MAX_FRAME + 1),     # oversized, body never sent
    wire.encode_request(1, "echo", ["before the handshake"]),
    wire.HEADER.pack(wire.VERSION, 3) + b"\xc1\xc1\xc1",    # undecodable body
])
@trio_test
async def test_junk_before_the_handshake_closes_that_connection_only(junk: bytes) -> None:
    backend = Backend()
    async with serving(backend) as (nursery, server):
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        await stream.send_all(junk)
        with trio.fail_after(2):  # well before the 5 s handshake timeout
            await read_until_closed(stream)
        await stream.aclose()
        await still_serves(nursery, server.port)
        assert backend.calls == ["echo"]


@pytest.mark.parametrize("junk", [
    b"\x00\x00\x00\x00\x00\x00\x00\x00garbage",
    wire.HEADER.pack(2, 3) + b"\x93\x00\x01",               # wrong version
    wire.HEADER.pack(wire.VERSION, wire.MAX_FRAME + 1),     # oversized, body never sent
    wire.HEADER.pack(wire.VERSION, 2) + b"\x92\xc1",        # undecodable body
    wire.encode_hello({"again": True}),                     # a second hello
    wire.encode_reply(1, "a client does not send replies"),
])
@trio_test
async def test_junk_after_the_handshake_gets_a_protocol_error_and_a_close(junk: bytes) -> None:
    backend = Backend()
    async with serving(backend) as (nursery, server):
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        decoder, _ = await raw_handshake(stream)
        await stream.send_all(junk + b"\0" * wire.TAG_SIZE)  # a made-up tag: the key is not ours
        with trio.fail_after(2):
            received = await read_until_closed(stream, decoder)
        await stream.aclose()
        assert len(received) == 1 and isinstance(received[0], wire.ErrorReply)
        assert received[0].errno == errno.EPROTO
        await still_serves(nursery, server.port)
        assert backend.calls == ["echo"]


@pytest.mark.parametrize("junk", [
    wire.HEADER.pack(wire.VERSION, 2) + b"\x92\xc1",        # undecodable body
    wire.encode_hello({"again": True}),                     # a second hello
    wire.encode_reply(1, "a client does not send replies"),
])
@trio_test
async def test_authenticated_junk_after_the_handshake_is_refused_too(junk: bytes) -> None:
    """A peer that knows the secret but misbehaves gets the same treatment as a stranger."""
    backend = Backend()
    async with serving(backend) as (nursery, server):
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        decoder, mac = await raw_handshake(stream)
        await stream.send_all(mac.seal(junk))
        with trio.fail_after(2):
            received = await read_until_closed(stream, decoder)
        await stream.aclose()
        assert len(received) == 1 and isinstance(received[0], wire.ErrorReply)
        assert received[0].errno == errno.EPROTO and "integrity" not in received[0].message
        await still_serves(nursery, server.port)
        assert backend.calls == ["echo"]


@trio_test
async def test_a_client_that_never_finishes_the_handshake_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rpc, "HANDSHAKE_TIMEOUT", 0.2)
    backend = Backend()
    async with serving(backend) as (nursery, server):
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        with trio.fail_after(2):
            received = await read_until_closed(stream)
        await stream.aclose()
        assert [type(m) for m in received] == [wire.Hello]
        await still_serves(nursery, server.port)


@trio_test
async def test_requests_after_a_good_handshake_are_served_raw() -> None:
    """The hand-made handshake above is the real protocol: a raw client can be served."""
    backend = Backend()
    async with serving(backend) as (_, server):
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        decoder, mac = await raw_handshake(stream)
        await stream.send_all(mac.seal(wire.encode_request(41, "echo", ["raw"]))
                              + mac.seal(wire.encode_request(42, "peer", [])))
        received: list[wire.Message] = []
        while len(received) < 2:
            received += decoder.feed(await stream.receive_some(65536))
        assert sorted(received, key=lambda m: m.id) == [wire.Reply(41, ["raw"]), wire.Reply(42, "raw")]  # type: ignore[union-attr]
        await stream.aclose()


# ---------------------------------------------------------------- time and failure


@trio_test
async def test_call_timeout_is_etimedout_and_the_connection_stays_usable() -> None:
    backend = Backend()
    async with serving(backend) as (nursery, server):
        client = await connect(nursery, server.port)
        with trio.fail_after(2):
            with pytest.raises(PeerUnavailable, match="no reply to sleep within 0.2s") as info:
                await client.call("sleep", 10, "late", timeout=0.2)
        assert info.value.errno == errno.ETIMEDOUT
        assert not client.closed
        assert await client.call("echo", 1) == [1]


@trio_test
async def test_server_going_away_mid_call_fails_the_call_instead_of_hanging() -> None:
    backend = Backend()
    async with serving(backend) as (nursery, server):
        client = await connect(nursery, server.port)
        outcome: list[BaseException] = []

        async def call() -> None:
            try:
                await client.call("forever", timeout=30)
            except PeerUnavailable as exc:
                outcome.append(exc)

        with trio.fail_after(2):
            async with open_nursery() as calls:
                calls.start_soon(call)
                await backend.started.wait()
                server.scope.cancel()
        assert len(outcome) == 1 and outcome[0].errno == errno.EHOSTDOWN
        assert client.closed
        with pytest.raises(PeerUnavailable):
            await client.call("echo")  # at once: the connection is known to be closed


@trio_test
async def test_session_cleanups_run_when_the_client_disconnects() -> None:
    backend = Backend()
    async with serving(backend) as (nursery, server):
        client = await connect(nursery, server.port)
        for tag in ("first", "bad", "last"):
            assert await client.call("hold", tag) == tag
        assert backend.cleaned == []
        await client.aclose()
        with trio.fail_after(2):
            while len(backend.cleaned) < 3:
                await trio.sleep(0.01)
        # Newest first; a failing cleanup does not skip the others.
        assert backend.cleaned == ["last", "bad", "first"]


@trio_test
async def test_session_cleanups_run_when_the_server_stops() -> None:
    backend = Backend()
    async with serving(backend) as (nursery, server):
        client = await connect(nursery, server.port)
        await client.call("hold", "h")
        server.scope.cancel()
        with trio.fail_after(2):
            while not backend.cleaned:
                await trio.sleep(0.01)
        assert backend.cleaned == ["h"]


@trio_test
async def test_a_send_cut_short_by_a_timeout_never_corrupts_the_next_request() -> None:
    """A request whose send times out half-way must not leave half a frame on the connection.

    Otherwise the peer reads the next request as the rest of the cut one and may
    execute a corrupted request (a write of the wrong bytes).
    """
    received: list[wire.Message] = []
    may_read = trio.Event()
    done = trio.Event()

    async def stalled_server(stream: trio.SocketStream) -> None:
        _, decoder, _ = await rpc._authenticate(stream, SECRET, "srv", False)
        await may_read.wait()  # not reading: the client's send blocks once the buffers fill
        data = bytearray()
        try:
            while chunk := await stream.receive_some(1 << 20):
                data += chunk
        except trio.BrokenResourceError:
            pass
        # Decode frame by frame, as a server would whose reads happened to end at each frame's end.
        offset = 0
        try:
            while offset + wire.HEADER.size <= len(data):
                _, length = wire.HEADER.unpack_from(data, offset)
                end = offset + wire.HEADER.size + length + wire.TAG_SIZE
                received.extend(decoder.feed(bytes(data[offset:end])))
                offset = end
        except wire.ProtocolError:
            pass
        done.set()

    async with open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, stalled_server, 0)
        port = listeners[0].socket.getsockname()[1]
        client = await connect(nursery, port)
        big = b"A" * (12 * 1024 * 1024)
        with pytest.raises(PeerUnavailable) as info:
            await client.call("write", 1, 0, big, timeout=0.3)
        assert info.value.errno == errno.ETIMEDOUT
        may_read.set()
        small = b"B" * (4 * 1024 * 1024)
        for _ in range(4):  # the stalled server never replies: each call times out (or the connection is closed)
            with pytest.raises(PeerUnavailable):
                await client.call("write", 1, 0, small, timeout=0.3)
        await client.aclose()
        with trio.fail_after(5):
            await done.wait()
        for message in received:
            assert isinstance(message, wire.Request)
            assert message.args in ([1, 0, big], [1, 0, small]), "the server decoded a corrupted request"
        nursery.cancel_scope.cancel()



@trio_test
async def test_a_request_served_past_its_callers_patience_is_logged(monkeypatch: pytest.MonkeyPatch,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(rpc, "SLOW_REQUEST", 0.1)
    async with serving(Backend()) as (nursery, server):
        client = await connect(nursery, server.port)
        assert await client.call("sleep", 0.3, "late") == "late"
        assert await client.call("sleep", 0.01, "soon") == "soon"
    slow = [r.getMessage() for r in caplog.records if "took" in r.getMessage()]
    assert len(slow) == 1 and slow[0].startswith("request sleep from cli took 0.") and "on node srv" in slow[0]


@trio_test
async def test_a_full_request_window_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    backend = Backend()
    async with open_nursery() as nursery:
        limits = rpc.RequestLimits(2, 100, "srv")
        listeners = await nursery.start(functools.partial(
            rpc.serve, "127.0.0.1", 0, backend.dispatch, secret=SECRET, name="srv", limits=limits))
        client = await connect(nursery, listeners[0].socket.getsockname()[1])
        async with open_nursery() as calls:
            for i in range(5):
                calls.start_soon(client.call, "sleep", 0.05, i)
        nursery.cancel_scope.cancel()
    full = [r.getMessage() for r in caplog.records if "further requests wait" in r.getMessage()]
    assert full == ["connection from cli has 2 requests in progress on node srv (the limit of "
                    "tuning.requests_per_connection): further requests wait"]


# ---------------------------------------------------------------- cancelled and timed-out requests


class GatedStream(trio.abc.Stream):
    """A server's end of a connection whose reading a test can hold (the client's sends then block)."""

    def __init__(self, inner: trio.SocketStream) -> None:
        self.inner = inner
        self.socket = inner.socket
        self.open = trio.Event()
        self.open.set()

    def hold(self) -> None:
        self.open = trio.Event()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await self.open.wait()
        return await self.inner.receive_some(max_bytes)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self.inner.aclose()


@asynccontextmanager
async def gated_server(backend: Backend) -> AsyncIterator[tuple[trio.Nursery, int, list[GatedStream]]]:
    streams: list[GatedStream] = []

    async def handler(stream: trio.SocketStream) -> None:
        gated = GatedStream(stream)
        streams.append(gated)
        await rpc.handle_connection(gated, backend.dispatch, secret=SECRET, name="srv")  # type: ignore[arg-type]

    async with open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, handler, 0)
        yield nursery, listeners[0].socket.getsockname()[1], streams
        nursery.cancel_scope.cancel()


@trio_test
async def test_a_caller_cancelled_while_its_frame_is_sent_leaves_the_connection_up(
        caplog: pytest.LogCaptureFixture) -> None:
    """A closed file's read-ahead is cancelled while its request is on the wire: the frame still goes out
    whole (the peer would read the next request as the rest of it), the connection stays up for every
    other caller, and the reply nobody waits for is dropped."""
    backend = Backend()
    async with gated_server(backend) as (nursery, port, streams):
        client = await connect(nursery, port)
        assert await client.call("echo", "before") == ["before"]
        streams[0].hold()  # the server stops reading: a 12 MiB send blocks half-way, in the kernel's buffers
        big = b"A" * (12 << 20)
        async with open_nursery() as callers:
            callers.start_soon(functools.partial(client.call, "echo", big, timeout=30))
            await trio.sleep(0.3)
            callers.cancel_scope.cancel()  # the caller goes away with its frame half sent
        assert not client.closed
        streams[0].open.set()
        with trio.fail_after(5):
            assert await client.call("echo", "after") == ["after"]
            while backend.calls.count("echo") < 3:
                await trio.sleep(0.01)
        assert backend.calls == ["echo", "echo", "echo"]  # the big one arrived whole, then ours
        assert not client.closed
        await client.aclose()
    assert "protocol error" not in caplog.text and "integrity" not in caplog.text


@trio_test
async def test_a_caller_cancelled_before_its_frame_was_taken_sends_nothing() -> None:
    backend = Backend()
    async with gated_server(backend) as (nursery, port, streams):
        client = await connect(nursery, port)
        streams[0].hold()
        async with open_nursery() as callers:
            callers.start_soon(functools.partial(client.call, "echo", b"A" * (12 << 20), timeout=30))
            await trio.sleep(0.2)  # the big frame blocks the writer: the next caller waits to hand over
            callers.start_soon(functools.partial(client.call, "echo", "never sent", timeout=30))
            await trio.sleep(0.1)
            callers.cancel_scope.cancel()
        streams[0].open.set()
        assert await client.call("peer") == "cli"
        assert backend.calls == ["echo", "peer"]


@trio_test(timeout=30)
async def test_many_concurrent_cancels_and_timeouts_never_take_the_connection_down(
        caplog: pytest.LogCaptureFixture) -> None:
    backend = Backend()
    rng = random.Random(28)
    async with serving(backend) as (nursery, server):
        client = await connect(nursery, server.port)
        outcomes: list[str] = []

        async def one(i: int) -> None:
            payload = rng.randbytes(rng.choice([10, 1000, 300_000, 1 << 20]))
            try:
                if i % 2:
                    with trio.move_on_after(rng.random() * 0.03):
                        assert await client.call("sleep", rng.random() * 0.02, payload, timeout=30) == payload
                        outcomes.append("answered")
                        return
                    outcomes.append("cancelled")
                else:
                    assert await client.call("sleep", rng.random() * 0.02, payload,
                                             timeout=rng.random() * 0.03 + 0.001) == payload
                    outcomes.append("answered")
            except rpc.RequestTimedOut as exc:
                assert exc.errno == errno.ETIMEDOUT
                outcomes.append("timed out")

        async with open_nursery() as calls:
            for i in range(300):
                calls.start_soon(one, i)
        assert len(outcomes) == 300 and {"cancelled", "timed out"} <= set(outcomes)
        assert not client.closed
        for i in range(20):  # and later calls are served as always
            assert await client.call("echo", i) == [i]
        await client.aclose()
    assert "protocol error" not in caplog.text and "closing connection" not in caplog.text


@trio_test
async def test_a_timeout_says_whether_the_peer_answered_anything_meanwhile() -> None:
    """A request that times out on a connection that stayed silent hints at a dead peer; one that
    times out while other replies came is just slow (the pool marks a peer down for the first only)."""
    backend = Backend()
    async with serving(backend) as (nursery, server):
        client = await connect(nursery, server.port)
        with pytest.raises(rpc.RequestTimedOut) as info:
            await client.call("sleep", 1, None, timeout=0.2)
        assert info.value.silent

        async def chatter() -> None:
            for _ in range(30):
                await client.call("echo")
                await trio.sleep(0.01)

        async with open_nursery() as others:
            others.start_soon(chatter)
            with pytest.raises(rpc.RequestTimedOut) as info:
                await client.call("sleep", 1, None, timeout=0.2)
        assert not info.value.silent
        assert not client.closed


@dataclass
class Holder(Backend):
    """A backend whose `open` hands out handles (slowly, when told) and whose `close` takes them back."""

    open_delay: float = 0.0
    handles: set[int] = field(default_factory=set)
    next_handle: int = 1

    async def _run(self, session: rpc.Session, op: str, args: list[Any]) -> Any:
        if op == "open":
            await trio.sleep(self.open_delay)
            handle, self.next_handle = self.next_handle, self.next_handle + 1
            self.handles.add(handle)
            return [handle, [0o100644, 1, 0, 0, 0, 0, 0, 0, 0, 4096, 0, 0, handle]]  # an Attr's 13 fields
        if op == "close":
            self.handles.remove(args[0])
            return None
        return await super()._run(session, op, args)


@trio_test
async def test_a_handle_in_a_reply_that_came_too_late_is_closed() -> None:
    """An open whose reply arrives after its caller gave up (timeout or cancel) must not leave the
    descriptor on the holder for the connection's life: the client closes it when the reply comes."""
    from gmountpy.protocol.client import LATE_REPLY_RELEASES

    holder = Holder(open_delay=0.3)
    async with serving(holder) as (nursery, server):
        client = await rpc.connect(nursery, "127.0.0.1", server.port, secret=SECRET, name="cli", peer="srv",
                                   releases=LATE_REPLY_RELEASES)
        for _ in range(5):
            with pytest.raises(rpc.RequestTimedOut):
                await client.call("open", "/f", os.O_RDONLY, timeout=0.05)
        with trio.move_on_after(0.05):  # a caller cancelled (a FUSE open interrupted)
            await client.call("open", "/f", os.O_RDONLY)
        with trio.fail_after(5):
            while holder.next_handle <= 6 or holder.handles:
                await trio.sleep(0.02)
        assert holder.calls.count("close") == 6 and client.released == 6
        holder.open_delay = 0
        handle, _ = await client.call("open", "/f", os.O_RDONLY)  # an answered open keeps its handle
        await trio.sleep(0.1)
        assert holder.handles == {handle}
        await client.aclose()


# ---------------------------------------------------------------- before the handshake


@trio_test
async def test_a_server_names_nothing_before_the_client_proved_the_secret() -> None:
    backend = Backend()
    async with serving(backend, name="node-with-a-telling-name") as (nursery, server):
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        first = await stream.receive_some(4096)
        [hello] = wire.FrameDecoder(preauth=True).feed(first)
        assert isinstance(hello, wire.Hello) and set(hello.fields) == {"proto", "v", "nonce"}
        await stream.send_all(wire.encode_hello({"node": "x", "nonce": os.urandom(32), "mac": os.urandom(32)}))
        rest = b"".join([m async for m in _chunks(stream)])
        assert b"telling-name" not in first + rest
        await stream.aclose()
        client = await rpc.connect(nursery, "127.0.0.1", server.port, secret=SECRET, name="cli",
                                   peer="node-with-a-telling-name")
        assert await client.call("echo", 1) == [1]  # once proved, the name is checked
        with pytest.raises(PeerUnavailable, match="is node 'node-with-a-telling-name', not 'n7'") as info:
            await rpc.connect(nursery, "127.0.0.1", server.port, secret=SECRET, name="cli", peer="n7")
        assert info.value.errno == errno.EACCES


async def _chunks(stream: trio.SocketStream) -> AsyncIterator[bytes]:
    with trio.fail_after(3):
        while True:
            try:
                data = await stream.receive_some(4096)
            except trio.BrokenResourceError:
                return
            if not data:
                return
            yield data


async def hello_or_closed(port: int, source: str) -> trio.SocketStream | None:
    """Connect from `source`: the stream if the server said hello, None if it closed at once."""
    sock = trio.socket.socket()
    await sock.bind((source, 0))
    await sock.connect(("127.0.0.1", port))
    stream = trio.SocketStream(sock)
    with trio.fail_after(2):
        data = await stream.receive_some(4096)
    if data:
        return stream
    await stream.aclose()
    return None


@trio_test
async def test_connections_in_their_handshake_are_limited_per_address_and_over_all(
        caplog: pytest.LogCaptureFixture) -> None:
    backend = Backend()
    limits = rpc.RequestLimits(node="srv", handshakes=5, handshakes_per_address=2)
    async with open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(
            rpc.serve, "127.0.0.1", 0, backend.dispatch, secret=SECRET, name="srv", limits=limits))
        port = listeners[0].socket.getsockname()[1]
        from_two = [await hello_or_closed(port, "127.0.0.2") for _ in range(4)]
        assert [s is not None for s in from_two] == [True, True, False, False]  # 2 per address
        others = [await hello_or_closed(port, f"127.0.0.{i}") for i in (3, 3, 4, 5)]
        assert [s is not None for s in others] == [True, True, True, False]  # 5 over all
        with pytest.raises(PeerUnavailable):  # nobody else gets in while strangers hold every slot ...
            await connect(nursery, port)
        for stream in [*from_two, *others]:
            if stream is not None:
                await stream.aclose()
        await trio.sleep(0.1)
        client = await connect(nursery, port)  # ... and everyone once they are gone
        assert await client.call("echo", 1) == [1]
        assert limits.handshaking.total() == 0 and limits.refused_connections >= 5
        nursery.cancel_scope.cancel()
    refused = [r.getMessage() for r in caplog.records if "refused a connection" in r.getMessage()]
    assert len(refused) == 1, refused  # one line per REFUSALS_LOGGED_EVERY, however many were refused
    assert "connections in their handshake" in refused[0]


@trio_test(timeout=30)
async def test_a_burst_of_clients_beyond_the_handshake_limits_all_get_in() -> None:
    """Many jobs starting at once each open a connection: those closed at once try again shortly."""
    backend = Backend()
    limits = rpc.RequestLimits(node="srv", handshakes=2, handshakes_per_address=2)
    async with open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(
            rpc.serve, "127.0.0.1", 0, backend.dispatch, secret=SECRET, name="srv", limits=limits))
        port = listeners[0].socket.getsockname()[1]
        blockers = [await hello_or_closed(port, "127.0.0.1") for _ in range(2)]  # every slot taken a while
        clients: list[rpc.RpcClient] = []

        async def one() -> None:
            clients.append(await connect(nursery, port, timeout=15))

        async with open_nursery() as burst:
            for _ in range(40):
                burst.start_soon(one)
            await trio.sleep(0.3)
            assert clients == [] and limits.refused_connections >= 40
            for blocker in blockers:
                assert blocker is not None
                await blocker.aclose()
        assert len(clients) == 40
        for client in clients:
            assert await client.call("echo", 1) == [1]
            await client.aclose()
        nursery.cancel_scope.cancel()
