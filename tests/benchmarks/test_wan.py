"""The WAN emulation harness (benchmarks/wan): sites as network namespaces with real RTTs.

Runs as root with network namespaces, iptables-legacy, gcc and libnetfilter_queue;
under CI a missing capability is a failure. No timing assertion here is about
gmount itself: only the emulated network's RTT is checked.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks.wan import Emulation, down, emulate, gmount_cluster, problem
from benchmarks.wan.sites import IPTABLES

from ..conftest import fuse_problem, require, wait_for

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def wan() -> None:
    require("WAN emulation (root, netns, iptables-legacy, gcc, libnetfilter-queue)", problem())


def cluster_file(base: Path, rtt_ms: float, nodes_per_site: int = 1) -> Path:
    name = f"wan-{uuid.uuid4().hex[:8]}"
    sites = {"east": [f"e{i}" for i in range(1, nodes_per_site + 1)],
             "west": [f"w{i}" for i in range(1, nodes_per_site + 1)]}
    lines = [f'name = "{name}"', "create_export = true", "[defaults]", f'export = "{base}/{{node}}/export"',
             f'mountpoint = "{base}/{{node}}/mnt"', "[tuning]", "attr_ttl = 0.5", "negative_ttl = 0.5"]
    for site, nodes in sites.items():
        lines += [f"[sites.{site}]", "nodes = [" + ", ".join(f'"{n}"' for n in nodes) + "]"]
    lines += ["[[links]]", 'sites = ["east", "west"]', f"rtt_ms = {rtt_ms}"]
    path = base / "cluster.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def host_snapshot() -> dict[str, str]:
    """What of the host's networking a run could leave behind: netns list, links, iptables."""
    return {
        "netns": subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout,
        "links": subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout,
        "iptables": subprocess.run([IPTABLES, "-S"], capture_output=True, text=True).stdout,
    }


def assert_gone(emu: Emulation, before: dict[str, str], pids: list[int]) -> None:
    after = host_snapshot()
    for ns in [emu.hub, *emu.netns.values()]:
        assert not Path(f"/run/netns/{ns}").exists(), f"namespace {ns} left behind"
        assert ns not in after["netns"]
    # Other runs may add or remove their own namespaces meanwhile: compare only ours.
    assert after["links"] == before["links"] or emu.prefix not in after["links"]
    assert after["iptables"] == before["iptables"], "the host's iptables rules changed"
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or _zombie(pid), f"process {pid} left running"
    with open("/proc/self/mounts") as f:
        assert emu.prefix not in f.read()
    assert not emu.state_file.exists()
    assert not Path(emu.cluster_file).exists()


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True


