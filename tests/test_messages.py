"""The typed RPC messages (gmountpy.protocol.messages): their wire forms, and a real daemon's use of them.

Every operation a node answers -- its service's, the daemon's, and the directory
index's -- has a request type that a handler takes; every request a node receives is
decoded through its type before any handler runs, and arguments that do not fit are
refused with EINVAL naming the operation and the field, never an internal error. Every
message type goes through msgpack and back unchanged, and every reply a real daemon
gives decodes with its type and encodes back to the same wire value.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

import pytest
import trio
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gmountpy._trio import open_nursery
from gmountpy.cluster import registry
from gmountpy.cluster import state as state_store
from gmountpy.cluster.state import ClusterState
from gmountpy.node import index as index_module
from gmountpy.node.control import NodeControl
from gmountpy.node.export import Export
from gmountpy.node.index import DirectoryIndex, ExportWatcher, Homes, IndexLocator, name_hash
from gmountpy.node.service import NodeService
from gmountpy.protocol import messages as msg
from gmountpy.protocol import rpc, wire
from gmountpy.protocol.attr import Attr
from gmountpy.protocol.client import client_ssl
from gmountpy.protocol.codec import WireError, codec
from gmountpy.protocol.tls import ClusterCA

from . import wire_values
from .conftest import LocalCluster, fuse_problem, local_cluster, require


def _through_the_wire(value: Any) -> Any:
    """`value` as the other end gets it: framed, packed with msgpack and unpacked."""
    (message,) = wire.FrameDecoder().feed(wire.encode_reply(1, value))
    assert isinstance(message, wire.Reply)
    return message.result


def _arguments_through_the_wire(request: msg.Request[Any]) -> list[Any]:
    (message,) = wire.FrameDecoder().feed(wire.encode_request(1, request.op, request.to_wire()))
    assert isinstance(message, wire.Request) and message.op == request.op
    return message.args


# --------------------------------------------------------------------------- the surface


class _NeverAsked:
    """Peers of index objects made only for their tables of operations."""

    me = "n1"

    async def ask(self, node: str, request: msg.Request[msg.R], *, timeout: float | None = None) -> msg.R:
        raise AssertionError(f"{request.op} sent while reading the index's tables of operations")

    def is_down(self, node: str) -> bool:
        return False


def _tables() -> Iterator[msg.Operations]:
    """The handler tables a daemon serves (as node/daemon.py wires them): its service's own, the
    directory index's and the node-wide ones."""
    peers, homes = _NeverAsked(), Homes(("n1",))
    with tempfile.TemporaryDirectory() as root:
        export = Export(root)
        try:
            yield NodeService(export, {"node": "n1"})._ops
        finally:
            export.close()
    yield DirectoryIndex(peers, ["n1"], lease=1.0, homes=homes).operations()
    yield ExportWatcher(peers, homes).operations()
    yield IndexLocator(peers, [("n1",)], homes).operations()
    yield NodeControl.operations(object.__new__(NodeControl))  # (it only names its methods)


def test_a_daemon_serves_exactly_the_requests_of_the_messages() -> None:
    served = [kind for table in _tables() for kind in table]
    assert set(served) == set(msg.REQUESTS.values())
    twice = {kind.op for kind in served if served.count(kind) > 1}
    assert twice == {"rescan"}  # the export watcher's stands in for the service's (no index: nothing to tell)
    assert {kind.op for kind in msg.REQUESTS.values()} == set(msg.REQUESTS)


def test_every_handler_takes_the_request_type_it_is_listed_under() -> None:
    for table in _tables():
        for kind, handler in table.items():
            assert msg.operations(handler) == {kind: handler}


def test_the_index_name_requests_are_the_ops_a_split_directory_serves_by_name() -> None:
    """An asker sends an IndexNameRequest to the partition its name hashes to; the server refuses
    names of other partitions for exactly these ops (index._NAME_OPS)."""
    by_name = {kind for kind in msg.REQUESTS.values() if issubclass(kind, msg.IndexNameRequest)}
    assert by_name == set(index_module._NAME_OPS)
    assert set(index_module._BACKED_OPS) | set(index_module._PART_OPS) <= set(msg.REQUESTS.values())


def _types_within(tp: Any) -> Iterator[Any]:
    yield tp
    for arg in get_args(tp):
        if isinstance(arg, type | object) and arg is not Ellipsis:
            yield from _types_within(arg)
    cls = get_origin(tp) or tp
    if isinstance(cls, type) and not issubclass(cls, msg.Request) and (hasattr(cls, "__dataclass_fields__") or
                                                                     hasattr(cls, "_fields")):
        for hint in get_type_hints(cls, include_extras=True).values():
            yield from _types_within(hint)


