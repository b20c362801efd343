"""Staged replicas through real mounts: copy, verify, serve locally, never stale."""

from __future__ import annotations

import hashlib
import os
import time

from gmountpy import Cluster as ApiCluster
from gmountpy.protocol.client import call, run_sync

from ..conftest import LocalCluster, wait_for


def stage(cluster: LocalCluster, node: str, path: str) -> dict:
    return run_sync(call, cluster.state, node, "stage", path)


def test_stage_copies_verifies_and_is_idempotent(cluster4: LocalCluster) -> None:
    data = os.urandom(9 * 1024 * 1024 + 123)  # several 4 MiB pieces and a ragged end
    (cluster4.export("n3") / "stage-a").mkdir()
    (cluster4.export("n3") / "stage-a" / "input.bin").write_bytes(data)
    first = stage(cluster4, "n1", "/stage-a/input.bin")
    assert first["status"] == "copied" and first["source"] == "n3"
    assert first["sha256"] == hashlib.sha256(data).hexdigest() and first["size"] == len(data)
    copy = cluster4.export("n1") / "stage-a" / "input.bin"
    assert copy.read_bytes() == data
    assert copy.stat().st_mtime_ns == (cluster4.export("n3") / "stage-a" / "input.bin").stat().st_mtime_ns
    assert stage(cluster4, "n1", "/stage-a/input.bin")["status"] == "up-to-date"
    assert not [p for p in os.listdir(cluster4.export("n1") / "stage-a") if "gmount-stage" in p]


def test_replica_wins_on_its_node_only(cluster4: LocalCluster) -> None:
    (cluster4.export("n4") / "stage-b.txt").write_text("original on n4")
    cluster4.rescan("n4")
    stage(cluster4, "n1", "/stage-b.txt")
    on_n1 = cluster4.mount("n1") / "stage-b.txt"
    assert wait_for(lambda: os.getxattr(on_n1, "user.gmount.node") == b"n1")
    assert os.getxattr(on_n1, "user.gmount.local_path").decode() == str(cluster4.export("n1") / "stage-b.txt")
    # n2 is n1's site-mate, but a replica serves only its own node: n2 reads the source
    assert os.getxattr(cluster4.mount("n2") / "stage-b.txt", "user.gmount.node") == b"n4"
    holders = run_sync(call, cluster4.state, "n1", "where", "/stage-b.txt")
    assert [(h["node"], h["replica_of"]) for h in holders] == [("n1", "n4"), ("n4", None)]


def test_replica_never_serves_stale_data(cluster4: LocalCluster) -> None:
    (cluster4.export("n3") / "stage-c.txt").write_text("version 1")
    cluster4.rescan("n3")
    stage(cluster4, "n2", "/stage-c.txt")
    on_n2 = cluster4.mount("n2") / "stage-c.txt"
    assert on_n2.read_text() == "version 1"
    time.sleep(0.05)
    (cluster4.mount("n4") / "stage-c.txt").write_text("version 2, written through n4")
    # after the attribute TTL (0.5 s in tests) the replica is checked against its source and dropped
    assert wait_for(lambda: on_n2.read_text() == "version 2, written through n4", timeout=3)
    assert wait_for(lambda: not (cluster4.export("n2") / "stage-c.txt").exists(), timeout=3)


