"""The one RPC client (gmountpy.protocol.client): connections opened once and shared, errors that say what to do."""

from __future__ import annotations

import errno
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from gmountpy._trio import open_nursery
from gmountpy.cluster.config import load_spec
from gmountpy.cluster.state import ClusterState, NodeRecord
from gmountpy.errors import GmountError, NodeUnavailable, PeerUnavailable
from gmountpy.protocol import rpc
from gmountpy.protocol.client import ClusterClient, open_client
from gmountpy.protocol.messages import Ping

from ._trio import trio_test

SECRET = b"s" * 32


class Daemon:
    """A stand-in daemon: answers `ping` like a node and counts the connections it was given."""

    def __init__(self) -> None:
        self.sessions: list[rpc.Session] = []

    async def dispatch(self, session: rpc.Session, op: str, args: list[Any]) -> Any:
        if all(session is not known for known in self.sessions):  # Sessions compare by value
            self.sessions.append(session)
        if op == "ping":
            return {"node": "n1", "site": "s", "cluster": "solo", "version": "test", "mountpoint": "/m",
                    "export": "/e", "pid": 1, "counters": {}}
        if op == "sleep":
            await trio.sleep(args[0])
            return None
        raise OSError(errno.ENOSYS, f"unknown operation {op!r}")


@asynccontextmanager
async def serving(daemon: Daemon) -> AsyncIterator[tuple[trio.Nursery, int, trio.CancelScope]]:
    async with open_nursery() as nursery:
        scope = trio.CancelScope()

        async def run(task_status: trio.TaskStatus[list[trio.SocketListener]] = trio.TASK_STATUS_IGNORED) -> None:
            with scope:
                await rpc.serve("127.0.0.1", 0, daemon.dispatch, secret=SECRET, name="n1", task_status=task_status)

        listeners = await nursery.start(run)
        yield nursery, listeners[0].socket.getsockname()[1], scope
        nursery.cancel_scope.cancel()


async def free_port() -> int:
    sock = trio.socket.socket()
    await sock.bind(("127.0.0.1", 0))
    port: int = sock.getsockname()[1]
    sock.close()
    return port


def a_state(tmp_path: Path, port: int) -> ClusterState:
    """A recorded cluster of one node listening on `port` (as `gmount up` would have written it)."""
    (tmp_path / "export").mkdir(exist_ok=True)
    path = tmp_path / "c.toml"
    path.write_text(f'name = "solo"\nlauncher = "local"\n[defaults]\nexport = "{tmp_path}/export"\n'
                    f'mountpoint = "{tmp_path}/mnt"\n[sites.s]\nnodes = ["n1"]\n')
    spec = load_spec(str(path))
    record = NodeRecord("n1", "s", 0, "127.0.0.1", port, f"{tmp_path}/mnt", f"{tmp_path}/export", "")
    return ClusterState(spec, {"n1": record}, 0.0)


@trio_test
async def test_requests_to_one_node_share_one_connection() -> None:
    daemon = Daemon()
    async with serving(daemon) as (nursery, port, _):
        client = ClusterClient(nursery, SECRET, name="t", addresses={"n1": ("127.0.0.1", port)})
        async with open_nursery() as calls:
            for _ in range(10):  # all before the connection is up: they wait for the one connect
                calls.start_soon(client.ask, "n1", Ping())
        first = await client.connection("n1")
        assert (await client.ask("n1", Ping()))["node"] == "n1"
        assert await client.connection("n1") is first
        assert len(daemon.sessions) == 1
        await client.aclose()


@trio_test
async def test_a_broken_connection_is_opened_again_on_the_next_request() -> None:
    daemon = Daemon()
    async with serving(daemon) as (nursery, port, _):
        client = ClusterClient(nursery, SECRET, name="t", addresses={"n1": ("127.0.0.1", port)})
        await client.ask("n1", Ping())
        first = await client.connection("n1")
        await first.aclose()
        assert (await client.ask("n1", Ping()))["node"] == "n1"
        assert await client.connection("n1") is not first
        assert len(daemon.sessions) == 2
        await client.aclose()


@trio_test
async def test_a_moved_node_is_reached_at_its_new_address() -> None:
    old, new = Daemon(), Daemon()
    async with serving(old) as (nursery, old_port, _), serving(new) as (_, new_port, _):
        client = ClusterClient(nursery, SECRET, name="t", addresses={"n1": ("127.0.0.1", old_port)})
        await client.ask("n1", Ping())
        assert client.set_address("n1", ("127.0.0.1", new_port))
        assert not client.set_address("n1", ("127.0.0.1", new_port))
        await client.ask("n1", Ping())
        assert (len(old.sessions), len(new.sessions)) == (1, 1)
        await client.aclose()


@trio_test
async def test_a_node_whose_daemon_is_down_is_named_with_its_address_and_what_to_do(tmp_path: Path) -> None:
    port = await free_port()  # nothing listens there
    async with open_client(a_state(tmp_path, port), secret=SECRET) as client:
        with pytest.raises(NodeUnavailable) as info:
            await client.ask("n1", Ping())
    message = str(info.value)
    assert "node 'n1' unavailable" in message
    assert f"127.0.0.1:{port}" in message
    assert f"gmount status {tmp_path / 'c.toml'}" in message
    assert isinstance(info.value, GmountError) and isinstance(info.value, OSError)


@trio_test
async def test_a_daemon_that_does_not_answer_in_time_is_named_with_its_address(tmp_path: Path) -> None:
    async with serving(Daemon()) as (_, port, _), open_client(a_state(tmp_path, port), secret=SECRET) as client:
        with pytest.raises(NodeUnavailable) as info:
            await client.call("n1", "sleep", 5, timeout=0.2)
    message = str(info.value)
    assert "no reply to sleep within 0.2s" in message and f"its daemon at 127.0.0.1:{port}" in message
    assert "gmount status" in message
    assert info.value.errno == errno.ETIMEDOUT


@trio_test
async def test_a_node_not_in_the_cluster_is_refused_naming_the_cluster(tmp_path: Path) -> None:
    async with open_client(a_state(tmp_path, 1), secret=SECRET) as client:
        with pytest.raises(PeerUnavailable, match="not a node of cluster 'solo'") as info:
            await client.ask("n9", Ping())
    assert info.value.errno == errno.ENOENT


@trio_test
async def test_without_advice_the_rpc_error_comes_back_as_it_is() -> None:
    async with open_nursery() as nursery:
        port = await free_port()
        client = ClusterClient(nursery, SECRET, name="t", addresses={"n1": ("127.0.0.1", port)})
        with pytest.raises(PeerUnavailable) as info:
            await client.ask("n1", Ping())
        assert not isinstance(info.value, NodeUnavailable)
        assert f"cannot connect to 127.0.0.1:{port}" in str(info.value)
