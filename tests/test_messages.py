"""The typed RPC messages (gmountpy.protocol.messages) against the real service and daemon.

Every operation a node answers -- its service's, the daemon's, and the
directory index's -- must have a request type whose fields are the
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
import subprocess
from pathlib import Path
from typing import Any

import pytest
import trio

from gmountpy._trio import open_nursery
from gmountpy.cluster import registry
from gmountpy.cluster import state as state_store
from gmountpy.cluster.state import ClusterState
from gmountpy.node import index as index_module
from gmountpy.node.control import NodeControl
from gmountpy.node.index import DirectoryIndex, ExportWatcher, Homes, IndexLocator, name_hash
from gmountpy.node.service import HANDLE_OPS, NodeService
from gmountpy.protocol import messages as msg
from gmountpy.protocol import rpc
from gmountpy.protocol.attr import Attr
from gmountpy.protocol.client import client_ssl
from gmountpy.protocol.tls import ClusterCA

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


class _NeverAsked:
    """Peers of index objects made only for their tables of operations."""

    me = "n1"

    async def ask(self, node: str, request: msg.Request[msg.R], *, timeout: float | None = None) -> msg.R:
        raise AssertionError(f"{request.op} sent while reading the index's tables of operations")

    async def call(self, node: str, op: str, *args: Any, timeout: float | None = None) -> Any:
        raise AssertionError(f"{op} sent while reading the index's tables of operations")

    def is_down(self, node: str) -> bool:
        return False


_REQUIRED = "(required)"


def _index_ops() -> dict[str, list[tuple[str, Any]]]:
    """op name -> its arguments as (name, default), from the tables the directory index adds to
    the service (DirectoryIndex, ExportWatcher and IndexLocator `operations()`, as daemon.py
    adds them)."""
    peers, homes = _NeverAsked(), Homes(("n1",))
    tables = [DirectoryIndex(peers, ["n1"], lease=1.0, homes=homes).operations(),
              ExportWatcher(peers, homes).operations(), IndexLocator(peers, [("n1",)], homes).operations()]
    return {op: [(p.name, _REQUIRED if p.default is p.empty else p.default)
                 for p in inspect.signature(handler).parameters.values()]
            for table in tables for op, handler in table.items()}


def _wire_fields(kind: type[msg.Request[Any]]) -> list[tuple[str, Any]]:
    """A request's fields as (name, default) in wire order. The request a forwarding op carries
    (`request` of index_backup and index_part) goes on the wire as its op and its arguments."""
    fields: list[tuple[str, Any]] = []
    for f in dataclasses.fields(kind):
        if f.name == "request":
            fields += [("op", _REQUIRED), ("args", _REQUIRED)]
        else:
            fields.append((f.name, _REQUIRED if f.default is dataclasses.MISSING else f.default))
    return fields


def test_every_service_op_has_a_request_with_its_arguments_in_order() -> None:
    for op, params in _service_ops().items():
        assert op in msg.REQUESTS, f"service op {op!r} has no request type in gmountpy/protocol/messages.py"
        fields = [f.name for f in dataclasses.fields(msg.REQUESTS[op])]
        assert fields == params, f"{op}: request fields {fields}, the service takes {params}"


def test_every_index_op_has_a_request_with_its_arguments_and_defaults_in_order() -> None:
    ops = _index_ops()
    assert {"index_lookup", "index_part", "index_backup", "index_listdir", "index_unhome", "rescan"} <= set(ops)
    for op, params in ops.items():
        assert op in msg.REQUESTS, f"index op {op!r} has no request type in gmountpy/protocol/messages.py"
        fields = _wire_fields(msg.REQUESTS[op])
        assert fields == params, f"{op}: request fields {fields}, the index takes {params}"


def test_the_messages_list_exactly_the_ops_nodes_answer() -> None:
    daemon_ops = _daemon_ops()
    assert {"where", "ls", "stage", "stats", "shutdown", "created", "set_peers", "renew_tls"} <= daemon_ops
    assert set(msg.REQUESTS) == set(_service_ops()) | daemon_ops | set(_index_ops())


def test_the_index_name_requests_are_the_ops_a_split_directory_serves_by_name() -> None:
    """An asker sends an IndexNameRequest to the partition its name hashes to; the server refuses
    names of other partitions for exactly these ops (index._NAME_OPS)."""
    by_name = {op for op, kind in msg.REQUESTS.items() if issubclass(kind, msg.IndexNameRequest)}
    assert by_name == set(index_module._NAME_OPS)
    assert set(index_module._BACKED_OPS) | set(index_module._PART_OPS) <= set(msg.REQUESTS)


def test_requests_send_their_fields_in_order() -> None:
    assert msg.Read(7, 4096, 100).args() == [7, 4096, 100]
    assert msg.Utimens("/a", None, 5).args() == ["/a", None, 5]
    assert msg.Ping().args() == []
    assert msg.Read.op == "read" and msg.PutClose.op == "put_close"
    assert msg.IndexDrop("/d", "a", ["n1"]).args() == ["/d", "a", ["n1"], None, None, False]  # defaults are sent too


ATTR = list(Attr.from_stat(os.stat(__file__)))
LOOKED_UP = {"holders": [["n1", ATTR, None], ["n2", ATTR, "n1"]], "complete": True, "pending": False, "lease": 0.0,
             "home": None, "home_lease": 0.0, "parts": None, "size": 2, "listing": None}


def test_forwarding_requests_carry_the_request_and_decode_its_reply() -> None:
    lookup = msg.IndexLookup("/d", "a", "n3")
    assert msg.IndexBackup("n1", lookup).args() == ["n1", "index_lookup", ["/d", "a", "n3", False]]
    assert msg.Recorded("n2", "n1", msg.Unlink("/d/a")).args() == ["n2", "n1", "unlink", ["/d/a"]]
    assert msg.IndexPart(3, "n1", [0, 1, 3], lookup).args() == [3, "n1", [0, 1, 3], "index_lookup",
                                                                 ["/d", "a", "n3", False]]
    stood_in = msg.IndexBackup("n1", lookup).decode(LOOKED_UP)
    assert stood_in == lookup.decode(LOOKED_UP) and stood_in.holders[1] == ("n2", Attr(*ATTR), "n1")
    served = msg.IndexPart(3, "n1", [0, 1, 3], lookup).decode(["ok", LOOKED_UP, [0, 1, 3, 7]])
    assert served == msg.PartOk(lookup.decode(LOOKED_UP), (0, 1, 3, 7))
    assert served.to_wire() == ["ok", LOOKED_UP, [0, 1, 3, 7]]
    redirected = msg.IndexPart(3, "n1", [0, 1, 3], lookup).decode(["redirect", [0, 1, 3, 7]])
    assert redirected == msg.PartRedirect((0, 1, 3, 7)) and redirected.to_wire() == ["redirect", [0, 1, 3, 7]]


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


def _but(**changed: Any) -> dict[str, Any]:
    return {**LOOKED_UP, **changed}


LISTED = {"entries": [["a", [["n1", ATTR, None]], None]], "complete": True, "exists": True, "lease": 1.0,
          "home_lease": 60.0, "parts": None}


@pytest.mark.parametrize(("request_", "reply", "named"), [
    (msg.IndexLookup("/d", "a"), {"holders": [], "complete": True, "lease": 0.0}, "index_lookup"),  # no "pending"
    (msg.IndexLookup("/d", "a"), _but(holders=[["n1", ATTR]]), "index_lookup"),  # a holder without its replica_of
    (msg.IndexLookup("/d", "a"), _but(lease="4.0"), "index_lookup"),
    (msg.IndexLookup("/d", "a"), _but(complete=1), "index_lookup"),  # not a bool
    (msg.IndexLookup("/d", "a"), _but(listing={**LISTED, "exists": None}), "index_lookup"),
    (msg.IndexClaim("/d", "a", "n1"), [[["n1", ATTR[:-1], None]], False, False], "index_claim"),
    (msg.IndexClaim("/d", "a", "n1"), [[], False], "index_claim"),
    (msg.IndexClaim("/d", "a", "n1"), None, "index_claim"),  # the reply before IndexClaimReply
    (msg.IndexClaim("/d", "a", "n1"), [[], "yes", False], "index_claim"),
    (msg.IndexList("/d"), {**LISTED, "entries": [["a", [], None, 0]]}, "index_list"),
    (msg.IndexList("/d"), {**LISTED, "parts": [0, "1"]}, "index_list"),
    (msg.IndexSet("/d", "a", "n1", None), 0, "index_set"),
    (msg.IndexDrop("/d", "a", None, "n1", "n2"), None, "index_drop"),  # the reply before the homes not reached
    (msg.IndexDrop("/d", "a", None, "n1", "n2"), [2], "index_drop"),
    (msg.IndexRecords("/d"), {"a": 3}, "index_records"),
    (msg.IndexListdir("/d"), {"a": ATTR}, "index_listdir"),
    (msg.IndexPart(1, "n1", [0, 1], msg.IndexList("/d")), ["ok", LISTED], "index_part"),  # the bitmap missing
    (msg.IndexPart(1, "n1", [0, 1], msg.IndexList("/d")), ["moved", [0, 1]], "index_part"),
    (msg.IndexPart(1, "n1", [0, 1], msg.IndexLookup("/d", "a")), ["ok", {"holders": []}, [0, 1]], "index_lookup"),
    (msg.IndexBackup("n2", msg.IndexClaim("/d", "a", "n1")), "taken", "index_claim"),
    (msg.Recorded("n2", "n1", msg.Chmod("/d/a", 0o600)), None, "chmod"),
    (msg.Rescan(), None, "rescan"),
])
def test_a_malformed_index_reply_is_a_protocol_error_naming_the_op(request_: msg.Request[Any], reply: Any,
                                                                  named: str) -> None:
    """A forwarding op's reply that is the carried request's names that request's op."""
    with pytest.raises(OSError) as info:
        request_.decode(reply)
    assert info.value.errno == errno.EPROTO
    assert f"malformed {named} reply" in str(info.value) and "same gmountpy" in str(info.value)


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


