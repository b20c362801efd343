"""gmount:// through fsspec, against a real cluster, reading over RPC (no mount used by the reader)."""

from __future__ import annotations

import hashlib
import io
import os
import posixpath
import shutil
import uuid
from collections.abc import Iterator
from typing import Any

import fsspec
import pandas as pd
import pytest
from fsspec.tests.abstract import AbstractFixtures
from fsspec.tests.abstract.get import AbstractGetTests

from gmountpy.api.filesystem import GmountFileSystem

from .conftest import LocalCluster  # noqa: E402


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
    assert isinstance(fs, GmountFileSystem) and fs.cluster.name == name and path == "/fs-url/hello.txt"
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


# --- fsspec's own abstract tests: the `get` family (remote -> local) ------------------
# gmount:// is read-only, so copy/put/pipe/open-for-writing do not apply. The
# scenarios the tests read are written straight into the exports, spread over
# three nodes of both sites, so every listing is a real union.

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


class TestGmountGet(AbstractFixtures, AbstractGetTests):
    # needs fs.mkdir/fs.touch on the remote side, which a read-only file system lacks
    test_get_directory_recursive = None  # type: ignore[assignment]

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

    def _scenario(self, builder: Any, cluster: LocalCluster, fs_path: str) -> str:
        return builder(_SpreadWriter(cluster), posixpath.join, fs_path)

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
