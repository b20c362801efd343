"""TLS on peer connections: certificates from the cluster CA, names checked, HMAC still required."""

from __future__ import annotations

import datetime
import errno
import functools

import pytest
import trio

from gmountpy._trio import open_nursery
from gmountpy.errors import PeerUnavailable
from gmountpy.protocol import rpc
from gmountpy.protocol.tls import (
    CA_VALIDITY,
    NODE_VALIDITY,
    RENEW_WITHIN,
    ClusterCA,
    NodeCredentials,
    certificate_name,
    certificate_problem,
    client_context,
    expires,
    expiring,
    make_cluster_credentials,
    server_context,
)

SECRET = b"s" * 32


async def echo(session: rpc.Session, op: str, args: list[object]) -> object:
    return [op, args]


async def _with_server(credentials, client_ca: str, peer_name: str, secret: bytes = SECRET,  # type: ignore[no-untyped-def]
                       client: NodeCredentials | None = None, name: str = "n2") -> object:
    async with open_nursery() as nursery:
        serve = functools.partial(rpc.serve, secret=SECRET, name="n1", ssl_context=server_context(credentials))
        listeners = await nursery.start(serve, "127.0.0.1", 0, echo)
        port = listeners[0].socket.getsockname()[1]
        try:
            client_connection = await rpc.connect(nursery, "127.0.0.1", port, secret=secret, name=name,
                                                  peer=peer_name, ssl_context=client_context(client_ca, client),
                                                  timeout=5)
            result = await client_connection.call("hello", b"\x00" * 100_000)
            await client_connection.aclose()
            return result
        finally:
            nursery.cancel_scope.cancel()


def test_tls_round_trip() -> None:
    ca, creds = make_cluster_credentials("c", ["n1", "n2"], SECRET)
    op, args = trio.run(_with_server, creds["n1"], ca, "n1", SECRET, creds["n2"])
    assert op == "hello" and args == [b"\x00" * 100_000]


def test_certificate_of_another_node_name_is_refused() -> None:
    ca, creds = make_cluster_credentials("c", ["n1", "n2"], SECRET)
    with pytest.raises(PeerUnavailable, match="certificate of this cluster made for another node") as info:
        trio.run(_with_server, creds["n1"], ca, "n2", SECRET, creds["n2"])  # we expect n2, the server proves n1
    assert info.value.errno == errno.EACCES


def test_certificate_from_another_cluster_is_refused() -> None:
    _, creds = make_cluster_credentials("c", ["n1"], SECRET)
    other_ca, _ = make_cluster_credentials("other", ["n1"], SECRET)
    with pytest.raises(PeerUnavailable, match="not issued by this cluster's CA .a foreign certificate") as info:
        trio.run(_with_server, creds["n1"], other_ca, "n1")
    assert info.value.errno == errno.EACCES


def test_an_expired_certificate_is_refused_with_a_clear_message() -> None:
    ca = ClusterCA.create("c")
    past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=10)
    expired = ca.issue("n1", secret=SECRET, now=past, validity=datetime.timedelta(days=2))
    with pytest.raises(PeerUnavailable, match="node 'n1' at 127.0.0.1:[0-9]+ presented an expired certificate: "
                                              "refused; run `gmount up`") as info:
        trio.run(_with_server, expired, ca.cert, "n1", SECRET, ca.issue("n2", secret=SECRET))
    assert info.value.errno == errno.EACCES
    assert "expired on" in (certificate_problem(expired, "n1", SECRET) or "")


