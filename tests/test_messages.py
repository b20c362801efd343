"""The typed RPC messages (gmountpy.messages) against the real service and daemon.

Every operation a node answers must have a request type whose fields are the
operation's arguments, and every reply a real daemon gives must decode with
that type and encode back to the same wire value: an operation whose
arguments or reply change breaks these tests.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import inspect
import os
import re
import stat
from pathlib import Path
from typing import Any

import pytest
import trio

from gmountpy import messages as msg
from gmountpy import rpc
from gmountpy import state as state_store
from gmountpy._trio import open_nursery
from gmountpy.client import client_ssl
from gmountpy.node.control import NodeControl
from gmountpy.node.export import Attr
from gmountpy.node.service import HANDLE_OPS, NodeService
from gmountpy.state import ClusterState
from gmountpy.tls import ClusterCA

from .conftest import fuse_problem, local_cluster, require


def _daemon_ops() -> set[str]:
    """The node-wide operations the daemon adds to the service (NodeControl.operations)."""
    source = inspect.getsource(NodeControl.operations)
    ops = set(re.findall(r'"(\w+)": self\.', source))
    assert ops, "NodeControl.operations no longer lists its operations as this test expects: update the test"
    return ops


def _service_ops() -> dict[str, list[str]]:
    """op name -> its arguments, from NodeService's op_* methods (the handle table is not an argument)."""
    ops = {}
    for name, method in inspect.getmembers(NodeService, inspect.isfunction):
        if name.startswith("op_"):
            params = list(inspect.signature(method).parameters)[1:]  # self
            if name[3:] in HANDLE_OPS:
                params = params[1:]
            ops[name[3:]] = params
    return ops


def test_every_service_op_has_a_request_with_its_arguments_in_order() -> None:
    for op, params in _service_ops().items():
        assert op in msg.REQUESTS, f"service op {op!r} has no request type in gmountpy/messages.py"
        fields = [f.name for f in dataclasses.fields(msg.REQUESTS[op])]
        assert fields == params, f"{op}: request fields {fields}, the service takes {params}"


def test_the_messages_list_exactly_the_ops_nodes_answer() -> None:
    daemon_ops = _daemon_ops()
    assert {"where", "ls", "stage", "stats", "shutdown", "created", "set_peers", "renew_tls"} <= daemon_ops
    assert set(msg.REQUESTS) == set(_service_ops()) | daemon_ops


def test_requests_send_their_fields_in_order() -> None:
    assert msg.Read(7, 4096, 100).args() == [7, 4096, 100]
    assert msg.Utimens("/a", None, 5).args() == ["/a", None, 5]
    assert msg.Ping().args() == []
    assert msg.Read.op == "read" and msg.PutClose.op == "put_close"


ATTR = list(Attr.from_stat(os.stat(__file__)))


@pytest.mark.parametrize(("request_", "reply"), [
    (msg.Open("/a", os.O_RDONLY), [3]),                      # a field missing
    (msg.Open("/a", os.O_RDONLY), ["3", ATTR]),              # a handle that is not a number
    (msg.Lookup("/a"), ATTR[:-1]),                           # attributes of another version
    (msg.Locate("/a"), [ATTR, ["n1", 3]]),                   # a replica source without its mtime
    (msg.Listdir("/"), [["a"]]),
    (msg.Read(1, 0, 10), "text"),
    (msg.Write(1, 0, b"x"), True),                           # a bool is not a count
    (msg.Close(1), 0),
    (msg.Ls("/"), {"entries": []}),                          # "unreachable" missing
    (msg.Where("/a"), [{"node": "n1"}]),
])
def test_a_reply_of_the_wrong_shape_is_a_protocol_error_naming_the_op(request_: msg.Request[Any],
                                                                      reply: Any) -> None:
    with pytest.raises(OSError) as info:
        request_.decode(reply)
    assert info.value.errno == errno.EPROTO
    assert "malformed" in str(info.value) and "same gmountpy" in str(info.value)


