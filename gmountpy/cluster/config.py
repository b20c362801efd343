"""The cluster spec: one TOML file that says which nodes exist, where they are, and how far apart.

Everything is validated up front so that a typo fails at load time with a
message naming the key, instead of as a hang or a mount in the wrong place
minutes later on some remote machine.
"""

from __future__ import annotations

import ipaddress
import os
import re
import tomllib
from dataclasses import asdict, dataclass, field, fields
from itertools import pairwise
from typing import Any

import networkx as nx

from gmountpy.errors import GmountError

_NAME_RE = re.compile(r"[A-Za-z0-9_.-]+")
_PLACEHOLDER_RE = re.compile(r"\{([^{}]*)\}")
_PLACEHOLDERS = ("node", "site", "cluster")
LAUNCHERS = ("local", "ssh")

_TOP_KEYS = ("name", "launcher", "intra_site_rtt_ms", "tls", "allow_other", "create_export", "defaults", "nodes",
             "sites", "links", "tuning", "ssh")
_NODE_KEYS = ("export", "mountpoint", "listen", "port", "host", "ssh_port", "python", "slots", "netns",
              "create_export")
_SITE_KEYS = ("nodes",)
_LINK_KEYS = ("sites", "rtt_ms")
_SSH_KEYS = ("known_hosts", "identity", "config", "concurrency", "connect_timeout")


class SpecError(GmountError, ValueError):
    """The cluster spec is invalid; the message names the offending key and value."""


@dataclass(frozen=True)
class NodeSpec:
    """One daemon: what it exports, where it mounts, and how to reach and start it."""

    name: str
    site: str
    export: str
    mountpoint: str
    listen: str = "127.0.0.1"
    port: int = 0
    host: str | None = None
    ssh_port: int = 22
    python: str = "python3"
    slots: int = 2
    netns: str | None = None  # local launcher: start the daemon in /run/netns/<netns> (emulated WAN sites)
    create_export: bool = False  # make a missing export directory instead of refusing to start


@dataclass(frozen=True)
class Link:
    """A measured round-trip time between two sites; the overlay is built from these."""

    sites: tuple[str, str]
    rtt_ms: float


@dataclass(frozen=True)
class Tuning:
    """Cache lifetimes, timeouts and limits, shared by every node so they behave alike.

    The limits keep one peer (or many connections) from exhausting a daemon:
    beyond them a request fails with EMFILE or EAGAIN naming the limit, and
    read-ahead falls back to plain reads.
    """

    attr_ttl: float = 1.0
    negative_ttl: float = 1.0
    rpc_timeout: float = 5.0
    connect_timeout: float = 3.0
    ready_timeout: float = 20.0
    requests_per_connection: int = 64    # served at once; beyond it that connection waits (back-pressure)
    requests_per_node: int = 1024        # served at once over all connections; beyond it EAGAIN
    handles_per_connection: int = 1024   # files a peer holds open here; beyond it EMFILE
    handles_per_node: int = 8192
    listings_per_connection: int = 64    # directory snapshots being paged through; beyond it EMFILE
    listings_per_node: int = 512
    readahead_mib: int = 256             # read-ahead blocks held by the node's mount
    lookup: str = "index"                # "index" (homed directory index), "flood" (GMount's search),
                                         # "central" (one node is every directory's home: a baseline)
    central_node: str = ""               # the home of every directory with lookup = "central"; "" = first node
    index_rescan: float = 30.0           # seconds before a home re-lists a directory from every node
    index_verify_misses: bool = False    # a home asks the nodes holding a directory before it answers "no such
                                         # name" to a lookup or a create (files copied straight into exports)
    index_split_entries: int = 8192      # a directory index partition holding more entries splits in two over
                                         # the nodes (Giga+); 0: never split
    bypass: bool = True                  # jobs' preload library may use this node's files straight from the
                                         # export (docs/bypass.md); false: every job goes through the mount
    passthrough: bool = False            # kernel FUSE passthrough of local files, where the daemon may (root):
                                         # reads of them then bypass the daemon and its byte counters too