def test_a_daemon_refuses_credentials_that_are_not_its_own() -> None:
    ca, other = ClusterCA.create("c"), ClusterCA.create("other")
    good = ca.issue("n1", secret=SECRET)
    assert certificate_problem(good, "n1", SECRET) is None
    assert "made for another node" in (certificate_problem(good, "n2", SECRET) or "")
    assert "made for another node" in (certificate_problem(good, "n1", b"another cluster's secret") or "")
    foreign = other.issue("n1", secret=SECRET)
    assert "not issued by this cluster's CA" in (certificate_problem(NodeCredentials(ca.cert, foreign.cert,
                                                                                     foreign.key), "n1", SECRET) or "")
    later = datetime.datetime.now(datetime.UTC) + CA_VALIDITY + datetime.timedelta(days=1)
    assert "CA certificate of this cluster expired" in (certificate_problem(good, "n1", SECRET, now=later) or "")


def test_lifetimes_and_the_renewal_window() -> None:
    ca = ClusterCA.create("c")
    now = datetime.datetime.now(datetime.UTC)
    creds = ca.issue("n1", secret=SECRET)
    assert abs(expires(creds.cert) - (now + NODE_VALIDITY)) < datetime.timedelta(minutes=1)
    assert abs(expires(ca.cert) - (now + CA_VALIDITY)) < datetime.timedelta(minutes=1)
    assert not expiring(creds.cert)
    assert expiring(creds.cert, now=now + NODE_VALIDITY - RENEW_WITHIN + datetime.timedelta(hours=1))
    # a node certificate never outlives its CA
    late = ca.issue("n1", secret=SECRET, now=now + CA_VALIDITY - datetime.timedelta(days=1))
    assert expires(late.cert) == expires(ca.cert)


def test_tls_does_not_replace_the_secret() -> None:
    ca, creds = make_cluster_credentials("c", ["n1", "n2"], SECRET)
    with pytest.raises(PeerUnavailable) as info:
        trio.run(_with_server, creds["n1"], ca, "n1", b"wrong secret", creds["n2"])
    assert info.value.errno == errno.EACCES


def test_a_tls_cluster_works_end_to_end(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import hashlib
    import os

    from gmountpy import launch
    from gmountpy.cluster import state as state_store
    from gmountpy.protocol.client import call, run_sync

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
        from gmountpy.launch.probe import probe

        assert [r.problem for r in probe(cluster.spec, count=2).rtts] == [None]  # its RPCs speak TLS too
        # a client without the cluster CA cannot even start talking
        record = cluster.state.nodes["n2"]

        async def plain() -> None:
            async with open_nursery() as nursery:
                await rpc.connect(nursery, record.host, record.port, secret=state_store.load_secret("tlsc"),
                                  name="x", peer="n2", timeout=2)

        with pytest.raises(PeerUnavailable):
            trio.run(plain)
        # what anyone reaching the port sees of a node before proving anything: no node, no cluster
        from cryptography import x509

        der = trio.run(presented_certificate, record.host, record.port, ca, "n2", state_store.load_secret("tlsc"))
        shown = x509.load_der_x509_certificate(der)
        names = shown.subject.rfc4514_string() + shown.issuer.rfc4514_string() + " ".join(
            shown.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
                x509.DNSName))
        assert "n2" not in names and "tlsc" not in names, names



async def presented_certificate(host: str, port: int, ca: str, node: str, secret: bytes) -> bytes:
    stream = trio.SSLStream(await trio.open_tcp_stream(host, port), client_context(ca),
                            server_hostname=certificate_name(node, secret))
    await stream.do_handshake()
    der = stream.getpeercert(binary_form=True)
    await stream.aclose()
    return der


