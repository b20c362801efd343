"""Which gmount files a Dask task reads, found in its spec (no cluster needed)."""

from __future__ import annotations

import functools

import pytest

pytest.importorskip("distributed")

from dask._task_spec import Alias, DataNode, Task, TaskRef  # noqa: E402

from gmountpy.api.dask_placement import input_paths  # noqa: E402


class FakeFs:
    """Looks like GmountFileSystem where input_paths looks: its protocol and its cluster's name."""

    protocol = "gmount"

    def __init__(self, cluster: str) -> None:
        self.cluster = cluster


class FakeOpenFile:
    def __init__(self, fs: FakeFs, path: str) -> None:
        self.fs = fs
        self.path = path


class Wrapper:
    """Like dask's ParquetFunctionWrapper: a callable carrying the file system its pieces are read with."""

    def __init__(self, fs: FakeFs) -> None:
        self.fs = fs

    def __call__(self, *args: object) -> None:
        return None


def test_urls_anywhere_in_the_arguments() -> None:
    task = Task("k", print, "gmount://c/data/a.csv", ["gmount:///data/b.csv", {"x": ("gmount://c//data/./c.csv",)}],
                DataNode("d", "gmount://c/data/d.csv"), sep=",", other="gmount://c/data/e.csv")
    assert input_paths(task, "c") == ["/data/a.csv", "/data/b.csv", "/data/c.csv", "/data/d.csv", "/data/e.csv"]


def test_other_clusters_references_and_plain_strings_are_not_inputs() -> None:
    task = Task("k", print, "gmount://other/data/a.csv", "/data/plain.csv", TaskRef("dep"), Alias("a", "b"),
                b"gmount://c/bytes", 3, None)
    assert input_paths(task, "c") == []


def test_open_files_and_functions_carrying_a_gmount_file_system() -> None:
    ours, theirs = FakeFs("c"), FakeFs("other")
    inner = Task("inner", functools.partial(print, sep=","), FakeOpenFile(ours, "/data/a.csv"), 0, 100)
    outer = Task("outer", print, inner, FakeOpenFile(theirs, "/data/x.csv"))
    assert input_paths(outer, "c") == ["/data/a.csv"]
    # read_parquet: the pieces are plain paths, read with the file system the function carries
    pieces = Task("p", Wrapper(ours), {"piece": ("/data/p.parquet", None, None)})
    assert input_paths(pieces, "c") == ["/data/p.parquet"]
    assert input_paths(Task("p", Wrapper(theirs), {"piece": ("/data/p.parquet", None, None)}), "c") == []
    partial = Task("q", functools.partial(Wrapper(ours), "/data/q.parquet"), "/data/r.parquet")
    assert input_paths(partial, "c") == ["/data/q.parquet", "/data/r.parquet"]


def test_a_path_named_twice_counts_once_and_deep_nesting_stops() -> None:
    assert input_paths(Task("k", print, "gmount://c/a", "gmount://c/a"), "c") == ["/a"]
    deep: object = "gmount://c/deep"
    for _ in range(40):
        deep = [deep]
    assert input_paths(Task("k", print, deep), "c") == []
