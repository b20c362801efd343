"""Pieces of the SSH launcher that need no server: messages, addresses, quoting."""

from __future__ import annotations

import asyncio
import socket

import asyncssh
import pytest

from gmountpy.cluster.config import SshOptions, parse_spec
from gmountpy.launch.ssh import Destination, SshPool, _connect_options, _connect_problem, _mounts_escape, _shell_word

DEST = Destination("alice@node7.example.org", 2222)
OPTIONS = SshOptions(known_hosts="/home/alice/kh", identity=("/home/alice/.ssh/id_x",), connect_timeout=4.0)


@pytest.mark.parametrize(("exc", "expected"), [
    (ConnectionRefusedError(111, "Connect call failed"),
     "cannot reach alice@node7.example.org port 2222: connection refused (no sshd listening there): "
     "check host and ssh_port"),
    (TimeoutError(),
     "cannot reach alice@node7.example.org port 2222: no answer within 4s (host down or firewalled?): "
     "check host and ssh_port, or raise connect_timeout in [ssh]"),
    (FileNotFoundError(2, "No such file or directory", "/home/alice/.ssh/id_x"),
     "cannot read /home/alice/.ssh/id_x to connect to alice@node7.example.org port 2222: No such file or "
     "directory: fix identity, known_hosts or config in [ssh]"),
    (socket.gaierror(-2, "Name or service not known"),
     "cannot reach alice@node7.example.org port 2222: unknown host name 'node7.example.org' "
     "(Name or service not known): check host"),
    (asyncssh.PermissionDenied("Permission denied"),
     "authentication refused by alice@node7.example.org port 2222 (tried keys /home/alice/.ssh/id_x): add your "
     "public key to ~/.ssh/authorized_keys there, or name the right key with identity in [ssh]"),
    (asyncssh.HostKeyNotVerifiable("Host key is not trusted"),
     "host key of alice@node7.example.org port 2222 is not trusted (Host key is not trusted): check it with "
     "`ssh -p 2222 alice@node7.example.org` and add it to /home/alice/kh; `known_hosts = false` in [ssh] skips "
     "the check (unsafe)"),
])
def test_connect_failures_say_what_and_what_to_do(exc: BaseException, expected: str) -> None:
    assert _connect_problem(exc, DEST, OPTIONS) == expected


def test_connect_options_leave_unset_things_to_the_users_ssh_setup() -> None:
    assert _connect_options(SshOptions(), Destination("node7", 22)) == {"connect_timeout": 10.0,
                                                                        "keepalive_interval": 30}
    assert _connect_options(OPTIONS, DEST) == {
        "connect_timeout": 4.0, "keepalive_interval": 30, "username": "alice", "port": 2222,
        "known_hosts": "/home/alice/kh", "client_keys": ["/home/alice/.ssh/id_x"]}
    relaxed = SshOptions(verify_host_keys=False, config=None)
    assert _connect_options(relaxed, DEST)["known_hosts"] is None
    assert _connect_options(relaxed, DEST)["config"] is None


def test_quoting_for_the_remote_shell_and_proc_mounts() -> None:
    assert _shell_word("~/venv/bin/python") == '"$HOME"/venv/bin/python'
    assert _shell_word("/opt/my python/bin/python3") == "'/opt/my python/bin/python3'"
    assert _mounts_escape("/tmp/a b\\c") == "/tmp/a\\040b\\134c"


def _spec(listen: str) -> dict[str, object]:
    return {"name": "c", "launcher": "ssh", "defaults": {"export": "/e/{node}", "mountpoint": "/m/{node}",
                                                          "listen": listen},
            "nodes": {"n1": {"host": "a@10.0.0.1"}, "n2": {"host": "a@10.0.0.2"}},
            "sites": {"s": {"nodes": ["n1", "n2"]}}}


@pytest.mark.parametrize(("listen", "problem"), [
    ("127.0.0.1", 'listens on 127.0.0.1 (loopback) but the cluster spans several machines: set listen = "0.0.0.0" '
                  "or an address of 10.0.0.1 the other nodes reach"),
    ("0.0.0.0", None),
])
def test_loopback_listen_is_refused_when_the_cluster_spans_machines(listen: str, problem: str | None) -> None:
    async def check() -> dict[str, str]:
        pool = SshPool(parse_spec(_spec(listen)))
        for link, ip in zip(pool.links, ["10.0.0.1", "10.0.0.2"], strict=True):
            link.conn = object()  # type: ignore[assignment]  # connected, as far as the check cares
            link.peer_ip = ip
        pool._check_listen_addresses(lambda node, what: None)
        assert pool.peer_host(parse_spec(_spec(listen)).node("n2"), "0.0.0.0") == "10.0.0.2"
        for link in pool.links:
            link.conn = None
        return pool.problems

    problems = asyncio.run(check())
    assert problems.get("n1") == problem
