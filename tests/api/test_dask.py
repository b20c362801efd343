"""Dask on gmount with real dask.distributed workers on a real 4-node local cluster (real FUSE mounts).

One cluster and one Dask cluster serve the tests of this module (each reads
files of its own, so page caches and counters of one test do not touch
another's); the test that kills a worker runs last and restores it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from gmountpy import Cluster, launch
from gmountpy.api.dask import placements, set_placement
from gmountpy.cluster import state as cluster_state
from gmountpy.launch import dask as dask_launch
from gmountpy.launch.orchestrate import pid_is_daemon

from ..conftest import FOUR_NODE_LINKS, FOUR_NODES, LocalCluster, fuse_problem, local_cluster, require, wait_for

distributed = pytest.importorskip("distributed")
dd = pytest.importorskip("dask.dataframe")

NODES = ["n1", "n2", "n3", "n4"]


def write_frames(lc: LocalCluster, directory: str, holders: list[str], rows: int = 200,
                 kinds: tuple[str, ...] = ("csv",)) -> dict[str, str]:
    """One small frame per entry of `holders`, written into that node's export; path -> holder."""
    written = {}
    for i, node in enumerate(holders):
        frame = pd.DataFrame({"station": [(i + j) % 7 for j in range(rows)],
                              "temperature": [round(0.5 * i + 0.25 * j, 2) for j in range(rows)]})
        for kind in kinds:
            target = lc.export(node) / directory / f"part-{i:02d}.{kind}"
            target.parent.mkdir(parents=True, exist_ok=True)
            frame.to_csv(target, index=False) if kind == "csv" else frame.to_parquet(target, index=False)
            written[f"/{directory}/{target.name}"] = node
    lc.rescan()
    return written


def remote_and_local(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]) -> dict[str, int]:
    return {key: sum(after[n][key] - before[n].get(key, 0) for n in after) for key in ("read_remote", "read_local")}


def reader() -> Callable[..., tuple[str, int]]:
    """A task: its node and the rows of `url`, read through fsspec (a worker reads through its mount).

    Made inside a function so that it is sent by value: the workers cannot import this test module.
    """
    def read_here(url: str, pause: float = 0.0) -> tuple[str, int]:
        frame = pd.read_csv(url)
        time.sleep(pause)
        return os.environ["GMOUNT_NODE"], len(frame)

    return read_here


@pytest.fixture(scope="module")
def on_dask(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, Cluster, Any]]:
    require("FUSE", fuse_problem())
    base = tmp_path_factory.mktemp("dask4")
    with local_cluster(base, f"dk-{os.getpid()}", FOUR_NODES, FOUR_NODE_LINKS) as lc:
        cluster = Cluster.open(lc.spec.name)
        client = cluster.dask()
        try:
            yield lc, cluster, client
        finally:
            client.close()
    # `local_cluster` ends with `gmount down`: it stopped the Dask processes too
    assert dask_launch.load(lc.spec.name) is None


def test_one_worker_per_node_runs_in_its_mount(on_dask: tuple[LocalCluster, Cluster, Any]) -> None:
    lc, cluster, client = on_dask

    def whoami(dask_worker: Any) -> tuple[str, str, str, str]:
        return (dask_worker.name, os.environ["GMOUNT_NODE"], os.environ["GMOUNT_CLUSTER"], os.getcwd())

    seen = sorted(client.run(whoami).values())
    assert seen == [(n, n, cluster.name, str(lc.mount(n))) for n in NODES]
    record = dask_launch.load(cluster.name)
    assert record is not None and record.placement and sorted(record.workers) == NODES
    assert record.address.startswith("tls://")
    # mutual TLS: a client with another key is refused
    stranger = dask_launch._security(*dask_launch._new_credentials("stranger"))
    with pytest.raises((OSError, TimeoutError)):
        distributed.Client(record.address, security=stranger, timeout=3, set_as_default=False)


def test_submitted_tasks_run_on_the_node_holding_their_input(on_dask: tuple[LocalCluster, Cluster, Any]) -> None:
    lc, cluster, client = on_dask
    read_here = reader()
    holders = ["n3", "n1", "n4", "n2", "n2", "n3"]
    written = write_frames(lc, "submit", holders)
    before = cluster.counters()
    urls = [f"gmount://{cluster.name}{path}" for path in written]
    results = client.gather(client.map(read_here, urls, pure=False))
    assert [node for node, _ in results] == holders
    assert all(rows == 200 for _, rows in results)
    moved = remote_and_local(before, cluster.counters())
    assert moved["read_remote"] == 0, moved
    sizes = sum((lc.export(node) / path.lstrip("/")).stat().st_size for path, node in written.items())
    assert moved["read_local"] >= sizes, moved
    # a task the client pins itself is left where the client put it: read remotely
    before = cluster.counters()
    far = next(url for url, node in zip(urls, holders, strict=True) if node == "n3")
    assert client.submit(read_here, far, workers=["n1"], pure=False).result()[0] == "n1"
    assert remote_and_local(before, cluster.counters())["read_remote"] > 0