async def _every_index_op(n1: _Conversation, n2: _Conversation) -> None:
    """The directory index's operations; n1 answers as the home of whatever it is asked about."""
    assert await n1.ask(msg.IndexForget(["/data"])) is None  # built again now: n2's replica is in it
    assert {e.name for e in await n1.ask(msg.IndexListdir("/data", "n1"))} >= {"a.txt", "sub"}
    on_n2 = await n2.ask(msg.IndexListdir("/data", "n1"))
    assert {e.name: e.replica_of for e in on_n2} == {"a.txt": "n1", "b.txt": None}
    found = await n1.ask(msg.IndexLookup("/data", "a.txt", "n2", True))
    assert found.complete and not found.pending and found.listing is not None
    assert sorted((h.node, h.replica_of) for h in found.holders) == [("n1", None), ("n2", "n1")]
    missing = await n1.ask(msg.IndexLookup("/data", "nowhere", "n2"))
    assert missing.holders == () and missing.lease > 0  # a leased "not found"
    sub = await n1.ask(msg.IndexLookup("/data", "sub", "n2"))
    assert sub.home is not None and sub.home_lease > 0
    listing = await n1.ask(msg.IndexList("/data", "n2"))
    assert {row.name for row in listing.entries} >= {"a.txt", "b.txt", "sub"} and listing.exists
    assert listing.lease > 0 and listing.parts is None

    # changes, told the home
    assert await n1.ask(msg.IndexClaim("/data", "claimed.txt", "n2")) == msg.IndexClaimReply((), False, False)
    taken = await n1.ask(msg.IndexClaim("/data", "a.txt", "n2"))
    assert [h.node for h in taken.holders] == ["n1"] and not taken.seeded
    assert (await n1.ask(msg.IndexClaim("/data", "made", "n1", True))).seeded  # n1 homes it and seeds it
    assert await n1.ask(msg.IndexSet("/data", "claimed.txt", "n2", None, None, False, "n2")) is None
    assert await n1.ask(msg.IndexDrop("/data", "claimed.txt", ["n2"], "n2")) == []
    assert await n1.ask(msg.IndexReplace("/data", "p.txt", ["n1"], False, "n2")) is None
    assert await n1.ask(msg.IndexRename("/data", "q.txt", "p.txt", ["n1"], False, "n2")) is None
    assert await n1.ask(msg.IndexSync("/data", "n2", [entry.to_wire() for entry in on_n2])) is None
    assert await n1.ask(msg.IndexRecords("/elsewhere", {"made": "n2"})) == {}  # a copy: nothing comes back
    assert await n1.ask(msg.IndexRecords("/elsewhere")) == {"made": "n2"}  # all of them, asked for
    assert await n1.ask(msg.IndexRecords("/elsewhere", {"made": None})) == {}
    assert await n1.ask(msg.IndexDrop("/elsewhere", "made", None, "n2", "n1")) == []  # its index forgotten here
    assert await n1.ask(msg.IndexRecords("/elsewhere", {"new": "n1"}, "n2")) == {}  # and seeded here
    assert await n1.ask(msg.IndexRecords("/elsewhere")) == {"new": "n1"}
    assert await n1.ask(msg.IndexSeed("/data/new", "n1")) is None
    assert await n1.ask(msg.IndexAdopt("/data/sub", "n1")) is None
    assert await n1.ask(msg.IndexUnlist("/data")) is None
    assert await n1.ask(msg.IndexUnhome(["/data/gone"])) is None

    # standing in for a home that did not answer, and a partition of a split directory
    stood_in = await n1.ask(msg.IndexBackup("n2", msg.IndexLookup("/data", "b.txt", None)))
    assert [h.node for h in stood_in.holders] == ["n2"] and stood_in.lease == 0.0  # a stand-in leases nothing
    served = await n1.ask(msg.IndexPart(0, "n1", [0], msg.IndexLookup("/data", "a.txt", None)))
    assert isinstance(served, msg.PartOk) and served.bitmap == (0,) and served.result.complete
    assert await n1.ask(msg.IndexParts("/data/big", "n2", [0, 1])) is None  # n2's partition 0 split
    name = next(f"f{i}" for i in range(64) if name_hash(f"f{i}") & 1 == 0)  # a name of partition 0
    redirected = await n1.ask(msg.IndexPart(0, "n2", [0, 1], msg.IndexLookup("/data/big", name, None)))
    assert redirected == msg.PartRedirect((0, 1))
    payload: msg.SplitPayload = {"home": "n2", "bitmap": [0, 1], "partition": 1, "entries": [], "missing": [],
                                 "exists": True, "holders": ["n1"], "negatives": {}, "listing_leases": {},
                                 "child_homes": {}, "home_leases": {}}
    assert await n1.ask(msg.IndexSplit("/data/big2", payload)) is None

    # a change made on its holder (n2), which records it at the home the asker names
    changed = await n2.ask(msg.Recorded("n2", "n1", msg.Chmod("/data/b.txt", 0o600)))
    assert stat.S_IMODE(changed.mode) == 0o600
    with pytest.raises(OSError) as refused:
        await n2.ask(msg.Recorded("n2", "n1", msg.Rmdir("/data")))
    assert refused.value.errno == errno.EINVAL and "does not record 'rmdir'" in str(refused.value)
    assert await n2.ask(msg.Recorded("n2", "n1", msg.Unlink("/data/b.txt"))) is None


