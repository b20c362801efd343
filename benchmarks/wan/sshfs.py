"""A central file server at one site, mounted by every node: the "shared home over the WAN" most groups run.

NFS cannot run here (this kernel has no nfsd), so the server is OpenSSH's sshd (its internal
sftp server) on one node's address, serving one directory; every node mounts it with sshfs,
started in the node's site namespace (and its cgroup, when nodes own their CPUs). sshd runs
outside every node's cgroup: a file server is a machine of its own. Metadata and data both
live at the server: a node at another site pays the WAN for every open, stat, read and write.
Keys and the sshd configuration are made for the run under <work>/sshfs; nothing in ~ or /etc.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from . import sites as wan

#: sshfs as a user mounts it: its defaults, with host keys of this run not checked
SSHFS_OPTIONS = "StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null,LogLevel=ERROR"
#: for a workflow whose jobs hand files from node to node: no cached attributes or directory entries
#: (sshfs's own cache keeps them 20 s by default: a job would see a file another node just wrote as
#: it was before, or not at all)
SSHFS_HANDOFF_OPTIONS = SSHFS_OPTIONS + ",cache=no,attr_timeout=0,entry_timeout=0,negative_timeout=0"


class SshfsError(wan.WanError):
    """The central server or a node's sshfs mount could not be started or used."""


def problem() -> str | None:
    """Why the central server cannot run here, or None."""
    for binary in ("sshfs", "ssh-keygen"):
        if shutil.which(binary) is None:
            return f"{binary} not found (Debian: sshfs openssh-client)"
    if not os.path.exists("/usr/sbin/sshd"):
        return "/usr/sbin/sshd not found (Debian: openssh-server)"
    return None


def wait_port(emu: wan.Emulation, node: str, host: str, port: int, timeout: float = 20) -> None:
    """Until something listens on host:port, seen from a node's site."""
    probe = f"import socket; socket.create_connection(({host!r}, {port}), timeout=1).close()"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if emu.run(node, [sys.executable, "-c", probe], capture_output=True).returncode == 0:
            return
        time.sleep(0.2)
    raise wan.WanError(f"nothing listens on {host}:{port} in {node}'s site after {timeout:g}s")


def wait_mounted(path: Path, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open("/proc/self/mounts") as f:
            if any(line.split(" ")[1] == str(path) for line in f):
                return
        time.sleep(0.1)
    raise wan.WanError(f"{path} was not mounted within {timeout:g}s")


class CentralServer:
    """sshd on `server` serving <work>/sshfs/server; an sshfs mount of it on every node."""

    name = "sshfs"

    def __init__(self, emu: wan.Emulation, work: Path, server: str, nodes: Sequence[str] | None = None,
                 name: str = "sshfs", options: str = SSHFS_OPTIONS) -> None:
        self.emu, self.work = emu, work / "sshfs"
        self.server = server
        self.nodes = list(nodes if nodes is not None else emu.address)
        self.data = self.work / "server"
        self.name = name
        self.options = options
        self.processes: dict[str, subprocess.Popen[Any]] = {}

    def place(self, kind: str, path: str, holder: str) -> None:
        """A target made before the run, straight into the served directory (the server holds everything)."""
        target = self.data / path
        if kind == "dir":
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.touch()

    def mount(self, node: str) -> Path:
        return self.work / "mnt" / node

    def check(self) -> None:
        """Every node's mount answers and reaches the server's directory; else SshfsError naming the node."""
        marker = self.data / ".central-check"
        marker.write_text(str(time.time()))
        for node in self.nodes:
            process = self.processes.get(f"sshfs:{node}")
            if process is None or process.poll() is not None:
                raise SshfsError(f"{node}: its sshfs client is not running")
            try:
                seen = (self.mount(node) / ".central-check").read_text()
            except OSError as exc:
                raise SshfsError(f"{node}: {self.mount(node)} does not reach the server: {exc}") from None
            if seen != marker.read_text():
                raise SshfsError(f"{node}: {self.mount(node)} shows stale contents")
        marker.unlink()

    @contextmanager
    def running(self) -> Iterator[None]:
        with ExitStack() as stack:
            stack.callback(self._teardown)
            keys = self.work / "keys"
            keys.mkdir(parents=True, exist_ok=True)
            self.data.mkdir(parents=True, exist_ok=True)
            for key in ("host", "user"):
                if not (keys / key).exists():
                    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / key)], check=True)
            (keys / "authorized_keys").write_text((keys / "user.pub").read_text())
            address = self.emu.address[self.server]
            config = keys / "sshd_config"
            config.write_text("\n".join([
                f"ListenAddress {address}:22", f"HostKey {keys / 'host'}",
                f"AuthorizedKeysFile {keys / 'authorized_keys'}", "PermitRootLogin prohibit-password",
                "PasswordAuthentication no", "StrictModes no", "UsePAM no", f"PidFile {self.work / 'sshd.pid'}",
                "Subsystem sftp internal-sftp", "LogLevel ERROR", "MaxStartups 100", "MaxSessions 100", ""]))
            os.makedirs("/run/sshd", exist_ok=True)
            self.processes["sshd"] = self.emu.spawn(self.server, ["/usr/sbin/sshd", "-D", "-e", "-f", str(config)],
                                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wait_port(self.emu, self.server, address, 22)
            for node in self.nodes:
                mnt = self.mount(node)
                mnt.mkdir(parents=True, exist_ok=True)
                self.emu.add_mount(str(mnt))
                self.processes[f"sshfs:{node}"] = self.emu.spawn(
                    node, ["sshfs", "-f", f"root@{address}:{self.data}", str(mnt), "-o",
                           f"IdentityFile={keys / 'user'},{self.options}"],
                    node=node, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for node in self.nodes:
                wait_mounted(self.mount(node))
            yield

    def _teardown(self) -> None:
        for node in self.nodes:
            if os.path.ismount(self.mount(node)):
                subprocess.run(["fusermount3", "-u", "-z", str(self.mount(node))], capture_output=True)
        for process in self.processes.values():
            wan._kill(process.pid, self.emu.starts.get(str(process.pid)))
