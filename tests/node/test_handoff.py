"""The workflow hand-off contract (docs/design.md), through the real mounts of a 4-node, 2-site cluster.

n1, n2 are site tsukuba; n3, n4 site hongo. A "hand-off" is what a workflow
does between two jobs on different nodes: one node writes and closes a file,
another node checks it (stat) and then opens and reads it. Every loop here
counts wrong reads and must count zero.

The TTLs are long (attr 2 s, negative 10 s) so that a stale cache, if one is
used, is still there when the next step runs: each check fails
deterministically on code that trusts its caches across a hand-off.
"""

from __future__ import annotations

import errno
import os
import random
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gmountpy import launch

from ..conftest import (
    FOUR_NODE_LINKS,
    FOUR_NODES,
    LOOKUPS,
    LocalCluster,
    fuse_problem,
    local_cluster,
    require,
    wait_for,
)

TUNING = "attr_ttl = 2.0\nnegative_ttl = 10.0\nrpc_timeout = 1.5\nconnect_timeout = 1.0"
SITE_A, SITE_B = ("n1", "n2"), ("n3", "n4")


@pytest.fixture(scope="module", params=LOOKUPS)
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """The cluster of this module's loops, once per locator (each keeps the contract)."""
    require("FUSE", fuse_problem())
    base = tmp_path_factory.mktemp("handoff")
    with local_cluster(base, f"ho-{request.param}-{os.getpid()}", FOUR_NODES, FOUR_NODE_LINKS,
                       f'{TUNING}\nlookup = "{request.param}"') as running:
        yield running


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def write_through(cluster: LocalCluster, node: str, rel: str, data: bytes, flags: int = 0) -> None:
    """What a job does: open (create or truncate), write, close -- through `node`'s mount."""
    fd = os.open(cluster.mount(node) / rel, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | flags, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def read_through(cluster: LocalCluster, node: str, rel: str) -> bytes:
    with open(cluster.mount(node) / rel, "rb") as f:
        return f.read()


def content(iteration: int, size: int) -> bytes:
    head = f"iteration {iteration} size {size}\n".encode()
    return (head + os.urandom(max(0, size - len(head))))[:size]


def holders(cluster: LocalCluster, rel: str) -> list[str]:
    return [node for node in cluster.nodes if os.path.lexists(cluster.export(node) / rel)]


def handoff_loop(cluster: LocalCluster, rel: str, iterations: int, sizes: list[int]) -> list[str]:
    """Write on one node, stat then read on a node of the other site; returns what went wrong."""
    wrong = []
    rng = random.Random(8)
    for i in range(iterations):
        writer = rng.choice(SITE_A if i % 2 == 0 else SITE_B)
        reader = rng.choice(SITE_B if i % 2 == 0 else SITE_A)
        expected = content(i, sizes[i % len(sizes)])
        write_through(cluster, writer, rel, expected)
        try:
            (cluster.mount(reader) / rel).stat()
            got = read_through(cluster, reader, rel)
        except OSError as exc:
            wrong.append(f"{i}: {writer}->{reader} {exc!r}")
            continue
        if got != expected:
            wrong.append(f"{i}: {writer}->{reader} read {len(got)} bytes ({got[:24]!r}), "
                         f"wanted {len(expected)} ({expected[:24]!r})")
    return wrong


# ------------------------------------------------ cross-node close-to-open


def test_close_to_open_handoff_loop_200_small_files(cluster: LocalCluster) -> None:
    rel = unique("c2o") + ".dat"
    sizes = [10, 5000, 300, 70_000, 1, 20_000, 4096, 0, 150_000, 777]  # up and down
    wrong = handoff_loop(cluster, rel, 200, sizes)
    assert wrong == [], f"{len(wrong)} of 200 hand-offs read wrong: {wrong[:5]}"
    assert len(holders(cluster, rel)) == 1, holders(cluster, rel)


def test_close_to_open_handoff_loop_large_files_with_read_ahead(cluster: LocalCluster) -> None:
    rel = unique("c2o-large") + ".dat"
    mib = 1 << 20
    sizes = [3 * mib + 17, mib // 2, 5 * mib, 2 * mib - 1, 6 * mib + 3, mib + 5]
    wrong = handoff_loop(cluster, rel, 60, sizes)
    assert wrong == [], f"{len(wrong)} of 60 large hand-offs read wrong: {wrong[:5]}"


def test_close_to_open_handoff_after_rename_over_on_another_node(cluster: LocalCluster) -> None:
    top = unique("c2o-mv")
    (cluster.mount("n1") / top).mkdir()
    rel = f"{top}/out.dat"
    write_through(cluster, "n3", rel, b"first")
    wrong = []
    for i in range(40):
        writer = ("n3", "n4", "n2")[i % 3]
        expected = content(i, (i * 7919) % 60_000 + 1)
        tmp = f"{top}/.tmp-{i}"
        try:
            assert read_through(cluster, "n1", rel)  # the reader has it cached
            write_through(cluster, writer, tmp, expected)
            os.replace(cluster.mount(writer) / tmp, cluster.mount(writer) / rel)
            (cluster.mount("n1") / rel).stat()
            got = read_through(cluster, "n1", rel)
        except OSError as exc:
            got = repr(exc).encode()
        if got != expected:
            wrong.append(f"{i}: via {writer}: {len(got)} bytes, wanted {len(expected)}")
    assert wrong == [], f"{len(wrong)} of 40 rename-over hand-offs read wrong: {wrong[:5]}"
    assert len(holders(cluster, rel)) == 1


def test_close_to_open_handoff_after_append_on_another_node(cluster: LocalCluster) -> None:
    rel = unique("c2o-append") + ".log"
    expected = b""
    write_through(cluster, "n3", rel, expected)
    wrong = []
    for i in range(40):
        piece = content(i, 100 + (i * 131) % 3000)
        with open(cluster.mount(("n3", "n4")[i % 2]) / rel, "ab") as f:
            f.write(piece)
        expected += piece
        (cluster.mount("n1") / rel).stat()
        got = read_through(cluster, "n1", rel)
        if got != expected:
            wrong.append(f"{i}: {len(got)} bytes, wanted {len(expected)}")
    assert wrong == [], f"{len(wrong)} of 40 append hand-offs read wrong: {wrong[:5]}"


def test_close_to_open_handoff_when_the_file_moved_to_another_holder(cluster: LocalCluster) -> None:
    rel = unique("c2o-moved") + ".dat"
    (cluster.export("n4") / rel).write_bytes(b"start")
    cluster.rescan("n4")
    wrong = []
    for i in range(20):
        assert read_through(cluster, "n1", rel)  # n1 caches the holder and the attributes
        holder = ("n3", "n2", "n4")[i % 3]
        expected = content(i, 1000 + i * 10)
        for node in cluster.nodes:  # moved behind n1's caches, straight in the exports
            (cluster.export(node) / rel).unlink(missing_ok=True)
        (cluster.export(holder) / rel).write_bytes(expected)
        cluster.rescan()
        try:
            got = read_through(cluster, "n1", rel)
        except OSError as exc:
            got = repr(exc).encode()
        if got != expected:
            wrong.append(f"{i}: now on {holder}: {got[:40]!r}")
    assert wrong == [], wrong[:5]


# ---------------------------------------------------- new names and duplicates


def test_handoff_negative_then_create_is_visible_100_times(cluster: LocalCluster) -> None:
    top = unique("neg")
    (cluster.mount("n1") / top).mkdir()
    invisible = []
    for i in range(100):
        consumer, producer = (("n1", "n3"), ("n4", "n2"), ("n2", "n4"), ("n3", "n1"))[i % 4]
        rel = f"{top}/out-{i}.dat"
        assert not (cluster.mount(consumer) / rel).exists()  # make checks outputs before the job
        expected = content(i, 200)
        write_through(cluster, producer, rel, expected)
        try:
            if read_through(cluster, consumer, rel) != expected:
                invisible.append(f"{i}: wrong bytes")
        except FileNotFoundError:
            invisible.append(f"{i}: {producer}->{consumer} ENOENT")
    assert invisible == [], f"{len(invisible)} of 100 new outputs not visible: {invisible[:5]}"


def test_handoff_negative_then_mkdir_and_symlink_are_visible(cluster: LocalCluster) -> None:
    top = unique("negdir")
    assert not (cluster.mount("n3") / top).exists()
    (cluster.mount("n1") / top / "sub").mkdir(parents=True)
    assert (cluster.mount("n3") / top / "sub").is_dir()
    assert not os.path.lexists(cluster.mount("n4") / top / "link")
    os.symlink("sub", cluster.mount("n2") / top / "link")
    assert os.readlink(cluster.mount("n4") / top / "link") == "sub"


def test_handoff_rotating_writers_make_no_duplicates(cluster: LocalCluster) -> None:
    rel = unique("rot") + ".dat"
    for node in cluster.nodes:  # every node checks first: all of them cache "absent"
        assert not (cluster.mount(node) / rel).exists()
    wrong = []
    for i in range(100):
        writer = cluster.nodes[i % 4]
        reader = cluster.nodes[(i + 1 + i // 4) % 4] if (i + 1 + i // 4) % 4 != i % 4 else cluster.nodes[(i + 2) % 4]
        expected = content(i, 64 + i)
        try:
            write_through(cluster, writer, rel, expected)
            got = read_through(cluster, reader, rel)
        except OSError as exc:
            got = repr(exc).encode()
        if got != expected:
            wrong.append(f"{i}: {writer}->{reader}: {got[:30]!r}")
    assert wrong == [], f"{len(wrong)} of 100 rewrites read back wrong: {wrong[:5]}"
    assert len(holders(cluster, rel)) == 1, holders(cluster, rel)


def test_handoff_create_excl_and_mkdir_of_a_remote_name_fail_eexist(cluster: LocalCluster) -> None:
    top = unique("excl")
    (cluster.mount("n3") / top).mkdir()
    names = ("f", "g", "d", "l")
    for name in names:  # n1 caches "absent" for each name
        assert not (cluster.mount("n1") / top / name).exists()
    for name in names:  # then they appear on n3, behind n1's cache (straight into n3's export)
        (cluster.export("n3") / top / name).write_bytes(b"on n3")
    cluster.rescan("n3")
    with pytest.raises(FileExistsError):
        os.open(cluster.mount("n1") / top / "f", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with pytest.raises(FileExistsError):
        os.mkdir(cluster.mount("n1") / top / "d")
    with pytest.raises(FileExistsError):
        os.symlink("x", cluster.mount("n1") / top / "l")
    # O_CREAT without O_EXCL opens the existing file: no local twin
    fd = os.open(cluster.mount("n1") / top / "g", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, b"ON", 0)
    finally:
        os.close(fd)
    assert (cluster.export("n3") / top / "g").read_bytes() == b"ON n3"
    assert holders(cluster, f"{top}/g") == ["n3"]
    assert holders(cluster, f"{top}/f") == ["n3"] and holders(cluster, f"{top}/d") == ["n3"]


# -------------------------------------------------------------- open files


def test_handoff_open_file_fstat_after_unlink_and_rename_elsewhere(cluster: LocalCluster) -> None:
    top = unique("openfile")
    (cluster.mount("n3") / top).mkdir()
    write_through(cluster, "n3", f"{top}/a", b"a" * 1234)
    write_through(cluster, "n1", f"{top}/b", b"b" * 567)
    fd_a = os.open(cluster.mount("n1") / top / "a", os.O_RDONLY)
    fd_b = os.open(cluster.mount("n2") / top / "b", os.O_RDONLY)
    try:
        os.unlink(cluster.mount("n4") / top / "a")            # remote file, unlinked on another node
        os.rename(cluster.mount("n3") / top / "b", cluster.mount("n3") / top / "c")  # renamed elsewhere
        wait_for(lambda: False, timeout=2.2)  # past attr_ttl: the kernel asks the daemon again
        assert os.fstat(fd_a).st_size == 1234
        assert os.pread(fd_a, 4, 0) == b"aaaa"
        assert os.fstat(fd_b).st_size == 567
    finally:
        os.close(fd_a)
        os.close(fd_b)


def test_handoff_release_after_rename_does_not_resurrect_the_old_name(cluster: LocalCluster) -> None:
    top = unique("resurrect")
    (cluster.mount("n1") / top).mkdir()
    for node, holder in (("n1", "n1"), ("n2", "n4")):
        old, new = f"{top}/old-{node}", f"{top}/new-{node}"
        write_through(cluster, holder, old, b"x")
        fd = os.open(cluster.mount(node) / old, os.O_WRONLY)
        try:
            os.rename(cluster.mount(node) / old, cluster.mount(node) / new)
            os.write(fd, b"written after the rename")
        finally:
            os.close(fd)
        assert not (cluster.mount(node) / old).exists(), node
        assert read_through(cluster, node, new) == b"written after the rename"
        fd = os.open(cluster.mount(node) / new, os.O_WRONLY | os.O_APPEND)
        try:
            os.unlink(cluster.mount(node) / new)
            os.write(fd, b"!")
        finally:
            os.close(fd)
        assert not (cluster.mount(node) / new).exists(), node


def test_handoff_read_ahead_dropped_when_another_handle_writes(cluster: LocalCluster) -> None:
    rel = unique("ra-write") + ".bin"
    mib = 1 << 20
    (cluster.export("n3") / rel).write_bytes(b"o" * (8 * mib))
    cluster.rescan("n3")
    reader = os.open(cluster.mount("n1") / rel, os.O_RDONLY)
    writer = os.open(cluster.mount("n1") / rel, os.O_WRONLY)
    try:
        for offset in range(0, mib, 128 * 1024):  # sequential: the daemon reads ahead several MiB
            assert os.pread(reader, 128 * 1024, offset) == b"o" * (128 * 1024)
        os.pwrite(writer, b"NEW!", 3 * mib + 10)
        assert os.pread(reader, 8, 3 * mib + 8) == b"ooNEW!oo"
    finally:
        os.close(reader)
        os.close(writer)


def test_handoff_reader_reads_to_the_new_end_after_growth(cluster: LocalCluster) -> None:
    rel = unique("ra-grow") + ".bin"
    mib = 1 << 20
    (cluster.export("n3") / rel).write_bytes(b"a" * (mib + mib // 2))
    cluster.rescan("n3")
    reader = os.open(cluster.mount("n1") / rel, os.O_RDONLY)
    writer = os.open(cluster.mount("n1") / rel, os.O_WRONLY | os.O_APPEND)
    try:
        data = b""
        while chunk := os.read(reader, 128 * 1024):
            data += chunk
        assert len(data) == mib + mib // 2
        os.write(writer, b"b" * 5000)  # same node: POSIX semantics, seen at once
        assert os.read(reader, 128 * 1024) == b"b" * 5000
    finally:
        os.close(reader)
        os.close(writer)


def test_handoff_open_of_a_stale_location_looks_up_again(cluster: LocalCluster) -> None:
    rel = unique("stale-loc") + ".txt"
    (cluster.export("n3") / rel).write_bytes(b"first home")
    cluster.rescan("n3")
    assert read_through(cluster, "n1", rel) == b"first home"  # n1 caches: held by n3
    (cluster.export("n3") / rel).unlink()
    (cluster.export("n2") / rel).write_bytes(b"second home")
    cluster.rescan("n2", "n3")
    assert read_through(cluster, "n1", rel) == b"second home"


# ------------------------------------------------------ errors are not absence


def test_handoff_dead_or_hung_holder_is_eio_not_absence(tmp_path: Path) -> None:
    require("FUSE", fuse_problem())
    with local_cluster(tmp_path, f"hoerr-{os.getpid()}", FOUR_NODES, FOUR_NODE_LINKS, TUNING) as cluster:
        (cluster.export("n3") / "held.txt").write_text("held by n3")
        (cluster.export("n4") / "other.txt").write_text("held by n4")
        cluster.rescan("n3", "n4")
        assert read_through(cluster, "n1", "held.txt") == b"held by n3"
        assert read_through(cluster, "n2", "other.txt") == b"held by n4"
        pid = cluster.state.nodes["n4"].pid
        os.kill(pid, signal.SIGSTOP)  # hung: answers nothing
        try:
            wait_for(lambda: False, timeout=2.2)  # past attr_ttl
            with pytest.raises(OSError) as info:  # EIO at stat (flood) or at open (index: stat asks the home)
                read_through(cluster, "n2", "other.txt")
            assert info.value.errno == errno.EIO
        finally:
            os.kill(pid, signal.SIGCONT)
        # not cached as absent (negative_ttl is 10 s): back once n4 is retried (2 s)
        assert wait_for(lambda: _exists(cluster.mount("n2") / "other.txt"), timeout=5)
        os.kill(cluster.state.nodes["n3"].pid, signal.SIGKILL)
        wait_for(lambda: False, timeout=2.2)
        with pytest.raises(OSError) as info:
            read_through(cluster, "n1", "held.txt")
        assert info.value.errno == errno.EIO
        launch.up(cluster.spec)
        assert wait_for(lambda: _exists(cluster.mount("n1") / "held.txt"), timeout=5)


def _exists(path: Path) -> bool:
    try:
        path.stat()
        return True
    except OSError:
        return False


def test_handoff_unlink_and_rename_over_while_a_holder_is_down_fail_eio(tmp_path: Path) -> None:
    require("FUSE", fuse_problem())
    with local_cluster(tmp_path, f"hotomb-{os.getpid()}", FOUR_NODES, FOUR_NODE_LINKS, TUNING) as cluster:
        for node in ("n1", "n3"):  # the same name on two nodes
            (cluster.export(node) / "dup.txt").write_text(f"copy on {node}")
            (cluster.export(node) / "dst.txt").write_text(f"old dst on {node}")
        (cluster.export("n1") / "src.txt").write_text("new dst")
        os.kill(cluster.state.nodes["n3"].pid, signal.SIGKILL)
        with pytest.raises(OSError) as info:
            os.unlink(cluster.mount("n1") / "dup.txt")
        assert info.value.errno == errno.EIO
        with pytest.raises(OSError) as info:
            os.rename(cluster.mount("n1") / "src.txt", cluster.mount("n1") / "dst.txt")
        assert info.value.errno == errno.EIO
        launch.up(cluster.spec)
        # The unlink and rename failed, so nothing old "comes back": every node sees what it saw.
        assert wait_for(lambda: _exists(cluster.mount("n4") / "dup.txt"), timeout=5)
        assert read_through(cluster, "n4", "dup.txt") == b"copy on n3"
        assert read_through(cluster, "n1", "dup.txt") == b"copy on n1"
        assert read_through(cluster, "n1", "src.txt") == b"new dst"
        # With every node up both work, and the old file is gone everywhere.
        os.unlink(cluster.mount("n1") / "dup.txt")
        os.rename(cluster.mount("n1") / "src.txt", cluster.mount("n1") / "dst.txt")
        assert holders(cluster, "dup.txt") == []
        assert holders(cluster, "dst.txt") == ["n1"]
        assert read_through(cluster, "n4", "dst.txt") == b"new dst"
