"""A man in the middle between a real client and a real node service, over real TCP.

The relay sees every frame and may modify, inject, replay or reorder them
(it cannot forge a tag: it does not know the cluster secret). Whatever it
does, the side that receives the bad frame closes the connection, logs why,
and executes nothing from that frame on.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio

from gmountpy._trio import open_nursery
from gmountpy.errors import PeerUnavailable
from gmountpy.node.export import Export
from gmountpy.node.service import NodeService
from gmountpy.protocol import rpc, wire

from ._trio import trio_test

SECRET = b"mitm test secret, 32 bytes long."

#: What the relay does with the n-th frame the client sends (0 is the hello): the bytes to forward instead.
Tamper = Callable[[int, bytes], bytes]


def _pass(index: int, frame: bytes) -> bytes:
    return frame


@dataclass
class Relay:
    """A TCP relay that splits the client's bytes into frames, so a test can tamper with them."""

    server_port: int
    to_server: Tamper = _pass
    to_client: Callable[[bytes], bytes] = lambda data: data
    sent: list[bytes] = field(default_factory=list)       # client frames as they were sent
    server_streams: list[trio.SocketStream] = field(default_factory=list)

    async def handle(self, client: trio.SocketStream) -> None:
        server = await trio.open_tcp_stream("127.0.0.1", self.server_port)
        self.server_streams.append(server)
        try:
            async with open_nursery() as nursery:
                nursery.start_soon(self._client_to_server, client, server, nursery.cancel_scope)
                nursery.start_soon(self._server_to_client, server, client, nursery.cancel_scope)
        finally:
            with trio.CancelScope(shield=True):
                await server.aclose()
                await client.aclose()

    async def _client_to_server(self, client: trio.SocketStream, server: trio.SocketStream,
                                scope: trio.CancelScope) -> None:
        buffer = bytearray()
        try:
            while data := await client.receive_some(1 << 16):
                buffer += data
                while len(buffer) >= wire.HEADER.size:
                    _, length = wire.HEADER.unpack_from(buffer)
                    end = wire.HEADER.size + length + (wire.TAG_SIZE if self.sent else 0)  # the hello has no tag
                    if len(buffer) < end:
                        break
                    frame = bytes(buffer[:end])
                    del buffer[:end]
                    index = len(self.sent)
                    self.sent.append(frame)
                    forward = self.to_server(index, frame)
                    if forward:
                        await server.send_all(forward)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        scope.cancel()

    async def _server_to_client(self, server: trio.SocketStream, client: trio.SocketStream,
                                scope: trio.CancelScope) -> None:
        try:
            while data := await server.receive_some(1 << 16):
                await client.send_all(self.to_client(data))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        scope.cancel()

    async def inject(self, data: bytes) -> None:
        """Send bytes of our own to the server, on the live connection."""
        await self.server_streams[-1].send_all(data)


@asynccontextmanager
async def node_behind_relay(root: Path, relay_setup: Callable[[Relay], None] = lambda relay: None
                            ) -> AsyncIterator[tuple[rpc.RpcClient, Relay]]:
    """A real NodeService on `root`, a relay in front of it, and a client connected through the relay."""
    service = NodeService(Export(str(root)), {"node": "srv"})
    async with open_nursery() as nursery:
        listeners = await nursery.start(
            lambda task_status: rpc.serve("127.0.0.1", 0, service.dispatch, secret=SECRET, name="srv",
                                          task_status=task_status))
        relay = Relay(listeners[0].socket.getsockname()[1])
        relay_setup(relay)
        relay_listeners = await nursery.start(trio.serve_tcp, relay.handle, 0)
        client = await rpc.connect(nursery, "127.0.0.1", relay_listeners[0].socket.getsockname()[1],
                                   secret=SECRET, name="cli", peer="srv", timeout=5)
        yield client, relay
        await client.aclose()
        nursery.cancel_scope.cancel()


def integrity_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "failed its integrity check" in r.getMessage()]


async def wait_closed(client: rpc.RpcClient) -> None:
    with trio.fail_after(5):
        while not client.closed:
            await trio.sleep(0.01)


@trio_test
async def test_untampered_traffic_through_the_relay_is_served(tmp_path: Path) -> None:
    async with node_behind_relay(tmp_path) as (client, relay):
        for i in range(20):
            await client.call("mkdir", f"/d{i}", 0o755)
        assert sorted(os.listdir(tmp_path)) == sorted(f"d{i}" for i in range(20))
        assert len(relay.sent) == 21  # the hello and one frame per request


@trio_test
async def test_a_modified_byte_is_refused_and_the_request_not_executed(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "keep").write_text("k")
    (tmp_path / "keeq").write_text("q")

    def flip(index: int, frame: bytes) -> bytes:
        if index == 2:  # the second request: unlink /keep becomes unlink /keeq
            at = frame.rindex(b"/keep") + 4
            return frame[:at] + b"q" + frame[at + 1:]
        return frame

    async with node_behind_relay(tmp_path, lambda relay: setattr(relay, "to_server", flip)) as (client, _):
        await client.call("mkdir", "/first", 0o755)
        with pytest.raises(PeerUnavailable):
            await client.call("unlink", "/keep")
        await wait_closed(client)
    assert (tmp_path / "keep").exists() and (tmp_path / "keeq").exists()
    assert (tmp_path / "first").is_dir()
    assert any("srv" in m or "cli" in m for m in integrity_warnings(caplog)), caplog.text


