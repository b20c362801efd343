"""A live daemon under hostile input: garbage frames, bad requests, escaping paths."""

from __future__ import annotations

import errno
import os
import random
import shutil
import socket
import struct
import time

import msgpack
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gmountpy._trio import open_nursery
from gmountpy.cluster.state import load_secret
from gmountpy.errors import PeerUnavailable
from gmountpy.protocol import rpc, wire
from gmountpy.protocol.client import call, run_sync

from .conftest import LocalCluster


def raw_connection(cluster: LocalCluster, node: str) -> socket.socket:
    record = cluster.state.nodes[node]
    return socket.create_connection((record.host, record.port), timeout=5)


def still_serves(cluster: LocalCluster, node: str) -> bool:
    answer = run_sync(call, cluster.state, node, "ping")
    return answer["node"] == node


def test_random_frames_never_crash_or_hang_a_daemon(cluster4: LocalCluster) -> None:
    rng = random.Random(1234)
    deadline = time.monotonic() + 5  # bounded in time
    sent = 0
    waiting: list[socket.socket] = []  # partial frames: the daemon waits, but only until the handshake deadline
    try:
        while time.monotonic() < deadline:
            sock = raw_connection(cluster4, "n2")
            kind = rng.randrange(5)
            if kind == 0:
                payload = rng.randbytes(rng.randrange(1, 200))
            elif kind == 1:  # valid header, garbage body
                body = rng.randbytes(rng.randrange(0, 100))
                payload = struct.pack(">BI", wire.VERSION, len(body)) + body
            elif kind == 2:  # wrong version
                payload = struct.pack(">BI", 99, 3) + b"abc"
            elif kind == 3:  # oversized length
                payload = struct.pack(">BI", wire.VERSION, wire.MAX_FRAME + 1)
            else:  # a well-formed request before authenticating
                payload = wire.encode_request(1, "unlink", ["/victim"])
            try:
                sock.recv(4096)  # the server's hello
                sock.sendall(payload)
                sock.settimeout(0.5)
                while sock.recv(4096):
                    pass
                sock.close()
            except (ConnectionResetError, BrokenPipeError):
                sock.close()
            except TimeoutError:
                waiting.append(sock)
            sent += 1
        assert sent > 10
        assert still_serves(cluster4, "n2")
        limit = time.monotonic() + rpc.HANDSHAKE_TIMEOUT + 2
        for sock in waiting:
            sock.settimeout(max(0.1, limit - time.monotonic()))
            try:
                while sock.recv(4096):
                    pass
            except ConnectionResetError:
                pass
            except TimeoutError:
                pytest.fail("daemon kept a stalled unauthenticated connection open past the handshake timeout")
    finally:
        for sock in waiting:
            sock.close()
    assert still_serves(cluster4, "n2")


def test_unauthenticated_requests_are_not_processed(cluster4: LocalCluster) -> None:
    victim = cluster4.export("n2") / "hostile-victim.txt"
    victim.write_text("must survive")
    with raw_connection(cluster4, "n2") as sock:
        sock.recv(4096)
        sock.sendall(wire.encode_hello({"node": "evil", "nonce": os.urandom(32), "mac": os.urandom(32)}))
        sock.sendall(wire.encode_request(1, "unlink", ["/hostile-victim.txt"]))
        sock.settimeout(3)
        data = b""
        try:
            while chunk := sock.recv(4096):
                data += chunk
        except ConnectionResetError:
            pass
    decoded = wire.FrameDecoder().feed(data)  # an EACCES error, or nothing: the daemon just closes
    assert all(isinstance(m, wire.ErrorReply) and m.errno in (errno.EACCES, errno.EPROTO) for m in decoded)
    assert victim.read_text() == "must survive"


def test_wrong_secret_is_refused(cluster4: LocalCluster) -> None:
    record = cluster4.state.nodes["n1"]

    async def attempt() -> None:
        async with open_nursery() as nursery:
            await rpc.connect(nursery, record.host, record.port, secret=b"not the secret",
                              name="intruder", peer="n1", timeout=3)

    with pytest.raises(PeerUnavailable) as info:
        trio.run(attempt)
    assert info.value.errno == errno.EACCES


def test_bad_requests_get_error_replies_and_the_connection_lives_on(cluster4: LocalCluster) -> None:
    secret = load_secret(cluster4.state.name)
    record = cluster4.state.nodes["n3"]

    async def session() -> None:
        async with open_nursery() as nursery:
            client = await rpc.connect(nursery, record.host, record.port, secret=secret, name="t", peer="n3")
            for op, args, expected in [
                ("no_such_op", [], errno.ENOSYS),
                ("lookup", [42], errno.EINVAL),
                ("lookup", ["relative"], errno.EINVAL),
                ("read", [999, 0, 10], errno.EBADF),
                ("read", [1, "x", None], None),
                ("mkdir", ["/x"], None),  # missing argument
            ]:
                with pytest.raises(OSError) as info:
                    await client.call(op, *args)
                if expected is not None:
                    assert info.value.errno == expected, (op, args, info.value)
            assert (await client.call("ping"))["node"] == "n3"
            await client.aclose()
            nursery.cancel_scope.cancel()

    trio.run(session)


OUTSIDE_SECRET = "top secret outside the export"

hostile_component = st.sampled_from(["..", ".", "", "escape", "etc", "passwd", "a\0b", "x" * 300, "ok"])
hostile_path = st.lists(hostile_component, min_size=1, max_size=6).map(lambda parts: "/" + "/".join(parts)) | \
    st.text(min_size=0, max_size=40)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=hostile_path)
def test_hostile_paths_over_the_wire_never_leave_the_export(cluster4: LocalCluster, path: str) -> None:
    export = cluster4.export("n4")
    outside = export.parent / "outside"
    outside.mkdir(exist_ok=True)
    (outside / "passwd").write_text(OUTSIDE_SECRET)
    escape = export / "escape"  # hostile operations may remove or replace it: plant it afresh
    if escape.is_symlink() or escape.is_file():
        escape.unlink()
    elif escape.exists():
        shutil.rmtree(escape)
    escape.symlink_to(outside)
    secret = load_secret(cluster4.state.name)
    record = cluster4.state.nodes["n4"]

    async def probe() -> list[object]:
        results: list[object] = []
        async with open_nursery() as nursery:
            client = await rpc.connect(nursery, record.host, record.port, secret=secret, name="t", peer="n4")
            for op, args in [("lookup", [path]), ("listdir", [path]), ("open", [path, os.O_RDONLY]),
                             ("readlink", [path]), ("truncate", [path, 0]), ("unlink", [path]),
                             ("chmod", [path, 0o777]), ("getxattr", [path, "user.x"]), ("mkdir", [path, 0o755])]:
                try:
                    result = await client.call(op, *args)
                    if op == "open":
                        results.append(await client.call("read", result[0], 0, 1000))
                    else:
                        results.append(result)
                except OSError:
                    pass
            await client.aclose()
            nursery.cancel_scope.cancel()
        return results

    results = trio.run(probe)
    assert OUTSIDE_SECRET.encode() not in msgpack.packb(results, default=str)
    assert (outside / "passwd").read_text() == OUTSIDE_SECRET
    assert os.stat(outside / "passwd").st_mode & 0o777 != 0o777
    assert sorted(os.listdir(outside)) == ["passwd"]
