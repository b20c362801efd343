"""ParaMark-style metadata benchmark over emulated WAN sites: gmountpy beside central designs.

    python -m benchmarks.wan.bench_meta [--quick | --ops N] [--r-adj 0.2,0.5,0.8,1.0] [--sites 2|3|4]
                                        [--systems gmountpy,gmountpy-index,...] [--isolated]
                                        [--out PATH [--resume]]

A 4-site x 2-node cluster (RTTs 5-25 ms between sites, see LINKS) is
emulated with benchmarks.wan; one client per node runs N ops of each type
(mkdir, rmdir, creat, stat, stat of a missing name, access, chmod, utime,
open/close, rename, unlink) on its own mount, all clients at once. For the
ops on existing files, a fraction r_adj of each client's targets is held at
the client's own site (half on its own node, half on its site-mate) and the
rest on nodes of the other sites, chosen at random.

Systems, all inside the same emulated sites, in the same run:
- gmountpy: daemons in the site namespaces; targets written into the holders' exports.
  Three systems, one per `lookup` mode: `gmountpy` (GMount's search, `lookup = "flood"`),
  `gmountpy-index` (the homed directory index) and `gmountpy-central` (every directory
  homed at the first node of the central site: gmountpy as a central-metadata design).
- sshfs: one sshd at the central site (the site with the smallest total RTT to the
  others) serves one directory; every node mounts it (sshfs in its own site's
  namespace). Metadata and data at one server: r_adj does not change where files are.
- moosefs: MooseFS master at the central site, one chunkserver per site, mfsmount on
  every node. Central metadata, distributed data (the Gfarm/Lustre design).
- gfarm: Gfarm (the GMount paper's baseline): gfmd at the central site, a gfsd and a gfarm2fs
  mount per node (benchmarks/wan/gfarm.py); each target is written through its holder's
  mount, so its copy is on the holder's gfsd. Central metadata, data where it was written.
- glusterfs: one glusterd and one brick per node, a distribute volume over all bricks,
  a FUSE client on every node (benchmarks/wan/glusterfs.py). No metadata server: the
  DHT hash of a name picks its brick, so r_adj does not change where files are either.
The aggregate rate of a phase is all clients' ops / the slowest client's time.
With --isolated the clients of a phase run one after another instead of at once:
the same formula then gives what nodes with CPUs of their own would reach (on a
small machine the concurrent run measures CPU contention as much as the protocol).
The JSON is written after every system and locality; --resume keeps each system's localities measured in full.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Protocol

from . import gfarm, glusterfs
from . import sites as wan
from .meta_client import OPS
from .sshfs import CentralServer, wait_mounted, wait_port

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
SITES = {f"s{i}": [f"s{i}a", f"s{i}b"] for i in range(1, 5)}
LINKS = [("s1", "s2", 5.0), ("s1", "s3", 10.0), ("s2", "s3", 15.0), ("s2", "s4", 20.0), ("s3", "s4", 25.0),
         ("s1", "s4", 25.0)]  # s1-s4 was 30, but the emulation (and the overlay) take the 25 ms path via s2
TARGET_OPS = ("stat", "access", "chmod", "utime", "open_close", "rename", "unlink")


def log(message: str) -> None:
    print(f"[wan-bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def cluster_toml(work: Path, name: str) -> str:
    lines = [f'name = "{name}"', "create_export = true", "[defaults]", f'export = "{work}/gmount/{{node}}/export"',
             f'mountpoint = "{work}/gmount/{{node}}/mnt"']
    for site, nodes in SITES.items():
        lines += [f"[sites.{site}]", "nodes = [" + ", ".join(f'"{n}"' for n in nodes) + "]"]
    for a, b, rtt in LINKS:
        lines += ["[[links]]", f'sites = ["{a}", "{b}"]', f"rtt_ms = {rtt}"]
    return "\n".join(lines) + "\n"


def use_sites(n: int) -> None:
    """A smaller run: only the first n sites of SITES and the links between them."""
    global SITES, LINKS
    SITES = dict(list(SITES.items())[:n])
    LINKS = [(a, b, rtt) for a, b, rtt in LINKS if a in SITES and b in SITES]


def central_site() -> str:
    """The site with the smallest total RTT to the others; of equal totals, the one whose farthest
    site is nearest (gmountpy's `Homes.of_holders` applies the same rule)."""
    rtts = {s: [rtt for a, b, rtt in LINKS if s in (a, b)] for s in SITES}
    return min(SITES, key=lambda s: (sum(rtts[s]), max(rtts[s], default=0.0)))


# --- the workload ------------------------------------------------------------------------


def layout(r_adj: float, n: int, seed: int = 1) -> dict[str, dict[str, list[tuple[str, str]]]]:
    """client -> op -> [(path relative to the namespace root, holder node)], for one r_adj."""
    tag = f"r{round(r_adj * 100):03d}"
    site_of = {node: site for site, nodes in SITES.items() for node in nodes}
    out: dict[str, dict[str, list[tuple[str, str]]]] = {}
    for client, site in site_of.items():
        mate = next(n for n in SITES[site] if n != client)
        remote = [n for n, s in site_of.items() if s != site]
        ops: dict[str, list[tuple[str, str]]] = {}
        base = f"wanbench/{tag}/{client}"
        ops["mkdir"] = ops["rmdir"] = [(f"{base}/new/d{i}", client) for i in range(n)]
        ops["creat"] = [(f"{base}/new/f{i}", client) for i in range(n)]
        ops["stat_missing"] = [(f"{base}/miss/m{i}", client) for i in range(n)]
        for op in TARGET_OPS:
            rng = random.Random(f"{seed}:{tag}:{client}:{op}")
            near = round(r_adj * n)
            kinds = ["near"] * near + ["far"] * (n - near)
            rng.shuffle(kinds)
            holders = [(client if i % 2 == 0 else mate) if kind == "near" else rng.choice(remote)
                       for i, kind in enumerate(kinds)]
            ops[op] = [(f"{base}/{op}/t{i}", holder) for i, holder in enumerate(holders)]
        out[client] = ops
    return out


def holdings(plan: dict[str, dict[str, list[tuple[str, str]]]]) -> Iterator[tuple[str, str, str]]:
    """(kind, path, holder) for everything that must exist before the phases: dirs and target files."""
    for client, ops in plan.items():
        base = ops["mkdir"][0][0].rsplit("/new/", 1)[0]
        yield "dir", f"{base}/new", client
        yield "dir", f"{base}/miss", client
        for op in TARGET_OPS:
            for path, holder in ops[op]:
                yield "file", path, holder


# --- systems under test ------------------------------------------------------------------


class System(Protocol):
    name: str

    def mount(self, node: str) -> Path: ...
    def place(self, kind: str, path: str, holder: str) -> None: ...


#: gmountpy's lookup modes, each a system of its own: GMount's search, the homed directory index
#: (gmountpy's default), and every directory homed at one node of the central site (central metadata).
GMOUNT_MODES = {"gmountpy": "flood", "gmountpy-index": "index", "gmountpy-central": "central"}
#: The whole suite: the default --systems, and what a result needs to be "complete".
ALL_SYSTEMS = (*GMOUNT_MODES, "sshfs", "moosefs", "glusterfs", "gfarm")


class Gmount:
    """gmountpy: targets written into the holders' exports before `up`, so no cache is stale."""

    def __init__(self, emu: wan.Emulation, name: str = "gmountpy", central: str = "") -> None:
        from gmountpy.cluster.config import load_spec

        self.name = name
        self.emu = emu
        mode = GMOUNT_MODES[name]
        # every mode names its lookup, the default's too: since the default became the index, a
        # `gmountpy` column run on the plain cluster file measured the index a second time
        self.variant = mode
        self.tuning: dict[str, Any] = {"lookup": mode}
        if mode == "central":
            self.tuning["central_node"] = SITES[central][0]
        self.spec = load_spec(wan.variant_file(emu, self.variant, self.tuning))

    def place(self, kind: str, path: str, holder: str) -> None:
        target = Path(self.spec.node(holder).export) / path
        if kind == "dir":
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.touch()

    @contextmanager
    def running(self) -> Iterator[None]:
        with wan.gmount_cluster(self.emu, self.variant, self.tuning):
            yield

    def mount(self, node: str) -> Path:
        return Path(self.spec.node(node).mountpoint)

    def messages(self) -> Counter[str]:
        """Requests all daemons have sent to other nodes so far, by operation (their counters),
        asked from inside a site: the host is not routed to the daemons."""
        script = ("import json,sys; from gmountpy.api import Cluster; "
                  "print(json.dumps(Cluster.open(sys.argv[1]).counters()))")
        where = next(iter(SITES.values()))[0]
        done = self.emu.run(where, [sys.executable, "-c", script, self.spec.name], capture_output=True, text=True,
                            check=True)
        total: Counter[str] = Counter()
        for row in json.loads(done.stdout).values():
            total.update({k.removeprefix("messages."): int(v) for k, v in row.items() if k.startswith("messages.")})
        return total


class MooseFs:
    """MooseFS: master at the central site, a chunkserver per site, mfsmount on every node."""

    name = "moosefs"

    def __init__(self, emu: wan.Emulation, work: Path, central: str) -> None:
        self.emu, self.work = emu, work / "moosefs"
        self.master = SITES[central][0]
        self.pending: list[tuple[str, str]] = []

    def place(self, kind: str, path: str, holder: str) -> None:
        self.pending.append((kind, path))  # made through the master-site mount once it is up

    def mount(self, node: str) -> Path:
        return self.work / "mnt" / node

    @contextmanager
    def running(self) -> Iterator[None]:
        address = self.emu.address[self.master]
        etc = self.work / "etc"
        etc.mkdir(parents=True, exist_ok=True)
        (self.work / "master").mkdir(exist_ok=True)
        (self.work / "master" / "metadata.mfs").write_bytes(b"MFSM NEW")  # = Debian's metadata.mfs.empty
        (etc / "mfsexports.cfg").write_text("* / rw,alldirs,maproot=0\n")
        (etc / "mfsmaster.cfg").write_text("\n".join([
            f"DATA_PATH = {self.work / 'master'}", f"EXPORTS_FILENAME = {etc / 'mfsexports.cfg'}",
            "WORKING_USER = root", "WORKING_GROUP = root", f"MATOML_LISTEN_HOST = {address}",
            f"MATOCS_LISTEN_HOST = {address}", f"MATOCL_LISTEN_HOST = {address}", "SYSLOG_IDENT = gmw-mfsmaster",
            ""]))
        self.emu.spawn(self.master, ["mfsmaster", "-f", "-c", str(etc / "mfsmaster.cfg"), "start"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.emu, self.master, address, 9421)
        for site, nodes in SITES.items():
            node = nodes[0]
            chunks = self.work / "chunks" / site
            chunks.mkdir(parents=True, exist_ok=True)
            (etc / f"hdd-{site}.cfg").write_text(f"{chunks}\n")
            (etc / f"cs-{site}.cfg").write_text("\n".join([
                f"DATA_PATH = {chunks}", f"HDD_CONF_FILENAME = {etc / f'hdd-{site}.cfg'}", "WORKING_USER = root",
                "WORKING_GROUP = root", f"MASTER_HOST = {address}", f"BIND_HOST = {self.emu.address[node]}",
                f"CSSERV_LISTEN_HOST = {self.emu.address[node]}", f"SYSLOG_IDENT = gmw-mfscs-{site}", ""]))
            self.emu.spawn(node, ["mfschunkserver", "-f", "-c", str(etc / f"cs-{site}.cfg"), "start"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for node in self.emu.address:
            mnt = self.mount(node)
            mnt.mkdir(parents=True, exist_ok=True)
            self.emu.add_mount(str(mnt))
            self.emu.spawn(node, ["mfsmount", "-f", str(mnt), "-H", address, "-o", "mfscachemode=AUTO"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for node in self.emu.address:
            wait_mounted(self.mount(node))
        top = self.mount(self.master)
        for kind, path in self.pending:
            target = top / path
            if kind == "dir":
                target.mkdir(parents=True, exist_ok=True)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.touch()  # empty: a MooseFS file with data needs a chunk (RTTs) per file
        try:
            yield
        finally:
            for node in self.emu.address:
                subprocess.run(["fusermount3", "-u", "-z", str(self.mount(node))], capture_output=True)


# --- running the phases ----------------------------------------------------------------


def run_phases(system: Any, plan: dict[str, dict[str, list[tuple[str, str]]]], r_adj: float,
               ops: tuple[str, ...], isolated: bool = False, settle_limit: float = 10.0) -> list[dict[str, Any]]:
    """One row per op type. All clients start each phase at once; `isolated` runs them one after
    another instead, so each client's time is what its node costs with the CPUs to itself."""
    clients: dict[str, subprocess.Popen[str]] = {}
    rows: list[dict[str, Any]] = []
    try:
        for client, paths in plan.items():
            mount = system.mount(client)
            # Run as a script: importing the package would import networkx in every client.
            process = subprocess.Popen([sys.executable, str(Path(__file__).with_name("meta_client.py"))],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            assert process.stdin is not None and process.stdout is not None
            process.stdin.write(json.dumps({"paths": {op: [str(mount / p) for p, _ in paths[op]]
                                                      for op in OPS}}) + "\n")
            process.stdin.flush()
            if process.stdout.readline().strip() != "READY":
                raise wan.WanError(f"metadata client for {client} did not start")
            clients[client] = process
        count = getattr(system, "messages", None)  # gmountpy only: its daemons count what they send
        for op in ops:
            before = count() if count else None
            replies = {}
            settled: dict[str, float] = {}
            for batch in ([[c] for c in clients] if isolated else [list(clients)]):
                if isolated:
                    settled[batch[0]] = settle(limit=settle_limit)
                for client in batch:
                    stdin = clients[client].stdin
                    assert stdin is not None
                    stdin.write(f"GO {op}\n")
                    stdin.flush()
                for client in batch:
                    replies[client] = json.loads(clients[client].stdout.readline())  # type: ignore[union-attr]
            slowest = max(r["seconds"] for r in replies.values())
            total = sum(r["count"] for r in replies.values())
            errors = sum(r["errors"] for r in replies.values())
            row = {"system": system.name, "r_adj": r_adj, "op": op, "ops_per_s": total / slowest if slowest else None,
                   "clients": len(replies), "ops_per_client": total // len(replies), "seconds_slowest": slowest,
                   "seconds_per_client": {c: round(r["seconds"], 4) for c, r in replies.items()},
                   "errors": errors, "first_errors": [e for r in replies.values() for e in r["first_errors"]][:3],
                   "isolated": isolated}
            if isolated:
                row["settle_seconds"] = {c: round(s, 2) for c, s in settled.items()}
            if count and before is not None:
                sent = count() - before
                row["messages_per_op"] = round(sum(sent.values()) / total, 3) if total else None
                row["messages_by_op"] = dict(sorted(sent.items()))
            rows.append(row)
            log(f"{system.name:<9} r_adj={r_adj:.1f} {op:<13} {row['ops_per_s']:>10.1f} ops/s"
                + (f"  {row['messages_per_op']} msg/op" if row.get("messages_per_op") is not None else "")
                + (f"  ({errors} errors: {row['first_errors'][:1]})" if errors else ""))
    finally:
        for process in clients.values():
            try:
                assert process.stdin is not None
                process.stdin.close()
                process.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                process.kill()
                process.wait()
            if process.stdout is not None:
                process.stdout.close()
    return rows


def describe_run() -> dict[str, Any]:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"machine": {"host": platform.node(), "kernel": platform.release(), "cpus": os.cpu_count(), "cpu": cpu},
            "commit": git("rev-parse", "HEAD") + ("-dirty" if git("status", "--porcelain") else ""),
            "loadavg_start": os.getloadavg()}


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", type=int, default=1000, help="ops per client per op type (default 1000)")
    parser.add_argument("--quick", action="store_true", help="50 ops per client per type")
    parser.add_argument("--r-adj", default="0.2,0.5,0.8,1.0")
    parser.add_argument("--systems", default=",".join(ALL_SYSTEMS))
    parser.add_argument("--only", default=",".join(OPS), help="these op types only (comma-separated; the phases "
                        "that make targets, mkdir before rmdir, are up to you)")
    parser.add_argument("--sites", type=int, default=4, choices=[2, 3, 4],
                        help="emulate only the first N of the 4 sites (default 4)")
    parser.add_argument("--isolated", action="store_true",
                        help="run the clients of a phase one after another, not all at once: each client's time is "
                        "then what its node costs with this machine's CPUs to itself (a node per machine)")
    parser.add_argument("--settle-limit", type=float, default=10.0,
                        help="with --isolated, wait at most this many seconds for idle CPUs before each client "
                        "(default 10; 0: do not wait, for systems bound by RTTs, not CPUs)")
    parser.add_argument("--out", type=Path, default=RESULTS / "wan_meta.json")
    parser.add_argument("--resume", action="store_true",
                        help="keep what --out already has for the same workload, each system's localities "
                        "(r_adj) measured in full, and run only the rest (a run too long for one sitting, done in "
                        "parts; each part records its own commit, times and load)")
    args = parser.parse_args(argv)
    use_sites(args.sites)
    n = 50 if args.quick else args.ops
    r_values = [float(r) for r in args.r_adj.split(",")]
    systems = [s for s in args.systems.split(",") if s]
    only = tuple(op for op in OPS if op in args.only.split(","))
    if unknown := set(args.only.split(",")) - set(OPS):
        parser.error(f"unknown op types {sorted(unknown)} (known: {', '.join(OPS)})")
    if (why := wan.problem()) is not None:
        log(f"cannot run: {why}")
        return 1
    if "moosefs" in systems and shutil.which("mfsmaster") is None:
        log("moosefs skipped: mfsmaster not installed (Debian: moosefs-master moosefs-chunkserver moosefs-client)")
        systems.remove("moosefs")
    if "glusterfs" in systems and (why := glusterfs.ensure_installed(log)) is not None:
        log(f"glusterfs skipped: {why}")
        systems.remove("glusterfs")
    if "gfarm" in systems and (why := gfarm.ensure_installed(log)) is not None:
        log(f"gfarm skipped: {why}")
        systems.remove("gfarm")
    if "sshfs" in systems and shutil.which("sshfs") is None:
        log("sshfs skipped: not installed (Debian: sshfs)")
        systems.remove("sshfs")

    signal.signal(signal.SIGTERM, _interrupt)  # tear down as on Ctrl-C
    run = describe_run()
    central = central_site()
    workload = {"ops_per_client": n, "sites": len(SITES), "clients": sum(len(v) for v in SITES.values()),
                "r_adj": r_values, "ops": list(only), "isolated": args.isolated, "central_site": central}
    result: dict[str, Any] = {"benchmark": "wan_meta", **run, **workload, "systems": {}, "results": [],
                              "complete": False}
    if args.resume and args.out.exists():
        result = resumed(json.loads(args.out.read_text()), workload, run)
        log(f"resuming {args.out}: keeping " + (", ".join(
            f"{s} r_adj {'/'.join(f'{r:g}' for r in localities(result, s))}" for s in result["systems"])
            or "nothing"))
    todo = {s: [r for r in r_values if r not in localities(result, s)] for s in systems}
    systems = [s for s in systems if todo[s]]
    rows: list[dict[str, Any]] = result["results"]
    with tempfile.TemporaryDirectory(prefix="gmw-meta-") as tmp, ExitStack() as stack:
        work = Path(tmp)
        old_state = os.environ.get("XDG_STATE_HOME")
        os.environ["XDG_STATE_HOME"] = str(work / "state")
        stack.callback(lambda: os.environ.__setitem__("XDG_STATE_HOME", old_state) if old_state
                       else os.environ.pop("XDG_STATE_HOME", None))
        name = f"wanmeta-{os.getpid()}"
        (work / "cluster.toml").write_text(cluster_toml(work, name))
        emu = stack.enter_context(wan.emulate(work / "cluster.toml", workdir=work))
        log(f"emulated {len(SITES)} sites x 2 nodes; central site for sshfs/moosefs: {central}; {n} ops/client/type")
        plans = {r: layout(r, n) for r in r_values}
        for system_name in systems:
            system: Any
            if system_name in GMOUNT_MODES:
                system = Gmount(emu, system_name, central)
            elif system_name == "sshfs":
                system = CentralServer(emu, work, SITES[central][0])
            elif system_name == "moosefs":
                system = MooseFs(emu, work, central)
            elif system_name == "glusterfs":
                system = glusterfs.GlusterFs(emu, work)
            elif system_name == "gfarm":
                system = gfarm.Gfarm(emu, work, metadata_node=SITES[central][0])
            else:
                raise SystemExit(f"unknown system {system_name!r} ({', '.join(GMOUNT_MODES)}, sshfs, moosefs, "
                                 "glusterfs, gfarm)")
            for plan in plans.values():
                for kind, path, holder in holdings(plan):
                    system.place(kind, path, holder)
            started = time.monotonic()
            about: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "commit": run["commit"],
                                     "loadavg_start": os.getloadavg(), "r_adj": todo[system_name]}
            if system_name in result["systems"]:  # the localities an earlier part measured, and when
                about["earlier_parts"] = earlier_parts(result["systems"][system_name])
            with system.running():
                about["up_seconds"] = round(time.monotonic() - started, 1)
                log(f"{system_name} up in {about['up_seconds']}s")
                result["systems"][system_name] = about
                result["cluster"] = (work / "cluster.toml").read_text().replace(str(work), "$WORK")
                for r in todo[system_name]:
                    rows += run_phases(system, plans[r], r, only, args.isolated, args.settle_limit)
                    write(args.out, result)  # after every locality: a run cut short keeps what it measured
            about["loadavg_end"] = os.getloadavg()
            write(args.out, result)
        result["loadavg_end"] = os.getloadavg()
    result["complete"] = complete(result)
    write(args.out, result)
    print(table(result))
    plot(result, args.out.with_suffix(".png"))
    return 0


def complete(result: dict[str, Any]) -> bool:
    """True when the result holds every system of the suite at every r_adj and op type it names (a run in parts
    is complete only once its last part is in)."""
    wanted = {(r, op) for r in result["r_adj"] for op in result["ops"]}
    have: dict[str, set[tuple[float, str]]] = {}
    for row in result["results"]:
        have.setdefault(row["system"], set()).add((row["r_adj"], row["op"]))
    return all(have.get(s, set()) >= wanted for s in ALL_SYSTEMS)


def _busy_jiffies() -> tuple[int, int]:
    """(busy, total) CPU time of the whole machine so far, from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def settle(quiet: float = 0.10, window: float = 0.25, limit: float = 10.0) -> float:
    """Wait until the machine's CPUs are idle (below `quiet` busy over `window` seconds, at most
    `limit` seconds); the seconds waited. With --isolated, before each client: the work the last
    client left behind (export scans, syncs, a previous phase's changes settling) would otherwise
    land on the next one, which on a node of its own runs on other CPUs."""
    started = time.monotonic()
    while time.monotonic() - started < limit:
        busy0, total0 = _busy_jiffies()
        time.sleep(window)
        busy1, total1 = _busy_jiffies()
        if total1 > total0 and (busy1 - busy0) / (total1 - total0) < quiet:
            break
    return time.monotonic() - started


def write(out: Path, result: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    log(f"wrote {out}")


def localities(result: dict[str, Any], system: str) -> list[float]:
    """The r_adj values at which `result` has every op type for `system`."""
    have = {(row["r_adj"], row["op"]) for row in result["results"] if row["system"] == system}
    return [r for r in result["r_adj"] if all((r, op) in have for op in result["ops"])]


def earlier_parts(about: dict[str, Any]) -> list[dict[str, Any]]:
    """A system's record from an earlier part, flattened: one entry per part, oldest first."""
    this = {k: v for k, v in about.items() if k != "earlier_parts"}
    return [*about.get("earlier_parts", []), this]


def resumed(old: dict[str, Any], workload: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """The earlier result for this same workload, keeping each system's localities measured in full (a
    locality cut short is measured again in full, so its ops share one start)."""
    differs = {k: (old.get(k), v) for k, v in workload.items() if old.get(k) != v}
    if differs:
        raise SystemExit(f"--resume: the earlier run measured another workload ({differs}); pick another --out")
    kept = {s: localities(old, s) for s in old.get("systems", {})}
    old["systems"] = {s: v for s, v in old["systems"].items() if kept[s]}
    old["results"] = [row for row in old["results"] if row["r_adj"] in kept.get(row["system"], [])]
    old["commits"] = sorted({old.get("commit", ""), *old.get("commits", []), run["commit"],
                             *(about.get("commit", "") for about in old["systems"].values())} - {""})
    old["complete"] = False
    return old


def table(result: dict[str, Any]) -> str:
    """Markdown: ops/s per op (rows) and system x r_adj (columns)."""
    rows = result["results"]
    systems = list(dict.fromkeys(r["system"] for r in rows))
    r_values = list(dict.fromkeys(r["r_adj"] for r in rows))
    cols = [(s, r) for s in systems for r in r_values]
    value = {(r["system"], r["r_adj"], r["op"]): r["ops_per_s"] for r in rows}
    lines = ["| op | " + " | ".join(f"{s} r={r:g}" for s, r in cols) + " |",
             "|---|" + "---:|" * len(cols)]
    for op in OPS:
        cells = [value.get((s, r, op)) for s, r in cols]
        lines.append(f"| {op} | " + " | ".join("-" if v is None else f"{v:.0f}" for v in cells) + " |")
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["results"]
    systems = list(dict.fromkeys(r["system"] for r in rows))
    r_values = list(dict.fromkeys(r["r_adj"] for r in rows))
    value = {(r["system"], r["r_adj"], r["op"]): r["ops_per_s"] or 0 for r in rows}
    fig, axes = plt.subplots(len(r_values), 1, figsize=(11, 2.6 * len(r_values)), sharex=True, squeeze=False)
    width = 0.8 / max(1, len(systems))
    for ax, r in zip(axes[:, 0], r_values, strict=True):
        for k, system in enumerate(systems):
            xs = [i + k * width for i in range(len(OPS))]
            ax.bar(xs, [value.get((system, r, op), 0) for op in OPS], width, label=system)
        ax.set_yscale("log")
        ax.set_ylabel("ops/s")
        ax.set_title(f"r_adj = {r:g}", fontsize=9)
    axes[0, 0].legend(fontsize=8, ncol=len(systems))
    axes[-1, 0].set_xticks([i + 0.4 - width / 2 for i in range(len(OPS))], OPS, rotation=30, fontsize=8)
    rtts = sorted({rtt for a, b, rtt in LINKS})
    span = f"{rtts[0]:g}-{rtts[-1]:g}" if len(rtts) > 1 else f"{rtts[0]:g}"
    fig.suptitle(f"Aggregate metadata ops/s, {result['clients']} clients on {result.get('sites', 4)} WAN sites "
                 f"(RTT {span} ms), "
                 f"{result['ops_per_client']} ops/client/type — " + (
                     f"commit {result['commit'][:10]}" if len(result.get("commits", [])) <= 1
                     else f"{len(result['commits'])} commits, one per part (see the JSON)"), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    ours = next((s for s in ("gmountpy-index", "gmountpy") if s in systems), None)  # the default lookup first
    if len(systems) > 1 and ours is not None:
        fig, ax = plt.subplots(figsize=(9, 4))
        for base in [s for s in systems if s != ours]:
            for op in ("stat", "open_close", "chmod", "creat", "stat_missing"):
                ys = [value[(ours, r, op)] / value[(base, r, op)] if value.get((base, r, op)) else 0
                      for r in r_values]
                ax.plot(r_values, ys, marker="o", label=f"{op} vs {base}")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_yscale("log")
        ax.set_xlabel("r_adj (fraction of targets at the client's site)")
        ax.set_ylabel(f"{ours} ops/s ÷ baseline ops/s")
        ax.legend(fontsize=7, ncol=2)
        ax.set_title(f"{ours} relative to the other systems in the same run", fontsize=9)
        fig.tight_layout()
        fig.savefig(path.with_name(path.stem + "_ratio.png"), dpi=110)
        plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
