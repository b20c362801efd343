"""Cluster spec parsing and validation: every mistake fails at load time with a clear message."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gmountpy.cluster.config import ClusterSpec, Link, NodeSpec, SpecError, Tuning, load_spec, parse_spec

DEMO_TOML = """\
name = "demo"
launcher = "local"            # "local" = processes on this machine; "ssh" = over SSH
[defaults]
export = "/tmp/gm-demo/{node}/export"
mountpoint = "/tmp/gm-demo/{node}/mnt"
[sites.tsukuba]
nodes = ["n1", "n2"]
[sites.hongo]
nodes = ["n3", "n4"]
[[links]]
sites = ["tsukuba", "hongo"]
rtt_ms = 14.0
"""


def demo() -> dict[str, Any]:
    """The minimal spec as parsed TOML, for tests that tweak one thing."""
    return {
        "name": "demo",
        "launcher": "local",
        "defaults": {"export": "/tmp/gm-demo/{node}/export", "mountpoint": "/tmp/gm-demo/{node}/mnt"},
        "sites": {"tsukuba": {"nodes": ["n1", "n2"]}, "hongo": {"nodes": ["n3", "n4"]}},
        "links": [{"sites": ["tsukuba", "hongo"], "rtt_ms": 14.0}],
    }


def write(tmp_path: Path, text: str, name: str = "cluster.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --- the happy path -----------------------------------------------------------


def test_minimal_form_parses(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, DEMO_TOML))
    assert spec.name == "demo"
    assert spec.launcher == "local"
    assert list(spec.nodes) == ["n1", "n2", "n3", "n4"]
    assert spec.sites == {"tsukuba": ("n1", "n2"), "hongo": ("n3", "n4")}
    assert spec.links == (Link(sites=("tsukuba", "hongo"), rtt_ms=14.0),)
    assert spec.intra_site_rtt_ms == 0.15
    assert spec.tuning == Tuning()
    assert spec.source == str(tmp_path / "cluster.toml")
    assert spec.node("n3") == NodeSpec(
        name="n3",
        site="hongo",
        export="/tmp/gm-demo/n3/export",
        mountpoint="/tmp/gm-demo/n3/mnt",
        listen="127.0.0.1",
        port=0,
        host=None,
        ssh_port=22,
        python="python3",
        slots=2,
    )
    assert spec.node("n1").site == "tsukuba"


def test_launcher_defaults_to_local() -> None:
    data = demo()
    del data["launcher"]
    assert parse_spec(data).launcher == "local"


def test_all_placeholders_and_relative_paths(tmp_path: Path) -> None:
    data = demo()
    data["defaults"] = {"export": "data/{cluster}/{site}/{node}", "mountpoint": "~/mnt/{node}"}
    spec = parse_spec(data, base_dir=str(tmp_path))
    assert spec.node("n3").export == str(tmp_path / "data" / "demo" / "hongo" / "n3")
    assert spec.node("n3").mountpoint == os.path.join(os.path.expanduser("~"), "mnt", "n3")


def test_relative_paths_resolve_against_toml_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sub = tmp_path / "conf"
    sub.mkdir()
    path = write(sub, DEMO_TOML.replace("/tmp/gm-demo/", "./state/"))
    monkeypatch.chdir(tmp_path)
    spec = load_spec(os.path.join("conf", "cluster.toml"))
    assert spec.node("n1").export == str(sub / "state" / "n1" / "export")
    assert spec.source == os.path.join("conf", "cluster.toml")
    assert path.exists()


def test_per_node_overrides() -> None:
    data = demo()
    data["launcher"] = "ssh"
    data["intra_site_rtt_ms"] = 0.5
    data["defaults"].update(listen="0.0.0.0", port=7000, host="alice@gw", python="/usr/bin/python3.11", slots=4)
    data["nodes"] = {
        "n2": {"port": 7001},
        "n3": {"host": "bob@hongo-3", "ssh_port": 2222, "export": "/data/{node}", "slots": 1},
        "n4": {"host": "hongo-4", "mountpoint": "/gm", "listen": "::1"},
    }
    data["tuning"] = {"attr_ttl": 0, "negative_ttl": 2, "rpc_timeout": 1.5, "connect_timeout": 1, "ready_timeout": 60}
    spec = parse_spec(data)
    n1, n2, n3, n4 = (spec.node(n) for n in ("n1", "n2", "n3", "n4"))
    assert (n1.listen, n1.port, n1.host, n1.ssh_port, n1.python, n1.slots) == (
        "0.0.0.0", 7000, "alice@gw", 22, "/usr/bin/python3.11", 4
    )
    assert n2.port == 7001 and n2.host == "alice@gw"
    assert (n3.host, n3.ssh_port, n3.export, n3.mountpoint, n3.slots) == (
        "bob@hongo-3", 2222, "/data/n3", "/tmp/gm-demo/n3/mnt", 1
    )
    assert (n4.host, n4.mountpoint, n4.listen, n4.export) == ("hongo-4", "/gm", "::1", "/tmp/gm-demo/n4/export")
    assert spec.intra_site_rtt_ms == 0.5
    assert spec.tuning == Tuning(attr_ttl=0.0, negative_ttl=2.0, rpc_timeout=1.5, connect_timeout=1.0,
                                 ready_timeout=60.0)
    assert isinstance(spec.tuning.negative_ttl, float)


def test_same_paths_on_different_hosts_are_fine() -> None:
    data = demo()
    data["defaults"] = {"export": "/srv/export", "mountpoint": "/srv/mnt"}
    data["nodes"] = {n: {"host": f"{n}.example.org"} for n in ("n1", "n2", "n3", "n4")}
    assert parse_spec(data).node("n4").export == "/srv/export"


def test_single_site_needs_no_links() -> None:
    data = demo()
    data["sites"] = {"only": {"nodes": ["a"]}}
    del data["links"]
    spec = parse_spec(data)
    assert spec.links == ()
    assert list(spec.nodes) == ["a"]


def test_node_lookup_error_lists_nodes() -> None:
    spec = parse_spec(demo())
    with pytest.raises(SpecError, match=r"^unknown node 'n9' \(nodes: n1, n2, n3, n4\)$"):
        spec.node("n9")


def test_spec_error_is_value_error() -> None:
    assert issubclass(SpecError, ValueError)


# --- validation errors --------------------------------------------------------


def mutated(**changes: Any) -> dict[str, Any]:
    data = demo()
    data.update(changes)
    return data


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({k: v for k, v in demo().items() if k != "name"}, r"missing required key 'name'"),
        ({k: v for k, v in demo().items() if k != "sites"}, r"missing required key 'sites'"),
        (mutated(name="my demo"), r"^name: invalid name 'my demo'"),
        (mutated(name=3), r"^name: invalid name 3"),
        (mutated(launcher="slurm"), r"^launcher: must be one of 'local', 'ssh', got 'slurm'$"),
        (mutated(intra_site_rtt_ms=0), r"^intra_site_rtt_ms: must be > 0, got 0$"),
        (mutated(intra_site_rtt_ms="fast"), r"^intra_site_rtt_ms: must be a number, got 'fast'$"),
        (mutated(intra_site_rtt_ms=True), r"^intra_site_rtt_ms: must be a number, got True$"),
        (mutated(sites={}), r"^sites: at least one"),
        (mutated(sites={"a": {"nodes": []}}), r"^sites\.a\.nodes: must list at least one node, got \[\]$"),
        (mutated(sites={"a": {}}), r"^sites\.a\.nodes: must be a list, got None$"),
        (mutated(sites={"a b": {"nodes": ["x"]}}), r"^sites\.a b: invalid site name 'a b'"),
        (mutated(sites={"a": {"nodes": ["x/y"]}}), r"^sites\.a\.nodes: invalid node name 'x/y'"),
        (mutated(sites={"a": {"nodes": [".."]}}), r"^sites\.a\.nodes: invalid node name '\.\.'"),
        (mutated(sites={"a": {"nodes": ["x"], "node": ["y"]}}), r"^unknown key 'node' in \[sites\.a\]"),
        (
            mutated(sites={"tsukuba": {"nodes": ["n1", "n2"]}, "hongo": {"nodes": ["n3", "n1"]}}),
            r"^sites\.hongo\.nodes: node 'n1' is already in site 'tsukuba'$",
        ),
        (
            mutated(sites={"tsukuba": {"nodes": ["n1", "n1"]}, "hongo": {"nodes": ["n3"]}}),
            r"^sites\.tsukuba\.nodes: node 'n1' is already in site 'tsukuba'$",
        ),
        (mutated(colour="red"), r"^unknown key 'colour' in top level"),
        (
            mutated(defaults={"exprot": "/e/{node}", "mountpoint": "/m/{node}"}),
            r"^unknown key 'exprot' in \[defaults\]",
        ),
        (mutated(nodes={"n1": {"slot": 3}}), r"^unknown key 'slot' in \[nodes\.n1\]"),
        (mutated(tuning={"attr_tll": 1}), r"^unknown key 'attr_tll' in \[tuning\]"),
        (
            mutated(links=[{"sites": ["tsukuba", "hongo"], "rtt_ms": 1, "rtt": 2}]),
            r"^unknown key 'rtt' in links\[0\]",
        ),
        (mutated(nodes={"n9": {"port": 1}}), r"^nodes\.n9: node 'n9' is not listed in any site"),
        (mutated(nodes={"n1": {"port": 70000}}), r"^nodes\.n1\.port: must be in 0\.\.65535, got 70000$"),
        (mutated(nodes={"n1": {"port": "80"}}), r"^nodes\.n1\.port: must be an integer, got '80'$"),
        (mutated(nodes={"n1": {"ssh_port": 0}}), r"^nodes\.n1\.ssh_port: must be in 1\.\.65535, got 0$"),
        (mutated(nodes={"n1": {"slots": 0}}), r"^nodes\.n1\.slots: must be >= 1, got 0$"),
        (mutated(nodes={"n1": {"listen": "localhost"}}), r"^nodes\.n1\.listen: not an IP address: 'localhost'$"),
        (mutated(nodes={"n1": {"host": ""}}), r"^nodes\.n1\.host: must be a non-empty string, got ''$"),
        (mutated(nodes={"n1": {"python": 3}}), r"^nodes\.n1\.python: must be a non-empty string, got 3$"),
        (
            mutated(defaults={"export": "/e/{node}", "mountpoint": "/m/{nod}"}),
            r"^defaults\.mountpoint: unknown placeholder '\{nod\}' in '/m/\{nod\}'",
        ),
        (mutated(defaults={"export": "/e/{node}"}), r"^node 'n1': no mountpoint \(set mountpoint in \[defaults\]"),
        (
            mutated(links=[{"sites": ["tsukuba", "hongo2"], "rtt_ms": 14.0}]),
            r"^links\[0\]\.sites: unknown site 'hongo2'",
        ),
        (
            mutated(links=[{"sites": ["tsukuba"], "rtt_ms": 14.0}]),
            r"^links\[0\]\.sites: must be a list of exactly two site names, got \['tsukuba'\]$",
        ),
        (
            mutated(links=[{"sites": ["hongo", "hongo"], "rtt_ms": 14.0}]),
            r"^links\[0\]\.sites: a link needs two distinct sites, got 'hongo' twice$",
        ),
        (mutated(links=[{"sites": ["tsukuba", "hongo"], "rtt_ms": -1}]), r"^links\[0\]\.rtt_ms: must be > 0, got -1$"),
        (mutated(links=[{"sites": ["tsukuba", "hongo"]}]), r"^links\[0\]: missing required key 'rtt_ms'$"),
        (
            mutated(
                links=[
                    {"sites": ["tsukuba", "hongo"], "rtt_ms": 14.0},
                    {"sites": ["hongo", "tsukuba"], "rtt_ms": 15.0},
                ]
            ),
            r"^links\[1\]\.sites: duplicate link between 'hongo' and 'tsukuba' \(already in links\[0\]\)$",
        ),
        (mutated(tuning={"attr_ttl": -1}), r"^tuning\.attr_ttl: must be >= 0, got -1$"),
        (mutated(tuning={"rpc_timeout": 0}), r"^tuning\.rpc_timeout: must be > 0, got 0$"),
        (mutated(tuning={"ready_timeout": float("inf")}), r"^tuning\.ready_timeout: must be a finite number"),
        (mutated(defaults=[1]), r"^defaults: must be a table, got \[1\]$"),
    ],
)
def test_validation_errors(data: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_spec(data)


def test_disconnected_sites() -> None:
    data = demo()
    data["sites"]["kashiwa"] = {"nodes": ["n5"]}
    with pytest.raises(
        SpecError,
        match=r"^sites 'tsukuba' and 'kashiwa' are not connected by any \[\[links\]\] path: "
        r"add a \[\[links\]\] entry with rtt_ms$",
    ):
        parse_spec(data)


def test_no_links_between_two_sites() -> None:
    data = demo()
    del data["links"]
    with pytest.raises(SpecError, match=r"^sites 'tsukuba' and 'hongo' are not connected"):
        parse_spec(data)


def test_export_equals_mountpoint() -> None:
    data = mutated(nodes={"n1": {"export": "/x", "mountpoint": "/x"}})
    with pytest.raises(SpecError, match=r"^node 'n1': export and mountpoint are the same path '/x'$"):
        parse_spec(data)


def test_mountpoint_inside_export() -> None:
    data = mutated(nodes={"n1": {"export": "/a/e", "mountpoint": "/a/e/m"}})
    with pytest.raises(SpecError, match=r"^node 'n1': mountpoint '/a/e/m' is inside export '/a/e'$"):
        parse_spec(data)


def test_export_inside_mountpoint() -> None:
    data = mutated(nodes={"n1": {"export": "/a/m/e", "mountpoint": "/a/m"}})
    with pytest.raises(SpecError, match=r"^node 'n1': export '/a/m/e' is inside mountpoint '/a/m'$"):
        parse_spec(data)


def test_sibling_with_common_prefix_is_not_inside() -> None:
    data = mutated(nodes={"n1": {"export": "/a/e", "mountpoint": "/a/ex"}})
    assert parse_spec(data).node("n1").mountpoint == "/a/ex"


def test_same_export_on_local_machine() -> None:
    data = mutated(nodes={"n2": {"export": "/tmp/gm-demo/n1/export"}})
    with pytest.raises(
        SpecError,
        match=r"^node 'n2': export '/tmp/gm-demo/n1/export' is already the export of node 'n1' on this machine$",
    ):
        parse_spec(data)


def test_same_mountpoint_on_same_ssh_host() -> None:
    data = demo()
    data["defaults"] = {"export": "/srv/{node}/export", "mountpoint": "/gm", "host": "hongo.example.org"}
    data["nodes"] = {"n4": {"host": "alice@hongo.example.org"}}
    with pytest.raises(
        SpecError,
        match=r"^node 'n2': mountpoint '/gm' is already the mountpoint of node 'n1' on host 'hongo\.example\.org'$",
    ):
        parse_spec(data)


def test_one_nodes_mountpoint_inside_another_nodes_export() -> None:
    data = mutated(nodes={"n1": {"export": "/shared"}, "n2": {"mountpoint": "/shared/n2"}})
    with pytest.raises(
        SpecError, match=r"^node 'n2': mountpoint '/shared/n2' is inside export '/shared' of node 'n1' on this machine$"
    ):
        parse_spec(data)


def test_same_fixed_port_on_same_host() -> None:
    data = demo()
    data["defaults"]["port"] = 7000
    data["nodes"] = {"n2": {"port": 7001}, "n3": {"port": 7001}, "n4": {"port": 7002}}
    with pytest.raises(SpecError, match=r"^node 'n3': port 7001 on 127\.0\.0\.1 is already used by node 'n2'"):
        parse_spec(data)


def test_parse_spec_prefixes_source() -> None:
    with pytest.raises(SpecError, match=r"^my\.toml: launcher: must be one of"):
        parse_spec(mutated(launcher="x"), source="my.toml")


# --- files ----------------------------------------------------------------------


def test_file_errors_are_prefixed_with_path(tmp_path: Path) -> None:
    path = write(tmp_path, DEMO_TOML.replace('rtt_ms = 14.0', 'rtt_ms = 14.0\n[defaults2]\n'))
    with pytest.raises(SpecError, match=r"cluster\.toml: unknown key 'defaults2' in top level") as info:
        load_spec(path)
    assert str(info.value).startswith(f"{path}: ")


def test_toml_syntax_error_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, 'name = "demo"\n[sites.a\nnodes = ["x"]\n', name="broken.toml")
    with pytest.raises(SpecError, match=r"broken\.toml: invalid TOML: .*line 2") as info:
        load_spec(path)
    assert str(info.value).startswith(f"{path}: ")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_spec(tmp_path / "nope.toml")


# --- serialisation --------------------------------------------------------------


def test_round_trip_demo(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, DEMO_TOML))
    data = spec.to_dict()
    assert json.loads(json.dumps(data)) == data
    assert ClusterSpec.from_dict(json.loads(json.dumps(data))) == spec
    assert ClusterSpec.from_dict(msgpack.unpackb(msgpack.packb(data))) == spec
    assert list(ClusterSpec.from_dict(data).nodes) == list(spec.nodes)


def test_from_dict_rejects_bad_data() -> None:
    data = parse_spec(demo()).to_dict()
    broken = copy.deepcopy(data)
    broken["links"] = []
    with pytest.raises(SpecError, match=r"are not connected"):
        ClusterSpec.from_dict(broken)
    broken = copy.deepcopy(data)
    del broken["tuning"]["attr_ttl"]
    with pytest.raises(SpecError, match=r"missing key 'attr_ttl' in tuning"):
        ClusterSpec.from_dict(broken)
    broken = copy.deepcopy(data)
    broken["nodes"]["n1"]["export"] = "relative"
    with pytest.raises(SpecError, match=r"nodes\.n1\.export: must be an absolute path, got 'relative'"):
        ClusterSpec.from_dict(broken)


NAME = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-", min_size=1, max_size=6)
RTT = st.floats(min_value=0.01, max_value=500.0, allow_nan=False, allow_infinity=False)


@st.composite
def raw_specs(draw: st.DrawFn) -> dict[str, Any]:
    """Parsed-TOML-shaped specs: random sites and nodes, a random spanning tree of links plus extras."""
    site_names = draw(st.lists(NAME, min_size=1, max_size=6, unique=True))
    node_names = draw(st.lists(NAME, min_size=len(site_names), max_size=len(site_names) + 10, unique=True))
    # Give every site at least one node, then scatter the rest.
    owners = list(range(len(site_names))) + [
        draw(st.integers(0, len(site_names) - 1)) for _ in node_names[len(site_names) :]
    ]
    sites: dict[str, dict[str, Any]] = {s: {"nodes": []} for s in site_names}
    for node, owner in zip(node_names, owners, strict=True):
        sites[site_names[owner]]["nodes"].append(node)
    links = []
    pairs = set()
    for i in range(1, len(site_names)):
        j = draw(st.integers(0, i - 1))
        links.append({"sites": [site_names[i], site_names[j]], "rtt_ms": draw(RTT)})
        pairs.add(frozenset((i, j)))
    for i, j in draw(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), max_size=4)):
        if i < len(site_names) and j < len(site_names) and i != j and frozenset((i, j)) not in pairs:
            pairs.add(frozenset((i, j)))
            links.append({"sites": [site_names[i], site_names[j]], "rtt_ms": draw(RTT)})
    data: dict[str, Any] = {
        "name": draw(NAME),
        "launcher": draw(st.sampled_from(["local", "ssh"])),
        "defaults": {"export": "state/{cluster}/{site}/{node}/export", "mountpoint": "~/gm/{node}"},
        "sites": sites,
        "links": links,
    }
    if draw(st.booleans()):
        data["intra_site_rtt_ms"] = draw(RTT)
    overrides: dict[str, Any] = {}
    for node in draw(st.lists(st.sampled_from(node_names), max_size=3, unique=True)):
        overrides[node] = {
            "host": f"user@{node}.example",
            "port": draw(st.integers(0, 65535)),
            "ssh_port": draw(st.integers(1, 65535)),
            "slots": draw(st.integers(1, 64)),
            "python": "python3.11",
            "listen": "0.0.0.0",
        }
    if overrides:
        data["nodes"] = overrides
    if draw(st.booleans()):
        data["tuning"] = {"attr_ttl": draw(st.floats(0, 60)), "rpc_timeout": draw(st.floats(0.1, 60))}
    return data


@settings(max_examples=150, deadline=None)
@given(raw_specs())
def test_round_trip_random_specs(data: dict[str, Any]) -> None:
    spec = parse_spec(data, base_dir="/base", source="random.toml")
    assert list(spec.sites) == list(data["sites"])
    assert list(spec.nodes) == [n for s in data["sites"].values() for n in s["nodes"]]
    wire = json.loads(json.dumps(spec.to_dict()))
    assert ClusterSpec.from_dict(wire) == spec
    assert ClusterSpec.from_dict(msgpack.unpackb(msgpack.packb(spec.to_dict()))) == spec
    for node in spec.nodes.values():
        assert node.export == f"/base/state/{spec.name}/{node.site}/{node.name}/export"
        assert os.path.isabs(node.mountpoint)


# --- [ssh]: how the SSH launcher reaches nodes -----------------------------------------------

SSH_TOML = """\
name = "remote"
launcher = "ssh"
[ssh]
known_hosts = "keys/known_hosts"
identity = "~/.ssh/id_gmount"
concurrency = 8
connect_timeout = 5
[defaults]
host = "alice@login.example.org"
python = "~/venv/bin/python"
export = "/scratch/alice/{node}"
mountpoint = "/tmp/alice-gmount/{node}"
listen = "0.0.0.0"
[sites.a]
nodes = ["n1"]
"""


def test_ssh_table_parses_with_paths_resolved(tmp_path: Path) -> None:
    from gmountpy.cluster.config import SshOptions

    spec = load_spec(write(tmp_path, SSH_TOML))
    assert spec.ssh == SshOptions(known_hosts=str(tmp_path / "keys" / "known_hosts"), verify_host_keys=True,
                                  identity=(os.path.expanduser("~/.ssh/id_gmount"),), config=(),
                                  concurrency=8, connect_timeout=5.0)
    assert spec.node("n1").python == "~/venv/bin/python"  # expanded on the node, not here
    wire = json.loads(json.dumps(spec.to_dict()))
    assert ClusterSpec.from_dict(wire) == spec
    assert ClusterSpec.from_dict(msgpack.unpackb(msgpack.packb(spec.to_dict()))) == spec


def test_ssh_defaults_follow_the_users_own_ssh_setup() -> None:
    from gmountpy.cluster.config import SshOptions

    spec = parse_spec(demo())
    assert spec.ssh == SshOptions()
    assert spec.ssh.verify_host_keys and spec.ssh.known_hosts is None and spec.ssh.config == ()
    data = spec.to_dict()
    del data["ssh"]  # a state file written before [ssh] existed
    assert ClusterSpec.from_dict(data) == spec


def test_host_key_checking_is_only_relaxed_explicitly() -> None:
    data = demo()
    data["ssh"] = {"known_hosts": False, "config": False}
    spec = parse_spec(data)
    assert spec.ssh.verify_host_keys is False and spec.ssh.config is None
    assert ClusterSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


@pytest.mark.parametrize(("table", "message"), [
    ({"known_hosts": True}, r"ssh\.known_hosts: must be a file path or false \(no host-key checking\), got True"),
    ({"known_hosts": ""}, r"ssh\.known_hosts: must be a file path or false"),
    ({"identity": [1]}, r"ssh\.identity: must be a key file path or a list of them, got \[1\]"),
    ({"config": 3}, r"ssh\.config: must be a file path, a list of them, or false, got 3"),
    ({"concurrency": 0}, r"ssh\.concurrency: must be >= 1, got 0"),
    ({"connect_timeout": 0}, r"ssh\.connect_timeout: must be > 0, got 0"),
    ({"user": "bob"}, r"unknown key 'user' in \[ssh\] \(allowed: known_hosts, identity, config, concurrency, "
                      r"connect_timeout\)"),
])
def test_bad_ssh_values_are_named(table: dict[str, Any], message: str) -> None:
    data = demo()
    data["ssh"] = table
    with pytest.raises(SpecError, match=message):
        parse_spec(data)
