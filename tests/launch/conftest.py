"""A real OpenSSH sshd for the SSH launcher tests, on loopback, with throwaway keys.

It listens on one free high port at 127.0.0.1 and at 127.0.1.1-4 (so nodes
can have distinct addresses), accepts only a key generated for this test
session, and marks every session it starts with GMOUNT_TEST_SSHD=<its dir>
in the environment: that is how the tests find (and, at the very end, kill
by pid) every process they caused, without touching anyone else's.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ..conftest import fuse_problem, require

SSHD = "/usr/sbin/sshd"
NODE_ADDRESSES = ["127.0.1.1", "127.0.1.2", "127.0.1.3", "127.0.1.4"]
MARKER = "GMOUNT_TEST_SSHD"


def sshd_problem() -> str | None:
    if not os.path.exists(SSHD):
        return f"{SSHD} is missing (Debian package openssh-server)"
    if shutil.which("ssh-keygen") is None:
        return "ssh-keygen is missing (Debian package openssh-client)"
    if not os.path.isdir("/run/sshd"):
        try:
            os.makedirs("/run/sshd", mode=0o755)  # sshd's privilege separation directory
        except OSError as exc:
            return f"/run/sshd (sshd's privilege separation directory) is missing and cannot be made: {exc}"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gmount-test", "-f", str(path)],
                   check=True, capture_output=True)


@dataclass
class Sshd:
    """The running sshd and what a cluster file needs to use it."""

    dir: Path
    port: int
    pid: int
    user: str
    user_key: Path          # authorized
    other_key: Path         # not authorized: "wrong key"
    known_hosts: Path

    @property
    def marker(self) -> str:
        return str(self.dir)

    def cluster_file(self, base: Path, name: str, sites: dict[str, list[str]],
                     links: list[tuple[str, str, float]], *, distinct_addresses: bool = False,
                     nodes: dict[str, dict[str, object]] | None = None, ssh: dict[str, object] | None = None,
                     defaults: dict[str, object] | None = None, tuning: dict[str, float] | None = None) -> Path:
        """Write a launcher = "ssh" cluster file whose nodes are all reached through this sshd."""
        ssh_table: dict[str, object] = {"known_hosts": str(self.known_hosts), "identity": [str(self.user_key)],
                                        "config": False}
        ssh_table.update(ssh or {})
        default_table: dict[str, object] = {
            "host": f"{self.user}@127.0.0.1", "ssh_port": self.port, "python": sys.executable,
            "export": f"{base}/{{node}}/export", "mountpoint": f"{base}/{{node}}/mnt"}
        default_table.update(defaults or {})
        node_tables: dict[str, dict[str, object]] = {}
        if distinct_addresses:
            all_nodes = [n for members in sites.values() for n in members]
            for node, address in zip(all_nodes, NODE_ADDRESSES, strict=False):
                node_tables[node] = {"host": f"{self.user}@{address}", "listen": address}
        for node, table in (nodes or {}).items():
            node_tables.setdefault(node, {}).update(table)
        lines = [f'name = "{name}"', 'launcher = "ssh"', "", "[ssh]"]
        lines += [f"{k} = {toml_value(v)}" for k, v in ssh_table.items()]
        lines += ["", "[defaults]"] + [f"{k} = {toml_value(v)}" for k, v in default_table.items()]
        for node, table in node_tables.items():
            lines += ["", f"[nodes.{node}]"] + [f"{k} = {toml_value(v)}" for k, v in table.items()]
        for site, members in sites.items():
            lines += ["", f"[sites.{site}]", "nodes = [" + ", ".join(f'"{n}"' for n in members) + "]"]
        for a, b, rtt in links:
            lines += ["", "[[links]]", f'sites = ["{a}", "{b}"]', f"rtt_ms = {rtt}"]
        if tuning:
            lines += ["", "[tuning]"] + [f"{k} = {v}" for k, v in tuning.items()]
        base.mkdir(parents=True, exist_ok=True)
        for node in (n for members in sites.values() for n in members):  # `gmount up` refuses a missing export
            export = str(node_tables.get(node, {}).get("export", default_table["export"])).replace("{node}", node)
            if export.startswith(str(base)):
                Path(export).mkdir(parents=True, exist_ok=True)
        path = base / "cluster.toml"
        path.write_text("\n".join(lines) + "\n")
        return path


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def marked_pids(marker: str) -> list[int]:
    """Processes started through the test sshd (its SetEnv marker is in their environment)."""
    needle = f"{MARKER}={marker}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def mounts_under(base: Path) -> list[str]:
    prefix = str(base).rstrip("/") + "/"
    with open("/proc/self/mounts") as f:
        return [line.split(" ")[1] for line in f if line.split(" ")[1].startswith(prefix)]


def _wait_listening(addresses: list[str], port: int, process: subprocess.Popen[bytes], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    pending = list(addresses)
    while pending and time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        try:
            with socket.create_connection((pending[0], port), timeout=1) as s:
                if s.recv(64).startswith(b"SSH-2.0"):
                    pending.pop(0)
                    continue
        except OSError:
            pass
        time.sleep(0.05)
    return not pending


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    """OpenSSH sshd as a child process for the whole session; always killed (by pid) at the end."""
    require("OpenSSH sshd", sshd_problem())
    require("FUSE", fuse_problem())
    base = tmp_path_factory.mktemp("sshd")
    keygen(base / "host_ed25519")
    keygen(base / "id_ed25519")
    keygen(base / "wrong_ed25519")
    shutil.copy(base / "id_ed25519.pub", base / "authorized_keys")
    state_home = os.environ.get("XDG_STATE_HOME", str(base / "state"))
    process: subprocess.Popen[bytes] | None = None
    port = 0
    for _attempt in range(5):
        port = free_port()
        config = base / "sshd_config"
        config.write_text("\n".join([
            f"Port {port}",
            *(f"ListenAddress {a}" for a in ["127.0.0.1", *NODE_ADDRESSES]),
            f"HostKey {base}/host_ed25519",
            "PidFile none",
            "StrictModes no",
            "UsePAM no",
            f"AuthorizedKeysFile {base}/authorized_keys",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "MaxStartups 200",
            f"SetEnv {MARKER}={base} XDG_STATE_HOME={state_home}",
            "",
        ]))
        log = open(base / "sshd.log", "ab")  # noqa: SIM115 -- handed to sshd, closed here once it has it
        process = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdout=log, stderr=log,
                                   stdin=subprocess.DEVNULL)
        log.close()
        if _wait_listening(["127.0.0.1", *NODE_ADDRESSES], port, process, 10.0):
            break
        process.kill()
        process.wait()
        process = None
    if process is None:
        require("OpenSSH sshd", "did not start: " + (base / "sshd.log").read_text()[-2000:])
        return
    host_key = (base / "host_ed25519.pub").read_text().split()[:2]
    (base / "known_hosts").write_text("".join(
        f"[{a}]:{port} {host_key[0]} {host_key[1]}\n" for a in ["127.0.0.1", *NODE_ADDRESSES]))
    server = Sshd(dir=base, port=port, pid=process.pid, user=getpass.getuser(),
                  user_key=base / "id_ed25519", other_key=base / "wrong_ed25519",
                  known_hosts=base / "known_hosts")
    try:
        yield server
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        # Safety net: anything still carrying our marker was started through this sshd by a test.
        for pid in marked_pids(server.marker):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