def test_every_request_declares_its_reply_and_checks_every_argument() -> None:
    """No argument a peer sends reaches a handler unchecked: no request field is typed Any."""
    for kind in msg.REQUESTS.values():
        if not issubclass(kind, msg.Carrying):
            codec(kind.reply)  # a reply type the codec knows
        for name, hint in get_type_hints(kind, include_extras=True).items():
            if name in {"op", "reply"}:
                continue
            assert Any not in set(_types_within(hint)), f"{kind.op}.{name} takes unchecked values: {hint}"


def test_requests_send_their_fields_in_order() -> None:
    assert msg.Read(7, 4096, 100).to_wire() == [7, 4096, 100]
    assert msg.Utimens("/a", None, 5).to_wire() == ["/a", None, 5]
    assert msg.Ping().to_wire() == []
    assert msg.Read.op == "read" and msg.PutClose.op == "put_close"
    assert msg.IndexDrop("/d", "a", ["n1"]).to_wire() == ["/d", "a", ["n1"], None, None, False]  # defaults too
    assert msg.IndexDrop.from_wire(["/d", "a"]) == msg.IndexDrop("/d", "a")  # defaults may be left out


ATTR = list(Attr.from_stat(os.stat(__file__)))
LOOKED_UP = [[["n1", ATTR, None], ["n2", ATTR, "n1"]], True, False, 0.0, None, 0.0, None, 2, None]
LISTED = [[["a", [["n1", ATTR, None]], None]], True, True, 1.0, 60.0, None]


def test_forwarding_requests_carry_the_request_and_decode_its_reply() -> None:
    lookup = msg.IndexLookup("/d", "a", "n3")
    assert msg.IndexBackup("n1", lookup).to_wire() == ["n1", ["index_lookup", ["/d", "a", "n3", False]]]
    assert msg.Recorded("n2", "n1", msg.Unlink("/d/a")).to_wire() == ["n2", "n1", ["unlink", ["/d/a"]]]
    assert msg.IndexPart(3, "n1", [0, 1, 3], lookup).to_wire() == [3, "n1", [0, 1, 3],
                                                                   ["index_lookup", ["/d", "a", "n3", False]]]
    assert msg.IndexBackup.from_wire(["n1", ["index_lookup", ["/d", "a", "n3", False]]]) == \
        msg.IndexBackup("n1", lookup)
    stood_in = msg.IndexBackup("n1", lookup).decode(LOOKED_UP)
    assert stood_in == lookup.decode(LOOKED_UP) and stood_in.holders[1] == ("n2", Attr(*ATTR), "n1")
    part = msg.IndexPart(3, "n1", [0, 1, 3], lookup)
    served = part.decode(["ok", LOOKED_UP, [0, 1, 3, 7]])
    assert served == msg.PartOk(lookup.decode(LOOKED_UP), (0, 1, 3, 7))
    assert _through_the_wire(part.encode_reply(served)) == ["ok", LOOKED_UP, [0, 1, 3, 7]]
    redirected = part.decode(["redirect", [0, 1, 3, 7]])
    assert redirected == msg.PartRedirect((0, 1, 3, 7))
    assert _through_the_wire(part.encode_reply(redirected)) == ["redirect", [0, 1, 3, 7]]


@pytest.mark.parametrize(("args", "refused"), [
    (["n1", ["index_part", [0, "n1", [0], ["index_list", ["/d"]]]]], "not an operation that can be carried"),
    (["n1", ["no_such_op", []]], "not an operation that can be carried"),
    (["n1", ["index_lookup", ["/d"]]], "`request.index_lookup`: 1 fields"),
    (["n1", "index_lookup", ["/d", "a"]], "3 fields where IndexBackup has 2"),  # the old wire form
])
def test_a_carried_request_is_decoded_through_its_own_type(args: list[Any], refused: str) -> None:
    """A carried request that carries another is refused: a peer cannot nest them without end."""
    with pytest.raises(WireError, match=refused):
        msg.IndexBackup.from_wire(args)