@dataclass(frozen=True)
class SshOptions:
    """How the launcher reaches nodes over SSH (the `[ssh]` table); used only by `launcher = "ssh"`.

    Everything left unset follows the user's own SSH setup: ~/.ssh/config,
    default keys and the agent, ~/.ssh/known_hosts. Host-key checking is only
    ever switched off explicitly (`known_hosts = false`).
    """

    known_hosts: str | None = None       # None: OpenSSH's defaults (~/.ssh/known_hosts, ssh config)
    verify_host_keys: bool = True        # False only from an explicit `known_hosts = false`
    identity: tuple[str, ...] = ()       # private keys to use instead of the defaults and the agent
    config: tuple[str, ...] | None = ()  # () = ~/.ssh/config; None = no ssh config file at all
    concurrency: int = 32                # SSH connections being set up at once
    connect_timeout: float = 10.0

    def to_dict(self) -> dict[str, Any]:
        return {"known_hosts": self.known_hosts, "verify_host_keys": self.verify_host_keys,
                "identity": list(self.identity), "config": None if self.config is None else list(self.config),
                "concurrency": self.concurrency, "connect_timeout": self.connect_timeout}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SshOptions:
        _expect_table(data, "ssh")
        _check_keys(data, tuple(f.name for f in fields(cls)), "ssh", required=True)
        known_hosts = data["known_hosts"]
        if known_hosts is not None and not isinstance(known_hosts, str):
            raise SpecError(f"ssh.known_hosts: must be a string or None, got {known_hosts!r}")
        if not isinstance(data["verify_host_keys"], bool):
            raise SpecError(f"ssh.verify_host_keys: must be true or false, got {data['verify_host_keys']!r}")
        config = data["config"]
        return cls(
            known_hosts=known_hosts,
            verify_host_keys=data["verify_host_keys"],
            identity=tuple(_string_list(data["identity"], "ssh.identity")),
            config=None if config is None else tuple(_string_list(config, "ssh.config")),
            concurrency=_integer(data["concurrency"], "ssh.concurrency", 1, None),
            connect_timeout=_number(data["connect_timeout"], "ssh.connect_timeout", zero_ok=False),
        )


# Tuning keys that may be 0 (a TTL of 0 disables caching); the rest must be > 0.
_ZERO_OK_TUNING = ("attr_ttl", "negative_ttl")
# Tuning keys that count things (integers >= 1); the rest are seconds.
_INTEGER_TUNING = ("requests_per_connection", "requests_per_node", "handles_per_connection", "handles_per_node",
                   "listings_per_connection", "listings_per_node")
_INTEGER_TUNING_ZERO_OK = ("readahead_mib", "index_split_entries")  # 0: no read-ahead, never split
_LIMIT_TUNING = _INTEGER_TUNING + _INTEGER_TUNING_ZERO_OK
# optional: absent from older state files
_LOOKUP_TUNING = ("lookup", "central_node", "index_rescan", "index_verify_misses", "index_split_entries")
_BOOLEAN_TUNING = ("index_verify_misses", "bypass", "passthrough")
_BYPASS_TUNING = ("bypass", "passthrough")
LOOKUP_MODES = ("flood", "index", "central")


