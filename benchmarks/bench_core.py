#!/usr/bin/env python3
"""Core gmountpy benchmark: stat, create and sequential read through a real mount vs the disk.

Brings up a real local 4-node, 2-site cluster (n1 n2 | n3 n4) with the
library, measures from node n1's mount, and measures the same operation
directly on the export directory in the same run (the baseline). Reports
medians over a few repetitions and the ratio mount / direct per row.

    python benchmarks/bench_core.py [--out benchmarks/results/core.json] [--quick]

The cluster, its daemons, mounts and temporary files are always torn down,
also on error, Ctrl-C or SIGTERM. See benchmarks/README.md for how to read
the numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import json
import os
import platform
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

try:
    from . import local_io
except ImportError:  # run as a script: python benchmarks/bench_core.py
    import local_io  # type: ignore[no-redef]

MiB = 1024 * 1024
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "core.json"
SITES = {"tsukuba": ["n1", "n2"], "hongo": ["n3", "n4"]}
LINK = ("tsukuba", "hongo", 14.0)
ME = "n1"                          # the node whose mount every measurement goes through
WHERE = {"local": "n1", "same-site": "n2", "other-site": "n3"}

# ---------------------------------------------------------------------------------------------
# small helpers


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


_libc = ctypes.CDLL(None, use_errno=True)
_SYS_CACHESTAT = 451  # x86_64 / generic; Linux >= 6.5


def cached_pages(fd: int) -> int | None:
    """Pages of this file in the page cache (cachestat(2)); None when the kernel lacks it."""
    if platform.machine() not in ("x86_64", "aarch64"):
        return None
    rng = ctypes.create_string_buffer(struct.pack("QQ", 0, 0), 16)
    out = ctypes.create_string_buffer(40)
    if _libc.syscall(_SYS_CACHESTAT, fd, rng, out, 0) != 0:
        return None
    return struct.unpack("5Q", out.raw)[0]


def cached_fraction(path: str | os.PathLike[str]) -> float | None:
    fd = os.open(path, os.O_RDONLY)
    try:
        pages = cached_pages(fd)
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    if pages is None or size == 0:
        return None
    return min(1.0, pages * os.sysconf("SC_PAGE_SIZE") / size)


def drop_cache(fd: int) -> None:
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def fmt(value: float | None) -> str:
    if value is None or value != value:
        return "-"
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


# ---------------------------------------------------------------------------------------------
# cleanup that survives Ctrl-C, SIGTERM and half-started clusters


class Interrupted(KeyboardInterrupt):
    pass


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise Interrupted(f"signal {signum}")


def _mounts_under(base: str) -> list[str]:
    found = []
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                point = line.split(" ")[1].encode().decode("unicode_escape")
                if point == base or point.startswith(base + "/"):
                    found.append(point)
    except OSError:
        pass
    return found


def _our_daemons(base: str) -> list[int]:
    """gmountpy node daemons of this user holding a descriptor inside our temp dir (ours by construction)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if b"gmountpy.node" not in f.read():
                    continue
            if os.stat(f"/proc/{entry}").st_uid != os.getuid():
                continue
            for fd in os.listdir(f"/proc/{entry}/fd"):
                try:
                    if os.readlink(f"/proc/{entry}/fd/{fd}").startswith(base + "/"):
                        pids.append(int(entry))
                        break
                except OSError:
                    continue
        except OSError:
            continue
    return pids


def cleanup(base: str, cluster_name: str | None, state: Any) -> list[str]:
    """Down the cluster, then make sure: no daemon of ours, nothing mounted, temp dir gone."""
    problems: list[str] = []
    if cluster_name is not None:
        try:
            from gmountpy import launch
            for node, why in (launch.down(cluster_name) or {}).items():
                problems.append(f"down: {node}: {why}")
        except Exception as exc:  # keep going: the forced steps below still run
            problems.append(f"launch.down failed: {exc!r}")
    pids = set(_our_daemons(base))
    if state is not None:
        from gmountpy.launch.orchestrate import pid_is_daemon
        pids |= {r.pid for r in state.nodes.values() if pid_is_daemon(r.pid)}
    for pid in pids:
        problems.append(f"daemon pid {pid} still running after down: terminated")
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while pids and time.monotonic() < deadline:
        pids = {p for p in pids if os.path.exists(f"/proc/{p}")}
        time.sleep(0.05)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for point in _mounts_under(base):
        result = subprocess.run(["fusermount3", "-u", "-z", point], capture_output=True, text=True)
        problems.append(f"{point} was still mounted: fusermount3 -u -z -> rc {result.returncode}")
    if _mounts_under(base):
        problems.append(f"mounts remain under {base}: temp dir NOT removed")
    else:
        shutil.rmtree(base, ignore_errors=True)
    return problems


# ---------------------------------------------------------------------------------------------
# cluster