def test_gmount_up_renews_expiring_certificates_of_a_running_cluster(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import ssl as ssl_module

    from gmountpy import launch
    from gmountpy.cluster import state as state_store
    from gmountpy.errors import GmountError
    from gmountpy.protocol import tls

    from .conftest import fuse_problem, local_cluster, require, wait_for

    require("FUSE", fuse_problem())
    with local_cluster(tmp_path, "renew", {"s": ["n1", "n2"]}, [], top="tls = true") as cluster:
        ca, before = state_store.load_tls("renew")
        with pytest.raises(GmountError, match="already up"):
            launch.up(cluster.spec)  # nothing close to expiry: `up` on a running cluster is refused as always
        monkeypatch.setattr(tls, "RENEW_WITHIN", NODE_VALIDITY + datetime.timedelta(days=1))  # all "expiring"
        said: list[tuple[str, str]] = []
        state = launch.up(cluster.spec, progress=lambda node, what: said.append((node, what)))
        assert state.nodes == cluster.state.nodes  # the same daemons, still running
        assert sorted(said) == [("n1", "certificate renewed"), ("n2", "certificate renewed")]
        ca_after, after = state_store.load_tls("renew")
        assert ca_after == ca
        for node in ("n1", "n2"):
            assert after[node]["cert"] != before[node]["cert"]
            record = cluster.state.nodes[node]
            presented = trio.run(presented_certificate, record.host, record.port, ca, node,
                                 state_store.load_secret("renew"))
            assert presented == ssl_module.PEM_cert_to_DER_cert(after[node]["cert"])
        (cluster.export("n2") / "after-renewal.txt").write_text("still talking")
        assert (cluster.mount("n1") / "after-renewal.txt").read_text() == "still talking"
        assert all(s.up for s in launch.status("renew"))
        from gmountpy.protocol.client import call, run_sync

        # the read above opened a handle on n2 and closed it (the kernel's release may come a moment later)
        assert wait_for(lambda: run_sync(call, state, "n2", "stats")["peer_handles"] == 0)
        stats = run_sync(call, state, "n2", "stats")
        assert stats["requests_refused"] == 0 and stats["requests_in_progress"] == 1  # this very request


async def _close_after_the_transport_went(credentials, client_ca: str, client: NodeCredentials) -> bool:  # type: ignore[no-untyped-def]
    async with open_nursery() as nursery:
        serve = functools.partial(rpc.serve, secret=SECRET, name="n1", ssl_context=server_context(credentials))
        listeners = await nursery.start(serve, "127.0.0.1", 0, echo)
        port = listeners[0].socket.getsockname()[1]
        try:
            client = await rpc.connect(nursery, "127.0.0.1", port, secret=SECRET, name="n2", peer="n1",
                                       ssl_context=client_context(client_ca, client), timeout=5)
            assert await client.call("hello") == ["hello", []]
            # what the reader does when the peer shuts down, at the moment the owner closes too
            client._stream.transport_stream.socket.close()  # type: ignore[attr-defined]
            await client.aclose()
            return client.closed
        finally:
            nursery.cancel_scope.cancel()


def test_closing_a_tls_connection_whose_socket_is_already_gone_is_no_error() -> None:
    """Seen in a test run: a daemon shut down, its reader closed the socket, and the client's own
    aclose then raised ClosedResourceError sending TLS close_notify."""
    ca, creds = make_cluster_credentials("c", ["n1", "n2"], SECRET)
    assert trio.run(_close_after_the_transport_went, creds["n1"], ca, creds["n2"])


# ---------------------------------------------------------------- mutual TLS


async def _served(credentials: NodeCredentials, attempt) -> list[str]:  # type: ignore[no-untyped-def]
    """Run `attempt(port)` against a TLS server; the operations the server executed."""
    served: list[str] = []

    async def record(session: rpc.Session, op: str, args: list[object]) -> object:
        served.append(op)
        return session.peer

    async with open_nursery() as nursery:
        serve = functools.partial(rpc.serve, secret=SECRET, name="n1", ssl_context=server_context(credentials))
        listeners = await nursery.start(serve, "127.0.0.1", 0, record)
        try:
            await attempt(nursery, listeners[0].socket.getsockname()[1])
        finally:
            nursery.cancel_scope.cancel()
    return served


def _connecting(ca: str, client: NodeCredentials | None, name: str):  # type: ignore[no-untyped-def]
    async def attempt(nursery: trio.Nursery, port: int) -> None:
        connection = await rpc.connect(nursery, "127.0.0.1", port, secret=SECRET, name=name, peer="n1",
                                       ssl_context=client_context(ca, client), timeout=5)
        assert await connection.call("whoami") == name
        await connection.aclose()
    return attempt


def test_a_client_without_a_certificate_of_the_cluster_is_refused_before_anything_is_served() -> None:
    ca = ClusterCA.create("c")
    other = ClusterCA.create("other")
    server = ca.issue("n1", secret=SECRET)
    for client, why in [(None, "closed the connection in the TLS handshake"),
                        (other.issue("n2", secret=SECRET), "closed the connection in the TLS handshake")]:
        with pytest.raises(PeerUnavailable, match=why) as info:
            trio.run(_served, server, _connecting(ca.cert, client, "n2"))
        assert info.value.errno == errno.EACCES


def test_the_name_a_client_claims_must_be_the_one_in_its_certificate() -> None:
    ca = ClusterCA.create("c")
    n1, n2, n3 = (ca.issue(node, secret=SECRET) for node in ("n1", "n2", "n3"))
    assert trio.run(_served, n1, _connecting(ca.cert, n2, "n2")) == ["whoami"]
    with pytest.raises(PeerUnavailable, match="refused us: authentication failed: the name in the hello") as info:
        trio.run(_served, n1, _connecting(ca.cert, n3, "n2"))  # n3's key, claiming to be n2
    assert info.value.errno == errno.EACCES


def test_a_client_certificate_lets_a_client_connect_but_not_serve() -> None:
    ca = ClusterCA.create("c")
    client = ca.issue_client("gmount-cli", secret=SECRET)
    n1, n2 = ca.issue("n1", secret=SECRET), ca.issue("n2", secret=SECRET)
    assert trio.run(_served, n1, _connecting(ca.cert, client, "gmount-cli")) == ["whoami"]
    with pytest.raises(PeerUnavailable, match="certificate that was refused: unsuitable certificate purpose"):
        trio.run(_served, client, _connecting(ca.cert, n2, "n2"))  # a daemon with a client's key


def test_certificates_name_neither_the_node_nor_the_cluster() -> None:
    """A certificate goes out before the peer proved anything (and the name asked for, in the clear):
    only holders of the cluster secret can tell which node, or which cluster, it is for."""
    from cryptography import x509

    ca = ClusterCA.create("my-lab-cluster")
    credentials = ca.issue("compute-node-7", secret=SECRET)
    for pem in (credentials.cert, ca.cert):
        cert = x509.load_pem_x509_certificate(pem.encode())
        shown = cert.subject.rfc4514_string() + cert.issuer.rfc4514_string()
        if pem == credentials.cert:
            san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            shown += " ".join(san.get_values_for_type(x509.DNSName))
            assert san.get_values_for_type(x509.DNSName) == [certificate_name("compute-node-7", SECRET)]
        assert "compute-node-7" not in shown and "my-lab-cluster" not in shown, shown
    assert certificate_name("compute-node-7", SECRET) != certificate_name("compute-node-7", b"x" * 32)
    assert certificate_problem(credentials, "compute-node-7", SECRET) is None


def test_keys_are_never_written_to_a_file(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """ssl loads keys from paths only; the key goes through an anonymous in-memory file, never /tmp."""
    import tempfile

    def no_files(*args: object, **kwargs: object) -> None:
        raise AssertionError("key material written to a temporary file")

    for name in ("NamedTemporaryFile", "TemporaryFile", "mkstemp", "mkdtemp"):
        monkeypatch.setattr(tempfile, name, no_files)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    ca, creds = make_cluster_credentials("c", ["n1", "n2"], SECRET)
    server_context(creds["n1"])
    client_context(ca, creds["n2"])
    assert list(tmp_path.iterdir()) == []
    op, _ = trio.run(_with_server, creds["n1"], ca, "n1", SECRET, creds["n2"])
    assert op == "hello"
