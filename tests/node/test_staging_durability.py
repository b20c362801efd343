"""Staging is verified before the copy gets its name, recorded durably, and a damaged
replica table never turns a staged copy into an original.

The first tests run real nodes without FUSE (tests/node/harness.py) so they
can pause a staging half-way (a delayed `checksum` on the source); the last
one restarts real daemons over a damaged table and reads through the mounts.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

import pytest
import trio

from gmountpy.node.daemon import default_log_path, replica_table_path
from gmountpy.node.replicas import STAGED_XATTR, Replica, ReplicaTable, is_marked_copy
from gmountpy.node.service import NodeService
from gmountpy.node.staging import stage_file
from gmountpy.protocol.client import call, run_sync

from .._trio import trio_test
from ..conftest import fuse_problem, local_cluster, require
from .harness import open_cluster

MiB = 1 << 20


async def _until(predicate, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.01)


def _temporaries(directory: Path) -> list[str]:
    return [name for name in os.listdir(directory) if "gmount-stage" in name]


@trio_test
async def test_a_copy_that_fails_verification_never_gets_its_name(tmp_path: Path) -> None:
    async with open_cluster(tmp_path / "c") as cluster:
        n1, n3 = cluster["n1"], cluster["n3"]
        table = str(tmp_path / "n1-replicas.json")
        n1.service.replicas = ReplicaTable(table)
        data = os.urandom(5 * MiB + 7)
        source = n3.put("/in/data.bin", data)
        n3.delay["checksum"] = 1.0  # the source's checksum comes late: staging pauses after the copy
        outcome: dict[str, object] = {}

        async def stage() -> None:
            try:
                outcome["value"] = await stage_file(n1.namespace, n1.service, "/in/data.bin")
            except OSError as exc:
                outcome["error"] = exc

        async with trio.open_nursery() as nursery:
            nursery.start_soon(stage)
            await _until(lambda: n3.served["checksum"] >= 1)
            # Copied, not yet verified: no file of that name here, and the temporary is nobody's file.
            assert not n1.has("/in/data.bin")
            (temporary,) = _temporaries(n1.path("/in"))
            assert n1.service.lookup(f"/in/{temporary}") is None
            assert [entry[0] for entry in n1.service.listing("/in") or []] == []
            assert ReplicaTable(table).leftover_temporaries() == [f"/in/{temporary}"]
            # The source changes behind its (size, mtime): only the checksum can tell.
            before = os.stat(source)
            source.write_bytes(bytes(len(data)))
            os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns))
        error = outcome.get("error")
        assert isinstance(error, OSError) and error.errno == errno.EAGAIN, outcome
        assert not n1.has("/in/data.bin") and _temporaries(n1.path("/in")) == []
        reloaded = ReplicaTable(table)
        assert reloaded.get("/in/data.bin") is None and reloaded.leftover_temporaries() == []


@trio_test
async def test_a_verified_copy_is_recorded_durably_before_it_is_renamed_into_place(tmp_path: Path) -> None:
    async with open_cluster(tmp_path / "c") as cluster:
        n1, n3 = cluster["n1"], cluster["n3"]
        table = str(tmp_path / "n1-replicas.json")
        n1.service.replicas = ReplicaTable(table)
        data = os.urandom(MiB + 3)
        n3.put("/in/data.bin", data)
        at_rename: dict[str, object] = {}
        rename = n1.export.rename

        def watched_rename(src: str, dst: str) -> None:
            at_rename["recorded"] = ReplicaTable(table).get(dst)  # what a crash right now would leave
            at_rename["marked"] = n1.export.getxattr(src, STAGED_XATTR)
            rename(src, dst)

        n1.export.rename = watched_rename  # type: ignore[method-assign]
        result = await stage_file(n1.namespace, n1.service, "/in/data.bin")
        assert result["status"] == "copied"
        recorded = at_rename["recorded"]
        assert isinstance(recorded, Replica) and recorded.source == "n3" and recorded.local_size == len(data)
        local = n1.export.lstat("/in/data.bin")
        assert recorded.matches_local(local)
        assert is_marked_copy(n1.export.getxattr("/in/data.bin", STAGED_XATTR), local)
        assert n1.path("/in/data.bin").read_bytes() == data
        reloaded = ReplicaTable(table)
        assert reloaded.get("/in/data.bin") == recorded and reloaded.leftover_temporaries() == []
        assert not os.path.exists(table + ".tmp")
        assert (await n1.namespace.lookup("/in/data.bin")).replica_of == "n3"


def test_the_table_is_written_with_fsync_rename_and_directory_fsync(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    table = str(tmp_path / "state" / "replicas.json")
    calls: list[tuple[str, str]] = []
    real_fsync, real_rename = os.fsync, os.rename

    def fsync(fd: int) -> None:
        calls.append(("fsync", "dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"))
        real_fsync(fd)

    def rename(src: str, dst: str) -> None:
        calls.append(("rename", f"{os.path.basename(src)}->{os.path.basename(dst)}"))
        real_rename(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    ReplicaTable(table).add("/a", Replica("n3", 1, 2, 1, 2, "00"))
    assert calls == [("fsync", "file"), ("rename", "replicas.json.tmp->replicas.json"), ("fsync", "dir")]
    monkeypatch.undo()
    assert ReplicaTable(table).get("/a") == Replica("n3", 1, 2, 1, 2, "00")


def test_a_damaged_table_is_detected_kept_and_refuses_new_entries(tmp_path: Path) -> None:
    table = tmp_path / "replicas.json"
    ReplicaTable(str(table)).add("/a", Replica("n3", 1, 2, 1, 2, "00"))
    raw = json.loads(table.read_text())
    raw["replicas"]["/a"]["source_size"] = 999  # well-formed JSON, wrong contents
    table.write_text(json.dumps(raw))
    for damage in (json.dumps(raw).encode(), table.read_bytes()[:20], b"\x00" * 64, b"[]"):
        table.write_bytes(damage)
        damaged = ReplicaTable(str(table))
        assert damaged.damaged is not None and len(damaged) == 0 and damaged.get("/a") is None
        with pytest.raises(OSError, match="damaged"):
            damaged.add("/b", Replica("n3", 1, 2, 1, 2, "00"))
        with pytest.raises(OSError, match="damaged"):
            damaged.begin_staging("/.b.gmount-stage-1", "/b")
        damaged.forget("/a")
        assert table.read_bytes() == damage  # the evidence is never overwritten
    table.write_text(json.dumps({"/old": {"source": "n2", "source_size": 1, "source_mtime_ns": 2,
                                          "local_size": 1, "local_mtime_ns": 2, "sha256": "ff"}}))
    legacy = ReplicaTable(str(table))  # tables written before the checksum existed still load
    assert legacy.damaged is None and legacy.get("/old") == Replica("n2", 1, 2, 1, 2, "ff")


def test_temporaries_of_an_interrupted_staging_are_removed_at_start(tmp_path: Path) -> None:
    from gmountpy.node.export import Export
    root = tmp_path / "export"
    (root / "d").mkdir(parents=True)
    (root / "d" / ".x.gmount-stage-1234").write_bytes(b"half a copy")
    table = str(tmp_path / "replicas.json")
    ReplicaTable(table).begin_staging("/d/.x.gmount-stage-1234", "/d/x")  # then the daemon was killed
    export = Export(str(root))
    try:
        NodeService(export, {}, replicas=ReplicaTable(table))
    finally:
        export.close()
    assert os.listdir(root / "d") == []
    assert ReplicaTable(table).leftover_temporaries() == []


def test_with_a_damaged_table_a_node_serves_no_replica_and_hides_its_staged_copies(tmp_path: Path) -> None:
    require("FUSE", fuse_problem())
    name = f"dmg-{os.getpid()}"
    sites, links = {"a": ["n1"], "b": ["n2"]}, [("a", "b", 5.0)]
    data = os.urandom(MiB + 11)
    with local_cluster(tmp_path, name, sites, links) as cluster:
        (cluster.export("n2") / "inputs").mkdir()
        (cluster.export("n2") / "inputs" / "big.bin").write_bytes(data)
        (cluster.export("n1") / "inputs").mkdir()
        (cluster.export("n1") / "inputs" / "own.txt").write_text("an original of n1\n")
        assert run_sync(call, cluster.state, "n1", "stage", "/inputs/big.bin")["status"] == "copied"
        assert os.getxattr(cluster.mount("n1") / "inputs" / "big.bin", "user.gmount.node") == b"n1"
    table = Path(replica_table_path(name, "n1"))
    damaged = table.read_bytes()[: len(table.read_bytes()) // 2]
    table.write_bytes(damaged)
    with local_cluster(tmp_path, name, sites, links) as cluster:
        staged = cluster.mount("n1") / "inputs" / "big.bin"
        assert (cluster.export("n1") / "inputs" / "big.bin").exists()  # still on n1's disk ...
        assert os.getxattr(staged, "user.gmount.node") == b"n2"        # ... but reads go to the source
        assert staged.read_bytes() == data
        holders = run_sync(call, cluster.state, "n2", "where", "/inputs/big.bin")
        assert [(h["node"], h["replica_of"]) for h in holders] == [("n2", None)]
        assert sorted(os.listdir(cluster.mount("n2") / "inputs")) == ["big.bin", "own.txt"]
        assert os.getxattr(cluster.mount("n2") / "inputs" / "own.txt", "user.gmount.node") == b"n1"
        with pytest.raises(OSError, match="damaged"):
            run_sync(call, cluster.state, "n1", "stage", "/inputs/big.bin")
        log = Path(default_log_path(name, "n1")).read_text()
        assert f"replica table {table} is damaged" in log
    assert table.read_bytes() == damaged
