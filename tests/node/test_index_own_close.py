"""A node's own write, seen by its own `stat` at once, with the directory index.

The kernel sends a file's release after close(2) has returned; only then does the node
learn the final size from the holder and tell the directory's home. A `stat` right after
the close (the kernel's getattr, served meanwhile) must not be answered with what the
node's locator or the home knew before the writes -- the kernel would keep that old size
for attr_ttl. (docs/consistency.md: another node's `stat` may lag for attr_ttl; a node's
own change is visible to itself at once.)
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from .._trio import trio_test
from ..conftest import LocalCluster, fuse_problem, local_cluster, require
from .harness import open_cluster

ATTR_TTL = 5.0


@trio_test
async def test_a_lookup_during_the_release_of_a_written_file_has_its_final_size(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, lookup="index") as cluster:
        holder, writer = cluster["n2"], cluster["n1"].namespace
        holder.put("/d/f", b"x")
        assert (await writer.lookup("/d/f")).attr.size == 1
        handle = await writer.open("/d/f", os.O_WRONLY)
        await writer.write(handle, 1, b"more data")
        holder.delay["fstat"] = 0.5  # the release asks the holder for the final size: slowly
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.release, handle)
            await trio.sleep(0.1)  # the release is under way (close(2) has returned)
            assert (await writer.lookup("/d/f")).attr.size == 10
        del holder.delay["fstat"]
        assert (await cluster["n3"].namespace.lookup("/d/f")).attr.size == 10  # the home was told


@pytest.fixture(scope="module")
def mounted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    require("FUSE", fuse_problem())
    base = tmp_path_factory.mktemp("own-close")
    tuning = f'attr_ttl = {ATTR_TTL}\nnegative_ttl = {ATTR_TTL}\nlookup = "index"'
    with local_cluster(base, f"oc-{os.getpid()}", {"tsukuba": ["n1", "n2"]}, [], tuning) as running:
        yield running


def test_stat_right_after_close_shows_the_size_this_node_wrote(mounted: LocalCluster) -> None:
    """n1 appends to files n2 holds, through n1's mount; `stat` on n1 right after each close."""
    directory = f"own-close-{uuid.uuid4().hex[:8]}"
    (mounted.mount("n2") / directory).mkdir()
    names = [f"f{i}" for i in range(4)]
    for name in names:
        (mounted.mount("n2") / directory / name).write_bytes(b"x")
    for name in names:  # looked up on n1 first: its caches (and a leased listing) know the old size
        assert os.stat(mounted.mount("n1") / directory / name).st_size == 1
    for name in names:
        target = mounted.mount("n1") / directory / name
        with open(target, "ab") as f:
            f.write(b"more data")
        assert os.stat(target).st_size == 10, name
    assert os.stat(mounted.export("n2") / directory / names[0]).st_size == 10  # written on n2, the holder