@dataclass(frozen=True)
class ClusterSpec:
    """The whole validated cluster; shipped to every node so they all agree on it."""

    name: str
    launcher: str
    nodes: dict[str, NodeSpec]
    sites: dict[str, tuple[str, ...]]
    links: tuple[Link, ...]
    intra_site_rtt_ms: float = 0.15
    tuning: Tuning = field(default_factory=Tuning)
    source: str | None = None
    ssh: SshOptions = field(default_factory=SshOptions)
    tls: bool = False  # encrypt peer connections (per-cluster CA made by the launcher)
    # let other local users (and root-run services) use the mounts; the kernel checks modes
    # (default_permissions). Non-root daemons need `user_allow_other` in /etc/fuse.conf.
    allow_other: bool = False

    def to_dict(self) -> dict[str, Any]:
        """Plain data (str/int/float/bool/None/list/dict) so the spec can cross the wire."""
        return {
            "name": self.name,
            "launcher": self.launcher,
            "intra_site_rtt_ms": self.intra_site_rtt_ms,
            "sites": {site: list(names) for site, names in self.sites.items()},
            "nodes": {name: asdict(node) for name, node in self.nodes.items()},
            "links": [{"sites": list(link.sites), "rtt_ms": link.rtt_ms} for link in self.links],
            "tuning": asdict(self.tuning),
            "source": self.source,
            "ssh": self.ssh.to_dict(),
            "tls": self.tls,
            "allow_other": self.allow_other,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ClusterSpec:
        """Inverse of to_dict; re-checks the invariants because the data came from outside."""
        _expect_table(data, "spec")
        required = ("name", "launcher", "intra_site_rtt_ms", "sites", "nodes", "links", "tuning", "source")
        # "ssh" is optional so that state files written before it existed still load.
        _check_keys({k: v for k, v in data.items() if k not in ("ssh", "tls", "allow_other")}, required, "spec dict",
                    required=True)
        sites_raw = _expect_table(data["sites"], "sites")
        sites = {
            _check_name(site, f"sites.{site}", what="site name"): tuple(
                _check_name(node, f"sites.{site}", what="node name") for node in _expect_list(names, f"sites.{site}")
            )
            for site, names in sites_raw.items()
        }
        nodes: dict[str, NodeSpec] = {}
        for name, raw in _expect_table(data["nodes"], "nodes").items():
            raw = _expect_table(raw, f"nodes.{name}")
            raw = {"netns": None, "create_export": False, **raw}  # absent from state files written before them
            _check_keys(raw, tuple(f.name for f in fields(NodeSpec)), f"nodes.{name}", required=True)
            for key in _NODE_KEYS:
                if key in ("host", "netns") and raw[key] is None:
                    continue
                _check_node_value(key, raw[key], f"nodes.{name}")
            for key in ("export", "mountpoint"):
                if not os.path.isabs(raw[key]):
                    raise SpecError(f"nodes.{name}.{key}: must be an absolute path, got {raw[key]!r}")
            nodes[name] = NodeSpec(**raw)
        links = []
        for i, raw in enumerate(_expect_list(data["links"], "links")):
            raw = _expect_table(raw, f"links[{i}]")
            _check_keys(raw, _LINK_KEYS, f"links[{i}]", required=True)
            links.append(_parse_link_values(raw, i))
        tuning_raw = _expect_table(data["tuning"], "tuning")
        # Limits may be absent from state files written before they existed: their defaults apply.
        _check_keys(tuning_raw, tuple(f.name for f in fields(Tuning)), "tuning")
        optional = _LIMIT_TUNING + _LOOKUP_TUNING + _BYPASS_TUNING
        _check_keys({k: v for k, v in tuning_raw.items() if k not in optional},
                    tuple(f.name for f in fields(Tuning) if f.name not in optional), "tuning", required=True)
        source = data["source"]
        if source is not None and not isinstance(source, str):
            raise SpecError(f"source: must be a string or None, got {source!r}")
        spec = cls(
            name=_check_name(data["name"], "name"),
            launcher=_check_launcher(data["launcher"]),
            nodes=nodes,
            sites=sites,
            links=tuple(links),
            intra_site_rtt_ms=_number(data["intra_site_rtt_ms"], "intra_site_rtt_ms", zero_ok=False),
            tuning=_parse_tuning(tuning_raw),
            source=source,
            ssh=SshOptions.from_dict(data["ssh"]) if "ssh" in data else SshOptions(),
            tls=_boolean(data.get("tls", False), "tls"),
            allow_other=_boolean(data.get("allow_other", False), "allow_other"),
        )
        _validate(spec)
        return spec

    def node(self, name: str) -> NodeSpec:
        """Look a node up, listing the real names so a typo is obvious."""
        try:
            return self.nodes[name]
        except KeyError:
            raise SpecError(f"unknown node {name!r} (nodes: {', '.join(self.nodes)})") from None


def load_spec(path: str | os.PathLike[str]) -> ClusterSpec:
    """Read and validate a cluster TOML file; every error message starts with the file path."""
    source = os.fspath(path)
    with open(source, "rb") as f:
        try:
            data = tomllib.load(f)
        except tomllib.TOMLDecodeError as e:
            raise SpecError(f"{source}: invalid TOML: {e}") from e
    base_dir = os.path.dirname(os.path.abspath(source))
    return parse_spec(data, base_dir=base_dir, source=source)


def parse_spec(data: dict[str, Any], base_dir: str | None = None, source: str | None = None) -> ClusterSpec:
    """Validate already-parsed TOML data; relative paths resolve against base_dir (default: cwd)."""
    try:
        spec = _parse(data, base_dir if base_dir is not None else os.getcwd(), source)
        _validate(spec)
    except SpecError as e:
        if source is None:
            raise
        raise SpecError(f"{source}: {e}") from e
    return spec


# --- parsing -----------------------------------------------------------------


def _parse(data: dict[str, Any], base_dir: str, source: str | None) -> ClusterSpec:
    _expect_table(data, "spec")
    _check_keys(data, _TOP_KEYS, "top level")
    if "name" not in data:
        raise SpecError("missing required key 'name' at top level")
    name = _check_name(data["name"], "name")
    launcher = _check_launcher(data.get("launcher", "local"))
    intra = _number(data.get("intra_site_rtt_ms", 0.15), "intra_site_rtt_ms", zero_ok=False)
    # Between hosts (ssh) peer traffic is encrypted unless the file says otherwise; on one machine
    # (local) every connection stays on loopback and is authenticated frame by frame anyway.
    tls = _boolean(data.get("tls", launcher == "ssh"), "tls")
    allow_other = _boolean(data.get("allow_other", False), "allow_other")
    create_export = _boolean(data.get("create_export", False), "create_export")

    sites = _parse_sites(data)
    site_of = {node: site for site, names in sites.items() for node in names}

    defaults = _expect_table(data.get("defaults", {}), "defaults")
    _check_keys(defaults, _NODE_KEYS, "[defaults]")
    for key, value in defaults.items():
        _check_node_value(key, value, "defaults")

    overrides = _expect_table(data.get("nodes", {}), "nodes")
    for node_name, table in overrides.items():
        if node_name not in site_of:
            raise SpecError(f"nodes.{node_name}: node {node_name!r} is not listed in any site "
                            f"(sites: {', '.join(sites)})")
        table = _expect_table(table, f"nodes.{node_name}")
        _check_keys(table, _NODE_KEYS, f"[nodes.{node_name}]")
        for key, value in table.items():
            _check_node_value(key, value, f"nodes.{node_name}")

    links = []
    for i, raw in enumerate(_expect_list(data.get("links", []), "links")):
        raw = _expect_table(raw, f"links[{i}]")
        _check_keys(raw, _LINK_KEYS, f"links[{i}]")
        for key in _LINK_KEYS:
            if key not in raw:
                raise SpecError(f"links[{i}]: missing required key {key!r}")
        links.append(_parse_link_values(raw, i))

    tuning_raw = _expect_table(data.get("tuning", {}), "tuning")
    _check_keys(tuning_raw, tuple(f.name for f in fields(Tuning)), "[tuning]")
    tuning = _parse_tuning(tuning_raw)
    ssh = _parse_ssh(_expect_table(data.get("ssh", {}), "ssh"), base_dir)

    nodes: dict[str, NodeSpec] = {}
    for site, names in sites.items():
        for node_name in names:
            nodes[node_name] = _build_node(node_name, site, name, {"create_export": create_export, **defaults},
                                           overrides.get(node_name, {}), base_dir)

    return ClusterSpec(
        name=name,
        launcher=launcher,
        nodes=nodes,
        sites=sites,
        links=tuple(links),
        intra_site_rtt_ms=intra,
        tuning=tuning,
        source=source,
        ssh=ssh,
        tls=tls,
        allow_other=allow_other,
    )


def _parse_sites(data: dict[str, Any]) -> dict[str, tuple[str, ...]]:
    if "sites" not in data:
        raise SpecError("missing required key 'sites' at top level (add a [sites.NAME] table with nodes = [...])")
    raw_sites = _expect_table(data["sites"], "sites")
    if not raw_sites:
        raise SpecError("sites: at least one [sites.NAME] table is required")
    sites: dict[str, tuple[str, ...]] = {}
    seen: dict[str, str] = {}
    for site, table in raw_sites.items():
        _check_name(site, f"sites.{site}", what="site name")
        table = _expect_table(table, f"sites.{site}")
        _check_keys(table, _SITE_KEYS, f"[sites.{site}]")
        names = _expect_list(table.get("nodes"), f"sites.{site}.nodes")
        if not names:
            raise SpecError(f"sites.{site}.nodes: must list at least one node, got []")
        for node in names:
            _check_name(node, f"sites.{site}.nodes", what="node name")
            if node in seen:
                raise SpecError(f"sites.{site}.nodes: node {node!r} is already in site {seen[node]!r}")
            seen[node] = site
        sites[site] = tuple(names)
    return sites


def _parse_link_values(raw: dict[str, Any], i: int) -> Link:
    pair = raw["sites"]
    if not isinstance(pair, list) or len(pair) != 2 or not all(isinstance(s, str) for s in pair):
        raise SpecError(f"links[{i}].sites: must be a list of exactly two site names, got {pair!r}")
    return Link(sites=(pair[0], pair[1]), rtt_ms=_number(raw["rtt_ms"], f"links[{i}].rtt_ms", zero_ok=False))


def _parse_tuning(raw: dict[str, Any]) -> Tuning:
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key == "lookup":
            if value not in LOOKUP_MODES:
                raise SpecError(f"tuning.lookup: must be one of {', '.join(map(repr, LOOKUP_MODES))}, got {value!r}")
            values[key] = value
        elif key in _BOOLEAN_TUNING:
            values[key] = _boolean(value, f"tuning.{key}")
        elif key == "central_node":
            if not isinstance(value, str):
                raise SpecError(f"tuning.central_node: must be a node name, got {value!r}")
            values[key] = value
        elif key in _INTEGER_TUNING or key in _INTEGER_TUNING_ZERO_OK:
            values[key] = _integer(value, f"tuning.{key}", 0 if key in _INTEGER_TUNING_ZERO_OK else 1, None)
        else:
            values[key] = _number(value, f"tuning.{key}", zero_ok=key in _ZERO_OK_TUNING)
    return Tuning(**values)


def _parse_ssh(raw: dict[str, Any], base_dir: str) -> SshOptions:
    """The [ssh] table; key paths resolve like export paths (~ and relative to the cluster file)."""
    _check_keys(raw, _SSH_KEYS, "[ssh]")

    def path(value: str) -> str:
        return os.path.normpath(os.path.join(base_dir, os.path.expanduser(value)))

    known_hosts: str | None = None
    verify = True
    if "known_hosts" in raw:
        value = raw["known_hosts"]
        if value is False:
            verify = False
        elif isinstance(value, str) and value:
            known_hosts = path(value)
        else:
            raise SpecError(f"ssh.known_hosts: must be a file path or false (no host-key checking), got {value!r}")
    identity = raw.get("identity", [])
    if isinstance(identity, str):
        identity = [identity]
    config: Any = raw.get("config", [])
    if config is False:
        config_paths: tuple[str, ...] | None = None
    else:
        if isinstance(config, str):
            config = [config]
        paths = _string_list(config, "ssh.config", "a file path, a list of them, or false")
        config_paths = tuple(path(p) for p in paths)
    return SshOptions(
        known_hosts=known_hosts,
        verify_host_keys=verify,
        identity=tuple(path(p) for p in _string_list(identity, "ssh.identity", "a key file path or a list of them")),
        config=config_paths,
        concurrency=_integer(raw.get("concurrency", 32), "ssh.concurrency", 1, None),
        connect_timeout=_number(raw.get("connect_timeout", 10.0), "ssh.connect_timeout", zero_ok=False),
    )


def _build_node(
    node: str, site: str, cluster: str, defaults: dict[str, Any], override: dict[str, Any], base_dir: str
) -> NodeSpec:
    """Merge defaults and the node's overrides, then expand placeholders and resolve paths."""
    values: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for where, table in (("defaults", defaults), (f"nodes.{node}", override)):
        for key, value in table.items():
            values[key] = value
            origin[key] = where
    for key in ("export", "mountpoint"):
        if key not in values:
            raise SpecError(f"node {node!r}: no {key} (set {key} in [defaults] or [nodes.{node}])")
        mapping = {"node": node, "site": site, "cluster": cluster}
        expanded = _expand(values[key], mapping, f"{origin[key]}.{key}")
        expanded = os.path.expanduser(expanded)
        values[key] = os.path.normpath(os.path.join(base_dir, expanded))
    if "netns" in values:
        values["netns"] = _expand(values["netns"], {"node": node, "site": site, "cluster": cluster},
                                  f"{origin['netns']}.netns")
    return NodeSpec(name=node, site=site, **values)


def _expand(value: str, mapping: dict[str, str], where: str) -> str:
    def replace(match: re.Match[str]) -> str:
        key = match.group(1)
        if key not in mapping:
            known = ", ".join("{" + k + "}" for k in _PLACEHOLDERS)
            raise SpecError(f"{where}: unknown placeholder {match.group(0)!r} in {value!r} (known: {known})")
        return mapping[key]

    return _PLACEHOLDER_RE.sub(replace, value)


# --- cross-checks on the built spec -------------------------------------------


def _validate(spec: ClusterSpec) -> None:
    """Checks that span several entries: links, connectivity, and paths/ports shared on one host."""
    _validate_membership(spec)
    _validate_links(spec)
    for node in spec.nodes.values():
        _validate_own_paths(node)
        if node.netns is not None and spec.launcher != "local":
            raise SpecError(f"node {node.name!r}: netns needs launcher = \"local\" (it names a network "
                            f"namespace on this machine), got launcher = {spec.launcher!r}")
    _validate_shared_host(spec)
    central = spec.tuning.central_node
    if central and central not in spec.nodes:
        raise SpecError(f"tuning.central_node: unknown node {central!r} (nodes: {', '.join(spec.nodes)})")


def _validate_membership(spec: ClusterSpec) -> None:
    if not spec.sites:
        raise SpecError("sites: at least one site is required")
    listed = [(node, site) for site, names in spec.sites.items() for node in names]
    for node, site in listed:
        if node not in spec.nodes:
            raise SpecError(f"sites.{site}.nodes: node {node!r} has no node entry")
        if spec.nodes[node].site != site:
            raise SpecError(f"node {node!r}: site is {spec.nodes[node].site!r} but it is listed in site {site!r}")
    if len(listed) != len(spec.nodes):
        extra = sorted(set(spec.nodes) - {node for node, _ in listed})
        raise SpecError(f"nodes.{extra[0] if extra else '?'}: node is not listed in any site")
    for name, node_spec in spec.nodes.items():
        if node_spec.name != name:
            raise SpecError(f"nodes.{name}: name field is {node_spec.name!r}")


def _validate_links(spec: ClusterSpec) -> None:
    graph: nx.Graph[str] = nx.Graph()
    graph.add_nodes_from(spec.sites)
    seen: dict[frozenset[str], int] = {}
    for i, link in enumerate(spec.links):
        a, b = link.sites
        for site in (a, b):
            if site not in spec.sites:
                raise SpecError(f"links[{i}].sites: unknown site {site!r} (sites: {', '.join(spec.sites)})")
        if a == b:
            raise SpecError(f"links[{i}].sites: a link needs two distinct sites, got {a!r} twice")
        if link.rtt_ms <= 0:
            raise SpecError(f"links[{i}].rtt_ms: must be > 0, got {link.rtt_ms!r}")
        pair = frozenset((a, b))
        if pair in seen:
            raise SpecError(f"links[{i}].sites: duplicate link between {a!r} and {b!r} "
                            f"(already in links[{seen[pair]}])")
        seen[pair] = i
        graph.add_edge(a, b, rtt_ms=link.rtt_ms)
    first = next(iter(spec.sites))
    reachable = nx.node_connected_component(graph, first)
    for site in spec.sites:
        if site not in reachable:
            raise SpecError(
                f"sites {first!r} and {site!r} are not connected by any [[links]] path: "
                "add a [[links]] entry with rtt_ms"
            )


def _validate_own_paths(node: NodeSpec) -> None:
    if node.export == node.mountpoint:
        raise SpecError(f"node {node.name!r}: export and mountpoint are the same path {node.export!r}")
    if _is_inside(node.mountpoint, node.export):
        raise SpecError(f"node {node.name!r}: mountpoint {node.mountpoint!r} is inside export {node.export!r}")
    if _is_inside(node.export, node.mountpoint):
        raise SpecError(f"node {node.name!r}: export {node.export!r} is inside mountpoint {node.mountpoint!r}")


def _validate_shared_host(spec: ClusterSpec) -> None:
    """Nodes on one machine must not share or nest directories, nor bind the same fixed port."""
    by_host: dict[str | None, list[tuple[int, NodeSpec]]] = {}
    for index, node in enumerate(spec.nodes.values()):
        by_host.setdefault(_host_key(node.host), []).append((index, node))
    for host, members in by_host.items():
        where = "this machine" if host is None else f"host {host!r}"
        # Sorting by path components puts every directory right before everything inside it,
        # so comparing neighbours finds any shared or nested pair without an O(n^2) scan.
        entries = sorted(
            (tuple(p for p in path.split("/") if p), index, kind, node)
            for index, node in members
            for kind, path in (("export", node.export), ("mountpoint", node.mountpoint))
        )
        for (parts_a, _, kind_a, a), (parts_b, _, kind_b, b) in pairwise(entries):
            path_a = getattr(a, kind_a)
            path_b = getattr(b, kind_b)
            if parts_a == parts_b:
                raise SpecError(
                    f"node {b.name!r}: {kind_b} {path_b!r} is already the {kind_a} of node {a.name!r} on {where}"
                )
            if parts_b[: len(parts_a)] == parts_a:
                raise SpecError(
                    f"node {b.name!r}: {kind_b} {path_b!r} is inside {kind_a} {path_a!r} of node {a.name!r} on {where}"
                )
        bound: dict[tuple[str, int], NodeSpec] = {}
        for _, node in members:
            if node.port == 0:
                continue
            key = (node.listen, node.port)
            if key in bound:
                raise SpecError(
                    f"node {node.name!r}: port {node.port} on {node.listen} is already used by node "
                    f"{bound[key].name!r} on {where}"
                )
            bound[key] = node


def _host_key(host: str | None) -> str | None:
    """The machine a node runs on; 'user@h' and 'h' are the same machine."""
    if host is None:
        return None
    return host.rpartition("@")[2]


def _is_inside(inner: str, outer: str) -> bool:
    return inner != outer and os.path.commonpath([inner, outer]) == outer


# --- small value checkers -----------------------------------------------------


def _check_keys(table: dict[str, Any], allowed: tuple[str, ...], where: str, required: bool = False) -> None:
    for key in table:
        if key not in allowed:
            raise SpecError(f"unknown key {key!r} in {where} (allowed: {', '.join(allowed)})")
    if required:
        for key in allowed:
            if key not in table:
                raise SpecError(f"missing key {key!r} in {where}")


def _check_node_value(key: str, value: Any, where: str) -> None:
    """Type- and range-check one per-node key, as written in [defaults] or [nodes.X]."""
    name = f"{where}.{key}"
    if key in ("export", "mountpoint", "python", "host"):
        if not isinstance(value, str) or not value:
            raise SpecError(f"{name}: must be a non-empty string, got {value!r}")
    elif key == "netns":
        if not isinstance(value, str) or not _NAME_RE.fullmatch(value.replace("{", "").replace("}", "")):
            raise SpecError(f"{name}: must be a network namespace name (letters, digits, '_', '.', '-'; "
                            f"placeholders {{site}}, {{node}}), got {value!r}")
    elif key == "listen":
        if not isinstance(value, str):
            raise SpecError(f"{name}: must be an IP address string, got {value!r}")
        try:
            ipaddress.ip_address(value)
        except ValueError:
            raise SpecError(f"{name}: not an IP address: {value!r}") from None
    elif key == "port":
        _integer(value, name, 0, 65535)
    elif key == "ssh_port":
        _integer(value, name, 1, 65535)
    elif key == "slots":
        _integer(value, name, 1, None)
    elif key == "create_export":
        _boolean(value, name)


def _integer(value: Any, name: str, low: int, high: int | None) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise SpecError(f"{name}: must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"in {low}..{high}"
        raise SpecError(f"{name}: must be {bounds}, got {value!r}")
    return value


def _number(value: Any, name: str, zero_ok: bool) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise SpecError(f"{name}: must be a number, got {value!r}")
    if value != value or value in (float("inf"), float("-inf")):
        raise SpecError(f"{name}: must be a finite number, got {value!r}")
    if value < 0 or (value == 0 and not zero_ok):
        raise SpecError(f"{name}: must be {'>= 0' if zero_ok else '> 0'}, got {value!r}")
    return float(value)


def _check_name(value: Any, name: str, what: str = "name") -> str:
    if not isinstance(value, str) or not _NAME_RE.fullmatch(value) or value in (".", ".."):
        raise SpecError(f"{name}: invalid {what} {value!r} (use letters, digits, '_', '.', '-')")
    return value


def _check_launcher(value: Any) -> str:
    if value not in LAUNCHERS:
        raise SpecError(f"launcher: must be one of {', '.join(map(repr, LAUNCHERS))}, got {value!r}")
    return str(value)


def _expect_table(value: Any, name: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SpecError(f"{name}: must be a table, got {value!r}")
    return value


def _string_list(value: Any, name: str, what: str = "a list of non-empty strings") -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise SpecError(f"{name}: must be {what}, got {value!r}")
    return value


def _expect_list(value: Any, name: str) -> list[Any]:
    if not isinstance(value, list):
        raise SpecError(f"{name}: must be a list, got {value!r}")
    return value


def _boolean(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise SpecError(f"{name}: must be true or false, got {value!r}")
    return value