async def _every_op(state: ClusterState, exports: dict[str, Path], ca: ClusterCA) -> set[str]:
    asked: set[str] = set()
    secret = state_store.load_secret(state.name)
    async with open_nursery() as nursery:
        async def connect(node: str) -> _Conversation:
            record = state.nodes[node]
            client = await rpc.connect(nursery, record.host, record.port, secret=secret, name="gmount-test",
                                       peer=node, timeout=5.0, ssl_context=client_ssl(state, "gmount-test"))
            return _Conversation(client, asked)

        n1, n2 = await connect("n1"), await connect("n2")

        # who the node is
        assert (await n1.ask(msg.Ping()))["node"] == "n1"
        assert set(await n1.ask(msg.Counters())) >= {"read_local", "served_read"}
        assert await n1.ask(msg.Rescan()) == 0  # no home has listed anything here yet: nothing to tell
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
        assert await n1.ask(msg.Remove("/data/fifo")) == ["n1"]  # as n1's mount removes it: holders and home
        table = {name: [record.host, record.port] for name, record in state.nodes.items()}
        assert await n1.ask(msg.SetPeers(table)) is None
        # a job registered on this machine, as make's wrapper registers its recipes
        sleeper = subprocess.Popen(["sleep", "30"])
        try:
            registry.register(state.name, "n2", "a target", sleeper.pid, kind="make", directory="/data")
            jobs = await n1.ask(msg.Jobs())
            assert [(j["node"], j["job"], j["kind"], j["pid"]) for j in jobs] == [("n2", "a target", "make",
                                                                                 sleeper.pid)]
        finally:
            sleeper.kill()
            sleeper.wait()
        assert await n1.ask(msg.Jobs()) == []

        # a staged replica on n2
        staged = await n2.ask(msg.Stage("/data/a.txt"))
        assert (staged["status"], staged["source"], staged["size"]) == ("copied", "n1", 11)
        replica = (await n2.ask(msg.Locate("/data/a.txt"))).replica
        assert replica is not None and (replica.node, replica.size) == ("n1", 11)
        assert await n2.ask(msg.DropReplica("/data/a.txt", 12, replica.mtime_ns)) is False  # not that source

        await _every_index_op(n1, n2)

        fresh = ca.issue("n2", secret=secret)
        assert "20" in await n2.ask(msg.RenewTls(fresh.cert, fresh.key))  # its new expiry date
        assert await n2.ask(msg.Shutdown()) is None
        await n1.client.aclose()
        await n2.client.aclose()
    return asked


def test_every_op_of_a_real_daemon_decodes_and_encodes_back(tmp_path: Path) -> None:
    require("FUSE", fuse_problem())
    with local_cluster(tmp_path, f"msg-{os.getpid()}", {"s1": ["n1"], "s2": ["n2"]}, [("s1", "s2", 5.0)],
                       tuning='attr_ttl = 0.5\nnegative_ttl = 0.5\nlookup = "index"', top="tls = true") as cluster:
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