def test_dataframe_partitions_run_on_their_holders(on_dask: tuple[LocalCluster, Cluster, Any]) -> None:
    lc, cluster, client = on_dask
    holders = ["n1", "n2", "n3", "n4", "n4", "n3", "n2", "n1"]
    written = write_frames(lc, "frames", holders, kinds=("csv", "parquet"))
    truth = pd.concat(pd.read_csv(lc.export(node) / path.lstrip("/")) for path, node in written.items()
                      if path.endswith(".csv")).groupby("station")["temperature"].sum()
    for kind in ("csv", "parquet"):
        before = cluster.counters()
        url = f"gmount://{cluster.name}/frames/*.{kind}"
        frame = (dd.read_csv(url) if kind == "csv" else dd.read_parquet(url)).persist()
        distributed.wait(frame)
        # the scheduler placed one read per file, on every node holding files
        placed = [node for key, node in placements(client).items() if "read" in key]
        assert len(placed) == len(holders) and set(placed) == set(NODES), placements(client)
        result = frame.groupby("station")["temperature"].sum().compute()
        pd.testing.assert_series_equal(result.sort_index(), truth, check_names=False)
        moved = remote_and_local(before, cluster.counters())
        assert moved["read_remote"] == 0, (kind, moved)
        assert moved["read_local"] > 0, (kind, moved)
        del frame


def test_an_overloaded_node_shares_its_tasks(on_dask: tuple[LocalCluster, Cluster, Any]) -> None:
    lc, cluster, client = on_dask
    read_here = reader()
    written = write_frames(lc, "crowded", ["n1"] * 12)
    before = cluster.counters()
    urls = [f"gmount://{cluster.name}{path}" for path in written]
    results = client.gather(client.map(read_here, urls, pause=0.6, pure=False))
    ran_on = [node for node, _ in results]
    assert all(rows == 200 for _, rows in results)
    # n1 (2 threads) holds all 12: its backlog is far over twice its threads, so idle workers take some,
    # reading remotely; most stay on n1
    assert set(ran_on) - {"n1"}, ran_on
    assert ran_on.count("n1") >= 4, ran_on
    assert remote_and_local(before, cluster.counters())["read_remote"] > 0


def test_stealing_leaves_evenly_spread_tasks_on_a_slow_node(on_dask: tuple[LocalCluster, Cluster, Any]) -> None:
    lc, cluster, client = on_dask
    read_here = reader()
    holders = NODES * 6
    written = write_frames(lc, "even", holders)
    urls = [f"gmount://{cluster.name}{path}" for path in written]
    # every node holds its share, but n2's tasks are slow: the others run idle while n2 still has a queue
    # of more than twice its threads. Dask's own stealing would move some of n2's tasks (a task without
    # dependencies looks free to move); n2 got no more than its share, so it is not overloaded: they stay
    pauses = [1.0 if node == "n2" else 0.05 for node in holders]
    ran_on = [node for node, _ in client.gather(client.map(read_here, urls, pauses, pure=False))]
    assert ran_on == holders


def test_placement_off_is_dasks_own_choice(on_dask: tuple[LocalCluster, Cluster, Any]) -> None:
    lc, cluster, client = on_dask
    read_here = reader()
    holders = ["n4"] * 8
    written = write_frames(lc, "unplaced", holders)
    set_placement(client, False)
    try:
        urls = [f"gmount://{cluster.name}{path}" for path in written]
        ran_on = [node for node, _ in client.gather(client.map(read_here, urls, pause=0.3, pure=False))]
    finally:
        set_placement(client, True)
    assert set(ran_on) != {"n4"}, ran_on  # Dask spreads them without regard to where the bytes are


def test_a_dead_workers_tasks_are_retried_elsewhere_reading_remotely(
        on_dask: tuple[LocalCluster, Cluster, Any]) -> None:
    lc, cluster, client = on_dask
    read_here = reader()
    written = write_frames(lc, "orphans", ["n3"] * 6)
    record = dask_launch.load(cluster.name)
    assert record is not None
    victim = record.workers["n3"]
    before = cluster.counters()
    urls = [f"gmount://{cluster.name}{path}" for path in written]
    futures = client.map(read_here, urls, pause=1.0, pure=False)
    assert wait_for(lambda: any(client.processing().get(victim.address, ())), timeout=20)
    os.kill(victim.pid, signal.SIGKILL)  # the worker dies; n3's daemon and its files stay
    results = client.gather(futures)
    assert all(rows == 200 for _, rows in results)
    ran_on = [node for node, _ in results]
    assert ran_on.count("n3") <= 2, ran_on  # at most what its 2 threads finished before it died: the rest
    # (its queue, and what it was running) went to the other workers
    assert remote_and_local(before, cluster.counters())["read_remote"] > 0
    # `Cluster.dask()` again starts the missing worker; the others keep running
    again = cluster.dask()
    try:
        names = sorted(w["name"] for w in again.scheduler_info(n_workers=-1)["workers"].values())
        assert names == NODES
        renewed = dask_launch.load(cluster.name)
        assert renewed is not None and renewed.workers["n3"].pid != victim.pid
        assert renewed.workers["n1"].pid == record.workers["n1"].pid
        assert again.submit(read_here, urls[0], pure=False).result()[0] == "n3"
    finally:
        again.close()


