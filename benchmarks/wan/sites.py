"""Sites of a cluster file as network namespaces, with real WAN round-trip times between them.

Layout (all names carry a per-run prefix `gmw<pid>x<rand>`, so parallel runs never collide
and no pre-existing namespace is touched; nothing is added to the host's own network
namespace):

    site namespace  <prefix>-<site>    veth `wan` 10.200.<i>.2/24, one address per node
                                       10.200.<i>.<10+k>, 10.200.0.0/16 via the hub, nothing else
                                       (an unreachable default route)
    hub namespace   <prefix>-hub       veth `s<i>` 10.200.<i>.1/24 towards each site, forwarding on;
                                       FORWARD -i s<i> -o s<j> -j NFQUEUE --queue-num <q(i,j)>
    gmw-delay (C, libnetfilter_queue)  inside the hub: holds each packet of queue q(i,j) for
                                       rtt(i,j)/2 - 0.1 ms, then accepts it (the kernel keeps it)

Nodes of one site share their site's namespace, each on its own address, so traffic
between them is local routing (~0.05 ms): `intra_site_rtt_ms` is not emulated, it only
orders lookups as usual. Links missing from the cluster file get the shortest-path RTT
over the links that are there (the hub routes directly). A link's optional
`bandwidth_mbit` (a harness-only key, removed from the cluster file given to gmount)
caps that path with an htb class on the hub's egress veth.

Processes go into a site with `nsenter --net=/run/netns/<ns>` (never `ip netns exec`,
whose private mount namespace would hide FUSE mounts from the host).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import networkx as nx  # type: ignore[import-untyped]

from gmountpy.cluster.config import ClusterSpec, parse_spec
from gmountpy.errors import GmountError

from .cgroups import CgroupError, Hierarchy, NodeCgroups, layout

IPTABLES = "iptables-legacy"
DELAY_SOURCE = Path(__file__).with_name("delay.c")
PROCESSING_ALLOWANCE_MS = 0.1  # per one-way trip: the queue round trip through user space
TCP_BUFFERS = "4096 131072 67108864"  # min default max: room for 10 ms x several GB/s


# Processes this interpreter started into the sites, by pid: reaped (waited for) when killed.
_children: dict[int, subprocess.Popen[Any]] = {}


class WanError(GmountError):
    """The emulation could not be built or torn down; the message says which step and why."""


def state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(base) / "gmountpy" / "wan"


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "gmountpy" / "wan"


@dataclass
class Emulation:
    """A running emulation: what was created, so that `down` removes exactly that."""

    name: str                       # the cluster's name
    prefix: str                     # gmw<pid>x<hex>: every namespace name starts with it
    hub: str                        # hub namespace
    netns: dict[str, str]           # site -> namespace
    address: dict[str, str]         # node -> IPv4 address inside its site namespace
    site_of: dict[str, str]         # node -> site
    rtt_ms: dict[str, float]        # "a|b" -> emulated RTT (every ordered pair of distinct sites)
    cluster_file: str               # the cluster file for gmount (listen/netns per node filled in)
    delay_pid: int = 0
    pids: list[int] = field(default_factory=list)      # processes started in the sites (pid, start time)
    starts: dict[str, int] = field(default_factory=dict)
    mounts: list[str] = field(default_factory=list)    # mountpoints to unmount on teardown
    gmount_up: bool = False
    bandwidth_mbit: dict[str, float] = field(default_factory=dict)  # "a|b" -> cap (both directions), if any
    cgroups: dict[str, Any] | None = None  # NodeCgroups.to_dict() when nodes own their CPUs
    watcher_pid: int = 0                   # the cgroup watcher (jobs with GMOUNT_NODE -> their node's CPUs)

    # --- running things inside the sites -----------------------------------------

    def netns_of(self, where: str) -> str:
        """Namespace of a site or of a node's site."""
        site = self.site_of.get(where, where)
        if site not in self.netns:
            raise WanError(f"{where!r} is neither a site nor a node of cluster {self.name!r} "
                           f"(sites: {', '.join(self.netns)})")
        return self.netns[site]

    def prefix_for(self, where: str) -> list[str]:
        """argv prefix that runs a command in a site's (or node's) network namespace."""
        return ["nsenter", f"--net=/run/netns/{self.netns_of(where)}", "--"]

    def spawn(self, where: str, argv: Sequence[str], *, node: str | None = None,
              **popen: Any) -> subprocess.Popen[Any]:
        """Start a process in a site; `down` kills it if it is still running.

        With `node` (and nodes that own their CPUs) it runs in that node's cgroup from its first
        instruction: a node's daemons (gfsd, gfarm2fs, sshfs) use that node's CPUs only.
        """
        popen.setdefault("start_new_session", True)
        groups = self.node_cgroups()
        if node is not None and groups is not None:
            popen["preexec_fn"] = groups.preexec(node)
        process = subprocess.Popen([*self.prefix_for(where), *argv], **popen)
        _children[process.pid] = process
        self.pids.append(process.pid)
        self.starts[str(process.pid)] = _start_time(process.pid) or 0
        self.save()
        return process

    def run(self, where: str, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        """Run a command to completion in a site."""
        return subprocess.run([*self.prefix_for(where), *argv], **kwargs)

    def node_cgroups(self) -> NodeCgroups | None:
        """The nodes' cgroups, when nodes own their CPUs (`up(..., node_cpus=True)`)."""
        return NodeCgroups.from_dict(self.cgroups) if self.cgroups else None

    def link(self) -> dict[str, Any]:
        """What every run states: the emulated RTT and bandwidth between each pair of sites, and the CPUs."""
        pairs = []
        for key, rtt in self.rtt_ms.items():
            a, b = key.split("|")
            if a < b:
                pairs.append({"sites": [a, b], "rtt_ms": rtt, "bandwidth_mbit": self.bandwidth_mbit.get(key)})
        groups = self.node_cgroups()
        return {"links": pairs, "cpus": groups.describe() if groups is not None else "shared (no node cgroups)"}

    def wan_bytes(self) -> dict[str, int]:
        """Bytes the hub has sent into each site so far (everything that crossed the WAN towards it)."""
        out = subprocess.run(["ip", "-n", self.hub, "-s", "-j", "link", "show"], capture_output=True, text=True,
                             check=True).stdout
        by_dev = {link["ifname"]: int(link["stats64"]["tx"]["bytes"]) for link in json.loads(out)}
        return {site: by_dev.get(f"s{i}", 0) for i, site in enumerate(self.netns, start=1)}

    def add_mount(self, mountpoint: str) -> None:
        """Remember a mount made from a site (sshfs, ...) so that `down` unmounts it."""
        self.mounts.append(str(mountpoint))
        self.save()

    def path_rtt(self, a: str, b: str) -> float:
        """Emulated RTT between two nodes (or sites); 0 inside one site."""
        sa, sb = self.site_of.get(a, a), self.site_of.get(b, b)
        return 0.0 if sa == sb else self.rtt_ms[f"{sa}|{sb}"]

    # --- persistence ----------------------------------------------------------------

    @property
    def state_file(self) -> Path:
        return state_dir() / f"{self.name}.json"

    def save(self) -> None:
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        os.replace(tmp, self.state_file)

    @classmethod
    def load(cls, name: str) -> Emulation | None:
        path = state_dir() / f"{name}.json"
        if not path.exists():
            return None
        return cls(**json.loads(path.read_text()))


# --- building -----------------------------------------------------------------------


def load_cluster(path: str | os.PathLike[str]) -> tuple[dict[str, Any], ClusterSpec, dict[frozenset[str], float]]:
    """Read a cluster file; returns (raw data without harness keys, validated spec, bandwidth per link)."""
    source = os.fspath(path)
    with open(source, "rb") as f:
        data = tomllib.load(f)
    bandwidth: dict[frozenset[str], float] = {}
    for link in data.get("links", []):
        if isinstance(link, dict) and "bandwidth_mbit" in link:
            mbit = link.pop("bandwidth_mbit")
            if not isinstance(mbit, (int, float)) or mbit <= 0:
                raise WanError(f"{source}: links {link.get('sites')}: bandwidth_mbit must be > 0, got {mbit!r}")
            bandwidth[frozenset(link["sites"])] = float(mbit)
    spec = parse_spec(data, base_dir=os.path.dirname(os.path.abspath(source)), source=source)
    if spec.launcher != "local":
        raise WanError(f"{source}: the WAN emulation runs nodes on this machine: launcher must be \"local\"")
    if len(spec.sites) > 250 or any(len(n) > 240 for n in spec.sites.values()):
        raise WanError(f"{source}: at most 250 sites of 240 nodes each")
    return data, spec, bandwidth


def site_rtts(spec: ClusterSpec) -> dict[str, float]:
    """RTT for every ordered pair of sites: the link's, else the shortest path over links."""
    graph = nx.Graph()
    graph.add_nodes_from(spec.sites)
    for link in spec.links:
        graph.add_edge(*link.sites, rtt_ms=link.rtt_ms)
    lengths = dict(nx.all_pairs_dijkstra_path_length(graph, weight="rtt_ms"))
    return {f"{a}|{b}": float(lengths[a][b]) for a in spec.sites for b in spec.sites if a != b}


def delay_binary() -> Path:
    """Compile delay.c once per source version into the cache dir (no binary is committed)."""
    source = DELAY_SOURCE.read_bytes()
    digest = hashlib.sha256(source).hexdigest()[:16]
    binary = cache_dir() / f"gmw-delay-{digest}"
    if binary.exists():
        return binary
    if shutil.which("gcc") is None:
        raise WanError("gcc not found: install gcc, libnetfilter-queue-dev and libmnl-dev (Debian) "
                       "to build the packet delay program")
    binary.parent.mkdir(parents=True, exist_ok=True)
    tmp = binary.with_suffix(f".tmp{os.getpid()}")
    result = subprocess.run(["gcc", "-O2", "-Wall", "-o", str(tmp), str(DELAY_SOURCE),
                             "-lnetfilter_queue", "-lmnl"], capture_output=True, text=True)
    if result.returncode != 0:
        raise WanError(f"compiling {DELAY_SOURCE} failed (need Debian libnetfilter-queue-dev, libmnl-dev):\n"
                       f"{result.stderr.strip()}")
    os.replace(tmp, binary)
    return binary


def problem() -> str | None:
    """Why the emulation cannot run here, or None (used by tests and the CLI)."""
    if os.geteuid() != 0:
        return "network namespaces and iptables need root"
    for tool in ("ip", "nsenter", IPTABLES, "gcc", "tc"):
        if shutil.which(tool) is None:
            return f"{tool} not found (Debian: iproute2, util-linux, iptables, gcc)"
    if not Path("/usr/include/libnetfilter_queue/libnetfilter_queue.h").exists():
        return "libnetfilter_queue headers missing (Debian: libnetfilter-queue-dev, libmnl-dev)"
    return None


def _sh(argv: Sequence[str], what: str) -> str:
    result = subprocess.run(list(argv), capture_output=True, text=True)
    if result.returncode != 0:
        raise WanError(f"{what} failed: `{' '.join(argv)}`: {result.stderr.strip() or result.stdout.strip()}")
    return result.stdout


def _in(ns: str, *argv: str) -> list[str]:
    return ["nsenter", f"--net=/run/netns/{ns}", "--", *argv]


def up(cluster_file: str | os.PathLike[str], *, workdir: str | os.PathLike[str] | None = None,
       node_cpus: bool = False, cpus: Sequence[int] | None = None) -> Emulation:
    """Build the emulated sites for a cluster file; on any failure everything built is removed.

    With `node_cpus` every node gets a cgroup of its own with its CPUs (`cgroups.layout` over
    `cpus`, default every CPU this process may use), and a watcher puts each job naming the
    node (GMOUNT_NODE) into it.
    """
    if (why := problem()) is not None:
        raise WanError(f"cannot emulate WAN sites here: {why}")
    data, spec, bandwidth = load_cluster(cluster_file)
    existing = Emulation.load(spec.name)
    if existing is not None:
        if any(Path(f"/run/netns/{ns}").exists() for ns in [existing.hub, *existing.netns.values()]):
            raise WanError(f"an emulation of cluster {spec.name!r} is already up: "
                           f"run `python -m benchmarks.wan down {os.fspath(cluster_file)}` first")
        existing.state_file.unlink(missing_ok=True)
    binary = delay_binary()
    prefix = f"gmw{os.getpid()}x{secrets.token_hex(2)}"
    sites = list(spec.sites)
    netns = {site: f"{prefix}-{site}" for site in sites}
    address = {node: f"10.200.{i + 1}.{10 + k}" for i, site in enumerate(sites)
               for k, node in enumerate(spec.sites[site])}
    out_dir = Path(workdir) if workdir is not None else state_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    emu = Emulation(name=spec.name, prefix=prefix, hub=f"{prefix}-hub", netns=netns, address=address,
                    site_of={n: s for s, ns in spec.sites.items() for n in ns}, rtt_ms=site_rtts(spec),
                    cluster_file=str(out_dir / f"{spec.name}.wan.toml"),
                    bandwidth_mbit={f"{a}|{b}": mbit for pair, mbit in bandwidth.items() for a in pair for b in pair
                                    if a != b})
    emu.save()  # first, so that an interrupted build is still torn down by `down`
    try:
        _build(emu, sites, bandwidth, binary)
        if node_cpus:
            _own_cpus(emu, list(emu.address), sorted(cpus if cpus is not None else os.sched_getaffinity(0)))
        Path(emu.cluster_file).write_text(_gmount_cluster_toml(data, spec, emu))
        emu.save()
    except BaseException:
        down(emu)
        raise
    return emu


def _own_cpus(emu: Emulation, nodes: list[str], cpus: list[int]) -> None:
    """A cgroup per node with its CPUs, and the watcher that puts each node's jobs into it."""
    groups = NodeCgroups(emu.prefix, layout(nodes, cpus), _hierarchy())
    emu.cgroups = groups.to_dict()  # before anything is made: `down` removes what `made` lists
    emu.save()
    try:
        groups._build()
    finally:
        emu.cgroups = groups.to_dict()
        emu.save()
    config = Path(emu.cluster_file).with_name(f"{emu.prefix}-cgroups.json")
    config.write_text(json.dumps({"groups": groups.to_dict(), "clusters": [emu.name]}))
    root = Path(__file__).resolve().parents[2]
    watcher = subprocess.Popen([sys.executable, "-m", "benchmarks.wan.cgroups", "watch", str(config)], cwd=root,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    _children[watcher.pid] = watcher
    emu.watcher_pid = watcher.pid
    emu.starts[str(watcher.pid)] = _start_time(watcher.pid) or 0
    emu.save()
    assert watcher.stdout is not None and watcher.stderr is not None
    line = watcher.stdout.readline()
    if line.strip() != "READY":
        raise WanError(f"the cgroup watcher did not start: {watcher.stderr.read().strip() or line.strip()}")
    watcher.stdout.close()
    watcher.stderr.close()


def _hierarchy() -> Hierarchy:
    try:
        return Hierarchy.detect()
    except CgroupError as exc:
        raise WanError(f"nodes cannot own their CPUs here: {exc}") from None


def _build(emu: Emulation, sites: list[str], bandwidth: dict[frozenset[str], float], binary: Path) -> None:
    _sh(["ip", "netns", "add", emu.hub], "creating the hub namespace")
    _sh(_in(emu.hub, "ip", "link", "set", "lo", "up"), "hub: lo up")
    _sh(_in(emu.hub, "sysctl", "-qw", "net.ipv4.ip_forward=1"), "hub: enabling forwarding")
    for i, site in enumerate(sites, start=1):
        ns = emu.netns[site]
        _sh(["ip", "netns", "add", ns], f"creating the namespace of site {site}")
        _sh(["ip", "-n", emu.hub, "link", "add", f"s{i}", "type", "veth", "peer", "name", "wan", "netns", ns],
            f"veth between hub and site {site}")
        _sh(["ip", "-n", emu.hub, "addr", "add", f"10.200.{i}.1/24", "dev", f"s{i}"], "hub address")
        _sh(["ip", "-n", emu.hub, "link", "set", f"s{i}", "up"], "hub veth up")
        _sh(["ip", "-n", ns, "link", "set", "lo", "up"], f"site {site}: lo up")
        _sh(["ip", "-n", ns, "addr", "add", f"10.200.{i}.2/24", "dev", "wan"], f"site {site}: address")
        for node in [n for n, s in emu.site_of.items() if s == site]:
            _sh(["ip", "-n", ns, "addr", "add", f"{emu.address[node]}/24", "dev", "wan"],
                f"site {site}: address of node {node}")
        _sh(["ip", "-n", ns, "link", "set", "wan", "up"], f"site {site}: veth up")
        _sh(["ip", "-n", ns, "route", "add", "10.200.0.0/16", "via", f"10.200.{i}.1"], f"site {site}: route")
        # Nothing outside the sites is reachable: say so at once, so that a peer's reverse DNS
        # lookup of a site address (glusterd does them) fails at once, not after the resolver's 5 s.
        _sh(["ip", "-n", ns, "route", "add", "unreachable", "default"], f"site {site}: unreachable default")
        for key in ("net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"):
            _sh(_in(ns, "sysctl", "-qw", f"{key}={TCP_BUFFERS}"), f"site {site}: {key}")
    queues: list[str] = []
    index = {site: i for i, site in enumerate(sites, start=1)}
    for a in sites:
        for b in sites:
            if a == b:
                continue
            q = len(queues)
            one_way_us = max(0.0, emu.rtt_ms[f"{a}|{b}"] / 2 - PROCESSING_ALLOWANCE_MS) * 1000
            queues.append(f"{q}:{one_way_us:.0f}")
            _sh(_in(emu.hub, IPTABLES, "-t", "filter", "-A", "FORWARD", "-i", f"s{index[a]}", "-o", f"s{index[b]}",
                    "-j", "NFQUEUE", "--queue-num", str(q)), f"hub: delay rule {a}->{b}")
    _shape(emu, sites, index, bandwidth)
    if queues:
        process = subprocess.Popen(_in(emu.hub, str(binary), *queues), stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, start_new_session=True)
        _children[process.pid] = process
        emu.delay_pid = process.pid
        emu.starts[str(process.pid)] = _start_time(process.pid) or 0
        emu.save()
        assert process.stdout is not None
        line = process.stdout.readline()
        if line.strip() != "READY":
            err = process.stderr.read() if process.stderr else ""
            raise WanError(f"packet delay program did not start: {err.strip() or line.strip()}")
        process.stdout.close()
        assert process.stderr is not None
        process.stderr.close()


def _shape(emu: Emulation, sites: list[str], index: dict[str, int], bandwidth: dict[frozenset[str], float]) -> None:
    """htb on the hub veth towards each site: one class per capped source site."""
    for b in sites:
        caps = [(a, bandwidth[frozenset((a, b))]) for a in sites if a != b and frozenset((a, b)) in bandwidth]
        if not caps:
            continue
        dev = f"s{index[b]}"
        _sh(_in(emu.hub, "tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb",
                "default", "999"), f"hub: htb on {dev}")
        for a, mbit in caps:
            cls = f"1:{index[a]}"
            _sh(_in(emu.hub, "tc", "class", "add", "dev", dev, "parent", "1:", "classid", cls,
                    "htb", "rate", f"{mbit}mbit", "ceil", f"{mbit}mbit"), f"hub: rate {a}->{b}")
            _sh(_in(emu.hub, "tc", "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip",
                    "u32", "match", "ip", "src", f"10.200.{index[a]}.0/24", "flowid", cls), f"hub: filter {a}->{b}")


def _gmount_cluster_toml(data: dict[str, Any], spec: ClusterSpec, emu: Emulation) -> str:
    """The user's cluster file with each node's `listen` address and `netns` filled in.

    Export and mountpoint are written resolved, as the file now lives elsewhere.
    """
    out = json.loads(json.dumps(data))
    nodes = out.setdefault("nodes", {})
    for node, ip in emu.address.items():
        table = nodes.setdefault(node, {})
        table["export"] = spec.node(node).export
        table["mountpoint"] = spec.node(node).mountpoint
        table["listen"] = ip
        table["netns"] = emu.netns_of(node)
    return "# written by benchmarks.wan up; removed by benchmarks.wan down\n" + _toml(out)


def _toml(data: dict[str, Any], prefix: str = "") -> str:
    """A small TOML writer for what cluster files contain (scalars, lists, tables, arrays of tables)."""
    lines: list[str] = []
    tables: list[tuple[str, Any]] = []
    for key, value in data.items():
        if isinstance(value, dict) or (isinstance(value, list) and value and all(isinstance(v, dict) for v in value)):
            tables.append((key, value))
        else:
            lines.append(f"{_key(key)} = {_value(value)}")
    text = "\n".join(lines) + ("\n" if lines else "")
    for key, value in tables:
        name = f"{prefix}{_key(key)}"
        if isinstance(value, dict):
            text += f"\n[{name}]\n" + _toml(value, name + ".")
        else:
            for item in value:
                text += f"\n[[{name}]]\n" + _toml(item, name + ".")
    return text


def _key(key: str) -> str:
    return key if key.replace("_", "").replace("-", "").isalnum() else json.dumps(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise WanError(f"cannot write {value!r} to a cluster file")


# --- tearing down ---------------------------------------------------------------------


def _start_time(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rpartition(")")[2].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _kill(pid: int, start: int | None, timeout: float = 5.0) -> None:
    """SIGTERM (then SIGKILL) one process we started, if it is still that process."""
    if pid <= 0 or _start_time(pid) is None or (start and _start_time(pid) != start):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.02)
    if _alive(pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _alive(pid: int) -> bool:
    child = _children.get(pid)
    if child is not None:
        if child.poll() is None:
            return True
        del _children[pid]
        return False
    try:
        os.waitpid(pid, os.WNOHANG)  # reap it if it is our child
    except ChildProcessError:
        pass
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def _netns_pids(ns: str) -> list[int]:
    result = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
    return [int(p) for p in result.stdout.split() if p.isdigit()]


def _mounted(path: str) -> bool:
    with open("/proc/self/mounts") as f:
        return any(line.split(" ")[1] == path for line in f)


def _gmount_runs_here(emu: Emulation) -> bool:
    """True if the gmount cluster recorded under this name has its daemons in our namespaces."""
    from gmountpy.cluster import state as state_store

    try:
        state = state_store.load(emu.name)
    except GmountError:
        return False
    ours = set(emu.netns.values())
    return state is not None and any(n.netns in ours for n in state.spec.nodes.values())


def down(emu: Emulation | str) -> list[str]:
    """Remove everything an emulation created; returns problems (empty when all went). Safe twice."""
    if isinstance(emu, str):
        loaded = Emulation.load(emu)
        if loaded is None:
            return []
        emu = loaded
    problems: list[str] = []
    if _gmount_runs_here(emu):
        from gmountpy import launch

        try:
            for node, why in launch.down(emu.name).items():
                problems.append(f"gmount down: {node}: {why}")
        except GmountError as exc:
            problems.append(f"gmount down {emu.name}: {exc}")
    for pid in emu.pids:
        _kill(pid, emu.starts.get(str(pid)))
    namespaces = [*emu.netns.values(), emu.hub]
    # Whatever else still runs in our namespaces was started into them by us or for us
    # (daemons, sshd, sshfs): stop it before the mounts and the namespaces go.
    for ns in namespaces:
        if Path(f"/run/netns/{ns}").exists():
            for pid in _netns_pids(ns):
                if pid != emu.delay_pid:
                    _kill(pid, None)
    for mountpoint in emu.mounts:
        if _mounted(mountpoint):
            result = subprocess.run(["fusermount3", "-u", "-z", mountpoint], capture_output=True, text=True)
            if result.returncode != 0:
                result = subprocess.run(["umount", "-l", mountpoint], capture_output=True, text=True)
            if result.returncode != 0:
                problems.append(f"could not unmount {mountpoint}: {result.stderr.strip()}")
    _kill(emu.delay_pid, emu.starts.get(str(emu.delay_pid)))
    groups = emu.node_cgroups()
    if groups is not None:
        _kill(emu.watcher_pid, emu.starts.get(str(emu.watcher_pid)))
        for node in groups.allotments:  # processes we put on a node's CPUs (jobs, daemons) are ours
            for pid in groups.pids(node):
                _kill(pid, None)
        problems += groups.remove()
        Path(emu.cluster_file).with_name(f"{emu.prefix}-cgroups.json").unlink(missing_ok=True)
    for ns in namespaces:
        if Path(f"/run/netns/{ns}").exists():
            for pid in _netns_pids(ns):
                _kill(pid, None)
            result = subprocess.run(["ip", "netns", "del", ns], capture_output=True, text=True)
            if result.returncode != 0:
                problems.append(f"could not delete namespace {ns}: {result.stderr.strip()}")
    Path(emu.cluster_file).unlink(missing_ok=True)
    emu.state_file.unlink(missing_ok=True)
    return problems


@contextmanager
def emulate(cluster_file: str | os.PathLike[str], *, workdir: str | os.PathLike[str] | None = None,
            node_cpus: bool = False, cpus: Sequence[int] | None = None) -> Iterator[Emulation]:
    """The emulation for the duration of a block; torn down on exit, errors and Ctrl-C."""
    emu = up(cluster_file, workdir=workdir, node_cpus=node_cpus, cpus=cpus)
    try:
        yield emu
    finally:
        problems = down(emu)
        if problems:
            raise WanError("teardown left things behind:\n  " + "\n  ".join(problems))


def variant_file(emu: Emulation, variant: str, tuning: dict[str, Any]) -> str:
    """The emulation's cluster file for a variant: own name, exports and mountpoints; `tuning` added."""
    data = tomllib.loads(Path(emu.cluster_file).read_text())
    data["name"] = f"{data['name']}-{variant}"
    for table in data.get("nodes", {}).values():
        table["export"] = f"{table['export']}-{variant}"
        table["mountpoint"] = f"{table['mountpoint']}-{variant}"
        os.makedirs(table["export"], exist_ok=True)
    data.setdefault("tuning", {}).update(tuning)
    path = Path(emu.cluster_file).with_name(f"{data['name']}.wan.toml")
    path.write_text("# written by benchmarks.wan for a variant of the cluster\n" + _toml(data))
    return str(path)


def own_cpus(emu: Emulation, cluster: str) -> None:
    """Put a running gmount cluster's daemons into their nodes' cgroups (if nodes own their CPUs):
    what a daemon starts afterwards runs there too."""
    from gmountpy.cluster import state as state_store

    groups = emu.node_cgroups()
    state = state_store.load(cluster)
    if groups is None or state is None:
        return
    for node, record in state.nodes.items():
        if node in groups.allotments:
            groups.enter(record.pid, node)


@contextmanager
def gmount_cluster(emu: Emulation, variant: str = "", tuning: dict[str, Any] | None = None) -> Iterator[ClusterSpec]:
    """`gmount up` on the emulation's cluster file (daemons in the site namespaces); down on exit.

    A `variant` is the same nodes and sites as another cluster, with exports and mountpoints of
    its own (suffixed `-<variant>`) and `tuning` added: e.g. `lookup = "central"` beside the default.
    """
    from gmountpy import launch
    from gmountpy.cluster.config import load_spec

    path = variant_file(emu, variant, tuning or {}) if variant else emu.cluster_file
    spec = load_spec(path)
    emu.gmount_up = True
    emu.save()
    try:
        launch.up(spec)
        own_cpus(emu, spec.name)
        yield spec
    finally:
        problems = launch.down(spec.name)
        emu.gmount_up = False
        emu.save()
        if variant:
            Path(path).unlink(missing_ok=True)
        if problems:
            raise WanError(f"gmount down {spec.name}: {problems}")


def install_packages(packages: Sequence[str], unusable: Callable[[], str | None],
                     log: Callable[[str], None]) -> str | None:
    """apt-get install a peer system's `packages` when `unusable()` says why it cannot run (as root on
    Debian); why it is still unusable afterwards, or None."""
    if unusable() is None:
        return None
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return unusable()
    log(f"installing {' '.join(packages)} with apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-qq"],
                 ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages]):
        result = subprocess.run(argv, capture_output=True, text=True, env=env)
        if result.returncode != 0:
            return f"`{' '.join(argv)}` failed: {result.stderr.strip()[-500:]}"
    return unusable()
