"""What the soak checks besides each operation: daemons' descriptors and memory, their logs, and, at
the end, every file from every node, twins, leftovers and bytes outside the exports."""

from __future__ import annotations

import hashlib
import os
import re
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from .cluster import FULL_NODE, NODES, SoakCluster
from .judge import Fault
from .work import SOAK, Expected

#: A disk with less than this free counts as full (the workload fills n4's small disk itself too).
FULL_BELOW = 4 << 20


@dataclass(frozen=True)
class Usage:
    pid: int
    fds: int
    rss: int      # bytes


def usage(pid: int) -> Usage | None:
    """Open descriptors and resident memory of a process, from /proc (None if it is gone)."""
    try:
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        with open(f"/proc/{pid}/status") as f:
            rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
        return Usage(pid, fds, rss)
    except (OSError, StopIteration):
        return None


def snapshot(cluster: SoakCluster) -> dict[str, Usage]:
    state = cluster.state()
    return {node: u for node in NODES if (u := usage(state.nodes[node].pid)) is not None}


@dataclass(eq=False)
class Sampler(threading.Thread):
    """Every `every` s: each daemon's descriptors and RSS; n4's free space (a disk the workload filled
    by itself counts as a disk_full fault while it lasts)."""

    cluster: SoakCluster
    faults: list[Fault]
    lock: threading.Lock
    stop: threading.Event
    every: float = 2.0
    samples: list[tuple[float, str, Usage]] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__(name="sampler", daemon=True)

    def run(self) -> None:
        full: Fault | None = None
        while not self.stop.wait(self.every):
            try:
                now = time.time()
                for node, used in snapshot(self.cluster).items():
                    self.samples.append((now, node, used))
                stat = os.statvfs(self.cluster.export(FULL_NODE))
                free = stat.f_bavail * stat.f_frsize
                filled_on_purpose = self.cluster.filler.exists()
                if free < FULL_BELOW and not filled_on_purpose and full is None:
                    full = Fault("disk_full", (FULL_NODE,), now - self.every, detail={"by": "the workload"})
                    with self.lock:
                        self.faults.append(full)
                elif full is not None and (free >= FULL_BELOW or filled_on_purpose):
                    full.end = now
                    full = None
            except (OSError, RuntimeError):
                continue  # a node between incarnations; the next sample sees it

    def peaks(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = defaultdict(lambda: {"fds": 0, "rss": 0, "incarnations": 0})
        pids: dict[str, set[int]] = defaultdict(set)
        for _, node, used in self.samples:
            out[node]["fds"] = max(out[node]["fds"], used.fds)
            out[node]["rss"] = max(out[node]["rss"], used.rss)
            pids[node].add(used.pid)
        for node in out:
            out[node]["incarnations"] = len(pids[node])
        return dict(out)


_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) (\w+) ([\w.]+): (.*)$")


@dataclass
class LogFindings:
    slow: list[Fault] = field(default_factory=list)       # timeouts the daemons logged: documented EIO/ETIMEDOUT
    internal_errors: list[str] = field(default_factory=list)
    stall_reports: int = 0
    unavailable: int = 0


def scan_logs(cluster: SoakCluster, since: float, rpc_timeout: float) -> LogFindings:
    """The daemons' logs since `since`: timeouts (evidence of a slow or unreachable node, with the time),
    internal errors (bugs), event-loop stall reports."""
    found = LogFindings()
    for node in NODES:
        try:
            text = cluster.log_path(node).read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("Timeout (0:00:"):
                found.stall_reports += 1
                continue
            match = _LINE.match(line)
            if match is None:
                continue
            when = time.mktime(time.strptime(match[1], "%Y-%m-%d %H:%M:%S")) + int(match[2]) / 1000
            if when < since:
                continue
            message = match[5]
            if "internal error" in message or match[3] == "CRITICAL" or "Traceback" in message:
                found.internal_errors.append(f"{node}: {line[:400]}")
            if "is unavailable" in message:
                found.unavailable += 1
            if "timed out" in message:
                peer = re.search(r"node (\S+?)[ :]", message)
                found.slow.append(Fault("slow", (peer[1] if peer else "?",), when - rpc_timeout - 1.0, when,
                                        detail={"logged_by": node, "line": message[:200]}))
    return found


@dataclass
class FileCheck:
    files: int = 0
    reads: int = 0
    failures: list[str] = field(default_factory=list)


