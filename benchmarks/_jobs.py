"""What the job-placement benchmarks share: a local cluster brought up and always torn down, CPU time
of processes, the commit measured, and the JSON document they write."""

from __future__ import annotations

import json
import os
import platform
import resource
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

BIN = os.path.dirname(os.path.abspath(sys.executable))
NODES = ["n1", "n2", "n3", "n4"]


def log(name: str, message: str) -> None:
    print(f"[{name} {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def cluster_file(base: Path, name: str, slots: int = 2) -> Path:
    """4 nodes on 2 sites (n1 n2 | n3 n4, 14 ms apart), as the demo's cluster."""
    path = base / "cluster.toml"
    path.write_text("\n".join([
        f'name = "{name}"', 'launcher = "local"', "create_export = true", "[defaults]",
        f'export = "{base}/{{node}}/export"', f'mountpoint = "{base}/{{node}}/mnt"', f"slots = {slots}",
        "[sites.tsukuba]", 'nodes = ["n1", "n2"]', "[sites.hongo]", 'nodes = ["n3", "n4"]',
        "[[links]]", 'sites = ["tsukuba", "hongo"]', "rtt_ms = 14.0", ""]))
    return path


@contextmanager
def local_cluster(base: Path, name: str, slots: int = 2) -> Iterator[tuple[Any, list[int]]]:
    """(spec, daemon pids) of a running 4-node local cluster; torn down and unmounted at the end."""
    from gmountpy import launch
    from gmountpy.cluster import state as state_store
    from gmountpy.cluster.config import load_spec

    spec = load_spec(cluster_file(base, name, slots))
    launch.up(spec)
    try:
        running = state_store.load(spec.name)
        yield spec, [record.pid for record in running.nodes.values()] if running is not None else []
    finally:
        launch.down(spec.name)
        for node in NODES:
            mnt = str(base / node / "mnt")
            with open("/proc/self/mounts") as f:
                if any(line.split(" ")[1] == mnt for line in f):
                    subprocess.run(["fusermount3", "-u", "-z", mnt], check=False, capture_output=True)


def children_cpu() -> float:
    """User + system seconds of every child waited for so far (and their children)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def processes_cpu(pids: list[int]) -> float:
    """User + system seconds the processes have used (utime, stime of /proc/PID/stat)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def code_version() -> dict[str, Any]:
    """The commit measured, and the files changed since (read-only git calls)."""
    repo = Path(__file__).resolve().parent.parent
    info: dict[str, Any] = {}
    try:
        info["commit"] = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                                        text=True, timeout=10).stdout.strip() or None
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--", "gmountpy", "plugins"],
                               capture_output=True, text=True, timeout=10).stdout.splitlines()
        info["uncommitted"] = [line[3:] for line in dirty]
    except (OSError, subprocess.SubprocessError):
        info["commit"] = None
    return info


def write_document(out: Path, load_start: tuple[float, float, float], parameters: dict[str, Any],
                   **results: Any) -> dict[str, Any]:
    doc = {"command": shlex.join([os.path.relpath(sys.argv[0]), *sys.argv[1:]]),
           "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "kernel": platform.release(),
                       "loadavg_at_start": load_start, "loadavg_at_end": os.getloadavg()},
           "code": code_version(), "parameters": parameters, **results,
           "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    return doc
