"""A live daemon under hostile input: garbage frames, bad requests, escaping paths."""

from __future__ import annotations

import errno
import os
import random
import shutil
import socket
import struct
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

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

from .conftest import LocalCluster, fuse_problem, local_cluster, require


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


# ---------------------------------------------------------------- before the handshake: the pre-auth budget

#: Bounds for what hostile pre-authentication input may cost a daemon. The target is 100 ms and a few
#: MiB; the bounds leave room for a loaded 2-core machine (other tests, other engineers: the stall bound
#: grows to 10 times the worst ping before the attack) and still fail by far without the budget
#: (measured then, same test: the loop stopped for 27-30 s, RSS grew by 0.4-1.2 GiB).
MAX_STALL = 0.5
MAX_RSS_GROWTH = 16 << 20
SIXTEEN_MIB = 16 << 20


def rss(pid: int, field: str = "VmRSS") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for pid {pid}")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.fixture
def victim(tmp_path: Path) -> Iterator[LocalCluster]:
    """A small cluster of its own: what an attack costs is measured on n2 alone, not on shared daemons."""
    require("FUSE", fuse_problem())
    with local_cluster(tmp_path / "c", f"hostile-{os.getpid()}-{uuid.uuid4().hex[:6]}", {"s": ["n1", "n2"]}, [],
                       tuning="") as cluster:
        yield cluster


class Probe:
    """Pings a daemon every 20 ms on an authenticated connection, and samples its RSS every 20 ms."""

    def __init__(self, cluster: LocalCluster, node: str) -> None:
        self.record = cluster.state.nodes[node]
        self.secret = load_secret(cluster.state.name)
        self.node = node
        self.latencies: list[float] = []
        self.rss: list[int] = []
        self._asked_at: float | None = None  # a ping on its way since then

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with open_nursery() as nursery:
            client = await rpc.connect(nursery, self.record.host, self.record.port, secret=self.secret,
                                       name="probe", peer=self.node)
            nursery.start_soon(self._sample)
            task_status.started()
            try:
                while True:
                    self._asked_at = trio.current_time()
                    await client.call("ping", timeout=60)
                    self.latencies.append(trio.current_time() - self._asked_at)
                    self._asked_at = None
                    await trio.sleep(0.02)
            finally:
                with trio.CancelScope(shield=True):
                    await client.aclose()

    async def _sample(self) -> None:
        while True:
            self.rss.append(rss(self.record.pid))
            await trio.sleep(0.02)

    def window(self) -> tuple[int, int]:
        return len(self.latencies), len(self.rss)

    def since(self, mark: tuple[int, int]) -> tuple[float, int]:
        """The worst ping latency (a ping still unanswered counts) and the highest RSS since `mark`."""
        waiting = trio.current_time() - self._asked_at if self._asked_at is not None else 0.0
        return max([*self.latencies[mark[0]:], waiting]), max(self.rss[mark[1]:], default=0)


async def attacker(host: str, port: int, source: str = "127.0.0.2") -> trio.SocketStream:
    """A TCP connection from another loopback address (the daemon's peers connect from 127.0.0.1)."""
    sock = trio.socket.socket()
    await sock.bind((source, 0))
    await sock.connect((host, port))
    return trio.SocketStream(sock)


async def send_ignoring_a_close(stream: trio.SocketStream, data: bytes) -> None:
    with trio.move_on_after(10):
        try:
            await stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the daemon closed the connection: what it should do


async def closed_by_the_daemon(stream: trio.SocketStream, within: float = 30) -> None:
    with trio.move_on_after(within):
        try:
            while await stream.receive_some(1 << 16):
                pass
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
    await stream.aclose()


def test_hostile_input_before_the_handshake_costs_a_daemon_neither_time_nor_memory(victim: LocalCluster) -> None:
    """One 16 MiB frame of empty msgpack arrays, then 20 incomplete 16 MiB frames held open, then
    hundreds of idle connections: the daemon's loop keeps answering within MAX_STALL, its memory
    grows by at most MAX_RSS_GROWTH, and its peers keep working."""
    record = victim.state.nodes["n2"]
    probe = Probe(victim, "n2")
    results: dict[str, tuple[float, int]] = {}

    async def attack() -> None:
        async with open_nursery() as nursery:
            await nursery.start(probe.run)
            await trio.sleep(1.0)
            baseline = probe.since((0, 0))
            base_rss = min(probe.rss)
            results["baseline"] = (baseline[0], base_rss)

            # one frame of 16 Mi empty arrays, sent before any handshake
            mark = probe.window()
            count = SIXTEEN_MIB - wire.HEADER.size - 5
            body = b"\xdd" + struct.pack(">I", count) + b"\x90" * count
            stream = await attacker(record.host, record.port)
            await send_ignoring_a_close(stream, wire.HEADER.pack(wire.VERSION, len(body)) + body)
            await closed_by_the_daemon(stream)  # whatever the daemon does with the frame is done by then
            await trio.sleep(0.5)
            results["arrays"] = probe.since(mark)

            # twenty 16 MiB frames, all but their last byte, held open
            mark = probe.window()
            held = []
            incomplete = wire.HEADER.pack(wire.VERSION, SIXTEEN_MIB) + b"\0" * (SIXTEEN_MIB - 1)
            for _ in range(20):
                stream = await attacker(record.host, record.port)
                held.append(stream)
                nursery.start_soon(send_ignoring_a_close, stream, incomplete)
            await trio.sleep(2.0)
            results["incomplete"] = probe.since(mark)
            for stream in held:
                await stream.aclose()

            # many idle connections from one address: a few are kept until the handshake deadline
            mark = probe.window()
            idle = [await attacker(record.host, record.port) for _ in range(300)]
            await trio.sleep(0.5)
            results["fds"] = (0.0, open_fds(record.pid))
            # a peer from another address still gets in
            results["peer"] = (0.0, int(await trio.to_thread.run_sync(still_serves, victim, "n2")))
            await trio.sleep(0.5)
            results["connections"] = probe.since(mark)
            for stream in idle:
                await stream.aclose()
            nursery.cancel_scope.cancel()

    trio.run(attack)
    base_latency, base_rss = results["baseline"]
    report = {k: (round(v[0], 3), round((v[1] - base_rss) / 2**20, 1)) for k, v in results.items()
              if k in ("arrays", "incomplete", "connections")}
    print(f"\nbaseline: worst ping {base_latency:.3f} s, RSS {base_rss / 2**20:.1f} MiB; "
          f"per attack (worst ping s, RSS growth MiB): {report}; fds with 300 idle connections: {results['fds'][1]}")
    for name in ("arrays", "incomplete", "connections"):
        latency, peak = results[name]
        assert latency < max(MAX_STALL, 10 * base_latency), f"{name}: the daemon did not answer a ping for " \
                                                             f"{latency:.2f} s"
        assert peak - base_rss < MAX_RSS_GROWTH, f"{name}: RSS grew by {(peak - base_rss) / 2**20:.0f} MiB"
    assert results["fds"][1] < 100 + rpc.HANDSHAKES_PER_ADDRESS, "the daemon kept the idle connections open"
    assert results["peer"][1] == 1
    assert still_serves(victim, "n2")
    assert (victim.mount("n1") / "after.txt").write_text("still") and \
        (victim.mount("n2") / "after.txt").read_text() == "still"