def _read(path: Path) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def verify_everywhere(cluster: SoakCluster, files: list[Expected], links: dict[str, str],
                      gone: set[str]) -> FileCheck:
    """Through every node's mount: every expected file has the bytes written (under exactly one of its
    two names after a failed directory rename), every symlink its target, every removed name is gone."""
    check = FileCheck(files=len(files))
    lock = threading.Lock()

    def one(expected: Expected) -> None:
        for node in NODES:
            mount = cluster.mount(node)
            problem = None
            try:
                size, sha = _read(mount / expected.path)
                if expected.alt is not None and os.path.lexists(mount / expected.alt):
                    problem = f"both {expected.path} and {expected.alt} exist after a failed rename"
            except FileNotFoundError as exc:
                if expected.alt is None:
                    problem = f"{type(exc).__name__}: {exc}"
                else:
                    try:
                        size, sha = _read(mount / expected.alt)
                    except OSError as again:
                        problem = f"under neither name after a failed rename: {again}"
            except OSError as exc:
                problem = f"{type(exc).__name__}: {exc}"
            if problem is None and sha != expected.sha:
                problem = f"{size} B sha256 {sha[:16]}, not the {expected.size} B written"
            with lock:
                check.reads += 1
                if problem is not None:
                    check.failures.append(f"{expected.path} on {node} ({expected.by}): {problem}")

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(one, files))
    for path, target in sorted(links.items()):
        for node in NODES:
            try:
                found = os.readlink(cluster.mount(node) / path)
                os.lstat(cluster.mount(node) / path)
            except OSError as exc:
                found = f"{type(exc).__name__}: {exc}"
            check.reads += 1
            if found != target:
                check.failures.append(f"symlink {path} on {node}: {found}, not -> {target}")
    for path in sorted(gone):
        for node in NODES:
            check.reads += 1
            if os.path.lexists(cluster.mount(node) / path):
                check.failures.append(f"{path}, removed, is back on {node}'s mount")
        for node in NODES:
            if os.path.lexists(cluster.export(node) / path):
                check.failures.append(f"{path}, removed, is still in {node}'s export")
    return check


def twins_and_leftovers(cluster: SoakCluster) -> tuple[list[str], list[str]]:
    """Files of one name held by two nodes (the soak stages nothing, so none may be), and temporary
    files of puts or stagings left in the exports."""
    holders: dict[str, list[str]] = defaultdict(list)
    leftovers = []
    for node in NODES:
        root = cluster.export(node)
        for directory, _dirs, names in os.walk(root / SOAK):
            for name in names:
                rel = os.path.relpath(os.path.join(directory, name), root)
                holders[rel].append(node)
                if ".gmount-" in name:
                    leftovers.append(f"{node}: {rel}")
    twins = [f"{rel}: {', '.join(nodes)}" for rel, nodes in sorted(holders.items()) if len(nodes) > 1]
    return twins, leftovers


def stray_in_exports(cluster: SoakCluster) -> list[str]:
    """Everything the soak writes is below soak/ in the namespace: anything else at an export's top is stray."""
    return [f"{node}: {name} at the top of its export" for node in NODES
            for name in sorted(os.listdir(cluster.export(node))) if name != SOAK]


def outside_exports(cluster: SoakCluster) -> list[str]:
    """After `gmount down` and the small disk's unmount: the cluster's directory on the root file system
    holds the cluster file, the exports and nothing else -- the mountpoints and the directory under the
    small disk are empty, so nothing was written beside a mount (into a bare mountpoint) or under it."""
    found = []
    allowed_files = {cluster.base / "cluster.toml"}
    exports = {cluster.base / node / "export" for node in NODES}
    for directory, dirs, names in os.walk(cluster.base):
        here = Path(directory)
        dirs[:] = [d for d in dirs if here / d not in exports and d != "quarantine"]  # (quarantine: counted)
        found += [str(here / n) for n in names if here / n not in allowed_files]
    return found


def exports_size(cluster: SoakCluster) -> dict[str, int]:
    sizes = {}
    for node in NODES:
        total = 0
        for directory, _dirs, names in os.walk(Path(cluster.export(node))):
            for name in names:
                try:
                    total += os.lstat(os.path.join(directory, name)).st_size
                except OSError:
                    pass
        sizes[node] = total
    return sizes
