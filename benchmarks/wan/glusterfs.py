"""GlusterFS (a distribute volume) as a peer system inside the emulated WAN sites.

Topology (one machine, the sites of benchmarks.wan):

    every node     one glusterd in its site's namespace, bound to the node's address
                   (management.transport.socket.bind-address), with its own working
                   directory, run directory, CLI socket and pid file: several glusterd on
                   one host never share /var/lib/glusterd or /var/run/glusterd.socket
    every node     one brick (a local directory); glusterd starts its glusterfsd in the
                   node's site namespace, so the brick listens on the node's address
    the cluster    the first node's glusterd probes the others; one distribute volume
                   over all bricks (no replication: one copy of each file, on the brick
                   chosen by the DHT hash of its name)
    every node     a FUSE client (`glusterfs -N --volfile-server=<own address>`) started in
                   its site's namespace, default volume options and mount timeouts
                   (attribute and entry timeout 1 s, like gmountpy's default tuning)

Nodes of one site share the site namespace (the emulation's design), but the bind
address keeps each glusterd's idea of "local" to its own node, so each node is a
separate peer. Traffic between sites crosses the hub and its delays.

glusterd puts two things outside the directories given to it: each brick's socket
(/var/run/gluster/<hash>.socket) and each brick's log (/var/log/glusterfs/bricks/
<brick path>.log). Both are named after our brick paths, read from the brick
processes' command lines, and removed at teardown. Whatever else runs in the site
namespaces is killed by the emulation's `down` as a last resort.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from itertools import pairwise, zip_longest
from pathlib import Path
from typing import Any

from . import sites as wan

#: Debian packages: glusterd, glusterfsd and the gluster CLI; the FUSE client
PACKAGES = ("glusterfs-server", "glusterfs-client")
BINARIES = ("glusterd", "glusterfsd", "glusterfs", "gluster")
CLI_TIMEOUT = 120.0
BRICK_LOGS = Path("/var/log/glusterfs/bricks")


class GlusterError(wan.WanError):
    """GlusterFS could not be started, used or stopped; the message says on which node and why."""


def problem() -> str | None:
    """Why GlusterFS cannot run here, or None."""
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        return f"{', '.join(missing)} not found (Debian: {' '.join(PACKAGES)})"
    return None


def ensure_installed(log: Callable[[str], None]) -> str | None:
    """apt-get install GlusterFS when it is missing (as root on Debian); returns why it is still unusable."""
    return wan.install_packages(PACKAGES, problem, log)


class GlusterFs:
    """A distribute volume over one brick per node; `running()` builds it and tears it all down."""

    name = "glusterfs"

    def __init__(self, emu: wan.Emulation, work: Path, nodes: Sequence[str] | None = None,
                 volume: str = "gmwbench") -> None:
        self.emu = emu
        self.dir = work / "glusterfs"
        self.nodes = list(nodes if nodes is not None else emu.address)
        self.volume = volume
        self.pending: list[tuple[str, str]] = []
        self.glusterd: dict[str, subprocess.Popen[Any]] = {}
        self.clients: dict[str, subprocess.Popen[Any]] = {}
        self.bricks: dict[int, list[str]] = {}  # brick pid -> its command line (for the socket and log)

    # --- where things are ------------------------------------------------------------

    def home(self, node: str) -> Path:
        return self.dir / node

    def brick(self, node: str) -> Path:
        return self.home(node) / "brick"

    def mount(self, node: str) -> Path:
        return self.home(node) / "mnt"

    def socket(self, node: str) -> Path:
        return self.home(node) / "gd.sock"

    def holder(self, path: Path) -> str:
        """The node whose brick holds a file, from the mount's `trusted.glusterfs.pathinfo`."""
        info = os.getxattr(path, "trusted.glusterfs.pathinfo").decode(errors="replace")
        for node in self.nodes:
            if f"<POSIX({self.brick(node)})" in info:
                return node
        raise GlusterError(f"{path}: no brick of ours in its pathinfo {info!r}")

    # --- the benchmark's System protocol ------------------------------------------------

    def place(self, kind: str, path: str, holder: str) -> None:
        """Remember a target; made through a mount once the volume is up (the DHT hash places it, not `holder`)."""
        self.pending.append((kind, path))

    # --- running -------------------------------------------------------------------------

    def cli(self, node: str, *args: str, check: bool = True) -> str:
        """The gluster CLI against one node's glusterd (its own socket), inside the node's site."""
        argv = ["gluster", "--mode=script", f"--glusterd-sock={self.socket(node)}",
                f"--log-file={self.home(node) / 'log' / 'cli.log'}", *args]
        try:
            result = self.emu.run(node, argv, capture_output=True, text=True, timeout=CLI_TIMEOUT)
        except subprocess.TimeoutExpired as exc:
            raise GlusterError(f"{node}: `gluster {' '.join(args)}` took over {CLI_TIMEOUT:g}s") from exc
        if check and result.returncode != 0:
            raise GlusterError(f"{node}: `gluster {' '.join(args)}` failed: "
                               f"{(result.stderr.strip() or result.stdout.strip())[-800:]} "
                               f"(glusterd log: {self.home(node) / 'log' / 'glusterd.log'})")
        return str(result.stdout)

    @contextmanager
    def running(self) -> Iterator[None]:
        """glusterd per node, peers, the volume started, a mount per node; everything removed on exit."""
        with ExitStack() as stack:
            stack.callback(self._teardown)
            for node in self.nodes:
                self._start_glusterd(node)
            for node in self.nodes:
                self._wait_glusterd(node)
            first = self.nodes[0]
            for node in self.nodes[1:]:
                self.cli(first, "peer", "probe", self.emu.address[node])
            self._wait_peers(first)
            bricks = [f"{self.emu.address[n]}:{self.brick(n)}" for n in self.nodes]
            self.cli(first, "volume", "create", self.volume, "transport", "tcp", *bricks, "force")
            self.cli(first, "volume", "start", self.volume)
            self._wait_bricks(first)
            for node in self.nodes:
                self._mount(node)
            for node in self.nodes:
                self._wait_connected(node)
            self._make_pending()
            yield

    def _start_glusterd(self, node: str) -> None:
        home = self.home(node)
        for sub in ("wd", "run", "log", "brick", "mnt"):
            (home / sub).mkdir(parents=True, exist_ok=True)
        options = {"working-directory": home / "wd", "run-directory": home / "run",
                   "glusterd-sockfile": self.socket(node),
                   "transport.socket.bind-address": self.emu.address[node]}
        argv = ["glusterd", "-N", f"--log-file={home / 'log' / 'glusterd.log'}", f"--pid-file={home / 'glusterd.pid'}"]
        for key, value in options.items():
            argv += ["--xlator-option", f"management.{key}={value}"]
        with open(home / "log" / "glusterd.out", "wb") as out:
            self.glusterd[node] = self.emu.spawn(node, argv, stdout=out, stderr=subprocess.STDOUT)

    def _wait_glusterd(self, node: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.glusterd[node].poll() is not None:
                raise GlusterError(f"{node}: glusterd exited with status {self.glusterd[node].returncode}; "
                                   f"see {self.home(node) / 'log'}")
            try:
                self.cli(node, "pool", "list")
                return
            except GlusterError:
                time.sleep(0.2)
        raise GlusterError(f"{node}: glusterd did not answer on {self.socket(node)} within {timeout:g}s")

    def _wait_peers(self, first: str, timeout: float = 60.0) -> None:
        """Every node's glusterd sees every other one as a connected member."""
        want = len(self.nodes) - 1
        deadline = time.monotonic() + timeout
        while True:
            ready = [n for n in self.nodes
                     if self.cli(n, "peer", "status").count("State: Peer in Cluster (Connected)") == want]
            if len(ready) == len(self.nodes):
                return
            if time.monotonic() > deadline:
                late = sorted(set(self.nodes) - set(ready))
                raise GlusterError(f"peers not all connected after {timeout:g}s; late: {', '.join(late)}")
            time.sleep(0.3)

    def _brick_status(self, node: str) -> list[dict[str, str]]:
        xml = self.cli(node, "volume", "status", self.volume, "--xml")
        root = ET.fromstring(xml)
        return [{child.tag: child.text or "" for child in entry} for entry in root.iter("node")]

    def _wait_bricks(self, first: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            entries = [e for e in self._brick_status(first) if e.get("path", "").startswith("/")]
            self._remember_bricks()
            if len(entries) == len(self.nodes) and all(e.get("status") == "1" for e in entries):
                return
            if time.monotonic() > deadline:
                down = [f"{e.get('hostname')}:{e.get('path')}" for e in entries if e.get("status") != "1"]
                raise GlusterError(f"volume {self.volume}: bricks not online after {timeout:g}s: "
                                   f"{', '.join(down) or f'{len(entries)} of {len(self.nodes)} listed'}")
            time.sleep(0.3)

    def _remember_bricks(self) -> None:
        """Brick pids from glusterd's pid files, with their command lines (socket and log paths)."""
        for node in self.nodes:
            for pidfile in (self.home(node) / "run" / "vols").glob("*/*.pid"):
                try:
                    pid = int(pidfile.read_text().strip())
                    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                except (OSError, ValueError):
                    continue
                if pid not in self.bricks and b"glusterfsd" in argv[0]:
                    self.bricks[pid] = [a.decode() for a in argv if a]

    def _mount(self, node: str) -> None:
        mnt = self.mount(node)
        self.emu.add_mount(str(mnt))
        self.clients[node] = self.emu.spawn(node, ["glusterfs", "-N", f"--volfile-server={self.emu.address[node]}",
                                                   f"--volfile-id={self.volume}",
                                                   f"--log-file={self.home(node) / 'log' / 'mount.log'}",
                                                   str(mnt)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def _wait_connected(self, node: str, timeout: float = 30.0) -> None:
        """Mounted, and the client connected to every brick (the meta xlator's per-client `connected`)."""
        mnt = self.mount(node)
        graph = mnt / ".meta" / "graphs" / "active"
        deadline = time.monotonic() + timeout
        connected = 0
        while time.monotonic() < deadline:
            if os.path.ismount(mnt):
                try:
                    clients = [d for d in graph.iterdir() if d.name.startswith(f"{self.volume}-client-")]
                    connected = sum("connected = 1" in (d / "private").read_text() for d in clients)
                except OSError:
                    clients = []
                if clients and connected == len(self.nodes):
                    return
            time.sleep(0.2)
        raise GlusterError(f"{node}: gluster mount {mnt} not connected to all bricks within {timeout:g}s "
                           f"({connected} of {len(self.nodes)}); see {self.home(node) / 'log' / 'mount.log'}")

    def _make_pending(self) -> None:
        """Directories first, then the files in parallel (each create costs WAN round trips).

        The files go round-robin over their directories: the kernel serialises creates in one
        directory (its lock is held across the FUSE round trip), so threads working through one
        directory at a time wait for each other. 5600 files over 4 sites: up in 177 s in
        directory order, 30 s round-robin (bench_meta --ops 100 --r-adj 0.2 --systems glusterfs)."""
        top = self.mount(self.nodes[0])
        for kind, path in self.pending:
            if kind == "dir":
                (top / path).mkdir(parents=True, exist_ok=True)
        by_directory: dict[Path, list[Path]] = {}
        for kind, path in self.pending:
            if kind == "file":
                target = top / path
                by_directory.setdefault(target.parent, []).append(target)
        for parent in sorted(by_directory):
            parent.mkdir(parents=True, exist_ok=True)
        files = [f for row in zip_longest(*by_directory.values()) for f in row if f is not None]
        with ThreadPoolExecutor(32) as pool:
            list(pool.map(lambda f: f.touch(), files))

    # --- teardown --------------------------------------------------------------------

    def _teardown(self) -> None:
        """Unmount, stop and delete the volume, kill what we started by pid, remove every file we made."""
        problems: list[str] = []
        for node in self.nodes:
            mnt = self.mount(node)
            if os.path.ismount(mnt):
                result = subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True, text=True)
                if result.returncode != 0:
                    problems.append(f"{node}: unmounting {mnt}: {result.stderr.strip()}")
        for process in self.clients.values():
            wan._kill(process.pid, self.emu.starts.get(str(process.pid)))
        self._remember_bricks()
        alive = [n for n, p in self.glusterd.items() if p.poll() is None]
        if alive:
            try:
                self.cli(alive[0], "volume", "stop", self.volume, "force", check=False)
                self.cli(alive[0], "volume", "delete", self.volume, check=False)
            except GlusterError as exc:  # a hung glusterd: the kills below still stop everything
                problems.append(str(exc))
        for pid in list(self.bricks):
            wan._kill(pid, None)
        for what, processes in (("glusterfs client", self.clients), ("glusterd", self.glusterd)):
            for node, process in processes.items():
                wan._kill(process.pid, self.emu.starts.get(str(process.pid)))
                if process.poll() is None:
                    problems.append(f"{node}: {what} {process.pid} still running")
        for argv in self.bricks.values():
            for flag, path in pairwise(argv):
                if flag == "-S" and path.startswith("/var/run/gluster/"):
                    Path(path).unlink(missing_ok=True)
                if flag == "-l" and Path(path).parent == BRICK_LOGS:
                    Path(path).unlink(missing_ok=True)
        for node in self.nodes:
            if os.path.ismount(self.mount(node)):
                problems.append(f"{node}: {self.mount(node)} still mounted")
        if not problems:
            shutil.rmtree(self.dir, ignore_errors=True)
        if problems:
            raise GlusterError("GlusterFS teardown left things behind (state in "
                               f"{self.dir}):\n  " + "\n  ".join(problems))
