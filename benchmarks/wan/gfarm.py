"""Gfarm (Debian's gfmd, gfsd, gfarm2fs and gfarm-client) as a peer system inside the emulated WAN sites.

Gfarm is the baseline of the paper gmountpy descends from (GMount: Montage in 547 s on
GMount against 3,638 s on Gfarm across sites). Topology, one machine, the sites of
benchmarks.wan, everything run by this process's user without touching /etc or ~:

    metadata node   one gfmd (metadata in memory: the `none` backend, as in Gfarm's own
                    tests) in the site namespace of the metadata node (default: the first
                    node), listening on GFMD_PORT
    every node      one gfsd (`-h <address> -l <address> -r <spool>`), registered with
                    `gfhost -c`; its file copies live in <work>/gfarm/<node>/spool
    every node      one gfarm2fs (FUSE 2) mount at <work>/gfarm/<node>/mnt, started in the
                    node's site namespace and in a UTS namespace of its own whose hostname is
                    the node's gfsd name: libgfarm takes gethostname() for "this host", so
                    new files are written to the node's own gfsd (write_local_priority, the
                    default) and reads of a local copy stay on the node, as on real hosts;
                    attributes cached `stat_cache` seconds (gfarm2fs -E and the kernel's TTLs)

Configuration is private: the config files, the shared secret (`shared_key_file`) and the
user map sit under <work>/gfarm/etc; every Gfarm process gets GFARM_CONFIG_FILE. gfsd and
gfarm2fs run in their node's cgroup (when nodes own their CPUs); gfmd, like a file server
a site runs on its own machine, runs outside every node's cgroup.

Names: a node's gfsd is registered under its emulated IPv4 address (a literal resolves
without /etc/hosts), which is also the hostname of its gfarm2fs's UTS namespace.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from . import sites as wan

#: Debian packages: the metadata server, the file system node daemon, the FUSE client, the commands
PACKAGES = ("gfmd", "gfsd", "gfarm2fs", "gfarm-client")
BINARIES = ("gfmd", "gfsd", "gfarm2fs", "gfhost", "gfkey", "gfwhere", "unshare")
GFMD_PORT = 10601
GFSD_PORT = 10600
COMMAND_TIMEOUT = 60.0


class GfarmError(wan.WanError):
    """Gfarm could not be started, used or stopped; the message says on which node and why."""


def problem() -> str | None:
    """Why Gfarm cannot run here, or None."""
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        return f"{', '.join(missing)} not found (Debian: {' '.join(PACKAGES)})"
    return None


def ensure_installed(log: Any) -> str | None:
    """apt-get install Gfarm when it is missing (as root on Debian); why it is still unusable, or None."""
    return wan.install_packages(PACKAGES, problem, log)


class Gfarm:
    """gfmd at one node's site, a gfsd and a gfarm2fs mount per node; `running()` builds and removes it all."""

    name = "gfarm"

    def __init__(self, emu: wan.Emulation, work: Path, nodes: Sequence[str] | None = None,
                 metadata_node: str | None = None, stat_cache: float = 1.0) -> None:
        self.emu = emu
        self.dir = work / "gfarm"
        self.nodes = list(nodes if nodes is not None else emu.address)
        self.metadata_node = metadata_node or self.nodes[0]
        # seconds gfarm2fs and the kernel keep attributes (gfarm2fs's default 1 s); 0 for workflows that
        # hand files from node to node, else a job may see the size a file had before another node wrote it
        self.stat_cache = stat_cache
        self.pending: list[tuple[str, str, str]] = []
        self.processes: dict[str, subprocess.Popen[Any]] = {}  # "gfmd", "gfsd:<node>", "gfarm2fs:<node>"
        self.failed = False

    # --- where things are --------------------------------------------------------------

    @property
    def etc(self) -> Path:
        return self.dir / "etc"

    @property
    def client_config(self) -> Path:
        return self.etc / "gfarm2.conf"

    def host(self, node: str) -> str:
        """The node's Gfarm host name (its emulated address)."""
        return self.emu.address[node]

    def spool(self, node: str) -> Path:
        return self.dir / node / "spool"

    def mount(self, node: str) -> Path:
        return self.dir / node / "mnt"

    def env(self) -> dict[str, str]:
        return {**os.environ, "GFARM_CONFIG_FILE": str(self.client_config)}

    # --- the benchmark's System protocol ---------------------------------------------------

    def place(self, kind: str, path: str, holder: str) -> None:
        """A target made once Gfarm is up, through `holder`'s mount: its copy lands on holder's gfsd."""
        self.pending.append((kind, path, holder))

    # --- commands ------------------------------------------------------------------------

    def command(self, *argv: str, node: str | None = None, check: bool = True) -> str:
        """A Gfarm command (gfhost, gfwhere, ...) run from a node's site (the only place gfmd is reachable)."""
        where = node or self.metadata_node
        try:
            result = self.emu.run(where, list(argv), capture_output=True, text=True, env=self.env(),
                                  timeout=COMMAND_TIMEOUT)
        except subprocess.TimeoutExpired as exc:
            raise GfarmError(f"{where}: `{' '.join(argv)}` took over {COMMAND_TIMEOUT:g}s") from exc
        if check and result.returncode != 0:
            raise GfarmError(f"{where}: `{' '.join(argv)}` failed: {(result.stderr or result.stdout).strip()[-600:]} "
                             f"(logs in {self.dir / 'log'})")
        return str(result.stdout)

    def holders(self, path: str) -> list[str]:
        """The nodes holding a copy of a file (path relative to the Gfarm root), from `gfwhere`."""
        out = self.command("gfwhere", "/" + path.lstrip("/"))
        by_host = {self.host(n): n for n in self.nodes}
        return [by_host[word] for word in out.split() if word in by_host]

    def check(self) -> None:
        """Gfarm serves every node: its daemons run, every gfsd answers, and a file written through each
        node's mount is read through another's; else GfarmError naming the node."""
        for key, process in self.processes.items():
            if process.poll() is not None:
                raise GfarmError(f"{key.replace(':', ' of ')} exited with status {process.returncode}; "
                                 f"see {self.dir / 'log'}")
        out = self.command("gfhost", "-l", check=False)
        for node in self.nodes:
            line = next((line for line in out.splitlines() if f" {self.host(node)} " in line), "")
            if not line[:1].isdigit():
                raise GfarmError(f"{node}: its gfsd ({self.host(node)}) is not serving; `gfhost -l` says: "
                                 f"{line.strip() or 'nothing'}")
        for i, node in enumerate(self.nodes):
            reader = self.nodes[(i + 1) % len(self.nodes)]
            marker = f".gfarm-check-{node}"
            stamp = f"{node} {time.time()}"
            seen = ""
            try:
                (self.mount(node) / marker).write_text(stamp)
                # gfarm2fs tells gfmd a file's new size when the kernel releases the file, just after
                # close() returned: another node may see the old size for a moment
                deadline = time.monotonic() + 5.0
                while seen != stamp and time.monotonic() < deadline:
                    seen = (self.mount(reader) / marker).read_text()
                    if seen != stamp:
                        time.sleep(0.1)
                (self.mount(node) / marker).unlink()
            except OSError as exc:
                raise GfarmError(f"{node}: a file written through its gfarm2fs mount could not be read back through "
                                 f"{reader}'s: {exc}") from None
            if seen != stamp:
                raise GfarmError(f"{node}: {reader} read {seen!r} from a file {node} wrote as {stamp!r}")

    # --- running ---------------------------------------------------------------------------

    @contextmanager
    def running(self) -> Iterator[None]:
        with ExitStack() as stack:
            stack.callback(self._teardown)
            stack.push(self._keep_logs_on_error)
            self._configure()
            self._start_gfmd()
            for node in self.nodes:
                self.command("gfhost", "-c", "-a", "x86_64-linux", "-p", str(GFSD_PORT), "-n", "1", self.host(node))
            for node in self.nodes:
                self._start_gfsd(node)
            self._wait_gfsds()
            for node in self.nodes:
                self._start_gfarm2fs(node)
            for node in self.nodes:
                self._wait_mounted(node)
            self._make_pending()
            yield

    def _configure(self) -> None:
        for sub in ("etc", "log", "run"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        for node in self.nodes:
            self.spool(node).mkdir(parents=True, exist_ok=True)
            self.mount(node).mkdir(parents=True, exist_ok=True)
        server = self.host(self.metadata_node)
        usermap = self.etc / "usermap"
        usermap.write_text("_gfarmfs root\n_gfarmmd root\n")  # the daemons' Gfarm users are this user
        common = [f"metadb_server_host {server}", f"metadb_server_port {GFMD_PORT}", "auth enable sharedsecret *",
                  f"shared_key_file {self.etc / 'shared_key'}", "sockopt keepalive",
                  "minimum_free_disk_space 64M",
                  # load averages here are this machine's, the same for every node (and high while
                  # others work): as on idle hosts of their own, every node counts as idle, so a
                  # write goes to the writer's own gfsd (write_local_priority), not to a random one
                  "schedule_idle_load_thresh 1000", "schedule_busy_load_thresh 1000"]
        (self.etc / "gfmd.conf").write_text("\n".join([
            *common, "admin_user root", "metadb_replication disable",
            f"metadb_journal_dir {self.dir / 'run' / 'journal'}", f"local_user_map {usermap}", ""]))
        (self.etc / "gfsd.conf").write_text("\n".join([*common, f"local_user_map {usermap}", ""]))
        self.client_config.write_text("\n".join([*common, ""]))
        result = subprocess.run(["gfkey", "-f", "-p", "31536000"], capture_output=True, text=True, env=self.env())
        if result.returncode != 0 or not (self.etc / "shared_key").exists():
            raise GfarmError(f"gfkey could not write {self.etc / 'shared_key'}: {result.stderr.strip()}")

    def _spawn(self, key: str, node: str, argv: list[str], confined: bool) -> None:
        # a process group of its own, not a session: gfsd's setpgid() fails in a session leader
        log = open(self.dir / "log" / f"{key.replace(':', '-')}.log", "wb")  # noqa: SIM115 (kept by the child)
        try:
            self.processes[key] = self.emu.spawn(node, argv, node=node if confined else None, env=self.env(),
                                                 stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                 start_new_session=False, process_group=0)
        finally:
            log.close()

    def _start_gfmd(self, timeout: float = 30.0) -> None:
        self._spawn("gfmd", self.metadata_node, ["gfmd", "-d", "-L", "notice", "-f", str(self.etc / "gfmd.conf"),
                                                 "-P", str(self.dir / "run" / "gfmd.pid")], confined=False)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.processes["gfmd"].poll() is not None:
                raise GfarmError(f"gfmd exited with status {self.processes['gfmd'].returncode}; "
                                 f"see {self.dir / 'log' / 'gfmd.log'}")
            if self._gfls_ok():
                return
            time.sleep(0.2)
        raise GfarmError(f"gfmd did not answer within {timeout:g}s; see {self.dir / 'log' / 'gfmd.log'}")

    def _gfls_ok(self) -> bool:
        result = self.emu.run(self.metadata_node, ["gfls", "-d", "/"], capture_output=True, text=True,
                              env=self.env(), timeout=COMMAND_TIMEOUT)
        return result.returncode == 0

    def _start_gfsd(self, node: str) -> None:
        address = self.host(node)
        self._spawn(f"gfsd:{node}", node, ["gfsd", "-d", "-L", "notice", "-f", str(self.etc / "gfsd.conf"),
                                           "-h", address, "-l", address, "-r", str(self.spool(node)),
                                           "-P", str(self.dir / "run" / f"gfsd-{node}.pid")], confined=True)

    def _wait_gfsds(self, timeout: float = 60.0) -> None:
        """Every gfsd connected to gfmd and answering (`gfhost -l` shows its load average)."""
        deadline = time.monotonic() + timeout
        up: set[str] = set()
        while True:
            for node in self.nodes:
                process = self.processes[f"gfsd:{node}"]
                if process.poll() is not None:
                    raise GfarmError(f"{node}: gfsd exited with status {process.returncode}; "
                                     f"see {self.dir / 'log' / f'gfsd-{node}.log'}")
            out = self.command("gfhost", "-l", check=False)
            up = {n for n in self.nodes for line in out.splitlines()
                  if f" {self.host(n)} " in line and line[:1].isdigit()}
            if up == set(self.nodes):
                return
            if time.monotonic() > deadline:
                raise GfarmError(f"gfsd not serving after {timeout:g}s on {', '.join(sorted(set(self.nodes) - up))}; "
                                 f"`gfhost -l`:\n{out}")
            time.sleep(0.3)

    def _start_gfarm2fs(self, node: str) -> None:
        mnt = self.mount(node)
        self.emu.add_mount(str(mnt))
        # a UTS namespace whose hostname is the node's gfsd name: libgfarm's idea of "this host"
        argv = ["unshare", "--uts", "--", "sh", "-c", 'hostname "$0" && exec "$@"', self.host(node),
                "gfarm2fs", "-f", str(mnt), "-E", str(self.stat_cache), "-o",
                f"attr_timeout={self.stat_cache},entry_timeout={self.stat_cache},loglevel=notice"]
        self._spawn(f"gfarm2fs:{node}", node, argv, confined=True)

    def _wait_mounted(self, node: str, timeout: float = 30.0) -> None:
        mnt = self.mount(node)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            process = self.processes[f"gfarm2fs:{node}"]
            if process.poll() is not None:
                raise GfarmError(f"{node}: gfarm2fs exited with status {process.returncode}; "
                                 f"see {self.dir / 'log' / f'gfarm2fs-{node}.log'}")
            if os.path.ismount(mnt):
                try:
                    os.listdir(mnt)
                    return
                except OSError:
                    pass
            time.sleep(0.1)
        raise GfarmError(f"{node}: gfarm2fs did not mount {mnt} within {timeout:g}s")

    def _make_pending(self) -> None:
        """Directories, then files in parallel, each through its holder's mount (its copy stays there)."""
        for kind, path, holder in self.pending:
            if kind == "dir":
                (self.mount(holder) / path).mkdir(parents=True, exist_ok=True)
        files = [(self.mount(holder) / path) for kind, path, holder in self.pending if kind == "file"]
        for parent in sorted({f.parent for f in files}):
            parent.mkdir(parents=True, exist_ok=True)
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda f: f.touch(), files))

    # --- teardown ---------------------------------------------------------------------------

    def _keep_logs_on_error(self, kind: type[BaseException] | None, *_: object) -> bool:
        self.failed = kind is not None
        return False

    def _teardown(self) -> None:
        """Unmount, stop every daemon we started (by pid), remove every file we made."""
        problems: list[str] = []
        for node in self.nodes:
            mnt = self.mount(node)
            if os.path.ismount(mnt):
                result = subprocess.run(["fusermount", "-u", "-z", str(mnt)], capture_output=True, text=True)
                if result.returncode != 0:
                    result = subprocess.run(["umount", "-l", str(mnt)], capture_output=True, text=True)
                if result.returncode != 0:
                    problems.append(f"{node}: unmounting {mnt}: {result.stderr.strip()}")
        for key in sorted(self.processes, key=lambda k: k == "gfmd"):  # clients, then gfsds, gfmd last
            process = self.processes[key]
            wan._kill(process.pid, self.emu.starts.get(str(process.pid)))
            if process.poll() is None:
                problems.append(f"{key} {process.pid} still running")
        if not problems and not self.failed:  # after a failure the logs stay, for whoever reads the error
            shutil.rmtree(self.dir, ignore_errors=True)
        if problems:
            raise GfarmError("Gfarm teardown left things behind (state in "
                             f"{self.dir}):\n  " + "\n  ".join(problems))