@trio_test
async def test_an_injected_frame_is_refused_and_nothing_after_it_runs(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "victim").write_text("v")

    def inject(index: int, frame: bytes) -> bytes:
        if index == 2:  # in front of the client's second request, a request of the attacker's own
            forged = wire.encode_request(99, "unlink", ["/victim"]) + os.urandom(wire.TAG_SIZE)
            return forged + frame
        return frame

    async with node_behind_relay(tmp_path, lambda relay: setattr(relay, "to_server", inject)) as (client, _):
        await client.call("mkdir", "/first", 0o755)
        with pytest.raises(PeerUnavailable):
            await client.call("mkdir", "/second", 0o755)
        await wait_closed(client)
    assert (tmp_path / "victim").exists()
    assert not (tmp_path / "second").exists()
    assert integrity_warnings(caplog)


@trio_test
async def test_a_frame_without_any_tag_is_not_executed(tmp_path: Path) -> None:
    """An attacker who knows the format but not the key: a bare request must not run."""
    (tmp_path / "victim").write_text("v")
    async with node_behind_relay(tmp_path) as (client, relay):
        await client.call("mkdir", "/first", 0o755)
        await relay.inject(wire.encode_request(99, "unlink", ["/victim"]) * 3)  # three bare frames
        await wait_closed(client)
    assert (tmp_path / "victim").exists()


@trio_test
async def test_a_replayed_unlink_does_not_unlink_the_file_created_again(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "f").write_text("first")
    async with node_behind_relay(tmp_path) as (client, relay):
        await client.call("unlink", "/f")
        assert not (tmp_path / "f").exists()
        (tmp_path / "f").write_text("second")     # the file is made again...
        await relay.inject(relay.sent[1])          # ...and the attacker replays the recorded unlink
        await wait_closed(client)
        with pytest.raises(PeerUnavailable):
            await client.call("mkdir", "/after", 0o755)
    assert (tmp_path / "f").read_text() == "second"
    assert not (tmp_path / "after").exists()
    assert integrity_warnings(caplog)


@trio_test
async def test_reordered_frames_are_refused(tmp_path: Path) -> None:
    held: list[bytes] = []

    def swap(index: int, frame: bytes) -> bytes:
        if index == 1:
            held.append(frame)
            return b""
        if index == 2:
            return frame + held.pop()
        return frame

    async def call(client: rpc.RpcClient, path: str) -> None:
        with pytest.raises(PeerUnavailable):
            await client.call("mkdir", path, 0o755)

    async with (node_behind_relay(tmp_path, lambda relay: setattr(relay, "to_server", swap)) as (client, _),
                open_nursery() as calls):
        calls.start_soon(call, client, "/one")
        await trio.sleep(0.05)  # /one is sent (and held by the relay) before /two
        calls.start_soon(call, client, "/two")
    assert os.listdir(tmp_path) == []


@trio_test
async def test_a_modified_reply_closes_the_connection_on_the_client(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "data").write_bytes(b"A" * 1000)
    tampering = {"on": False}

    def corrupt(data: bytes) -> bytes:
        if tampering["on"] and b"A" * 100 in data:
            return data.replace(b"A" * 100, b"B" + b"A" * 99, 1)
        return data

    async with node_behind_relay(tmp_path, lambda relay: setattr(relay, "to_client", corrupt)) as (client, _):
        handle, _ = await client.call("open", "/data", os.O_RDONLY)
        assert await client.call("read", handle, 0, 1000) == b"A" * 1000
        tampering["on"] = True
        with pytest.raises(PeerUnavailable, match="integrity check") as info:
            await client.call("read", handle, 0, 1000)
        assert info.value.errno == errno.EHOSTDOWN
        assert client.closed
    assert integrity_warnings(caplog)


@trio_test
async def test_a_recorded_session_replayed_on_a_new_connection_is_refused(tmp_path: Path) -> None:
    """The server's fresh nonce makes every connection's handshake and keys new: old frames are worthless."""
    (tmp_path / "f").write_text("first")
    async with node_behind_relay(tmp_path) as (client, relay):
        await client.call("unlink", "/f")
        (tmp_path / "f").write_text("second")
        replay = await trio.open_tcp_stream("127.0.0.1", relay.server_port)
        hello = await replay.receive_some(4096)  # the server's hello, with a nonce we cannot answer
        assert hello
        await replay.send_all(b"".join(relay.sent))  # the client's hello, then its sealed unlink
        with trio.fail_after(5):  # the server refuses the handshake and closes
            try:
                while await replay.receive_some(4096):
                    pass
            except trio.BrokenResourceError:
                pass
        await replay.aclose()
    assert (tmp_path / "f").read_text() == "second"