@contextmanager
def scratch_cluster(prefix: str) -> Iterator[tuple[Path, dict[str, Any]]]:
    """A fresh temp dir with the launcher state in it (never the user's own clusters) and a
    holder the run fills with the cluster's name and state; on the way out (errors and Ctrl-C
    included) `cleanup` downs that cluster and removes everything, logging what it could not."""
    base = Path(tempfile.mkdtemp(prefix=prefix))
    os.environ["XDG_STATE_HOME"] = str(base / "state")
    holder: dict[str, Any] = {"name": None, "state": None}
    try:
        yield base, holder
    finally:
        for problem in cleanup(str(base), holder["name"], holder["state"]):
            log(f"cleanup: {problem}")


def write_cluster_file(base: Path, name: str) -> Path:
    lines = [f'name = "{name}"', 'launcher = "local"', "[defaults]",
             f'export = "{base}/{{node}}/export"', f'mountpoint = "{base}/{{node}}/mnt"']
    for site, nodes in SITES.items():
        lines += [f"[sites.{site}]", "nodes = [" + ", ".join(f'"{n}"' for n in nodes) + "]"]
    lines += ["[[links]]", f'sites = ["{LINK[0]}", "{LINK[1]}"]', f"rtt_ms = {LINK[2]}"]
    # no [tuning]: the library defaults are what is measured
    for node in (n for members in SITES.values() for n in members):
        (base / node / "export").mkdir(parents=True, exist_ok=True)
    path = base / "cluster.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def daemon_stats(state: Any, node: str) -> dict[str, Any] | None:
    from gmountpy.protocol.client import call, run_sync
    try:
        return run_sync(call, state, node, "stats")
    except Exception as exc:
        log(f"stats from {node} failed: {exc!r}")
        return None


def lookups_seen(state: Any, node: str = ME) -> int | None:
    """Namespace lookups that reached the node's locator so far (cache hits + negative hits + misses)."""
    s = daemon_stats(state, node)
    if not s:
        return None
    return int(s["cache_hits"]) + int(s["negative_hits"]) + int(s["cache_misses"])


def code_version() -> dict[str, Any]:
    """The commit measured, and whether the tree had uncommitted changes (read-only git calls)."""
    repo = Path(__file__).resolve().parent.parent
    info: dict[str, Any] = {}
    try:
        info["commit"] = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                                        text=True, timeout=10).stdout.strip() or None
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--", "gmountpy"],
                               capture_output=True, text=True, timeout=10).stdout.splitlines()
        info["uncommitted_in_gmountpy"] = [line[3:] for line in dirty]
    except (OSError, subprocess.SubprocessError):
        info["commit"] = None
    try:
        import gmountpy
        info["gmountpy_path"] = os.path.dirname(gmountpy.__file__)
    except ImportError:
        pass
    return info


def write_results(out: Path, load_start: tuple[float, float, float], parameters: dict[str, Any],
                  results: Any, **extra: Any) -> None:
    """The JSON document of a cluster benchmark: machine and load, commit, parameters, results."""
    doc = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                       "loadavg_at_start": load_start, "loadavg_at_end": os.getloadavg()},
           "code": code_version(), "parameters": parameters, "results": results, **extra,
           "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")


def fuse_bdi_info(mountpoint: str) -> dict[str, Any]:
    dev = os.stat(mountpoint).st_dev
    major, minor = os.major(dev), os.minor(dev)
    info: dict[str, Any] = {"dev": f"{major}:{minor}"}
    for key, path in (("read_ahead_kb", f"/sys/class/bdi/{major}:{minor}/read_ahead_kb"),
                      ("max_background", f"/sys/fs/fuse/connections/{minor}/max_background")):
        try:
            info[key] = int(Path(path).read_text().strip())
        except (OSError, ValueError):
            info[key] = None
    with open("/proc/self/mounts") as f:
        for line in f:
            parts = line.split(" ")
            if parts[1] == mountpoint:
                info["mount_options"] = parts[3]
    return info


# ---------------------------------------------------------------------------------------------
# measurements


class Results:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.targets: list[dict[str, Any]] = []

    def add(self, name: str, unit: str, mount: list[float], direct: list[float], n: int,
            **extra: Any) -> dict[str, Any]:
        m, d = median(mount), median(direct)
        # Each repeat measures mount and direct back to back, so their ratio is paired: a burst of
        # load from elsewhere slows both sides of one repeat, and the median of the paired ratios
        # is steadier than the ratio of the two medians (kept as ratio_of_medians).
        paired = [a / b for a, b in zip(mount, direct, strict=False) if b]
        row = {"name": name, "unit": unit, "mount": m, "direct": d,
               "ratio": median(paired) if paired else None,
               "ratio_of_medians": (m / d) if d else None, "n": n, "repeats": len(mount),
               "samples": {"mount": mount, "direct": direct, "ratio": paired}}
        row.update(extra)
        self.rows.append(row)
        log(f"{name}: mount {fmt(m)} {unit}, direct {fmt(d)} {unit}, ratio {fmt(row['ratio'])}")
        return row