def _wire(decoded: Any) -> Any:
    """What a decoded reply looks like on the wire again."""
    if hasattr(decoded, "to_wire"):
        return decoded.to_wire()
    if isinstance(decoded, Attr | tuple):
        return list(decoded)
    if isinstance(decoded, list):
        return [_wire(item) for item in decoded]
    return decoded


class _Conversation:
    """One authenticated connection to one node; every reply is decoded and checked against its wire value."""

    def __init__(self, client: rpc.RpcClient, asked: set[str]) -> None:
        self.client = client
        self.asked = asked

    async def ask(self, request: msg.Request[Any]) -> Any:
        raw = await self.client.call(request.op, *request.args(), timeout=30.0)
        decoded = request.decode(raw)
        assert _wire(decoded) == raw, f"{request.op}: {decoded!r} does not encode back to {raw!r}"
        self.asked.add(request.op)
        return decoded


async def _every_op(state: ClusterState, exports: dict[str, Path], ca: ClusterCA) -> set[str]:
    asked: set[str] = set()
    secret = state_store.load_secret(state.name)
    async with open_nursery() as nursery:
        async def connect(node: str) -> _Conversation:
            record = state.nodes[node]
            client = await rpc.connect(nursery, record.host, record.port, secret=secret, name="gmount-test",
                                       peer=node, timeout=5.0, ssl_context=client_ssl(state))
            return _Conversation(client, asked)

        n1, n2 = await connect("n1"), await connect("n2")

        # who the node is
        assert (await n1.ask(msg.Ping()))["node"] == "n1"
        assert set(await n1.ask(msg.Counters())) >= {"read_local", "served_read"}
        assert await n1.ask(msg.Rescan()) == 0  # flooding: nothing to tell any home
        assert (await n1.ask(msg.Stats()))["node"] == "n1"

        # metadata of n1's own export
        attr = await n1.ask(msg.Lookup("/data/a.txt"))
        assert isinstance(attr, Attr) and attr.size == 11
        assert await n1.ask(msg.Lookup("/data/nowhere")) is None
        located = await n1.ask(msg.Locate("/data/a.txt"))
        assert located.attr == attr and located.replica is None
        summed = await n1.ask(msg.Checksum("/data/a.txt"))
        assert (summed.size, summed.sha256) == (11, hashlib.sha256(b"hello world").hexdigest())
        assert {e.name for e in await n1.ask(msg.Listdir("/data"))} == {"a.txt", "sub"}
        assert await n1.ask(msg.Listdir("/data/nowhere")) is None
        opened_dir = await n1.ask(msg.Opendir("/data"))
        assert opened_dir.count == 2
        assert len(await n1.ask(msg.Readdir(opened_dir.handle, 0, 10))) == 2
        assert await n1.ask(msg.Closedir(opened_dir.handle)) is None
        assert len(await n1.ask(msg.Statfs())) >= 8

        # changes to n1's export
        assert stat.S_ISLNK((await n1.ask(msg.Symlink("a.txt", "/data/link"))).mode)
        assert await n1.ask(msg.Readlink("/data/link")) == "a.txt"
        assert (await n1.ask(msg.Mkdir("/data/d", 0o755))).is_dir
        assert await n1.ask(msg.Rmdir("/data/d")) is None
        assert stat.S_IMODE((await n1.ask(msg.Chmod("/data/a.txt", 0o640))).mode) == 0o640

        # a put from outside the mount, and one given up
        put = await n1.ask(msg.PutOpen("/data/p.txt", 0o644))
        assert await n1.ask(msg.Write(put, 0, b"put data")) == 8
        landed = await n1.ask(msg.PutClose(put, 8, hashlib.sha256(b"put data").hexdigest()))
        assert landed.size == 8 and (exports["n1"] / "data" / "p.txt").read_bytes() == b"put data"
        abandoned = await n1.ask(msg.PutOpen("/data/q.txt", 0o644))
        assert await n1.ask(msg.PutAbort(abandoned)) is None

        # file data through a handle of this connection
        opened = await n1.ask(msg.Open("/data/p.txt", os.O_RDWR))
        assert opened.attr.size == 8
        assert await n1.ask(msg.Read(opened.handle, 0, 100)) == b"put data"
        assert await n1.ask(msg.Write(opened.handle, 8, b"!")) == 1
        assert await n1.ask(msg.Fsync(opened.handle, False)) is None
        assert (await n1.ask(msg.Fstat(opened.handle))).size == 9
        assert (await n1.ask(msg.Ftruncate(opened.handle, 3))).size == 3
        assert await n1.ask(msg.Close(opened.handle)) is None

        assert (await n1.ask(msg.Truncate("/data/p.txt", 1))).size == 1
        assert (await n1.ask(msg.Utimens("/data/p.txt", None, 10**18))).mtime_ns == 10**18
        assert stat.S_ISFIFO((await n1.ask(msg.Mknod("/data/fifo", stat.S_IFIFO | 0o644, 0))).mode)
        assert (await n1.ask(msg.Link("/data/p.txt", "/data/p2.txt"))).nlink == 2
        assert (await n1.ask(msg.Chown("/data/p.txt", -1, -1))).nlink == 2
        assert await n1.ask(msg.Setxattr("/data/p.txt", "user.test", b"value")) is None
        assert await n1.ask(msg.Getxattr("/data/p.txt", "user.test")) == b"value"
        assert "user.test" in await n1.ask(msg.Listxattr("/data/p.txt"))
        assert await n1.ask(msg.Removexattr("/data/p.txt", "user.test")) is None
        assert await n1.ask(msg.Rename("/data/p2.txt", "/data/p3.txt")) is None
        assert await n1.ask(msg.Unlink("/data/p3.txt")) is None

        # the namespace as n1's mount sees it
        rows = await n1.ask(msg.Where("/data/b.txt"))
        assert [row["node"] for row in rows] == ["n2"]
        listing = await n1.ask(msg.Ls("/data"))
        by_name = {e.name: e for e in listing.entries}
        assert by_name["b.txt"].node == "n2" and by_name["a.txt"].holders == ("n1",)
        assert listing.unreachable == ()
        assert await n1.ask(msg.Created("/data/elsewhere.txt", False)) is None
        table = {name: [record.host, record.port] for name, record in state.nodes.items()}
        assert await n1.ask(msg.SetPeers(table)) is None

        # a staged replica on n2
        staged = await n2.ask(msg.Stage("/data/a.txt"))
        assert (staged["status"], staged["source"], staged["size"]) == ("copied", "n1", 11)
        replica = (await n2.ask(msg.Locate("/data/a.txt"))).replica
        assert replica is not None and (replica.node, replica.size) == ("n1", 11)
        assert await n2.ask(msg.DropReplica("/data/a.txt", 12, replica.mtime_ns)) is False  # not that source

        fresh = ca.issue("n2")
        assert "20" in await n2.ask(msg.RenewTls(fresh.cert, fresh.key))  # its new expiry date
        assert await n2.ask(msg.Shutdown()) is None
        await n1.client.aclose()
        await n2.client.aclose()
    return asked


def test_every_op_of_a_real_daemon_decodes_and_encodes_back(tmp_path: Path) -> None:
    require("FUSE", fuse_problem())
    with local_cluster(tmp_path, f"msg-{os.getpid()}", {"s1": ["n1"], "s2": ["n2"]}, [("s1", "s2", 5.0)],
                       top="tls = true") as cluster:
        (cluster.export("n1") / "data" / "sub").mkdir(parents=True)
        (cluster.export("n1") / "data" / "a.txt").write_bytes(b"hello world")
        (cluster.export("n2") / "data").mkdir()
        (cluster.export("n2") / "data" / "b.txt").write_bytes(b"on n2")
        ca_pem, _ = state_store.load_tls(cluster.spec.name)
        ca_key = state_store.load_tls_ca_key(cluster.spec.name)
        assert ca_key is not None
        exports = {node: cluster.export(node) for node in cluster.nodes}
        asked = trio.run(_every_op, cluster.state, exports, ClusterCA(ca_pem, ca_key))
    assert asked == set(msg.REQUESTS), f"not exercised here: {sorted(set(msg.REQUESTS) - asked)}"
