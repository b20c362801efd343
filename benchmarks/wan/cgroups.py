"""Emulated nodes that own their CPUs: one cgroup per node, with a CPU set or a CPU quota.

On one machine every emulated node would otherwise share every CPU, and a run would show
contention, not placement. So each node gets a cgroup of its own:

- as many nodes as CPUs or fewer: each node its own CPUs (a cpuset; the CPUs split evenly);
- more nodes than CPUs: nodes pinned round-robin to the CPUs, each with a quota of
  CPUs/nodes (cpu.max, or cpu.cfs_quota_us on cgroup v1), so each gets the same share.

What lands in a node's cgroup:

- the processes the harness starts for a node (its gmount daemon, gfsd, gfarm2fs, sshfs):
  moved there by pid, or entering it before they exec (`preexec`);
- everything those processes start afterwards (the kernel puts a child in its parent's
  cgroup): so jobs a node's daemon starts itself run on that node's CPUs;
- every process that carries GMOUNT_NODE=<node> and GMOUNT_CLUSTER=<the emulation's cluster
  or one of its variants> in its environment: what make's gmount-sh, the Snakemake executor,
  `Cluster.run`/`spawn` and the pipelines' placement baselines give a job. A watcher process
  (`python -m benchmarks.wan.cgroups watch FILE`) follows the kernel's process events
  (the netlink process connector: every fork and exec on the machine) and moves such a
  process into its node's cgroup at its exec, before it does any work of its own -- whoever
  started it, so the rule holds however jobs are started.

Both hierarchies work: cgroup v2 (one tree with the cpuset and cpu controllers) and v1 (the
cpuset, cpu and cpuacct hierarchies mounted separately, as on this machine: Debian bookworm
in a VM with a hybrid layout, where cpuset and cpu are bound to v1).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

CFS_PERIOD_US = 100_000


class CgroupError(Exception):
    """A node's cgroup could not be made, used or removed; the message says which and why."""


@dataclass(frozen=True)
class Allotment:
    """What a node was given: its CPUs, and (when nodes share CPUs) its share of one CPU's time."""

    cpus: tuple[int, ...]
    quota: float | None = None  # CPUs' worth of time per period; None: all of `cpus`

    def describe(self) -> str:
        cpus = ",".join(str(c) for c in self.cpus)
        return f"CPU {cpus}" + (f" at {self.quota:g} CPU" if self.quota is not None else " (own)")


def layout(nodes: Sequence[str], cpus: Sequence[int]) -> dict[str, Allotment]:
    """Each node's CPUs: an even split when there are enough CPUs, else round-robin with equal quotas."""
    if not nodes:
        return {}
    if not cpus:
        raise CgroupError("no CPUs to give to the nodes")
    cpus = sorted(cpus)
    if len(nodes) <= len(cpus):
        per, extra = divmod(len(cpus), len(nodes))
        result: dict[str, Allotment] = {}
        start = 0
        for i, node in enumerate(nodes):
            count = per + (1 if i < extra else 0)
            result[node] = Allotment(tuple(cpus[start:start + count]))
            start += count
        return result
    share = round(len(cpus) / len(nodes), 4)
    return {node: Allotment((cpus[i % len(cpus)],), share) for i, node in enumerate(nodes)}


def parse_cpus(text: str) -> list[int]:
    """"0-2,5" -> [0, 1, 2, 5] (the kernel's CPU list format)."""
    result: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-")
            result += range(int(a), int(b) + 1)
        else:
            result.append(int(part))
    return result