def stat_pass(paths: list[str]) -> tuple[float, int]:
    """Stat every path once; (ops/s, how many did not exist)."""
    missing = 0
    stat = os.stat
    t0 = time.perf_counter()
    for p in paths:
        try:
            stat(p)
        except FileNotFoundError:
            missing += 1
    return len(paths) / (time.perf_counter() - t0), missing


def warm_stat_pass(paths: list[str], ttl: float, passes: int = 4,
                   probe: Callable[[], int | None] | None = None) -> tuple[float, int, int, float | None]:
    """Stat each chunk once (untimed prime), then `passes` more times (timed) within the TTL.

    Returns (ops/s over the timed stats, chunks whose prime+timed span exceeded the TTL,
    missing count, requests that reached the daemon per timed stat in the first chunk, if
    `probe` counts them). Chunks shrink when one crosses the TTL, so the warm stats stay warm.
    """
    stat = os.stat
    chunk = 200
    ops = 0
    elapsed = 0.0
    crossed = 0
    missing = 0
    reached: float | None = None
    i = 0
    while i < len(paths):
        part = paths[i:i + chunk]
        t_prime = time.perf_counter()
        for p in part:
            try:
                stat(p)
            except FileNotFoundError:
                pass
        first = probe is not None and i == 0
        count0 = probe() if first else None  # type: ignore[misc]
        t0 = time.perf_counter()
        for _ in range(passes):
            for p in part:
                try:
                    stat(p)
                except FileNotFoundError:
                    missing += 1
        t1 = time.perf_counter()
        if first:
            count1 = probe()  # type: ignore[misc]
            if count0 is not None and count1 is not None:
                reached = (count1 - count0) / (passes * len(part))
        ops += passes * len(part)
        elapsed += t1 - t0
        if t1 - t_prime > 0.9 * ttl:
            crossed += 1
            chunk = max(10, chunk // 2)
        i += len(part)
    return ops / elapsed, crossed, missing // passes, reached


def create_pass(directory: str, n: int) -> float:
    names = [os.path.join(directory, f"c{i:05d}") for i in range(n)]
    flags = os.O_CREAT | os.O_WRONLY | os.O_EXCL | os.O_CLOEXEC
    t0 = time.perf_counter()
    for p in names:
        os.close(os.open(p, flags, 0o644))
    return n / (time.perf_counter() - t0)


def timed_read(path: str, buf: bytearray, before: Callable[[int], None] | None = None
               ) -> tuple[float, int, float | None]:
    """Read the whole file with len(buf)-sized reads; (MB/s, bytes, cached fraction at start)."""
    with open(path, "rb", buffering=0) as f:
        fd = f.fileno()
        if before is not None:
            before(fd)
        size = os.fstat(fd).st_size
        pages = cached_pages(fd)
        frac = None if pages is None or not size else min(1.0, pages * os.sysconf("SC_PAGE_SIZE") / size)
        total = 0
        readinto = f.readinto
        t0 = time.perf_counter()
        while True:
            got = readinto(buf)
            if not got:
                break
            total += got
        dt = time.perf_counter() - t0
    return total / dt / 1e6, total, frac


def make_big_file(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    block = os.urandom(MiB)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for _ in range(size // MiB):
            os.write(fd, block)
        os.fsync(fd)  # written back, so DONTNEED can really drop it
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------------
# the benchmark


def run(args: argparse.Namespace, base: Path, holder: dict[str, Any]) -> dict[str, Any]:
    from gmountpy import launch
    from gmountpy.cluster.config import load_spec
    from gmountpy.cluster.overlay import Overlay

    n_files = args.files
    repeats = args.repeats
    size = args.size_mib * MiB
    res = Results()
    t_start = time.monotonic()

    # -- fixtures, written straight into the exports before the cluster starts -------------
    name = f"bench-{os.getpid()}"
    spec = load_spec(write_cluster_file(base, name))
    ttl = spec.tuning.attr_ttl
    export = {n: Path(spec.node(n).export) for n in spec.nodes}
    mnt = Path(spec.node(ME).mountpoint)
    log(f"writing fixtures under {base}: {3 * repeats * n_files} empty files, 2 x {args.size_mib} MiB")
    for kind, node in WHERE.items():
        for r in range(repeats):
            d = export[node] / "bench" / f"stat-{kind}" / f"r{r}"
            d.mkdir(parents=True)
            for i in range(n_files):
                os.close(os.open(d / f"f{i:05d}", os.O_CREAT | os.O_WRONLY, 0o644))
    big = {"local": ("n1", "bench/big-n1.bin"), "remote": ("n3", "bench/big-n3.bin")}
    for node, rel in big.values():
        make_big_file(export[node] / rel, size)
    (export[ME] / "bench" / "create-direct").mkdir(parents=True)
    local_modes = ("bypass", "mount", "sshfs")
    if args.local_io:
        local_io.make_stat_fixtures(export[ME], local_modes, repeats, n_files)
        make_big_file(export[ME] / "bench" / "mid-n1.bin", args.sshfs_mib * MiB)  # sshfs's read file: smaller

    # -- cluster up ------------------------------------------------------------------------
    log(f"starting cluster {name} (4 nodes, 2 sites, default tuning)")
    holder["name"] = name  # from here on, cleanup runs launch.down
    t_up = time.monotonic()
    state = launch.up(spec)
    holder["state"] = state
    up_seconds = time.monotonic() - t_up
    log(f"cluster up in {up_seconds:.1f}s")

    cluster_info = {
        "name": name,
        "launcher": "local",
        "sites": SITES,
        "links": [{"sites": [LINK[0], LINK[1]], "rtt_ms": LINK[2]}],
        "measured_from": ME,
        "lookup_tiers_from_n1": [list(t) for t in Overlay(spec).lookup_tiers(ME)],
        "tuning": dataclasses.asdict(spec.tuning),
        "tuning_is_default": True,
        "up_seconds": round(up_seconds, 2),
        "n1_fuse": fuse_bdi_info(str(mnt)),
    }
    res.notes.append(f"Default tuning (no [tuning] table): attr_ttl={spec.tuning.attr_ttl:g}s, "
                     f"negative_ttl={spec.tuning.negative_ttl:g}s; FUSE entry/attr timeouts equal attr_ttl.")
    res.notes.append(f"All four daemons and the benchmark run on this one machine ({os.cpu_count()} CPUs) and "
                     "talk over 127.0.0.1; rtt_ms=14 in the cluster file only orders lookups, no WAN latency "
                     "is emulated, so 'other-site' costs extra lookup RPCs but not extra latency.")

    # sanity: every fixture resolves to the node meant to hold it
    for kind, node in WHERE.items():
        p = mnt / "bench" / f"stat-{kind}" / "r0" / "f00000"
        got = os.getxattr(p, "user.gmount.node").decode()
        if got != node:
            res.notes.append(f"ANOMALY: {p} resolved to {got}, expected {node}")
    # resolve the directory chains once so the timed stats measure the file lookups
    for kind in WHERE:
        for r in range(repeats):
            os.stat(mnt / "bench" / f"stat-{kind}" / f"r{r}")

    # -- stat ----------------------------------------------------------------------------
    def paths(root: Path, kind: str, r: int, missing: bool = False) -> list[str]:
        stem = "nx" if missing else "f"
        return [str(root / "bench" / f"stat-{kind}" / f"r{r}" / f"{stem}{i:05d}") for i in range(n_files)]

    kinds = [*WHERE, "nonexistent"]
    cold: dict[str, dict[str, list[float]]] = {k: {"mount": [], "direct": []} for k in kinds}
    warm: dict[str, dict[str, list[float]]] = {k: {"mount": [], "direct": []} for k in kinds}
    remote_per_op: dict[str, list[float]] = {k: [] for k in kinds}
    reached_warm: dict[str, list[float]] = {k: [] for k in kinds}
    warm_crossed = 0
    for r in range(repeats):
        for kind in kinds:
            src_kind = "local" if kind == "nonexistent" else kind
            missing = kind == "nonexistent"
            holder_node = WHERE[src_kind]
            m_paths = paths(mnt, src_kind, r, missing)
            d_paths = paths(export[holder_node], src_kind, r, missing)
            os.stat(mnt / "bench" / f"stat-{src_kind}" / f"r{r}")  # parent dentry fresh
            before = daemon_stats(state, ME)
            rate, miss = stat_pass(m_paths)
            after = daemon_stats(state, ME)
            if before and after:
                remote_per_op[kind].append((after["remote_queries"] - before["remote_queries"]) / n_files)
            cold[kind]["mount"].append(rate)
            expect = n_files if missing else 0
            if miss != expect:
                res.notes.append(f"ANOMALY: cold stat {kind} r{r}: {miss} of {n_files} missing, expected {expect}")
            rate, miss = stat_pass(d_paths)
            cold[kind]["direct"].append(rate)
            rate, crossed, miss, reached = warm_stat_pass(m_paths, ttl, probe=lambda: lookups_seen(state))
            if reached is not None:
                reached_warm[kind].append(reached)
            warm_crossed += crossed
            if miss != expect:
                res.notes.append(f"ANOMALY: warm stat {kind} r{r}: {miss} of {n_files} missing, expected {expect}")
            warm[kind]["mount"].append(rate)
            rate, _, _, _ = warm_stat_pass(d_paths, ttl)
            warm[kind]["direct"].append(rate)
    labels = {"local": "local file (n1)", "same-site": "same-site file (n2)",
              "other-site": "other-site file (n3)", "nonexistent": "nonexistent path"}
    for kind in kinds:
        res.add(f"stat cold: {labels[kind]}", "ops/s", cold[kind]["mount"], cold[kind]["direct"], n_files,
                remote_lookups_per_op=median(remote_per_op[kind]))
    for kind in kinds:
        res.add(f"stat warm: {labels[kind]}", "ops/s", warm[kind]["mount"], warm[kind]["direct"], n_files,
                daemon_lookups_per_op=median(reached_warm[kind]))
    res.notes.append(
        "stat cold = first os.stat of each of n distinct files (fresh files per repeat); direct cold is "
        "os.stat on the export path, whose dentries are hot (files were just created): it is the cost of "
        "one syscall + path walk, not of a disk read. remote_lookups_per_op = n1's lookup RPCs to other "
        "nodes per stat during the mount pass (from the daemon's stats RPC).")
    res.notes.append(
        f"stat warm = the same files stat'ed again within the TTL: each chunk is stat'ed once (untimed), "
        f"then 4 more times (timed); chunks shrink if prime+timed exceeds 0.9*attr_ttl "
        f"(happened {warm_crossed} times). daemon_lookups_per_op = lookups that reached n1's daemon per timed "
        f"warm stat (first chunk of each repeat): 0 means the kernel answered from its own cache.")

    # -- create ----------------------------------------------------------------------------
    m_rates: list[float] = []
    d_rates: list[float] = []
    remote_create: list[float] = []
    lookups_create: list[float] = []
    os.makedirs(mnt / "bench" / "create-mount")
    for r in range(repeats):
        md = mnt / "bench" / "create-mount" / f"r{r}"
        os.mkdir(md)
        before = daemon_stats(state, ME)
        m_rates.append(create_pass(str(md), n_files))
        after = daemon_stats(state, ME)
        if before and after:
            remote_create.append((after["remote_queries"] - before["remote_queries"]) / n_files)
            lookups_create.append(sum(after[k] - before[k] for k in ("cache_hits", "negative_hits", "cache_misses"))
                                  / n_files)
        landed = export[ME] / "bench" / "create-mount" / f"r{r}" / f"c{n_files - 1:05d}"
        if not landed.exists():
            res.notes.append(f"ANOMALY: a file created through n1's mount is not in n1's export ({landed})")
        dd = export[ME] / "bench" / "create-direct" / f"r{r}"
        os.mkdir(dd)
        d_rates.append(create_pass(str(dd), n_files))
    res.add("create empty file (O_CREAT+close)", "ops/s", m_rates, d_rates, n_files,
            remote_lookups_per_op=median(remote_create), daemon_lookups_per_op=median(lookups_create))
    res.notes.append("create = os.open(O_CREAT|O_EXCL|O_WRONLY) + close of n new names in a fresh directory, "
                     "through n1's mount (lands in n1's export) vs directly in n1's export.")

    # -- sequential read -------------------------------------------------------------------
    buf = bytearray(MiB)
    read_rows: dict[str, dict[str, list[float]]] = {}
    cache_seen: dict[str, list[float | None]] = {}

    def record(row: str, side: str, value: float, frac: float | None) -> None:
        read_rows.setdefault(row, {"mount": [], "direct": []})[side].append(value)
        cache_seen.setdefault(f"{row} [{side}]", []).append(frac)

    def check(got: int, path: str) -> None:
        if got != size:
            res.notes.append(f"ANOMALY: read {got} bytes of {path}, expected {size}")

    for _ in range(repeats):
        for kind, (node, rel) in big.items():
            e_path = str(export[node] / rel)
            m_path = str(mnt / rel)
            # direct, caches dropped (DONTNEED on the export file; it is fsync'ed so clean)
            v, got, frac = timed_read(e_path, buf, before=drop_cache)
            check(got, e_path)
            record(f"{kind} cold (all caches dropped)", "direct", v, frac)
            # direct, page cache (the file was just read)
            v, got, frac = timed_read(e_path, buf)
            check(got, e_path)
            record(f"{kind} first read (FUSE cache cold, export cached)", "direct", v, frac)
            # mount, FUSE page cache dropped, export file in the host page cache
            v, got, frac = timed_read(m_path, buf, before=drop_cache)
            check(got, m_path)
            record(f"{kind} first read (FUSE cache cold, export cached)", "mount", v, frac)
            cache_seen.setdefault(f"{kind} first read: export cached [mount]", []).append(cached_fraction(e_path))
            # mount again: keep_cache should serve from the FUSE page cache
            v, got, frac = timed_read(m_path, buf)
            check(got, m_path)
            record(f"{kind} reread (keep_cache)", "mount", v, frac)
            v, got, frac = timed_read(e_path, buf)
            check(got, e_path)
            record(f"{kind} reread (keep_cache)", "direct", v, frac)
            # mount, every cache dropped: FUSE pages and the export file's pages

            export_left: list[float | None] = []

            def drop_both(fd: int, e_path: str = e_path, export_left: list[float | None] = export_left) -> None:
                drop_cache(fd)
                efd = os.open(e_path, os.O_RDONLY)
                try:
                    drop_cache(efd)
                    pages = cached_pages(efd)
                    export_left.append(None if pages is None else pages * os.sysconf("SC_PAGE_SIZE") / size)
                finally:
                    os.close(efd)

            v, got, frac = timed_read(m_path, buf, before=drop_both)
            check(got, m_path)
            record(f"{kind} cold (all caches dropped)", "mount", v, frac)
            cache_seen.setdefault(f"{kind} cold: export cached [mount]", []).extend(export_left)
    order = ["first read (FUSE cache cold, export cached)", "cold (all caches dropped)", "reread (keep_cache)"]
    cache_summary = {k: [None if f is None else round(f, 3) for f in v] for k, v in cache_seen.items()}
    for kind, (node, _) in big.items():
        for what in order:
            row = f"{kind} {what}"
            sides = read_rows[row]
            res.add(f"read {args.size_mib} MiB {kind} ({node}): {what}", "MB/s", sides["mount"], sides["direct"],
                    1, cached_at_start={"mount": cache_summary.get(f"{row} [mount]"),
                                        "direct": cache_summary.get(f"{row} [direct]")})
    res.notes.append(
        f"read = sequential read of a {args.size_mib} MiB file with 1 MiB readinto() calls; 'local' is held "
        "by n1, 'remote' by n3 (other site), both read through n1's mount. cached_at_start = fraction of the "
        "file in the page cache when the timed read began (cachestat(2)); for the mount side it is the FUSE "
        "inode's own page cache, separate from the export file's.")
    res.notes.append(
        "first read: posix_fadvise(DONTNEED) on the mount's file descriptor empties the FUSE page cache, while "
        "the export file stays in the host page cache (checked with cachestat; its direct baseline is a "
        "page-cache read too). This is the overhead of FUSE + daemon (+ RPC for remote), not of the disk.")
    res.notes.append(
        "cold: posix_fadvise(DONTNEED) on the export file (fsync'ed, so clean and really dropped) before the "
        "direct read, and on both the export file and the FUSE file before the mount read. The disk is a "
        "virtio disk whose host likely caches it, so 'cold' is faster than a real disk.")
    res.notes.append(
        "reread: the mount file is opened again unchanged, so the daemon sets keep_cache and the kernel serves "
        "it from the FUSE page cache without asking the daemon; direct reread is a page-cache read.")
    export_cached = cache_summary.get("local first read: export cached [mount]", []) + \
        cache_summary.get("remote first read: export cached [mount]", [])
    res.notes.append(f"export file cached fraction after each 'first read' through the mount: {export_cached}")
    export_dropped = cache_summary.get("local cold: export cached [mount]", []) + \
        cache_summary.get("remote cold: export cached [mount]", [])
    res.notes.append("export file cached fraction at the start of each 'cold' read through the mount: "
                     f"{export_dropped}")

    # -- local I/O of a job gmount starts: direct, mount, bypass, sshfs, kernel passthrough ----------
    if args.local_io:
        local_io_section(args, base, spec.name, export[ME], mnt, res)

    # -- evidence from the daemons --------------------------------------------------------
    stats = {n: daemon_stats(state, n) for n in spec.nodes}
    cluster_info["daemon_stats_at_end"] = stats
    cluster_info["n1_fuse_at_end"] = fuse_bdi_info(str(mnt))
    cluster_info["cache_at_start"] = cache_summary
    cluster_info["elapsed_before_teardown_s"] = round(time.monotonic() - t_start, 1)
    return {"cluster": cluster_info, "results": res.rows, "notes": res.notes, "targets": res.targets}


def local_io_section(args: argparse.Namespace, base: Path, name: str, export: Path, mnt: Path,
                     res: Results) -> None:
    """Rows for local_io.MODES (see benchmarks/local_io.py), paired per repeat, and the issue's targets."""
    from gmountpy import launch
    from gmountpy.cluster.config import load_spec

    big = "bench/big-n1.bin"
    samples: dict[str, dict[str, list[list[float]]]] = {}

    def record(mode: str, measured: dict[str, list[float]]) -> None:
        for op, pair in measured.items():
            samples.setdefault(mode, {}).setdefault(op, []).append(pair)

    problem = local_io.sshfs_problem()
    if problem is not None:
        res.notes.append(f"sshfs rows skipped: {problem}")
    with contextlib.ExitStack() as stack:
        sshfs = None if problem else stack.enter_context(local_io.sshfs_mount(export, base / "sshfs", log))
        for r in range(args.repeats):
            for mode, target, bypass in (("bypass", mnt, True), ("mount", mnt, False), ("sshfs", sshfs, False)):
                if target is None:
                    continue
                log(f"local I/O job on {ME}: {mode}, repeat {r + 1}/{args.repeats}")
                record(mode, local_io.run_job(name, ME, export, target, "bench/mid-n1.bin" if mode == "sshfs" else big,
                                              "bench/jstat", mode, r, bypass, args.write_mib, args.random_reads,
                                              args.files))
    if os.geteuid() == 0 and tuple(int(x) for x in platform.release().split("-")[0].split(".")[:2]) >= (6, 9):
        # A second cluster, one node, whose daemon uses kernel passthrough; the read fixture is the same file.
        pt_base = base / "passthrough"
        pt_export = pt_base / "a" / "export"
        (pt_export / "bench").mkdir(parents=True)
        os.link(export / big, pt_export / big)
        local_io.make_stat_fixtures(pt_export, ("passthrough",), args.repeats, args.files)
        (pt_base / "cluster.toml").write_text("\n".join([
            f'name = "{name}-pt"', 'launcher = "local"', "[defaults]", f'export = "{pt_base}/{{node}}/export"',
            f'mountpoint = "{pt_base}/{{node}}/mnt"', "[sites.s]", 'nodes = ["a"]', "[tuning]", "passthrough = true",
            ""]))
        pt_spec = load_spec(pt_base / "cluster.toml")
        log("starting a one-node cluster with kernel passthrough")
        launch.up(pt_spec)
        try:
            for r in range(args.repeats):
                log(f"local I/O job: passthrough, repeat {r + 1}/{args.repeats}")
                record("passthrough", local_io.run_job(pt_spec.name, "a", pt_export, pt_base / "a" / "mnt", big,
                                                       "bench/jstat", "passthrough", r, False, args.write_mib,
                                                       args.random_reads, args.files))
        finally:
            launch.down(pt_spec.name)
    else:
        res.notes.append("passthrough rows skipped: kernel FUSE passthrough needs a root daemon on Linux >= 6.9")
    read_mib = {mode: args.sshfs_mib if mode == "sshfs" else args.size_mib for mode in local_io.MODES}
    local_io.add_rows(res, samples, read_mib, args.write_mib, args.random_reads, args.files)
    res.notes.append(
        "job <mode> rows: measured by a job started on n1 with Cluster.run (bypass_job.py), each operation on n1's "
        "export (direct) and then through the mode: bypass = n1's mount with the job's preload library (the "
        "default for jobs gmount starts), mount = the same with GMOUNT_BYPASS=0, sshfs = n1's export over sshfs "
        "and ssh to 127.0.0.1, passthrough = a one-node cluster with kernel FUSE passthrough. Writes create a new "
        "file, write it in 1 MiB blocks and close it (it is removed afterwards, untimed). Cold stat = first "
        "os.stat of each of n fresh empty files (direct: fresh files in the export). Within a job the two sides "
        "take turns in slices (8 MiB of a read, each side its own chunks of the file on its own descriptor; 4 MiB "
        "of a write; 1000 random reads; 50 stats), so load from elsewhere on the machine hits both alike, and a "
        "side's rate is that of its faster half of slices: with a dozen processes on 2 CPUs many slices wait "
        "for a CPU, which says nothing about either side. Warm reads: five passes.")
    checks = local_io.targets(res.rows)
    res.targets = checks
    for check in checks:
        log(f"target {'met' if check['met'] else 'MISSED'}: {check['target']} (this run: {fmt(check['value'])})")


def scan_logs(base: Path, name: str) -> list[str]:
    """WARNING/ERROR lines and tracebacks from the daemons' logs (they live in our temp state dir)."""
    notes = []
    logs = base / "state" / "gmountpy" / "logs"
    for path in sorted(logs.glob(f"{name}-*.log")):
        bad = [line.rstrip() for line in path.read_text(errors="replace").splitlines()
               if " WARNING " in line or " ERROR " in line or "Traceback" in line]
        if bad:
            notes.append(f"daemon log {path.name}: {len(bad)} warning/error lines, first: {bad[0][:300]}")
    return notes


def spread(values: list[float]) -> str:
    """(max - min) / median of the samples, as a percentage: how noisy the row was."""
    if len(values) < 2 or not median(values):
        return "-"
    return f"{100 * (max(values) - min(values)) / median(values):.0f}%"


def print_table(doc: dict[str, Any]) -> None:
    rows = doc["results"]
    width = max(len(r["name"]) for r in rows)
    header = (f"{'measurement':<{width}}  {'unit':>5}  {'mount':>9}  {'spread':>6}  {'direct':>9}  "
              f"{'spread':>6}  {'ratio':>6}")
    print()
    print(header)
    print("-" * len(header))
    for r in rows:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2g}" if r["ratio"] < 0.1 else f"{r['ratio']:.2f}"
        print(f"{r['name']:<{width}}  {r['unit']:>5}  {fmt(r['mount']):>9}  {spread(r['samples']['mount']):>6}  "
              f"{fmt(r['direct']):>9}  {spread(r['samples']['direct']):>6}  {ratio:>6}")
    print("-" * len(header))
    for check in doc.get("targets", []):
        print(f"target {'met   ' if check['met'] else 'MISSED'} {check['target']}: {fmt(check['value'])}")
    m = doc["machine"]
    print(f"ratio = mount / direct, median of the per-repeat ratios (1.00 = as fast as the export "
          f"directly; 0.01 = 100x slower).\nmount, direct = medians of {rows[0]['repeats']} repeats; "
          f"spread = (max-min)/median of those samples.\n"
          f"{m['cpus']} CPUs ({m['cpu_model']}), kernel {m['kernel']}, Python {m['python']}, "
          f"load {m['loadavg_at_start'][0]:.1f} -> {m['loadavg_at_end'][0]:.1f}; "
          f"total {doc['runtime_seconds']:.0f}s.")
    print()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON output (default {DEFAULT_OUT})")
    parser.add_argument("--quick", action="store_true", help="300 files per location, 128 MiB read files")
    parser.add_argument("--files", type=int, help="files per location for stat/create (default 2000)")
    parser.add_argument("--size-mib", type=int, help="size of the read files in MiB (default 1024)")
    parser.add_argument("--repeats", type=int, default=5, help="repetitions per measurement (default 5)")
    parser.add_argument("--no-local-io", dest="local_io", action="store_false",
                        help="skip the local I/O rows of a job (direct, mount, bypass, passthrough, sshfs)")
    parser.add_argument("--write-mib", type=int, help="size written by the local I/O job (default 1024)")
    parser.add_argument("--random-reads", type=int, help="4 KiB random reads by the local I/O job (default 100000)")
    args = parser.parse_args()
    args.files = args.files or (300 if args.quick else 2000)
    args.size_mib = args.size_mib or (128 if args.quick else 1024)
    args.write_mib = args.write_mib or (64 if args.quick else 1024)
    args.random_reads = args.random_reads or (20_000 if args.quick else 100_000)
    args.sshfs_mib = min(args.size_mib, 64 if args.quick else 256)

    for problem, ok in (("/dev/fuse is missing or not usable", os.access("/dev/fuse", os.R_OK | os.W_OK)),
                        ("fusermount3 is not installed (Debian package fuse3)", shutil.which("fusermount3"))):
        if not ok:
            print(f"bench_core: {problem}", file=sys.stderr)
            return 2

    base = Path(tempfile.mkdtemp(prefix="gmount-bench-"))
    # Launcher state and daemon logs go to our temp dir, never the user's own state.
    os.environ["XDG_STATE_HOME"] = str(base / "state")
    holder: dict[str, Any] = {"name": None, "state": None}
    old_term = signal.signal(signal.SIGTERM, _raise_interrupt)
    old_hup = signal.signal(signal.SIGHUP, _raise_interrupt)
    t0 = time.monotonic()
    load_start = os.getloadavg()
    code = code_version()
    doc: dict[str, Any] | None = None
    log_notes: list[str] = []
    try:
        doc = run(args, base, holder)
    except KeyboardInterrupt:
        log("interrupted: cleaning up")
    finally:
        # Nothing may interrupt the teardown.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if holder["name"] is not None:
            log_notes = scan_logs(base, holder["name"])
        problems = cleanup(str(base), holder["name"], holder["state"])
        for p in problems:
            log(f"cleanup: {p}")
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, old_term)
        signal.signal(signal.SIGHUP, old_hup)
        log(f"cluster down, {base} removed" if not base.exists() else f"cleanup incomplete: {base} left")
    if doc is None:
        return 130
    runtime = time.monotonic() - t0
    doc = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "kernel": platform.release(),
                    "cpu_model": _cpu_model(), "loadavg_at_start": load_start, "loadavg_at_end": os.getloadavg()},
        "code": code,
        "cluster": doc["cluster"],
        "targets": doc.get("targets", []),
        "parameters": {"files_per_location": args.files, "read_file_mib": args.size_mib,
                       "write_mib": args.write_mib, "random_reads": args.random_reads, "sshfs_read_mib": args.sshfs_mib,
                       "repeats": args.repeats, "quick": args.quick, "read_size_bytes": MiB},
        "results": doc["results"],
        "notes": doc["notes"] + log_notes + (["cleanup: " + p for p in problems] if problems else []),
        "runtime_seconds": round(runtime, 1),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print_table(doc)
    print(f"results written to {args.out}")
    return 0


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


if __name__ == "__main__":
    sys.exit(main())
