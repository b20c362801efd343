"""gmount:// through fsspec, against a real cluster, over RPC (no mount used by the reader or writer):
one connection per file system, a file bound to one handle from open to close, transactions, and
fsspec's own abstract test suite."""

from __future__ import annotations

import ast
import gc
import hashlib
import io
import os
import posixpath
import shutil
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pandas as pd
import pytest
from fsspec.tests.abstract import (
    AbstractCopyTests,
    AbstractFixtures,
    AbstractGetTests,
    AbstractOpenTests,
    AbstractPipeTests,
    AbstractPutTests,
)

from gmountpy.api import filesystem as filesystem_module
from gmountpy.api.filesystem import GmountFileSystem

from .conftest import LocalCluster, wait_for


def put(cluster: LocalCluster, node: str, path: str, data: bytes) -> bytes:
    target = cluster.export(node) / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    cluster.rescan(node)
    return data


@pytest.fixture(scope="module")
def gfs(cluster4: LocalCluster) -> GmountFileSystem:
    return GmountFileSystem(cluster=cluster4.spec.name)


def test_registered_through_the_entry_point() -> None:
    assert fsspec.get_filesystem_class("gmount") is GmountFileSystem


def test_url_forms(cluster4: LocalCluster) -> None:
    name = cluster4.spec.name
    data = put(cluster4, "n3", "/fs-url/hello.txt", b"hello from n3\n")
    fs, path = fsspec.core.url_to_fs(f"gmount://{name}/fs-url/hello.txt")
    assert isinstance(fs, GmountFileSystem) and fs.cluster == name and path == "/fs-url/hello.txt"
    with fsspec.open(f"gmount://{name}/fs-url/hello.txt") as f:
        assert f.read() == data
    with fsspec.open("gmount:///fs-url/hello.txt", cluster=name) as f:
        assert f.read() == data
    assert fs.unstrip_protocol("/fs-url/hello.txt") == f"gmount://{name}/fs-url/hello.txt"
    assert GmountFileSystem._strip_protocol(f"gmount://{name}/a//b/") == "/a/b"
    assert GmountFileSystem._strip_protocol("gmount:///") == "/"
    with pytest.raises(Exception, match="neither a running cluster's name"):
        fsspec.open("gmount://not-a-cluster/x").open()


def test_ls_and_info_carry_locations(cluster4: LocalCluster, gfs: GmountFileSystem) -> None:
    put(cluster4, "n2", "/fs-ls/a.csv", b"1,2\n")
    put(cluster4, "n4", "/fs-ls/a.csv", b"1,2\n3,4\n")
    put(cluster4, "n4", "/fs-ls/sub/b.bin", b"b" * 100)
    entries = {e["name"]: e for e in gfs.ls("/fs-ls")}
    assert set(entries) == {"/fs-ls/a.csv", "/fs-ls/sub"}
    assert entries["/fs-ls/a.csv"]["type"] == "file" and entries["/fs-ls/a.csv"]["size"] == 4
    assert entries["/fs-ls/a.csv"]["node"] == "n2" and entries["/fs-ls/a.csv"]["holders"] == ["n2", "n4"]
    assert entries["/fs-ls/sub"]["type"] == "directory"
    assert gfs.ls("/fs-ls", detail=False) == ["/fs-ls/a.csv", "/fs-ls/sub"]
    info = gfs.info(f"gmount://{cluster4.spec.name}/fs-ls/a.csv")
    assert info["name"] == "/fs-ls/a.csv" and info["node"] == "n2" and info["site"] == "tsukuba"
    assert [loc["node"] for loc in info["locations"]] == ["n2", "n4"]
    assert info["locations"][1]["export_path"] == str(cluster4.export("n4") / "fs-ls" / "a.csv")
    assert info["locations"][1]["rtt_ms"] == 14.0
    # another node's point of view: the nearest copy differs
    from_n4 = GmountFileSystem(cluster=cluster4.spec.name, node="n4")
    assert from_n4.info("/fs-ls/a.csv")["node"] == "n4" and from_n4.info("/fs-ls/a.csv")["size"] == 8
    assert from_n4.cat_file("/fs-ls/a.csv") == b"1,2\n3,4\n"
    assert gfs.isdir("/fs-ls/sub") and gfs.isfile("/fs-ls/sub/b.bin") and not gfs.exists("/fs-ls/nope")
    assert sorted(gfs.find("/fs-ls")) == ["/fs-ls/a.csv", "/fs-ls/sub/b.bin"]
    assert gfs.glob("/fs-ls/**/*.bin") == ["/fs-ls/sub/b.bin"]
    assert gfs.du("/fs-ls") == 104
    with pytest.raises(FileNotFoundError):
        gfs.info("/fs-ls/nope")
    with pytest.raises(FileNotFoundError):
        gfs.ls("/fs-ls/nope")