@pytest.mark.parametrize(("request_", "reply"), [
    (msg.Open("/a", os.O_RDONLY), [3]),                      # a field missing
    (msg.Open("/a", os.O_RDONLY), ["3", ATTR]),              # a handle that is not a number
    (msg.Lookup("/a"), ATTR[:-1]),                           # attributes of another version
    (msg.Locate("/a"), [ATTR, ["n1", 3]]),                   # a replica source without its mtime
    (msg.Listdir("/"), [["a"]]),
    (msg.Read(1, 0, 10), "text"),
    (msg.Write(1, 0, b"x"), True),                           # a bool is not a count
    (msg.Close(1), 0),
    (msg.Ls("/"), [[]]),                                     # the unreachable nodes missing
    (msg.Where("/a"), [{"node": "n1"}]),
    (msg.Ping(), {"node": "n1", "site": "s", "cluster": "c", "version": "v", "mountpoint": "/m", "export": "/e",
                  "pid": 1, "counters": {}, "extra": 1}),   # a key this version does not know
])
def test_a_reply_of_the_wrong_shape_is_a_protocol_error_naming_the_op(request_: msg.Request[Any],
                                                                      reply: Any) -> None:
    with pytest.raises(OSError) as info:
        request_.decode(reply)
    assert info.value.errno == errno.EPROTO
    assert f"malformed {request_.op} reply" in str(info.value) and "same gmountpy" in str(info.value)


def _but(reply: list[Any], index: int, value: Any) -> list[Any]:
    return [*reply[:index], value, *reply[index + 1:]]


