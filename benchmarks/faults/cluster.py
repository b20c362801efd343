"""The soak's cluster: 4 nodes on 2 emulated WAN sites, one node's export on a small disk of its own.

    east: n1 n2  <-- rtt_ms -->  west: n3 n4

Every daemon runs in its site's network namespace (benchmarks.wan), so packets
between the sites can be dropped and delayed with iptables inside the sites, and
connections cut with `ss -K`. The mounts are in this mount namespace: the
workload runs here. n4's export lives on a tmpfs of `disk_mib` MiB made for the
run (and removed after it), so the harness can fill that disk without touching
any other file system: the filler is a file beside the export, outside the
namespace.

The CLI and the library reach the daemons from inside a site (`in_site`):
`gmount up` after a node was killed (it restarts just that node and tells the
others its new address) runs there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from types import TracebackType
from typing import Any

from benchmarks.wan import sites as wan
from gmountpy.cluster import state as state_store
from gmountpy.cluster.config import ClusterSpec, load_spec
from gmountpy.cluster.state import ClusterState
from gmountpy.launch.orchestrate import pid_is_daemon

SITES = {"east": ["n1", "n2"], "west": ["n3", "n4"]}
NODES = [node for members in SITES.values() for node in members]
SITE_OF = {node: site for site, members in SITES.items() for node in members}
FULL_NODE = "n4"  # whose export is on a disk of its own, filled on purpose
BIN = Path(sys.executable).parent
GMOUNT = str(BIN / "gmount")


class SoakCluster:
    """Brings the sites, the disk and the gmount cluster up in `__enter__`, and everything down in `__exit__`."""

    def __init__(self, base: Path, name: str, *, disk_mib: int, rtt_ms: float, tuning: str = "") -> None:
        self.base = base
        self.name = name
        self.disk_mib = disk_mib
        self.rtt_ms = rtt_ms
        self.tuning = tuning
        self.disk = base / FULL_NODE / "disk"
        self.filler = self.disk / "filler"  # outside the export: fills the disk, never seen in the namespace
        self._stack = ExitStack()
        self.emu: wan.Emulation | None = None
        self.spec: ClusterSpec | None = None
        self._disk_mounted = False

    # -- up and down -----------------------------------------------------------------------------

    def __enter__(self) -> SoakCluster:
        try:
            self._build()
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise
        return self

    def _build(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        for node in NODES:
            (self.base / node / "mnt").mkdir(parents=True, exist_ok=True)
            if node != FULL_NODE:
                (self.base / node / "export").mkdir(parents=True, exist_ok=True)
        self.disk.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.disk_mib}m,mode=0755", f"gmsoak-{self.name}",
                        str(self.disk)], check=True, capture_output=True, text=True)
        self._disk_mounted = True
        (self.disk / "export").mkdir()
        lines = [f'name = "{self.name}"', "[defaults]", f'export = "{self.base}/{{node}}/export"',
                 f'mountpoint = "{self.base}/{{node}}/mnt"']
        for site, members in SITES.items():
            lines += [f"[sites.{site}]", "nodes = [" + ", ".join(f'"{n}"' for n in members) + "]"]
        lines += ["[[links]]", 'sites = ["east", "west"]', f"rtt_ms = {self.rtt_ms}"]
        lines += [f"[nodes.{FULL_NODE}]", f'export = "{self.disk}/export"']
        if self.tuning.strip():
            lines += ["[tuning]", self.tuning.strip()]
        cluster_file = self.base / "cluster.toml"
        cluster_file.write_text("\n".join(lines) + "\n")
        self.emu = self._stack.enter_context(wan.emulate(cluster_file, workdir=self.base))
        self.spec = self._stack.enter_context(wan.gmount_cluster(self.emu))

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            self._stack.close()  # gmount down, then the sites
        finally:
            if self._disk_mounted:
                result = subprocess.run(["umount", str(self.disk)], capture_output=True, text=True)
                if result.returncode != 0:
                    subprocess.run(["umount", "-l", str(self.disk)], capture_output=True)
                self._disk_mounted = False

    # -- what it is ----------------------------------------------------------------------------------

    @property
    def cluster_file(self) -> str:
        assert self.emu is not None
        return self.emu.cluster_file

    def state(self) -> ClusterState:
        state = state_store.load(self.name)
        if state is None:
            raise RuntimeError(f"cluster {self.name} has no state: it is not up")
        return state

    def mount(self, node: str) -> Path:
        return self.base / node / "mnt"

    def export(self, node: str) -> Path:
        return self.disk / "export" if node == FULL_NODE else self.base / node / "export"

    def pid(self, node: str) -> int:
        return self.state().nodes[node].pid

    def port(self, node: str) -> int:
        return self.state().nodes[node].port

    def address(self, node: str) -> str:
        assert self.emu is not None
        return self.emu.address[node]

    def alive(self, node: str) -> bool:
        return pid_is_daemon(self.pid(node))

    def log_path(self, node: str) -> Path:
        return Path(self.state().nodes[node].log)

    def netns(self, site: str) -> str:
        assert self.emu is not None
        return self.emu.netns[site]

    def subnet(self, site: str) -> str:
        """The site's addresses (benchmarks.wan gives site i 10.200.i.0/24)."""
        assert self.emu is not None
        return f"10.200.{list(self.emu.netns).index(site) + 1}.0/24"

    # -- doing things in a site ----------------------------------------------------------------------

    def site_argv(self, node: str, argv: list[str]) -> list[str]:
        """`argv` run as on `node`: inside its site's network namespace (its mount is everywhere)."""
        return ["nsenter", f"--net=/run/netns/{self.netns(SITE_OF[node])}", "--", *argv]

    def in_site(self, site: str, argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """Run a command to completion inside a site's network namespace."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(["nsenter", f"--net=/run/netns/{self.netns(site)}", "--", *argv], **kwargs)

    def spawn_in_site(self, site: str, argv: list[str], **kwargs: Any) -> subprocess.Popen[str]:
        """Start a process inside a site's network namespace (the caller ends it)."""
        return subprocess.Popen(["nsenter", f"--net=/run/netns/{self.netns(site)}", "--", *argv], text=True,
                                **kwargs)

    def up_again(self, timeout: float = 180.0) -> tuple[bool, str]:
        """`gmount up` as a user runs it after a node died: restarts the dead nodes. (ok, its output)."""
        started = time.monotonic()
        try:
            result = self.in_site("east", [GMOUNT, "up", self.cluster_file], timeout=timeout)
        except subprocess.TimeoutExpired:
            return False, f"gmount up did not finish within {timeout:.0f} s"
        output = (result.stdout + result.stderr).strip()
        return result.returncode == 0, f"{output} ({time.monotonic() - started:.1f} s)"

    def mounted(self, node: str) -> bool:
        with open("/proc/self/mounts") as f:
            return any(line.split(" ")[1] == str(self.mount(node)) for line in f)

    def reload_spec(self) -> ClusterSpec:
        return load_spec(self.cluster_file)


def problem() -> str | None:
    """Why the soak cannot run here, or None."""
    if (why := wan.problem()) is not None:
        return why
    if shutil.which("fusermount3") is None or not os.path.exists("/dev/fuse"):
        return "FUSE is not usable (fusermount3, /dev/fuse)"
    for tool in ("ss", "make", "tar", "dd", "sha256sum"):
        if shutil.which(tool) is None:
            return f"{tool} not found"
    return None