def test_reads_ranges_from_the_holder(cluster4: LocalCluster, gfs: GmountFileSystem) -> None:
    data = put(cluster4, "n4", "/fs-read/blob.bin", os.urandom(9 * 1024 * 1024 + 99))
    assert gfs.cat_file("/fs-read/blob.bin") == data
    assert gfs.cat_file("/fs-read/blob.bin", start=-10) == data[-10:]
    assert gfs.cat_file("/fs-read/blob.bin", start=100, end=-100) == data[100:-100]
    assert gfs.cat_file("/fs-read/blob.bin", start=50, end=40) == b""
    with gfs.open("/fs-read/blob.bin", block_size=1024 * 1024) as f:
        assert f.holder == "n4" and f.size == len(data)
        f.seek(4 * 1024 * 1024 - 5)
        assert f.read(10) == data[4 * 1024 * 1024 - 5:4 * 1024 * 1024 + 5]
        f.seek(0)
        assert hashlib.sha256(f.read()).digest() == hashlib.sha256(data).digest()
    with pytest.raises(IsADirectoryError):
        gfs.open("/fs-read")
    with pytest.raises(NotImplementedError, match="not 'ab'"):
        gfs.open("/fs-read/new.txt", "ab")


def test_pandas_reads_a_remote_csv(cluster4: LocalCluster) -> None:
    put(cluster4, "n3", "/fs-pandas/table.csv", b"x,y\n1,2.5\n2,3.5\n3,4.5\n")
    frame = pd.read_csv(f"gmount://{cluster4.spec.name}/fs-pandas/table.csv")
    assert list(frame.columns) == ["x", "y"] and frame["y"].sum() == 10.5


# --- one connection, one handle ---------------------------------------------------------------


