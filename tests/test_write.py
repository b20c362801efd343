"""Writing into the namespace from outside any mount: Cluster.write_bytes/put/get/mkdir/remove and fsspec."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import fsspec
import pytest

from gmountpy import Cluster
from gmountpy.api.filesystem import GmountFileSystem

from .conftest import LocalCluster, wait_for


def holders(cluster: LocalCluster, path: str) -> list[str]:
    return [n for n in cluster.nodes if (cluster.export(n) / path.lstrip("/")).is_file()]


def test_write_bytes_lands_on_the_asking_node_and_reads_back_everywhere(cluster4: LocalCluster) -> None:
    c = Cluster.open(cluster4.spec.name)
    data = os.urandom(5 * 1024 * 1024 + 7)  # more than one 4 MiB piece
    assert c.write_bytes("/w-api/new/blob.bin", data, from_node="n3") == "n3"
    assert holders(cluster4, "/w-api/new/blob.bin") == ["n3"]
    assert c.read_bytes("/w-api/new/blob.bin", from_node="n3") == data
    # other nodes see it once their negative cache (0.5 s here) expired
    assert wait_for(lambda: (cluster4.mount("n1") / "w-api/new/blob.bin").is_file(), timeout=5)
    assert (cluster4.mount("n1") / "w-api/new/blob.bin").read_bytes() == data
    assert c.checksum("/w-api/new/blob.bin") == (len(data), hashlib.sha256(data).hexdigest())


def test_rewriting_replaces_the_file_on_its_holder_and_drops_twins(cluster4: LocalCluster) -> None:
    c = Cluster.open(cluster4.spec.name)
    for node in ("n2", "n4"):
        target = cluster4.export(node) / "w-twin/f.txt"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(f"old on {node}".encode())
    assert c.write_bytes("/w-twin/f.txt", b"new", from_node="n1") == "n2"  # nearest holder from n1
    assert holders(cluster4, "/w-twin/f.txt") == ["n2"]
    assert (cluster4.export("n2") / "w-twin/f.txt").read_bytes() == b"new"
    assert c.write_bytes("/w-twin/f.txt", b"moved", on="n4") == "n4"
    assert holders(cluster4, "/w-twin/f.txt") == ["n4"]


def test_names_up_to_255_bytes_write_read_and_copy_back(cluster4: LocalCluster, tmp_path: Path) -> None:
    """Any name the disk takes, the API takes: the temporary files of a put (on the holder) and of a
    get (beside the local copy) are named to fit NAME_MAX whatever the final name."""
    c = Cluster.open(cluster4.spec.name)
    for name in ("L" * 255, "é" * 127, "m" * 235):
        data = name.encode() * 3
        assert c.write_bytes(f"/w-long/{name}", data, on="n3") == "n3"
        assert (cluster4.export("n3") / "w-long" / name).read_bytes() == data
        through = cluster4.mount("n1") / "w-long" / name
        assert wait_for(through.is_file, timeout=5)
        assert through.read_bytes() == data
        assert c.get(f"/w-long/{name}", tmp_path / name) == (len(data), hashlib.sha256(data).hexdigest())
        assert (tmp_path / name).read_bytes() == data
    assert [p.name for p in tmp_path.iterdir() if "gmount-get" in p.name] == []
    assert [p.name for p in (cluster4.export("n3") / "w-long").iterdir() if "gmount-put" in p.name] == []


def test_put_get_mkdir_remove(cluster4: LocalCluster, tmp_path: Path) -> None:
    c = Cluster.open(cluster4.spec.name)
    local = tmp_path / "in.bin"
    local.write_bytes(os.urandom(100_000))
    os.chmod(local, 0o600)
    assert c.put(local, "/w-put/in.bin", on="n4") == "n4"
    on_disk = cluster4.export("n4") / "w-put/in.bin"
    assert on_disk.read_bytes() == local.read_bytes() and on_disk.stat().st_mode & 0o777 == 0o600
    back = tmp_path / "back.bin"
    size, digest = c.get("/w-put/in.bin", back)
    assert back.read_bytes() == local.read_bytes() and size == 100_000
    assert digest == hashlib.sha256(local.read_bytes()).hexdigest()
    assert back.stat().st_mtime_ns == on_disk.stat().st_mtime_ns  # keeps the source's mtime
    assert [p.name for p in tmp_path.iterdir() if "gmount-get" in p.name] == []

    assert c.mkdir("/w-put/sub/deeper", on="n2") == "n2"
    assert (cluster4.export("n2") / "w-put/sub/deeper").is_dir()
    with pytest.raises(FileExistsError, match="on node n2"):
        c.mkdir("/w-put/sub/deeper", from_node="n2")
    assert c.remove("/w-put/in.bin") == ("n4",)
    assert not on_disk.exists()
    with pytest.raises(FileNotFoundError):
        c.remove("/w-put/in.bin", from_node="n4")
    with pytest.raises(IsADirectoryError):
        c.write_bytes("/w-put/sub", b"x", from_node="n2")
    with pytest.raises(OSError, match="on node n2"):
        c.remove("/w-put/sub", from_node="n2")  # not empty
    assert c.remove("/w-put/sub/deeper", from_node="n2") == ("n2",)


def test_fsspec_write_read_round_trip(cluster4: LocalCluster, tmp_path: Path) -> None:
    name = cluster4.spec.name
    fs = GmountFileSystem(cluster=name, node="n3")
    payload = os.urandom(3 * 1024 * 1024)
    with fsspec.open(f"gmount://{name}/w-fs/a/b.bin", "wb", node="n3") as f:
        f.write(payload[:1000])
        f.write(payload[1000:])
    assert holders(cluster4, "/w-fs/a/b.bin") == ["n3"]
    with fsspec.open(f"gmount://{name}/w-fs/a/b.bin", "rb") as f:
        assert f.read() == payload
    fs.pipe("/w-fs/piped.txt", b"piped\n")
    assert fs.cat("/w-fs/piped.txt") == b"piped\n"
    with pytest.raises(FileExistsError):
        fs.open("/w-fs/piped.txt", "xb")
    local = tmp_path / "up.txt"
    local.write_text("uploaded\n")
    fs.put(str(local), "/w-fs/up.txt")
    assert fs.cat("/w-fs/up.txt") == b"uploaded\n" and holders(cluster4, "/w-fs/up.txt") == ["n3"]
    fs.touch("/w-fs/empty")
    assert fs.info("/w-fs/empty")["size"] == 0
    fs.mkdir("/w-fs/dir")
    fs.makedirs("/w-fs/dir", exist_ok=True)
    assert fs.isdir("/w-fs/dir")
    fs.rm("/w-fs", recursive=True)
    assert not any((cluster4.export(n) / "w-fs").exists() for n in cluster4.nodes)


def test_a_remove_through_the_api_is_seen_by_every_node_at_once(cluster4: LocalCluster) -> None:
    """`remove` goes through the asking node's namespace, as an `rm` in its mount would: the
    directory's home hears of it before the call returns (not at the holder's next export scan),
    so no node lists or finds the file after it, and the emptied directory can go at once."""
    c = Cluster.open(cluster4.spec.name)
    for round_ in range(5):
        directory = f"/w-rm/r{round_}"
        c.write_bytes(f"{directory}/f.txt", b"x", from_node="n4")
        # (a put makes its parent directories in the holder's export: their homes hear of them at its next scan)
        assert wait_for(lambda d=directory: all(c.where(d, from_node=n)[0].holders for n in ("n1", "n2", "n3")))
        for node in ("n1", "n2", "n3"):  # each node learns the file (and may keep the directory's listing)
            assert [e.name for e in c.ls(directory, from_node=node).entries] == ["f.txt"]
        assert c.remove(f"{directory}/f.txt", from_node="n1") == ("n4",)
        for node in ("n1", "n2", "n3", "n4"):
            assert not c.where(f"{directory}/f.txt", from_node=node)[0].holders, node
            assert c.ls(directory, from_node=node).entries == (), node
        assert c.remove(directory, from_node="n2") == ("n4",)


def test_a_new_file_from_outside_the_mounts_lands_near_its_directory_s_data(cluster4: LocalCluster) -> None:
    """Not on the asking node (n1 here): on the node holding the new name's directory -- of several, the
    one holding the most bytes there -- or its nearest existing ancestor's; `on=` still decides."""
    name = cluster4.spec.name
    files = {("n3", "w-near/data/a.csv"): b"x" * 5000, ("n2", "w-near/shared/small.txt"): b"s",
             ("n4", "w-near/shared/big.bin"): b"b" * 20_000}
    for (node, rel), data in files.items():
        (cluster4.export(node) / rel).parent.mkdir(parents=True, exist_ok=True)
        (cluster4.export(node) / rel).write_bytes(data)
    cluster4.rescan()
    c = Cluster.open(name)
    assert c.home == "n1"
    assert c.write_bytes("/w-near/data/new.csv", b"new") == "n3"  # the only node holding the directory
    assert holders(cluster4, "/w-near/data/new.csv") == ["n3"]
    assert c.write_bytes("/w-near/data/deeper/still/out.bin", b"deep") == "n3"  # its nearest existing ancestor
    assert holders(cluster4, "/w-near/data/deeper/still/out.bin") == ["n3"]
    assert c.write_bytes("/w-near/shared/new.txt", b"z") == "n4"  # n2 is nearer, n4 holds more there
    assert c.write_bytes("/w-near/data/pinned.txt", b"p", on="n2") == "n2"  # told otherwise
    assert c.mkdir("/w-near/data/sub") == "n3" and (cluster4.export("n3") / "w-near/data/sub").is_dir()
    local = Path(cluster4.base) / "put-near.txt"
    local.write_bytes(b"put\n")
    assert c.put(local, "/w-near/shared/put.txt") == "n4"
    fs = GmountFileSystem(cluster=name)  # fsspec writes go through the same API
    fs.pipe("/w-near/data/piped.txt", b"piped")
    assert holders(cluster4, "/w-near/data/piped.txt") == ["n3"]
    with fsspec.open(f"gmount://{name}/w-near/shared/opened.txt", "wb") as f:
        f.write(b"opened")
    assert holders(cluster4, "/w-near/shared/opened.txt") == ["n4"]
    # a name below nothing but the namespace root: the asking node, as a create through its mount
    assert c.write_bytes(f"/w-near-{os.getpid()}/alone.txt", b"a", from_node="n2") == "n2"
