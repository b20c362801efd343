"""GlusterFS, the WAN benchmarks' distribute-volume peer, across a 2-site emulation.

GlusterFS is a benchmark peer, not a dependency of gmountpy: `nox -s bench` and
`nox -s tests` install it (Debian's glusterfs-server and -client). Like every other
capability these tests need (root, namespaces, FUSE), a missing one skips them on a
developer's machine and fails them under CI.
"""

from __future__ import annotations

import os
import subprocess
from itertools import pairwise
from pathlib import Path

import pytest

from benchmarks.wan import emulate
from benchmarks.wan import glusterfs as gluster

from ..conftest import fuse_problem, require
from .test_wan import assert_gone, base, cluster_file, host_snapshot, wan  # noqa: F401 (fixtures)


def _ours_running(markers: list[str]) -> list[str]:
    """Command lines of running processes that mention one of our paths."""
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if any(m in line for m in markers)]


def test_a_file_written_at_one_site_is_read_at_the_other_and_teardown_leaves_nothing(
        wan: None, base: Path) -> None:  # noqa: F811
    require("GlusterFS", gluster.problem())
    require("FUSE", fuse_problem())
    before = host_snapshot()
    payload = os.urandom(200_000)
    with emulate(cluster_file(base, 6.0, nodes_per_site=2), workdir=base) as emu:
        volume = gluster.GlusterFs(emu, base)
        with volume.running():
            daemons = {n: p.pid for n, p in volume.glusterd.items()}
            assert len(daemons) == 4 and len(volume.bricks) == 4, "a glusterd and a brick per node"
            for pid in [*daemons.values(), *volume.bricks]:
                netns = os.readlink(f"/proc/{pid}/ns/net")
                assert netns != os.readlink("/proc/self/ns/net"), f"process {pid} runs in the host namespace"
            # Several names, so that files land on bricks of both sites (the DHT hash decides).
            written = {}
            for i in range(12):
                path = volume.mount("e1") / f"from-east-{i}.bin"
                path.write_bytes(payload[i:])
                written[path.name] = volume.holder(path)
            assert {emu.site_of[n] for n in written.values()} == {"east", "west"}, written
            for name, holder in written.items():
                assert (volume.mount("w2") / name).read_bytes() == payload[int(name[10:-4]):]
                assert (volume.brick(holder) / name).exists(), f"{name} not on brick {holder}"
            far = next(name for name, holder in written.items() if emu.site_of[holder] == "west")
            (volume.mount("w1") / far).write_bytes(b"changed in the west")
            assert (volume.mount("e2") / far).read_bytes() == b"changed in the west"
            markers = [str(volume.dir)]
            brick_files = [a for argv in volume.bricks.values() for f, a in pairwise(argv) if f in ("-S", "-l")]
            assert len(brick_files) == 8
        assert _ours_running(markers) == []
        assert not volume.dir.exists()
        for leftover in brick_files:
            assert not Path(leftover).exists(), f"{leftover} left behind"
        with open("/proc/self/mounts") as f:
            assert str(base) not in f.read()
        pids = [*daemons.values(), *volume.bricks, emu.delay_pid]
    assert_gone(emu, before, pids)


def test_failure_while_running_still_removes_the_volume(wan: None, base: Path) -> None:  # noqa: F811
    require("GlusterFS", gluster.problem())
    require("FUSE", fuse_problem())
    with emulate(cluster_file(base, 2.0), workdir=base) as emu:
        volume = gluster.GlusterFs(emu, base)
        with pytest.raises(KeyboardInterrupt), volume.running():
            (volume.mount("e1") / "x").write_text("x")
            raise KeyboardInterrupt
        assert _ours_running([str(volume.dir)]) == []
        assert not volume.dir.exists()
        assert not any(os.path.ismount(volume.mount(n)) for n in volume.nodes)