# --- the two hierarchies ----------------------------------------------------------------------


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, fs type, options) of every cgroup file system."""
    found = []
    with open("/proc/self/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 4 and parts[2] in ("cgroup", "cgroup2"):
                found.append((parts[1].replace("\\040", " "), parts[2], set(parts[3].split(","))))
    return found


@dataclass
class Hierarchy:
    """Where the node cgroups go: v2 (one directory per node) or v1 (one per node per controller)."""

    version: int
    roots: dict[str, str]  # v2: {"unified": path}; v1: {"cpuset": path, "cpu": path, "cpuacct": path}

    @classmethod
    def detect(cls) -> Hierarchy:
        mounts = _mounts()
        for point, fstype, _ in mounts:
            if fstype != "cgroup2":
                continue
            try:
                controllers = Path(point, "cgroup.controllers").read_text().split()
            except OSError:
                continue
            if "cpuset" in controllers and "cpu" in controllers:
                return cls(2, {"unified": point})
        roots: dict[str, str] = {}
        for point, fstype, options in mounts:
            if fstype == "cgroup":
                for controller in ("cpuset", "cpu", "cpuacct"):
                    if controller in options and controller not in roots:
                        roots[controller] = point
        if "cpuset" in roots and "cpu" in roots:
            return cls(1, roots)
        raise CgroupError("no cgroup hierarchy with the cpuset and cpu controllers is mounted (v2: enable them in "
                          "cgroup.subtree_control; v1: mount the cpuset and cpu hierarchies)")

    def directories(self, group: str) -> list[Path]:
        """The directories of one cgroup (`group` relative to the roots), one per hierarchy."""
        return list(dict.fromkeys(Path(root, group) for root in self.roots.values()))

    def describe(self) -> str:
        if self.version == 2:
            return f"cgroup v2 at {self.roots['unified']}"
        return "cgroup v1 (" + ", ".join(f"{c} at {p}" for c, p in self.roots.items()) + ")"


def problem() -> str | None:
    """Why node cgroups cannot be made here, or None."""
    if os.geteuid() != 0:
        return "cgroups need root"
    try:
        Hierarchy.detect()
    except CgroupError as exc:
        return str(exc)
    return None


# --- the node cgroups ---------------------------------------------------------------------------


@dataclass
class NodeCgroups:
    """One cgroup per node under `<root>/<top>/<node>`, with the node's allotment; `remove` undoes it all."""

    top: str                                   # e.g. gmw1234xab12: the emulation's prefix
    allotments: dict[str, Allotment]
    hierarchy: Hierarchy
    made: list[str] = field(default_factory=list)  # directories created, in creation order

    @classmethod
    def create(cls, top: str, allotments: Mapping[str, Allotment]) -> NodeCgroups:
        groups = cls(top, dict(allotments), Hierarchy.detect())
        try:
            groups._build()
        except BaseException:
            groups.remove()
            raise
        return groups

    def _write(self, path: Path, value: str) -> None:
        try:
            path.write_text(value)
        except OSError as exc:
            raise CgroupError(f"writing {value!r} to {path}: {exc.strerror or exc}") from None

    def _mkdir(self, path: Path) -> None:
        try:
            path.mkdir()
        except FileExistsError:
            raise CgroupError(f"{path} exists already: another emulation with prefix {self.top}?") from None
        except OSError as exc:
            raise CgroupError(f"creating cgroup {path}: {exc.strerror or exc}") from None
        self.made.append(str(path))

    def _build(self) -> None:
        h = self.hierarchy
        if h.version == 2:
            root = Path(h.roots["unified"])
            enabled = (root / "cgroup.subtree_control").read_text().split()
            missing = [c for c in ("cpuset", "cpu") if c not in enabled]
            if missing:
                self._write(root / "cgroup.subtree_control", " ".join(f"+{c}" for c in missing))
            top = root / self.top
            self._mkdir(top)
            self._write(top / "cgroup.subtree_control", "+cpuset +cpu")
            for node, allot in self.allotments.items():
                d = top / node
                self._mkdir(d)
                self._write(d / "cpuset.cpus", ",".join(map(str, allot.cpus)))
                quota = "max" if allot.quota is None else str(round(allot.quota * CFS_PERIOD_US))
                self._write(d / "cpu.max", f"{quota} {CFS_PERIOD_US}")
            return
        for controller, root_text in h.roots.items():
            root = Path(root_text)
            if str(root / self.top) in self.made:  # co-mounted controllers (cpu,cpuacct): one directory
                continue
            top = root / self.top
            self._mkdir(top)
            if controller == "cpuset":  # v1: a new cpuset is empty; it needs CPUs and memory nodes first
                self._write(top / "cpuset.cpus", (root / "cpuset.cpus").read_text().strip())
                self._write(top / "cpuset.mems", (root / "cpuset.mems").read_text().strip())
            for node, allot in self.allotments.items():
                d = top / node
                self._mkdir(d)
                if controller == "cpuset":
                    self._write(d / "cpuset.cpus", ",".join(map(str, allot.cpus)))
                    self._write(d / "cpuset.mems", (top / "cpuset.mems").read_text().strip())
                if (d / "cpu.cfs_quota_us").exists():
                    self._write(d / "cpu.cfs_period_us", str(CFS_PERIOD_US))
                    quota = -1 if allot.quota is None else round(allot.quota * CFS_PERIOD_US)
                    self._write(d / "cpu.cfs_quota_us", str(quota))

    # --- putting processes in -------------------------------------------------------------------

    def procs_files(self, node: str) -> list[str]:
        if node not in self.allotments:
            raise CgroupError(f"no cgroup for node {node!r} (nodes: {', '.join(self.allotments)})")
        return [str(d / "cgroup.procs") for d in self.hierarchy.directories(f"{self.top}/{node}")]

    def enter(self, pid: int, node: str) -> None:
        """Move a process (all its threads) into a node's cgroup; its later children follow it."""
        for path in self.procs_files(node):
            try:
                with open(path, "w") as f:
                    f.write(str(pid))
            except ProcessLookupError:
                return
            except OSError as exc:
                raise CgroupError(f"moving pid {pid} into node {node}'s cgroup ({path}): "
                                  f"{exc.strerror or exc}") from None

    def preexec(self, node: str) -> Callable[[], None]:
        """A `preexec_fn` that puts the child into a node's cgroup before it execs (no window on other CPUs)."""
        files = self.procs_files(node)

        def enter_self() -> None:
            for path in files:
                fd = os.open(path, os.O_WRONLY)
                try:
                    os.write(fd, b"0")  # "0": the writing process itself
                finally:
                    os.close(fd)

        return enter_self

    def pids(self, node: str) -> list[int]:
        path = self.procs_files(node)[0]
        try:
            return [int(p) for p in Path(path).read_text().split()]
        except OSError:
            return []

    def node_of(self, pid: int) -> str | None:
        """The node whose cgroup a process is in (by its cpuset on v1, its only cgroup on v2), or None."""
        try:
            lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        except OSError:
            return None
        for line in lines:
            _, controllers, path = line.split(":", 2)
            if self.hierarchy.version == 2 and controllers != "":
                continue
            if self.hierarchy.version == 1 and "cpuset" not in controllers.split(","):
                continue
            parts = path.strip("/").split("/")
            if len(parts) >= 2 and parts[-2] == self.top and parts[-1] in self.allotments:
                return parts[-1]
        return None

    # --- what each node used ------------------------------------------------------------------

    def usage(self, node: str) -> dict[str, object]:
        """CPU time the node's cgroup has used: total seconds, and per CPU where the kernel says (v1)."""
        dirs = self.hierarchy.directories(f"{self.top}/{node}")
        if self.hierarchy.version == 2:
            stat = dict(line.split() for line in (dirs[0] / "cpu.stat").read_text().splitlines() if line.strip())
            throttled = int(stat.get("throttled_usec", 0)) / 1e6
            return {"cpu_seconds": int(stat["usage_usec"]) / 1e6, "per_cpu": None, "throttled_seconds": throttled}
        acct = Path(self.hierarchy.roots.get("cpuacct", self.hierarchy.roots["cpu"]), self.top, node)
        per_cpu = [int(v) / 1e9 for v in (acct / "cpuacct.usage_percpu").read_text().split()]
        throttled = 0.0
        stat_path = Path(self.hierarchy.roots["cpu"], self.top, node, "cpu.stat")
        if stat_path.exists():
            stat = dict(line.split() for line in stat_path.read_text().splitlines() if line.strip())
            throttled = int(stat.get("throttled_time", 0)) / 1e9
        return {"cpu_seconds": round(sum(per_cpu), 3), "per_cpu": {str(i): round(v, 3) for i, v in enumerate(per_cpu)},
                "throttled_seconds": round(throttled, 3)}

    def usage_all(self) -> dict[str, dict[str, object]]:
        return {node: self.usage(node) for node in self.allotments}

    def describe(self) -> dict[str, object]:
        """What each node was given, for reports."""
        return {"hierarchy": self.hierarchy.describe(), "cpus_on_machine": os.cpu_count(),
                "nodes": {node: {"cpus": list(a.cpus), "quota_cpus": a.quota, "text": a.describe()}
                          for node, a in self.allotments.items()}}

    # --- persistence and teardown -------------------------------------------------------------

    def to_dict(self) -> dict[str, object]:
        return {"top": self.top, "allotments": {n: asdict(a) for n, a in self.allotments.items()},
                "version": self.hierarchy.version, "roots": self.hierarchy.roots, "made": self.made}

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> NodeCgroups:
        allotments = {n: Allotment(tuple(a["cpus"]), a["quota"])  # type: ignore[index]
                      for n, a in data["allotments"].items()}  # type: ignore[attr-defined]
        hierarchy = Hierarchy(int(data["version"]), dict(data["roots"]))  # type: ignore[call-overload, arg-type]
        return cls(str(data["top"]), allotments, hierarchy, list(data["made"]))  # type: ignore[call-overload]

    def remove(self) -> list[str]:
        """Move what is left in the node cgroups to their parent's parent, delete them; the problems."""
        problems: list[str] = []
        for path in reversed(self.made):
            d = Path(path)
            if not d.exists():
                continue
            procs = d / "cgroup.procs"
            target = d.parent.parent / "cgroup.procs" if d.name in self.allotments else d.parent / "cgroup.procs"
            for _ in range(3):
                try:
                    left = procs.read_text().split()
                except OSError:
                    break
                if not left:
                    break
                for pid in left:
                    try:
                        target.write_text(pid)
                    except OSError:
                        pass
            try:
                d.rmdir()
            except OSError as exc:
                problems.append(f"could not remove cgroup {d}: {exc.strerror or exc}")
        return problems