def test_a_restarted_nodes_worker_is_replaced_by_dask_up(on_dask: tuple[LocalCluster, Cluster, Any]) -> None:
    """A node's daemon dies and `gmount up` restarts it: its worker still runs, in the dead mount it
    started in; `Cluster.dask()` starts that worker again, so tasks on the node read its files."""
    lc, cluster, client = on_dask
    read_here = reader()
    written = write_frames(lc, "restarted", ["n2"] * 2)
    urls = [f"gmount://{cluster.name}{path}" for path in written]
    record = dask_launch.load(cluster.name)
    assert record is not None
    daemon = cluster_state.load(cluster.name).nodes["n2"].pid
    os.kill(daemon, signal.SIGKILL)
    assert wait_for(lambda: not pid_is_daemon(daemon), timeout=10)
    launch.up(lc.spec)  # restarts n2; its worker, untouched, kept the old mount as working directory
    assert cluster_state.load(cluster.name).nodes["n2"].pid != daemon
    assert dask_launch._start_time(record.workers["n2"].pid) == record.workers["n2"].start
    again = cluster.dask()
    try:
        renewed = dask_launch.load(cluster.name)
        assert renewed is not None
        assert renewed.workers["n2"].pid != record.workers["n2"].pid
        assert dask_launch._start_time(record.workers["n2"].pid) is None  # the stale worker was stopped
        assert renewed.workers["n1"].pid == record.workers["n1"].pid   # the others kept running
        results = [again.submit(read_here, url, workers=["n2"], pure=False).result(timeout=60) for url in urls]
        assert results == [("n2", 200)] * 2
    finally:
        again.close()


# distributed's TLS connector can leave a socket to the SIGKILLed scheduler unclosed (its
# ResourceWarning, raised at garbage collection); that is the library's, not gmountpy's
@pytest.mark.filterwarnings("ignore:Exception ignored in. <ssl.SSLSocket:pytest.PytestUnraisableExceptionWarning")
def test_cli_up_and_down_and_gmount_down_stops_dask(tmp_path: Path) -> None:
    require("FUSE", fuse_problem())
    with local_cluster(tmp_path, f"dkcli-{os.getpid()}", {"s": ["a", "b"]}, []) as lc:
        name = lc.spec.name
        gmount = [sys.executable, "-m", "gmountpy"]
        up = subprocess.run([*gmount, "dask", "up", name], capture_output=True, text=True, timeout=120)
        assert up.returncode == 0, up.stderr
        assert "2 workers" in up.stdout and f"gmountpy.Cluster.open({name!r}).dask()" in up.stdout
        record = dask_launch.load(name)
        assert record is not None
        pids = [record.scheduler.pid, *(w.pid for w in record.workers.values())]
        assert all(dask_launch._start_time(pid) is not None for pid in pids)
        down = subprocess.run([*gmount, "dask", "down", name], capture_output=True, text=True, timeout=120)
        assert down.returncode == 0, down.stderr
        assert all(dask_launch._start_time(pid) is None for pid in pids)
        assert dask_launch.load(name) is None
        assert all(n.up for n in Cluster.open(name).status().nodes)  # the cluster itself stays up
        client = Cluster.open(name).dask(threads=1)
        client.close()
        crashed = dask_launch.load(name)
        assert crashed is not None
        # a scheduler that died: the next `dask()` clears what is left of it and starts afresh
        os.kill(crashed.scheduler.pid, signal.SIGKILL)
        client = Cluster.open(name).dask(threads=1)
        assert client.submit(lambda: os.environ["GMOUNT_NODE"], workers=["b"]).result() == "b"
        client.close()
        record = dask_launch.load(name)
        assert record is not None and record.scheduler.pid != crashed.scheduler.pid
        assert all(dask_launch._start_time(w.pid) is None for w in crashed.workers.values())
        pids = [record.scheduler.pid, *(w.pid for w in record.workers.values())]
        assert launch.down(name) == {}  # `gmount down`: Dask first, then the daemons
        assert all(dask_launch._start_time(pid) is None for pid in pids)
        assert dask_launch.load(name) is None