@pytest.mark.parametrize(("request_", "reply", "named"), [
    (msg.IndexLookup("/d", "a"), LOOKED_UP[:2], "index_lookup"),  # no "pending"
    (msg.IndexLookup("/d", "a"), _but(LOOKED_UP, 0, [["n1", ATTR]]), "index_lookup"),  # a holder without replica_of
    (msg.IndexLookup("/d", "a"), _but(LOOKED_UP, 3, "4.0"), "index_lookup"),
    (msg.IndexLookup("/d", "a"), _but(LOOKED_UP, 1, 1), "index_lookup"),  # not a bool
    (msg.IndexLookup("/d", "a"), _but(LOOKED_UP, 8, _but(LISTED, 2, None)), "index_lookup"),
    (msg.IndexClaim("/d", "a", "n1"), [[["n1", ATTR[:-1], None]], False, False], "index_claim"),
    (msg.IndexClaim("/d", "a", "n1"), [[], 0], "index_claim"),
    (msg.IndexClaim("/d", "a", "n1"), None, "index_claim"),
    (msg.IndexClaim("/d", "a", "n1"), [[], "yes", False], "index_claim"),
    (msg.IndexList("/d"), _but(LISTED, 0, [["a", [], None, 0]]), "index_list"),
    (msg.IndexList("/d"), _but(LISTED, 5, [0, "1"]), "index_list"),
    (msg.IndexSet("/d", "a", "n1", None), 0, "index_set"),
    (msg.IndexDrop("/d", "a", None, "n1", "n2"), None, "index_drop"),  # the reply before the homes not reached
    (msg.IndexDrop("/d", "a", None, "n1", "n2"), [2], "index_drop"),
    (msg.IndexRecords("/d"), {"a": 3}, "index_records"),
    (msg.IndexListdir("/d"), {"a": ATTR}, "index_listdir"),
    (msg.IndexPart(1, "n1", [0, 1], msg.IndexList("/d")), ["ok", LISTED], "index_part"),  # the bitmap missing
    (msg.IndexPart(1, "n1", [0, 1], msg.IndexList("/d")), ["moved", [0, 1]], "index_part"),
    (msg.IndexPart(1, "n1", [0, 1], msg.IndexLookup("/d", "a")), ["ok", [[]], [0, 1]], "index_lookup"),
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


# --------------------------------------------------------------------------- every type through msgpack


KINDS = sorted(msg.REQUESTS.values(), key=lambda kind: kind.op)


@settings(max_examples=25, deadline=None)
@given(data=st.data())
@pytest.mark.parametrize("kind", KINDS, ids=[kind.op for kind in KINDS])
def test_every_request_and_its_reply_go_through_msgpack_and_back(kind: type[msg.Request[Any]],
                                                                 data: st.DataObject) -> None:
    request = data.draw(wire_values.requests(kind), label="request")
    assert kind.from_wire(_arguments_through_the_wire(request)) == request
    if isinstance(request, msg.IndexPart):
        reply_type: Any = msg.PartOk[request.request.reply] | msg.PartRedirect
    elif isinstance(request, msg.Carrying):
        reply_type = request.request.reply
    else:
        reply_type = kind.reply
    reply = data.draw(wire_values.values(reply_type), label="reply")
    assert request.decode(_through_the_wire(request.encode_reply(reply))) == reply


@pytest.mark.parametrize(("kind", "args", "field"), [
    (msg.Read, [1, 0, msg.MAX_IO + 1], "size"),
    (msg.Read, [1, -1, 10], "offset"),
    (msg.Write, [1, 0, b"x" * (msg.MAX_IO + 1)], "data"),
    (msg.Lookup, ["/" + "a" * msg.PATH_MAX], "path"),
    (msg.IndexLookup, ["/d", "n" * (msg.NAME_MAX + 1)], "name"),
    (msg.Chown, ["/a", -2, 0], "uid"),
    (msg.Mkdir, ["/a", 0o200000], "mode"),
    (msg.IndexPart, [msg.MAX_PARTITIONS, "n1", [0], ["index_list", ["/d"]]], "partition"),
    (msg.SetPeers, [{"n1": ["h", 65536]}], "table['n1'][1]"),
    (msg.Utimens, ["/a", None, 2**63], "mtime_ns"),
])
def test_arguments_are_checked_against_their_limits(kind: type[msg.Request[Any]], args: list[Any],
                                                    field: str) -> None:
    with pytest.raises(WireError) as info:
        kind.from_wire(args)
    assert info.value.where == field
    at_limit = [msg.MAX_IO if v == msg.MAX_IO + 1 else v for v in args]
    if at_limit != args:
        kind.from_wire(at_limit)  # the limit itself is taken


def test_file_data_goes_through_the_codec_without_a_copy() -> None:
    """Reads and writes carry up to MAX_IO bytes: checked, never copied (nor a listing walked to be sent)."""
    data = b"x" * msg.MAX_IO
    assert msg.Write.from_wire([1, 0, data]).data is data
    assert msg.Read(1, 0, msg.MAX_IO).decode(data) is data
    assert msg.Read(1, 0, msg.MAX_IO).encode_reply(data) is data
    listing = [msg.DirEntry("a", Attr(*ATTR))] * 1000
    assert msg.Listdir("/").encode_reply(listing) is listing


def test_the_service_refuses_bad_arguments_before_any_handler_runs(tmp_path: Path) -> None:
    """Arguments that do not fit are refused with EINVAL naming the op, the node and the field; the
    handler never runs (a mkdir with a bad mode makes no directory)."""
    export = Export(str(tmp_path))
    service = NodeService(export, {"node": "n9"})

    async def main() -> None:
        session = rpc.Session("peer")
        with pytest.raises(rpc.BadRequest) as info:
            await service.dispatch(session, "mkdir", ["/made", "0755"])
        assert info.value.errno == errno.EINVAL
        assert info.value.strerror == ("bad arguments to 'mkdir' on node n9: `mode`: expected an integer, "
                                   "got '0755' (str)")
        assert not (tmp_path / "made").exists()
        with pytest.raises(OSError) as unknown:
            await service.dispatch(session, "no_such_op", [])
        assert unknown.value.errno == errno.ENOSYS
        assert await service.dispatch(session, "mkdir", ["/made", 0o755]) == export.lstat("/made")
        session.close()

    try:
        trio.run(main)
    finally:
        export.close()


class _Conversation:
    """One authenticated connection to one node; every reply is decoded and checked against its wire value."""

    def __init__(self, client: rpc.RpcClient, asked: set[str]) -> None:
        self.client = client
        self.asked = asked

    async def ask(self, request: msg.Request[Any]) -> Any:
        raw = await self.client.call(request.op, *request.to_wire(), timeout=30.0)
        decoded = request.decode(raw)
        again = _through_the_wire(request.encode_reply(decoded))
        assert again == raw, f"{request.op}: {decoded!r} does not encode back to {raw!r}"
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
    assert await n1.ask(msg.IndexClaim("/data", "claimed.txt", "n2")) == msg.IndexClaimReply(())
    taken = await n1.ask(msg.IndexClaim("/data", "a.txt", "n2"))
    assert [h.node for h in taken.holders] == ["n1"] and not taken.seeded
    assert (await n1.ask(msg.IndexClaim("/data", "made", "n1", True))).seeded  # n1 homes it and seeds it
    assert await n1.ask(msg.IndexSet("/data", "claimed.txt", "n2", None, None, False, "n2")) is None
    assert await n1.ask(msg.IndexDrop("/data", "claimed.txt", ["n2"], "n2")) == []
    assert await n1.ask(msg.IndexReplace("/data", "p.txt", ["n1"], False, "n2")) is None
    assert await n1.ask(msg.IndexRename("/data", "q.txt", "p.txt", ["n1"], False, "n2")) is None
    assert await n1.ask(msg.IndexSync("/data", "n2", [msg.SyncEntry(*entry) for entry in on_n2])) is None
    assert await n1.ask(msg.IndexRecords("/elsewhere", {"made": "n2"})) == {}  # a copy: nothing comes back
    assert await n1.ask(msg.IndexRecords("/elsewhere")) == {"made": "n2"}  # all of them, asked for
    assert await n1.ask(msg.IndexRecords("/elsewhere", {"made": None})) == {}
    assert await n1.ask(msg.IndexDrop("/elsewhere", "made", None, "n2", "n1")) == []  # its index forgotten here
    assert await n1.ask(msg.IndexRecords("/elsewhere", {"new": "n1"}, "n2")) == {}  # and seeded here
    assert await n1.ask(msg.IndexRecords("/elsewhere")) == {"new": "n1"}
    assert await n1.ask(msg.IndexSeed("/data/new", "n1")) is None
    kept = [msg.SyncEntry("out.txt", Attr(*ATTR))]
    assert await n1.ask(msg.IndexOwned("/owned", "n2", kept, True)) is None  # kept as its backup
    assert await n1.ask(msg.IndexOwned("/owned", "n2", [msg.SyncEntry("out.txt", None)])) is None
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
    payload = msg.SplitPayload(home="n2", bitmap=[0, 1], partition=1, entries=[], missing=[], exists=True,
                               holders=["n1"], negatives={}, listing_leases={}, child_homes={}, home_leases={})
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
        settled = await n1.ask(msg.Settle(opened.handle))  # the same open file under a new number
        assert settled != opened.handle and (await n1.ask(msg.Fstat(settled))).size == 3
        assert await n1.ask(msg.Close(settled)) is None

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
        table = {name: (record.host, record.port) for name, record in state.nodes.items()}
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


# --------------------------------------------------------------------------- malformed requests to a real daemon


@pytest.fixture(scope="module")
def daemons(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Two real daemons (directory index, TLS), only ever sent requests they must refuse."""
    require("FUSE", fuse_problem())
    with local_cluster(tmp_path_factory.mktemp("malformed"), f"bad-{os.getpid()}", {"s1": ["n1"], "s2": ["n2"]},
                       [("s1", "s2", 5.0)], tuning='lookup = "index"', top="tls = true") as cluster:
        yield cluster


async def _refused(cluster: LocalCluster, calls: list[tuple[str, list[Any]]]) -> list[OSError]:
    """Each call sent to n1 on one connection, and how it was refused (a call that succeeds fails the test)."""
    state = cluster.state
    record = state.nodes["n1"]
    errors: list[OSError] = []
    async with open_nursery() as nursery:
        client = await rpc.connect(nursery, record.host, record.port, secret=state_store.load_secret(state.name),
                                   name="gmount-test", peer="n1", timeout=5.0,
                                   ssl_context=client_ssl(state, "gmount-test"))
        for op, args in calls:
            with pytest.raises(OSError) as info:
                await client.call(op, *args, timeout=10.0)
            errors.append(info.value)
        assert (await client.call("ping"))["node"] == "n1"  # and the daemon serves on
        await client.aclose()
    return errors


def test_a_real_daemon_decodes_every_op_through_its_type(daemons: LocalCluster) -> None:
    """Every op the messages name is decoded by the daemon (too many arguments: EINVAL naming the op,
    not ENOSYS), and an op they do not name is not served."""
    calls = [(op, [["x"]] * (len(wire_values.struct_fields(kind)[1]) + 1))  # one argument too many
             for op, kind in sorted(msg.REQUESTS.items())]
    errors = trio.run(_refused, daemons, [*calls, ("no_such_op", [])])
    for (op, _), error in zip(calls, errors, strict=False):
        assert error.errno == errno.EINVAL and f"bad arguments to {op!r} on node n1" in str(error), (op, error)
    assert errors[-1].errno == errno.ENOSYS


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_malformed_arguments_are_refused_with_einval_by_a_real_daemon(daemons: LocalCluster,
                                                                            data: st.DataObject) -> None:
    """Whatever a peer sends as arguments, a request its type refuses is answered EINVAL naming the
    op and the field -- never an internal error (EIO), never a crash: the daemon serves on."""
    kind = data.draw(st.sampled_from(KINDS), label="op")
    args, field = data.draw(wire_values.wrong_arguments(kind), label="arguments")
    try:
        kind.from_wire(args)
    except WireError:
        pass
    else:
        assume(False)  # a wrong value that happens to fit (an int where an int goes)
    (error,) = trio.run(_refused, daemons, [(kind.op, args)])
    assert error.errno == errno.EINVAL, error
    assert f"bad arguments to {kind.op!r} on node n1" in str(error)
    if field is not None:
        assert f"`{field}" in str(error), error