# --- the watcher: jobs carrying GMOUNT_NODE go to their node's cgroup -----------------------------


NETLINK_CONNECTOR = 11
CN_IDX_PROC = 1
CN_VAL_PROC = 1
PROC_CN_MCAST_LISTEN = 1
PROC_EVENT_FORK = 0x1
PROC_EVENT_EXEC = 0x2
_NLMSG_HDR = struct.Struct("=IHHII")
_CN_MSG = struct.Struct("=IIIIHH")
_EVENT_HEAD = struct.Struct("=IIQ")  # what, cpu, timestamp


def job_node(environ: bytes, clusters: Iterable[str]) -> str | None:
    """The node a process's environment names, if it belongs to one of `clusters` (or a variant `<c>-...`)."""
    node = cluster = None
    for entry in environ.split(b"\0"):
        if entry.startswith(b"GMOUNT_NODE="):
            node = entry[len(b"GMOUNT_NODE="):].decode(errors="replace")
        elif entry.startswith(b"GMOUNT_CLUSTER="):
            cluster = entry[len(b"GMOUNT_CLUSTER="):].decode(errors="replace")
    if not node or not cluster:
        return None
    if any(cluster == c or cluster.startswith(c + "-") for c in clusters):
        return node
    return None


class Watcher:
    """Moves every process whose environment names one of our nodes into that node's cgroup."""

    def __init__(self, groups: NodeCgroups, clusters: Sequence[str]) -> None:
        self.groups = groups
        self.clusters = list(clusters)
        self.moved = 0

    def consider(self, pid: int) -> None:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            return  # gone already, or a kernel thread
        node = job_node(environ, self.clusters)
        if node is None or node not in self.groups.allotments:
            return
        try:
            self.groups.enter(pid, node)
            self.moved += 1
        except CgroupError:
            pass  # exited meanwhile

    def sweep(self) -> None:
        """Every process now running (at start, and after the kernel dropped events)."""
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                self.consider(int(entry))

    def run(self, ready: Callable[[], None]) -> None:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_CONNECTOR)
        try:
            sock.setsockopt(socket.SOL_SOCKET, 33, 8 << 20)  # SO_RCVBUFFORCE: bursts of forks
        except OSError:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        sock.bind((0, CN_IDX_PROC))
        payload = struct.pack("=I", PROC_CN_MCAST_LISTEN)
        cn = _CN_MSG.pack(CN_IDX_PROC, CN_VAL_PROC, 0, 0, len(payload), 0) + payload
        sock.send(_NLMSG_HDR.pack(_NLMSG_HDR.size + len(cn), 3, 0, 0, 0) + cn)  # NLMSG_DONE
        self.sweep()
        ready()
        offset = _NLMSG_HDR.size + _CN_MSG.size
        while True:
            try:
                data = sock.recv(65536)
            except OSError as exc:
                if exc.errno == 105:  # ENOBUFS: events were dropped; look at everything
                    self.sweep()
                    continue
                raise
            while len(data) >= offset + _EVENT_HEAD.size:
                length = _NLMSG_HDR.unpack_from(data)[0]
                what = _EVENT_HEAD.unpack_from(data, offset)[0]
                body = offset + _EVENT_HEAD.size
                if what == PROC_EVENT_FORK:
                    _, _, child_pid, child_tgid = struct.unpack_from("=IIII", data, body)
                    if child_pid == child_tgid:  # a process, not a thread
                        self.consider(child_tgid)
                elif what == PROC_EVENT_EXEC:
                    pid, tgid = struct.unpack_from("=II", data, body)
                    if pid == tgid:
                        self.consider(tgid)
                data = data[(length + 3) & ~3:] if length else b""  # NLMSG_ALIGN


def watch_main(argv: list[str]) -> int:
    """`python -m benchmarks.wan.cgroups watch FILE`: FILE holds {"groups": ..., "clusters": [...]}."""
    if len(argv) != 1:
        print("usage: python -m benchmarks.wan.cgroups watch FILE", file=sys.stderr)
        return 2
    config = json.loads(Path(argv[0]).read_text())
    groups = NodeCgroups.from_dict(config["groups"])
    watcher = Watcher(groups, config["clusters"])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))

    def ready() -> None:
        print("READY", flush=True)

    watcher.run(ready)
    return 0


def wait_for_node(groups: NodeCgroups, pid: int, node: str, timeout: float = 5.0) -> bool:
    """True once `pid` is in `node`'s cgroup (for tests and checks)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if groups.node_of(pid) == node:
            return True
        time.sleep(0.01)
    return False


if __name__ == "__main__":
    if sys.argv[1:2] == ["watch"]:
        sys.exit(watch_main(sys.argv[2:]))
    print("usage: python -m benchmarks.wan.cgroups watch FILE", file=sys.stderr)
    sys.exit(2)
