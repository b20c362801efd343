"""The library API against a real 4-node, 2-site local cluster (n1 n2 | n3 n4, 14 ms apart)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
import time
from pathlib import Path

import pytest
import trio

import gmountpy
from gmountpy import Cluster, CommandTimeout, GmountError, StageError, launch
from gmountpy.api.cluster import _running
from gmountpy.cluster import state as state_store
from gmountpy.cluster.config import load_spec

from .conftest import LocalCluster, force_cleanup, wait_for
from .launch.conftest import Sshd, sshd  # noqa: F401,F811  (the real OpenSSH sshd, for the SSH case)


def put(cluster: LocalCluster, node: str, path: str, data: bytes | str) -> bytes:
    """Write a file straight into a node's export, as a user's earlier job would have."""
    target = cluster.export(node) / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode() if isinstance(data, str) else data
    target.write_bytes(raw)
    cluster.rescan(node)
    return raw


@pytest.fixture(scope="module")
def api(cluster4: LocalCluster) -> Cluster:
    return Cluster.open(cluster4.spec.name)


def test_public_surface() -> None:
    for name in ("Cluster", "Locations", "Placement", "RunResult", "StageReport", "StageError", "load_spec"):
        assert name in gmountpy.__all__ and hasattr(gmountpy, name)
    assert sorted(gmountpy.__all__) == sorted(set(gmountpy.__all__))


def test_open_by_name_file_and_mount_path(cluster4: LocalCluster, api: Cluster) -> None:
    assert api.name == cluster4.spec.name and api.home == "n1"
    assert api.nodes.names == ("n1", "n2", "n3", "n4")
    assert api.nodes["n3"].site == "hongo" and api.nodes["n3"].slots == 2
    assert api.sites == {"tsukuba": ("n1", "n2"), "hongo": ("n3", "n4")}
    assert api.graph.edges["tsukuba", "hongo"]["rtt_ms"] == 14.0
    assert api.overlay.lookup_order("n4") == ["n4", "n3", "n1", "n2"]
    from_file = Cluster.open(cluster4.base / "cluster.toml")
    assert from_file.name == api.name and from_file.home == "n1"
    from_mount = Cluster.open(cluster4.mount("n3"))
    assert from_mount.name == api.name and from_mount.home == "n3"
    with pytest.raises(GmountError, match="neither a running cluster's name"):
        Cluster.open("no-such-cluster")
    assert "4 nodes" in repr(api) and "<table>" in api._repr_html_()


def test_status(api: Cluster) -> None:
    status = api.status()
    assert status.up and [n.name for n in status.nodes] == ["n1", "n2", "n3", "n4"]
    assert "up" in repr(status) and "<td" in status._repr_html_()


def test_where_matches_export_contents(cluster4: LocalCluster, api: Cluster) -> None:
    layout = {"/api-where/a.dat": ["n3"], "/api-where/b.dat": ["n2", "n4"], "/api-where/sub/c.dat": ["n1", "n3", "n4"]}
    for path, nodes in layout.items():
        for i, node in enumerate(nodes):
            put(cluster4, node, path, "x" * (10 + i))
    result = api.where(list(layout) + ["/api-where/none.dat"])
    assert len(result) == 4
    for path, nodes in layout.items():
        found = result[path]
        on_disk = {n for n in cluster4.nodes if (cluster4.export(n) / path.lstrip("/")).exists()}
        assert set(found.nodes) == on_disk == set(nodes)
        assert list(found.nodes) == api.overlay.nearest("n1", nodes)  # nearest first, from n1
        for holder in found.holders:
            assert os.path.getsize(holder.export_path) == holder.size
            assert holder.export_path == str(cluster4.export(holder.node) / path.lstrip("/"))
            assert holder.rtt_ms == api.overlay.rtt("n1", holder.node)
    assert result.missing == ("/api-where/none.dat",)
    assert not result["/api-where/none.dat"].exists
    # A path inside n4's mount is asked from n4, and may be looked up as written.
    in_mount = cluster4.mount("n4") / "api-where" / "b.dat"
    seen = api.where(in_mount)[str(in_mount)]
    assert seen.asked_from == "n4" and seen.nodes == ("n4", "n2")
    assert api.where("api-where/b.dat", from_node="n3")[0].nodes == ("n4", "n2")
    text = repr(result)
    assert "/api-where/sub/c.dat" in text and "no node holds it" in text
    assert "<table>" in result._repr_html_() and "n4" in result[1]._repr_html_()


def test_ls_merges_and_names_holders(cluster4: LocalCluster, api: Cluster) -> None:
    put(cluster4, "n2", "/api-ls/one.txt", "1")
    put(cluster4, "n4", "/api-ls/one.txt", "1111")
    put(cluster4, "n3", "/api-ls/two.txt", "22")
    put(cluster4, "n4", "/api-ls/deep/three.txt", "333")
    listing = api.ls("/api-ls")
    assert [e.name for e in listing] == ["deep", "one.txt", "two.txt"]
    assert listing["one.txt"].node == "n2" and listing["one.txt"].holders == ("n2", "n4")
    assert listing["one.txt"].size == 1
    assert listing["two.txt"].node == "n3" and listing["deep"].kind == "directory"
    from_n4 = api.ls(cluster4.mount("n4") / "api-ls")
    assert from_n4.asked_from == "n4" and from_n4["one.txt"].node == "n4" and from_n4["one.txt"].size == 4
    assert sorted(os.listdir(cluster4.mount("n1") / "api-ls")) == [e.name for e in listing]
    with pytest.raises(FileNotFoundError, match="no node holds /api-ls/nothing"):
        api.ls("/api-ls/nothing")


def test_read_bytes_from_the_holder(cluster4: LocalCluster, api: Cluster) -> None:
    data = put(cluster4, "n4", "/api-read/blob.bin", os.urandom(9 * 1024 * 1024 + 17))
    assert api.read_bytes("/api-read/blob.bin") == data
    assert api.read_bytes("/api-read/blob.bin", start=5 * 1024 * 1024 - 3, end=5 * 1024 * 1024 + 3) == \
        data[5 * 1024 * 1024 - 3:5 * 1024 * 1024 + 3]
    with pytest.raises(IsADirectoryError):
        api.read_bytes("/api-read")


def test_stage_identical_idempotent_and_wins_lookup_on_target(cluster4: LocalCluster, api: Cluster) -> None:
    data = put(cluster4, "n3", "/api-stage/input.bin", os.urandom(3 * 1024 * 1024 + 5))
    small = put(cluster4, "n4", "/api-stage/more/small.txt", "small input\n")
    on_n1 = cluster4.mount("n1") / "api-stage" / "input.bin"
    assert os.getxattr(on_n1, "user.gmount.node") == b"n3"

    report = api.stage(["/api-stage"], to="n1", progress=True)  # a directory: every file below
    assert {f.path: f.status for f in report.files} == {"/api-stage/input.bin": "copied",
                                                         "/api-stage/more/small.txt": "copied"}
    first = next(f for f in report.files if f.path == "/api-stage/input.bin")
    assert first.source == "n3" and first.size == len(data) and first.sha256 == hashlib.sha256(data).hexdigest()
    assert (cluster4.export("n1") / "api-stage" / "input.bin").read_bytes() == data
    assert (cluster4.export("n1") / "api-stage" / "more" / "small.txt").read_bytes() == small
    assert report.copied_bytes == len(data) + len(small)

    again = api.stage(cluster4.mount("n2") / "api-stage" / "input.bin", to=api.nodes["n1"])
    assert [f.status for f in again.files] == ["up-to-date"]

    # The target now finds its own copy first; other nodes still see the source.
    assert wait_for(lambda: os.getxattr(on_n1, "user.gmount.node") == b"n1")
    assert on_n1.read_bytes() == data
    holders = api.where("/api-stage/input.bin", from_node="n1")[0]
    assert holders.nodes[0] == "n1" and holders.holders[0].replica_of == "n3"
    assert "copied" in repr(report) and "<table>" in report._repr_html_()


def test_stage_reports_what_failed(cluster4: LocalCluster, api: Cluster) -> None:
    put(cluster4, "n4", "/api-stage-fail/ok.txt", "fine")
    with pytest.raises(StageError, match="/api-stage-fail/missing.txt: no node holds it") as info:
        api.stage(["/api-stage-fail/ok.txt", "/api-stage-fail/missing.txt"], to="n2")
    assert [f.path for f in info.value.report.files] == ["/api-stage-fail/ok.txt"]
    with pytest.raises(GmountError, match="unknown node 'n9'.*nodes: n1, n2, n3, n4"):
        api.stage("/api-stage-fail/ok.txt", to="n9")
    with pytest.raises(ValueError, match="`concurrency` must be at least 1"):
        api.stage("/api-stage-fail/ok.txt", to="n2", concurrency=0)


def test_place_follows_the_rule_on_a_real_cluster(cluster4: LocalCluster, api: Cluster) -> None:
    put(cluster4, "n3", "/api-place/big.dat", b"b" * 60_000)
    put(cluster4, "n1", "/api-place/mid.dat", b"m" * 40_000)
    put(cluster4, "n4", "/api-place/tiny.dat", b"t" * 100)
    inputs = ["/api-place/big.dat", "/api-place/mid.dat", "/api-place/tiny.dat"]
    placement = api.place(inputs)
    assert placement.node == "n3"
    rows = {r.node: r for r in placement.rows}
    assert rows["n3"].input_bytes == 60_000 and rows["n1"].candidate and not rows["n4"].candidate
    assert "<- chosen" in repr(placement) and str(placement) == "n3"
    # with both of n3's slots taken by jobs this process runs there, n1 (within half) wins
    threads = [threading.Thread(target=api.run, args=("sleep 1.5",), kwargs={"on": "n3"}) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        assert wait_for(lambda: _running(api.name).get("n3") == 2, timeout=5)
        busy = api.place(inputs)
        assert busy.node == "n1" and "free slot" in busy.reason
    finally:
        for t in threads:
            t.join()
    assert api.place(inputs).node == "n3"
    nowhere = api.place(["/api-place/absent.dat"])
    assert nowhere.unlocated == ("/api-place/absent.dat",) and "least loaded" in nowhere.reason


def test_run_near_runs_on_the_holder(cluster4: LocalCluster, api: Cluster) -> None:
    put(cluster4, "n4", "/api-run/input.txt", "three\nlines\nhere\n")
    result = api.run('echo "node=$GMOUNT_NODE site=$GMOUNT_SITE"; pwd; wc -l < api-run/input.txt',
                     near=["/api-run/input.txt"])
    assert result.ok and result.node == "n4"
    lines = result.stdout.splitlines()
    assert lines == ["node=n4 site=hongo", str(cluster4.mount("n4")), "3"]
    # outputs land where the job ran
    api.run("echo out > produced.txt", on="n2", cwd="/api-run").check()
    assert (cluster4.export("n2") / "api-run" / "produced.txt").read_text() == "out\n"
    failed = api.run("echo oops >&2; exit 3", on="n1")
    assert failed.returncode == 3 and failed.stderr == "oops\n"
    with pytest.raises(GmountError, match="exit status 3: oops"):
        failed.check()
    with pytest.raises(CommandTimeout, match="did not finish within 0.3s"):
        api.run("sleep 5", on="n1", timeout=0.3)
    with pytest.raises(ValueError, match="give `on` or `near`, not both"):
        api.run("true", on="n1", near=["/x"])
    with pytest.raises(GmountError, match="not a directory in its mount"):
        api.run("true", on="n1", cwd="/api-run/no-such-dir")


def test_sync_api_inside_running_event_loops(cluster4: LocalCluster, api: Cluster) -> None:
    """A Jupyter kernel runs cells inside its asyncio loop: the sync API must work there (and in trio)."""
    put(cluster4, "n3", "/api-loop.txt", "in a loop")

    async def from_asyncio() -> tuple[str, bytes, str]:
        asyncio.get_running_loop()  # we really are inside a running loop
        return (api.where("/api-loop.txt")[0].nearest.node, api.read_bytes("/api-loop.txt"),  # type: ignore[union-attr]
                api.run("echo $GMOUNT_NODE", on="n2").stdout)

    assert asyncio.run(from_asyncio()) == ("n3", b"in a loop", "n2\n")

    async def from_trio() -> str:
        return api.place(["/api-loop.txt"]).node

    assert trio.run(from_trio) == "n3"


def test_up_attaches_to_a_running_cluster(cluster4: LocalCluster) -> None:
    before = {n: r.pid for n, r in cluster4.state.nodes.items()}
    started = time.monotonic()
    again = Cluster.up(cluster4.base / "cluster.toml")
    assert time.monotonic() - started < 2
    assert {n: r.pid for n, r in again._state.nodes.items()} == before


# --- an SSH cluster: `run` goes over SSH to the node's host ------------------------------------

def test_run_over_ssh_on_an_ssh_cluster(sshd: Sshd, tmp_path: Path) -> None:  # noqa: F811
    path = sshd.cluster_file(tmp_path, f"api-ssh-{os.getpid()}", {"near": ["s1"], "far": ["s2"]},
                             [("near", "far", 5.0)], distinct_addresses=True,
                             tuning={"attr_ttl": 0.5, "negative_ttl": 0.5})
    spec = load_spec(path)
    try:
        cluster = Cluster.up(path)
        assert cluster._is_ssh("s2")
        (tmp_path / "s2" / "export" / "in.txt").write_text("a\nb\n")
        result = cluster.run('echo "$GMOUNT_NODE $GMOUNT_CLUSTER $(pwd)"; wc -l < in.txt', near=["/in.txt"])
        assert result.node == "s2"
        assert result.stdout.splitlines() == [f"s2 {spec.name} {tmp_path / 's2' / 'mnt'}", "2"], result
        failed = cluster.run("echo bad >&2; exit 5", on="s1")
        assert (failed.returncode, failed.stderr) == (5, "bad\n")
        assert Cluster.up(path)._state.nodes["s1"].pid == cluster._state.nodes["s1"].pid  # attached, not restarted
    finally:
        state = state_store.load(spec.name)
        try:
            launch.down(spec.name, forget=True)
        finally:
            force_cleanup(spec, state)


def test_read_range_reads_from_the_named_holder_only(cluster4: LocalCluster, api: Cluster) -> None:
    data = put(cluster4, "n3", "/read-range/file.bin", os.urandom(10_000))
    assert api.read_range("/read-range/file.bin", 100, 5000, holder="n3") == data[100:5000]
    assert api.read_range("/read-range/file.bin", 9000, None, holder="n3") == data[9000:]
    assert api.read_range("/read-range/file.bin", 0, 20_000, holder="n3") == data  # clamped at the end
    with pytest.raises(FileNotFoundError, match="gone from node n1"):
        api.read_range("/read-range/file.bin", 0, 10, holder="n1")  # no lookup: n1 does not hold it
    with pytest.raises(GmountError, match="unknown node"):
        api.read_range("/read-range/file.bin", 0, 10, holder="n9")


def test_write_from_streams_an_open_binary_file(cluster4: LocalCluster, api: Cluster) -> None:
    import io

    data = os.urandom(300_000)
    assert api.write_from("/write-from/out.bin", io.BytesIO(data), on="n2") == "n2"
    assert (cluster4.export("n2") / "write-from" / "out.bin").read_bytes() == data
