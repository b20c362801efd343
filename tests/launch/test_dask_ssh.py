"""Dask over a real OpenSSH sshd: the scheduler on the first node, a worker per node in its mount, reading
`gmount://` through it with the cluster shipped to the node; `gmount down` stops them there."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from gmountpy import Cluster, launch
from gmountpy.cluster.config import load_spec
from gmountpy.launch import dask as dask_launch

from .conftest import Sshd, marked_pids
from .test_ssh import assert_nothing_left, cleanup

pytest.importorskip("distributed")


def test_dask_over_ssh_runs_workers_in_the_mounts_and_down_stops_them(sshd: Sshd, tmp_path: Path) -> None:
    spec = load_spec(sshd.cluster_file(tmp_path, "sshdask", {"s": ["n1", "n2"]}, [], distinct_addresses=True))
    with cleanup(sshd, spec):
        launch.up(spec)
        cluster = Cluster.open("sshdask")
        (tmp_path / "n2" / "export" / "data").mkdir(parents=True)
        (tmp_path / "n2" / "export" / "data" / "x.csv").write_text("a,b\n" + "".join(f"{i},{i}\n" for i in range(50)))
        cluster.rescan()
        client = cluster.dask()
        try:
            record = dask_launch.load("sshdask")
            assert record is not None
            assert record.scheduler.node == "n1" and record.scheduler.ssh is not None
            assert record.address.startswith("tls://127.0.1.1:")  # the first node's own address
            assert {w.ssh for w in record.workers.values()} == {f"{sshd.user}@127.0.1.1 port {sshd.port}",
                                                                f"{sshd.user}@127.0.1.2 port {sshd.port}"}
            started_by_sshd = set(marked_pids(sshd.marker))
            assert {record.scheduler.pid, *(w.pid for w in record.workers.values())} <= started_by_sshd

            def whoami(dask_worker: Any) -> tuple[str, str, str, str]:
                return (dask_worker.name, os.environ["GMOUNT_NODE"], os.getcwd(), os.environ["XDG_STATE_HOME"])

            seen = sorted(client.run(whoami).values())
            assert [s[:3] for s in seen] == [("n1", "n1", str(tmp_path / "n1" / "mnt")),
                                             ("n2", "n2", str(tmp_path / "n2" / "mnt"))]
            assert all(s[3] != os.environ["XDG_STATE_HOME"] for s in seen)  # the cluster was shipped, privately

            def rows(url: str) -> tuple[str, int]:
                import pandas as pd
                return os.environ["GMOUNT_NODE"], len(pd.read_csv(url))

            before = cluster.counters()
            assert client.submit(rows, "gmount://sshdask/data/x.csv", pure=False).result() == ("n2", 50)
            after = cluster.counters()
            assert sum(after[n]["read_remote"] - before[n]["read_remote"] for n in after) == 0
            assert after["n2"]["read_local"] > before["n2"]["read_local"]
        finally:
            client.close()
        pids = [record.scheduler.pid, *(w.pid for w in record.workers.values())]
        assert launch.down("sshdask") == {}
        deadline = time.monotonic() + 10
        while set(pids) & set(marked_pids(sshd.marker)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not set(pids) & set(marked_pids(sshd.marker))
        assert dask_launch.load("sshdask") is None
        assert_nothing_left(sshd, tmp_path)