def connections_to(cluster: LocalCluster, node: str) -> set[int]:
    """Local ports of this process's established TCP connections to `node`'s daemon."""
    record = cluster.state.nodes[node]
    ours = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            ours.add(target[8:-1])
    wanted = f"{socket.inet_aton(record.host)[::-1].hex().upper()}:{record.port:04X}"
    ports = set()
    with open("/proc/self/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            local, remote, state, inode = fields[1], fields[2], fields[3], fields[9]
            if remote == wanted and state == "01" and inode in ours:
                ports.add(int(local.split(":")[1], 16))
    return ports


def summary(data: bytes) -> dict[str, int]:
    """Length and count of each byte value: short to compare, and to print when it differs."""
    return {"length": len(data), **{chr(value): count for value in set(data) if (count := data.count(value))}}


def test_one_connection_per_file_system_shared_by_every_read(cluster4: LocalCluster) -> None:
    data = put(cluster4, "n4", "/fs-conn/blob.bin", os.urandom(3 * 1024 * 1024))
    before = connections_to(cluster4, "n4")  # other file systems of this process (fsspec caches instances)
    fs = GmountFileSystem(cluster=cluster4.spec.name, node="n1", skip_instance_cache=True)
    seen: list[set[int]] = []
    with fs.open("/fs-conn/blob.bin", block_size=256 * 1024, cache_type="none") as f:
        assert f.holder == "n4"
        for offset in range(0, len(data), 512 * 1024):
            f.seek(offset)
            assert f.read(1000) == data[offset:offset + 1000]
            seen.append(connections_to(cluster4, "n4") - before)
    assert fs.cat_file("/fs-conn/blob.bin", start=5, end=10) == data[5:10]
    seen.append(connections_to(cluster4, "n4") - before)
    assert len(seen[0]) == 1 and all(ports == seen[0] for ports in seen), seen
    del f, fs  # a file system that is dropped closes its connections (and ends its loop's thread)
    gc.collect()
    assert wait_for(lambda: not connections_to(cluster4, "n4") - before, timeout=10)


def test_a_file_is_bound_at_open_never_bytes_of_two_versions(cluster4: LocalCluster) -> None:
    """Close-to-open: a file replaced on its node after open is still read whole as it was opened."""
    old = put(cluster4, "n3", "/fs-bound/data.bin", b"a" * (4 * 1024 * 1024))
    fs = GmountFileSystem(cluster=cluster4.spec.name, node="n1")
    on_disk = cluster4.export("n3") / "fs-bound" / "data.bin"
    with fs.open("/fs-bound/data.bin", block_size=512 * 1024, cache_type="none") as f:
        first = f.read(512 * 1024)
        replacement = on_disk.with_name("data.bin.new")
        replacement.write_bytes(b"b" * (5 * 1024 * 1024))
        os.replace(replacement, on_disk)  # a new file under the name, as `cp` to a temporary and `mv` do
        rest = f.read()
    assert summary(first + rest) == summary(old)  # not a byte of the new version
    with fs.open("/fs-bound/data.bin") as f:  # the next open reads the new file
        assert summary(f.read()) == summary(b"b" * (5 * 1024 * 1024))


def test_writes_commit_at_close_and_a_failed_write_leaves_the_old_file(cluster4: LocalCluster) -> None:
    fs = GmountFileSystem(cluster=cluster4.spec.name, node="n2")
    fs.pipe_file("/fs-commit/f.txt", b"old")
    reader = GmountFileSystem(cluster=cluster4.spec.name, node="n4")
    with fs.open("/fs-commit/f.txt", "wb", block_size=1024 * 1024) as f:
        f.write(b"x" * (3 * 1024 * 1024))  # past the block size: sent to n2 already
        assert reader.cat_file("/fs-commit/f.txt") == b"old"  # but not in place before close
    assert summary(reader.cat_file("/fs-commit/f.txt")) == summary(b"x" * (3 * 1024 * 1024))
    with pytest.raises(RuntimeError, match="half-way"), \
            fs.open("/fs-commit/f.txt", "wb", block_size=1024 * 1024) as f:
        f.write(b"y" * (3 * 1024 * 1024))
        raise RuntimeError("the writer failed half-way")
    assert summary(reader.cat_file("/fs-commit/f.txt")) == summary(b"x" * (3 * 1024 * 1024))
    directory = cluster4.export("n2") / "fs-commit"
    assert sorted(p.name for p in directory.iterdir()) == ["f.txt"]  # no temporary file left behind


def test_a_transaction_commits_every_file_at_its_end_or_none(cluster4: LocalCluster) -> None:
    fs = GmountFileSystem(cluster=cluster4.spec.name, node="n3")
    with fs.transaction:
        with fs.open("/fs-tx/a.txt", "wb") as f:
            f.write(b"a")
        fs.pipe_file("/fs-tx/b.txt", b"b")
        assert not fs.exists("/fs-tx/a.txt") and not fs.exists("/fs-tx/b.txt")  # closed, not committed
    assert fs.cat_file("/fs-tx/a.txt") == b"a" and fs.cat_file("/fs-tx/b.txt") == b"b"

    with pytest.raises(KeyError), fs.transaction:
        fs.pipe_file("/fs-tx/a.txt", b"changed")
        fs.pipe_file("/fs-tx/c.txt", b"c")
        raise KeyError("something failed before the end of the transaction")
    assert fs.cat_file("/fs-tx/a.txt") == b"a" and not fs.exists("/fs-tx/c.txt")

    by_hand = fs.open("/fs-tx/d.txt", "wb", autocommit=False)
    by_hand.write(b"d")
    by_hand.close()
    assert not fs.exists("/fs-tx/d.txt")
    by_hand.commit()
    assert fs.cat_file("/fs-tx/d.txt") == b"d"
    dropped = fs.open("/fs-tx/e.txt", "wb", autocommit=False)
    dropped.write(b"e")
    dropped.close()
    dropped.discard()
    assert not fs.exists("/fs-tx/e.txt")
    assert sorted(p.name for p in (cluster4.export("n3") / "fs-tx").iterdir()) == ["a.txt", "b.txt", "d.txt"]


def test_put_keeps_the_mode_and_cp_copies_between_nodes(cluster4: LocalCluster, tmp_path: Path) -> None:
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o750)
    fs = GmountFileSystem(cluster=cluster4.spec.name, node="n1")
    fs.put(str(script), "/fs-put/run.sh")
    assert (cluster4.export("n1") / "fs-put" / "run.sh").stat().st_mode & 0o777 == 0o750
    put(cluster4, "n4", "/fs-put/far.bin", b"far" * 1000)
    fs.cp_file("/fs-put/far.bin", "/fs-put/near.bin")
    assert (cluster4.export("n1") / "fs-put" / "near.bin").read_bytes() == b"far" * 1000