@pytest.fixture
def base(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    # A failed test must not leave an emulation behind: down whatever is recorded for it.
    for toml in tmp_path.glob("cluster.toml"):
        name = toml.read_text().split('"')[1]
        down(name)


def probe(emu: Emulation, where: str, *args: str) -> subprocess.Popen[str]:
    return emu.spawn(where, [sys.executable, "-m", "benchmarks.wan.probe", *args], cwd=ROOT,
                     stdout=subprocess.PIPE, text=True)


def reap(*processes: subprocess.Popen[str]) -> None:
    """After teardown: collect the exit status and close the pipes of processes started in a site."""
    for process in processes:
        process.wait(timeout=10)
        if process.stdout is not None:
            process.stdout.close()


@pytest.mark.parametrize("rtt_ms", [4.0, 20.0])
def test_tcp_ping_pong_between_sites_measures_the_configured_rtt(wan: None, base: Path, rtt_ms: float) -> None:
    before = host_snapshot()
    with emulate(cluster_file(base, rtt_ms), workdir=base) as emu:
        server = probe(emu, "west", "serve", emu.address["w1"], "5201")
        assert server.stdout is not None and server.stdout.readline().strip() == "LISTENING"
        client = probe(emu, "east", "rtt", emu.address["w1"], "5201", "30")
        out, _ = client.communicate(timeout=60)
        samples = json.loads(out)["rtt_ms"]
        median = statistics.median(samples)
        assert rtt_ms * 0.8 <= median <= rtt_ms * 1.2, f"median RTT {median:.2f} ms for a {rtt_ms} ms link"
        # Within a site there is no added delay.
        server2 = probe(emu, "east", "serve", "127.0.0.1", "5202")
        assert server2.stdout is not None and server2.stdout.readline().strip() == "LISTENING"
        local_client = probe(emu, "east", "rtt", "127.0.0.1", "5202", "10")
        local, _ = local_client.communicate(timeout=30)
        assert statistics.median(json.loads(local)["rtt_ms"]) < rtt_ms * 0.5
        pids = [*emu.pids, emu.delay_pid]
    reap(server, client, server2, local_client)
    assert_gone(emu, before, pids)


def test_gmount_across_sites_reads_a_remote_file_and_teardown_leaves_nothing(wan: None, base: Path) -> None:
    require("FUSE", fuse_problem())
    before = host_snapshot()
    payload = os.urandom(300_000)
    export = base / "w1" / "export"
    export.mkdir(parents=True)
    (export / "remote.bin").write_bytes(payload)
    with emulate(cluster_file(base, 6.0), workdir=base) as emu, gmount_cluster(emu) as spec:
        daemons = [int(p) for ns in emu.netns.values()
                   for p in subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()]
        assert len(daemons) == 2, "one daemon per node, each inside its site's namespace"
        mount = Path(spec.node("e1").mountpoint)
        assert (mount / "remote.bin").read_bytes() == payload
        (mount / "made-in-east.txt").write_text("east")
        assert wait_for(lambda: (Path(spec.node("w1").mountpoint) / "made-in-east.txt").exists())
        assert (base / "e1" / "export" / "made-in-east.txt").read_text() == "east"
        pids = [*daemons, emu.delay_pid]
    assert_gone(emu, before, pids)
    assert not os.path.ismount(base / "e1" / "mnt")


def test_interrupt_inside_the_block_still_tears_everything_down(wan: None, base: Path) -> None:
    before = host_snapshot()
    with pytest.raises(KeyboardInterrupt), emulate(cluster_file(base, 2.0), workdir=base) as emu:
        sleeper = emu.spawn("east", ["sleep", "600"])
        raise KeyboardInterrupt
    reap(sleeper)
    assert_gone(emu, before, [sleeper.pid, emu.delay_pid])


def test_down_by_name_removes_an_emulation_left_up(wan: None, base: Path) -> None:
    before = host_snapshot()
    from benchmarks.wan import up

    emu = up(cluster_file(base, 2.0), workdir=base)
    sleeper = emu.spawn("west", ["sleep", "600"])
    assert Emulation.load(emu.name) is not None
    assert down(emu.name) == []
    assert down(emu.name) == []  # safe twice
    reap(sleeper)
    assert_gone(emu, before, [sleeper.pid, emu.delay_pid])


def test_netns_in_a_cluster_file_expands_placeholders_and_needs_the_local_launcher(tmp_path: Path) -> None:
    from gmountpy.cluster.config import ClusterSpec, SpecError, parse_spec

    defaults = {"export": "/x/{node}/e", "mountpoint": "/x/{node}/m", "netns": "ns-{site}"}
    data: dict[str, Any] = {"name": "c", "defaults": defaults,
            "sites": {"a": {"nodes": ["n1"]}, "b": {"nodes": ["n2"]}},
            "links": [{"sites": ["a", "b"], "rtt_ms": 5}]}
    spec = parse_spec(data)
    assert spec.node("n1").netns == "ns-a" and spec.node("n2").netns == "ns-b"
    assert ClusterSpec.from_dict(spec.to_dict()) == spec
    old = spec.to_dict()
    for node in old["nodes"].values():
        del node["netns"]  # a state file written before netns existed
    assert ClusterSpec.from_dict(old).node("n1").netns is None
    with pytest.raises(SpecError, match="netns needs launcher"):
        parse_spec({**data, "launcher": "ssh"})
    with pytest.raises(SpecError, match="network namespace name"):
        parse_spec({**data, "defaults": {**defaults, "netns": "../etc"}})


def test_bandwidth_mbit_caps_the_link_and_is_not_passed_to_gmount(wan: None, base: Path) -> None:
    path = cluster_file(base, 2.0)
    path.write_text(path.read_text() + "bandwidth_mbit = 80\n")  # appended to the [[links]] table
    with emulate(path, workdir=base) as emu:
        assert "bandwidth_mbit =" not in Path(emu.cluster_file).read_text()
        server = probe(emu, "west", "serve", emu.address["w1"], "5203")
        assert server.stdout is not None and server.stdout.readline().strip() == "LISTENING"
        client = probe(emu, "east", "bulk", emu.address["w1"], "5203", "2")
        out, _ = client.communicate(timeout=60)
        measured = json.loads(out)
        mbit = measured["bytes"] * 8 / measured["seconds"] / 1e6
        assert 40 <= mbit <= 84, f"{mbit:.1f} Mbit/s through an 80 Mbit/s cap"
    reap(server, client)


COUNTERS_OF_E1 = ("import json, sys; from gmountpy.api import Cluster; "
                  "print(json.dumps(Cluster.open(sys.argv[1]).counters()['e1']))")


def test_a_variant_runs_the_same_sites_with_its_own_exports_and_lookup_mode(wan: None, base: Path) -> None:
    """bench_meta's gmountpy-central: the same emulation, its own directories, every lookup to the central node."""
    require("FUSE", fuse_problem())
    before = host_snapshot()
    with emulate(cluster_file(base, 4.0), workdir=base) as emu:
        with gmount_cluster(emu, "central", {"lookup": "central", "central_node": "w1"}) as spec:
            assert spec.name.endswith("-central") and spec.tuning.lookup == "central"
            assert spec.node("w1").export == f"{base}/w1/export-central"
            Path(spec.node("w1").export, "held-in-west.txt").write_text("west")
            assert (Path(spec.node("e1").mountpoint) / "held-in-west.txt").read_text() == "west"
            assert (Path(spec.node("e1").mountpoint) / "nowhere.txt").exists() is False
            # the daemons listen inside the sites: ask them from there
            asking = emu.spawn("east", [sys.executable, "-c", COUNTERS_OF_E1, spec.name], cwd=ROOT,
                               stdout=subprocess.PIPE, text=True)
            out, _ = asking.communicate(timeout=60)
            sent = json.loads(out)
            assert sent.get("messages.index_lookup", 0) >= 2, sent  # the home answers hits and misses
            assert sent.get("messages.locate", 0) == 0, sent  # and nothing is searched for
        assert not Path(emu.cluster_file).with_name(f"{spec.name}.wan.toml").exists()
        pids = [emu.delay_pid]
    assert_gone(emu, before, pids)


def test_bench_meta_runs_each_gmountpy_system_in_the_lookup_mode_it_names(tmp_path: Path) -> None:
    """`gmountpy` is GMount's search whatever the default is (it ran the index while the default was)."""
    from benchmarks.wan import bench_meta

    toml = tmp_path / "cluster.toml"
    toml.write_text(bench_meta.cluster_toml(tmp_path, "modes"))
    emu = Emulation(name="modes", prefix="", hub="", netns={}, address={}, site_of={}, rtt_ms={},
                    cluster_file=str(toml))
    for system, mode in bench_meta.GMOUNT_MODES.items():
        spec = bench_meta.Gmount(emu, system, bench_meta.central_site()).spec
        assert spec.tuning.lookup == mode and spec.name == f"modes-{mode}", system


def test_a_run_in_parts_is_complete_only_with_every_system_at_every_r_adj_and_op() -> None:
    """`complete` said true after any last part; a resume keeps each system's localities measured in full."""
    from benchmarks.wan import bench_meta

    workload = {"ops_per_client": 10, "sites": 4, "clients": 8, "r_adj": [0.2, 1.0], "ops": ["mkdir", "stat"],
                "isolated": False, "central_site": "s1"}

    def rows(system: str, ops: list[str], r_adj: list[float] = workload["r_adj"]) -> list[dict[str, object]]:
        return [{"system": system, "r_adj": r, "op": op, "ops_per_s": 1.0} for r in r_adj for op in ops]

    four = [s for s in bench_meta.ALL_SYSTEMS if s not in ("glusterfs", "sshfs")]
    part = {**workload, "commit": "a", "commits": ["0"], "systems": {s: {} for s in [*four, "glusterfs", "sshfs"]},
            "results": [row for s in four for row in rows(s, ["mkdir", "stat"])] + rows("glusterfs", ["mkdir"])
            + rows("sshfs", ["mkdir", "stat"], [0.2]) + rows("sshfs", ["mkdir"], [1.0])}
    assert not bench_meta.complete(part)
    kept = bench_meta.resumed(part, workload, {"commit": "b"})
    assert set(kept["systems"]) == {*four, "sshfs"} and kept["commits"] == ["0", "a", "b"]  # glusterfs: nothing
    assert bench_meta.localities(kept, "sshfs") == [0.2]  # cut short at r_adj 1: that locality is measured again
    assert [row for row in kept["results"] if row["system"] == "sshfs"] == rows("sshfs", ["mkdir", "stat"], [0.2])
    kept["results"] += rows("glusterfs", ["mkdir", "stat"]) + rows("sshfs", ["mkdir", "stat"], [1.0])
    assert bench_meta.complete(kept)
    parts = bench_meta.earlier_parts({"commit": "b", "earlier_parts": [{"commit": "a"}]})
    assert parts == [{"commit": "a"}, {"commit": "b"}]


def test_a_run_with_the_index_but_not_flood_gets_its_ratio_plot(tmp_path: Path) -> None:
    """The ratio plot puts the default lookup (the index) over every other system; it was drawn
    only when flood ("gmountpy") was in the run, and put flood over the rest."""
    from benchmarks.wan import bench_meta

    rows = [{"system": system, "r_adj": r, "op": op, "ops_per_s": 10.0 if system == "gmountpy-index" else 5.0}
            for system in ("gmountpy-index", "moosefs") for r in (0.2, 1.0) for op in bench_meta.OPS]
    result = {"results": rows, "clients": 8, "sites": 4, "ops_per_client": 10, "commit": "a" * 40,
              "commits": ["a" * 40, "b" * 40]}
    bench_meta.plot(result, tmp_path / "meta.png")
    assert (tmp_path / "meta.png").stat().st_size > 0 and (tmp_path / "meta_ratio.png").stat().st_size > 0


def test_settle_waits_for_idle_cpus_at_most_its_limit() -> None:
    """--isolated waits before each client until the CPUs are idle; a busy machine costs the limit, no more."""
    from benchmarks.wan import bench_meta

    assert bench_meta.settle(quiet=1.01, window=0.05) < 1.0  # anything counts as idle: one window
    waited = bench_meta.settle(quiet=0.0, window=0.05, limit=0.3)  # nothing does: the limit
    assert 0.3 <= waited < 2.0
    busy, total = bench_meta._busy_jiffies()
    assert 0 <= busy <= total


def test_run_puts_a_command_in_a_site_with_gmount_up_and_tears_everything_down(wan: None, base: Path) -> None:
    """`python -m benchmarks.wan run C.toml -- CMD`: how a workflow runs under the WAN in one line."""
    require("FUSE", fuse_problem())
    before = host_snapshot()
    toml = cluster_file(base, 4.0)
    script = "ip -o -4 addr show; echo ===; gmount status --json {cluster}; exit 3"
    done = subprocess.run([sys.executable, "-m", "benchmarks.wan", "run", str(toml), "--site", "west", "--",
                           "sh", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 3, done.stderr  # the command's exit status is passed through
    addresses, _, status = done.stdout.partition("===\n")
    assert " 10.200." in addresses, "the command runs inside a site's namespace"
    west = [line for line in addresses.splitlines() if " wan " in line or "wan@" in line]
    assert west and all("10.200." in line for line in west)
    nodes = {node["name"]: node for node in json.loads(status)}
    assert sorted(nodes) == ["e1", "w1"] and all(node["up"] for node in nodes.values()), status
    name = toml.read_text().split('"')[1]
    assert Emulation.load(name) is None, "the emulation is removed after the command"
    namespace = done.stderr.split("running in site west (", 1)[1].split(")", 1)[0]
    prefix = namespace.removesuffix("-west")
    after = host_snapshot()
    assert prefix not in after["netns"] and prefix not in after["links"]
    assert after["iptables"] == before["iptables"]
    with open("/proc/self/mounts") as f:
        assert str(base) not in f.read()


def test_run_passes_sigterm_to_the_command_then_tears_down(wan: None, base: Path) -> None:
    require("FUSE", fuse_problem())
    toml = cluster_file(base, 4.0)
    script = 'trap "echo stopped by TERM; kill \\$!; exit 7" TERM; echo started; sleep 60 & wait'
    runner = subprocess.Popen([sys.executable, "-m", "benchmarks.wan", "run", str(toml), "--", "sh", "-c", script],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert runner.stdout is not None
        assert runner.stdout.readline() == "started\n"
        runner.send_signal(signal.SIGTERM)
        out, err = runner.communicate(timeout=120)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.communicate()
    assert "stopped by TERM" in out, err  # the command got the signal (and exited with its own status)
    assert runner.returncode == 7, err
    name = toml.read_text().split('"')[1]
    assert Emulation.load(name) is None
    with open("/proc/self/mounts") as f:
        assert str(base) not in f.read()
