"""TLS on peer connections: certificates from the cluster CA, names checked, HMAC still required."""

from __future__ import annotations

import errno
import functools

import pytest
import trio

from gmountpy import rpc
from gmountpy.errors import PeerUnavailable
from gmountpy.tls import client_context, make_cluster_credentials, server_context
from gmountpy._trio import open_nursery

SECRET = b"s" * 32


async def echo(session: rpc.Session, op: str, args: list[object]) -> object:
    return [op, args]


async def _with_server(credentials, client_ca: str, peer_name: str, secret: bytes = SECRET) -> object:  # type: ignore[no-untyped-def]
    async with open_nursery() as nursery:
        serve = functools.partial(rpc.serve, secret=SECRET, name="n1", ssl_context=server_context(credentials))
        listeners = await nursery.start(serve, "127.0.0.1", 0, echo)
        port = listeners[0].socket.getsockname()[1]
        try:
            client = await rpc.connect(nursery, "127.0.0.1", port, secret=secret, name="n2", peer=peer_name,
                                       ssl_context=client_context(client_ca), timeout=5)
            result = await client.call("hello", b"\x00" * 100_000)
            await client.aclose()
            return result
        finally:
            nursery.cancel_scope.cancel()


def test_tls_round_trip() -> None:
    ca, creds = make_cluster_credentials("c", ["n1", "n2"])
    op, args = trio.run(_with_server, creds["n1"], ca, "n1")
    assert op == "hello" and args == [b"\x00" * 100_000]


def test_certificate_of_another_node_name_is_refused() -> None:
    ca, creds = make_cluster_credentials("c", ["n1", "n2"])
    with pytest.raises(PeerUnavailable):
        trio.run(_with_server, creds["n1"], ca, "n2")  # we expect n2, the server proves it is n1


def test_certificate_from_another_cluster_is_refused() -> None:
    _, creds = make_cluster_credentials("c", ["n1"])
    other_ca, _ = make_cluster_credentials("other", ["n1"])
    with pytest.raises(PeerUnavailable):
        trio.run(_with_server, creds["n1"], other_ca, "n1")


def test_tls_does_not_replace_the_secret() -> None:
    ca, creds = make_cluster_credentials("c", ["n1"])
    with pytest.raises(PeerUnavailable) as info:
        trio.run(_with_server, creds["n1"], ca, "n1", b"wrong secret")
    assert info.value.errno == errno.EACCES


def test_a_tls_cluster_works_end_to_end(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import hashlib
    import os

    from gmountpy import launch
    from gmountpy import state as state_store
    from gmountpy.client import call, run_sync

    from .conftest import FOUR_NODE_LINKS, FOUR_NODES, fuse_problem, local_cluster, require

    require("FUSE", fuse_problem())
    with local_cluster(tmp_path, "tlsc", FOUR_NODES, FOUR_NODE_LINKS, top="tls = true") as cluster:
        data = os.urandom(3_000_000)
        (cluster.export("n3") / "secret.bin").write_bytes(data)
        read = (cluster.mount("n1") / "secret.bin").read_bytes()
        assert hashlib.sha256(read).digest() == hashlib.sha256(data).digest()
        assert all(s.up for s in launch.status("tlsc"))
        assert run_sync(call, cluster.state, "n2", "where", "/secret.bin")[0]["node"] == "n3"
        ca, nodes = state_store.load_tls("tlsc")
        assert "BEGIN CERTIFICATE" in ca and set(nodes) == set(cluster.nodes)
        # a client without the cluster CA cannot even start talking
        record = cluster.state.nodes["n2"]

        async def plain() -> None:
            async with open_nursery() as nursery:
                await rpc.connect(nursery, record.host, record.port, secret=state_store.load_secret("tlsc"),
                                  name="x", peer="n2", timeout=2)

        with pytest.raises(PeerUnavailable):
            trio.run(plain)