def test_the_file_system_does_not_import_the_facade() -> None:
    """gmountpy.api.cluster builds GmountFileSystem (Cluster.fs); the file system never imports it back."""
    tree = ast.parse(Path(filesystem_module.__file__).read_text())
    imported = {(node.level, node.module) for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert (1, "cluster") not in imported and (0, "gmountpy.api.cluster") not in imported, imported
    assert (1, None) not in imported  # `from . import cluster` neither


# --- fsspec's own abstract test suite: copy, get, put, open, pipe ---------------------------


class _Fixtures(AbstractFixtures):
    @pytest.fixture
    def fs(self, cluster4: LocalCluster) -> GmountFileSystem:
        return GmountFileSystem(cluster=cluster4.spec.name, node="n1")

    @pytest.fixture
    def fs_join(self) -> Any:
        return posixpath.join

    @pytest.fixture
    def fs_path(self, cluster4: LocalCluster) -> Iterator[str]:
        path = f"/fs-abstract-{uuid.uuid4().hex[:8]}"
        yield path
        for node in cluster4.nodes:
            shutil.rmtree(cluster4.export(node) / path.lstrip("/"), ignore_errors=True)
        cluster4.rescan()


class TestGmountCopy(_Fixtures, AbstractCopyTests):
    pass


class TestGmountPut(_Fixtures, AbstractPutTests):
    pass


class TestGmountOpen(_Fixtures, AbstractOpenTests):
    pass


class TestGmountPipe(_Fixtures, AbstractPipeTests):
    pass


# The `get` family reads scenarios written straight into the exports, spread over three nodes
# of both sites, so every listing it copies from is a real union of several nodes.

SPREAD = ("n2", "n3", "n4")


class _SpreadWriter:
    """Enough of a file system for fsspec's scenario builders: writes into the exports."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster

    def _node(self, path: str) -> str:
        return SPREAD[int(hashlib.md5(path.encode()).hexdigest(), 16) % len(SPREAD)]

    def _local(self, node: str, path: str) -> str:
        return os.path.join(self.cluster.export(node), path.lstrip("/"))

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        os.makedirs(self._local(self._node(path), path), exist_ok=True)

    def pipe(self, path: str, value: bytes) -> None:
        local = self._local(self._node(path), path)
        os.makedirs(os.path.dirname(local), exist_ok=True)
        with open(local, "wb") as f:
            f.write(value)

    def touch(self, path: str) -> None:
        self.pipe(path, b"")


class TestGmountGet(_Fixtures, AbstractGetTests):
    def _scenario(self, builder: Any, cluster: LocalCluster, fs_path: str) -> str:
        source = builder(_SpreadWriter(cluster), posixpath.join, fs_path)
        cluster.rescan(*SPREAD)
        return source

    @pytest.fixture
    def fs_bulk_operations_scenario_0(self, cluster4: LocalCluster, fs_path: str) -> str:
        return self._scenario(self._bulk_operations_scenario_0, cluster4, fs_path)

    @pytest.fixture
    def fs_glob_edge_cases_files(self, cluster4: LocalCluster, fs_path: str) -> str:
        return self._scenario(self._glob_edge_cases_files, cluster4, fs_path)

    @pytest.fixture
    def fs_dir_and_file_with_same_name_prefix(self, cluster4: LocalCluster, fs_path: str) -> str:
        return self._scenario(self._dir_and_file_with_same_name_prefix, cluster4, fs_path)

    @pytest.fixture
    def fs_10_files_with_hashed_names(self, cluster4: LocalCluster, fs_path: str) -> str:
        return self._scenario(self._10_files_with_hashed_names, cluster4, fs_path)


def test_reader_needs_no_mount(cluster4: LocalCluster) -> None:
    """The file system talks RPC only: it works for a node whose mount this process never touches."""
    data = put(cluster4, "n1", "/fs-nomount/x.bin", b"on n1")
    fs = GmountFileSystem(cluster=cluster4.spec.name, node="n3")
    assert fs.cat_file("/fs-nomount/x.bin") == data
    assert io.BytesIO(fs.cat_file("/fs-nomount/x.bin")).read() == b"on n1"