def test_a_replica_is_checked_at_its_source_once_per_ttl_for_lookups_and_at_every_open(
        cluster4: LocalCluster) -> None:
    """Lookups of a replica (make checking its prerequisites with `stat`) trust a check of its source
    for attr_ttl, as they trust any attributes; an open still asks the source (close-to-open), so a
    change made elsewhere is read at once."""
    (cluster4.export("n3") / "stage-f.txt").write_text("version 1")
    cluster4.rescan("n3")
    stage(cluster4, "n2", "/stage-f.txt")
    on_n2 = cluster4.mount("n2") / "stage-f.txt"
    api = ApiCluster.open(cluster4.spec.name)
    assert on_n2.read_text() == "version 1"

    def asked_n3() -> int:
        return api.counters()["n2"].get("messages.lookup", 0)  # the source check

    before = asked_n3()
    started = time.monotonic()
    for _ in range(20):
        assert os.getxattr(on_n2, "user.gmount.node") == b"n2"  # the daemon's lookup, past the kernel's cache
    asked = asked_n3() - before
    if time.monotonic() - started < 0.4:  # within one attr_ttl (0.5 s in tests)
        assert asked <= 1, f"n2 asked about its replica {asked} times for 20 lookups"
    else:
        assert asked < 10, f"n2 asked about its replica {asked} times for 20 lookups"
    holders = run_sync(call, cluster4.state, "n2", "where", "/stage-f.txt")
    assert [(h["node"], h["replica_of"]) for h in holders] == [("n2", "n3"), ("n3", None)]

    time.sleep(0.05)
    (cluster4.mount("n4") / "stage-f.txt").write_text("version 2, written through n4")
    assert on_n2.read_text() == "version 2, written through n4"  # at once, not after the TTL
    assert wait_for(lambda: not (cluster4.export("n2") / "stage-f.txt").exists(), timeout=3)


def test_a_replica_on_its_directorys_home_is_checked_there_and_a_close_anywhere_is_seen_at_once(
        cluster4: LocalCluster) -> None:
    """The home of the replica's directory is told of every write before its close(2) returns, so an
    open there checks the replica against the home's own record: no message to the source, and a
    file rewritten through any node's mount is read in its new version at the next open."""
    (cluster4.mount("n2") / "stage-home").mkdir()  # made through n2: n2 is the directory's home
    (cluster4.mount("n3") / "stage-home" / "f.txt").write_text("version 1")
    stage(cluster4, "n2", "/stage-home/f.txt")
    on_n2 = cluster4.mount("n2") / "stage-home" / "f.txt"
    api = ApiCluster.open(cluster4.spec.name)
    assert os.getxattr(on_n2, "user.gmount.node") == b"n2"

    def asked() -> int:
        return sum(value for key, value in api.counters()["n2"].items()
                   if key.startswith("messages.") and key not in ("messages.index_sync", "messages.index_owned"))

    before = asked()
    for _ in range(5):
        assert on_n2.read_text() == "version 1"
    assert asked() == before, "an open of the replica on its directory's home asked another node"

    # the same size, no truncate: only the new mtime tells the versions apart, and only the close
    # tells the home of it (n4 writes through a handle on n3's file, n3 through its own)
    for writer, text in (("n4", "version 2"), ("n3", "version 3")):
        time.sleep(0.01)
        with open(cluster4.mount(writer) / "stage-home" / "f.txt", "r+") as f:
            f.write(text)
        assert on_n2.read_text() == text  # at once: the close told the home
    assert wait_for(lambda: not (cluster4.export("n2") / "stage-home" / "f.txt").exists(), timeout=3)


def test_writes_through_the_replica_node_go_to_the_source(cluster4: LocalCluster) -> None:
    (cluster4.export("n3") / "stage-d.txt").write_text("base\n")
    cluster4.rescan("n3")
    stage(cluster4, "n1", "/stage-d.txt")
    with open(cluster4.mount("n1") / "stage-d.txt", "a") as f:
        f.write("appended on n1\n")
    assert (cluster4.export("n3") / "stage-d.txt").read_text() == "base\nappended on n1\n"
    assert wait_for(lambda: (cluster4.mount("n1") / "stage-d.txt").read_text() == "base\nappended on n1\n")


def test_stage_of_missing_file_and_of_local_file(cluster4: LocalCluster) -> None:
    import pytest
    with pytest.raises(FileNotFoundError):
        stage(cluster4, "n1", "/no-such-stage-file")
    (cluster4.export("n1") / "stage-e.txt").write_text("mine")
    assert stage(cluster4, "n1", "/stage-e.txt")["status"] == "local"
