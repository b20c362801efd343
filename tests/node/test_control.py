"""The node-wide operations (gmountpy.node.control), served by the service as the daemon wires them."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from gmountpy.node.control import NodeControl
from gmountpy.protocol import messages as msg
from gmountpy.protocol import rpc

from .._trio import trio_test
from .harness import Cluster, open_cluster


def wire_control(cluster: Cluster, name: str) -> NodeControl:
    """A NodeControl for one harness node, its operations added to that node's service (as daemon.py does)."""
    node = cluster[name]
    control = NodeControl(name, cluster.spec, cluster.overlay, service=node.service, pool=node.pool,
                          locator=node.locator, index=node.index, namespace=node.namespace,
                          limits=rpc.RequestLimits(node=name))
    node.service.add_operations(control.operations())
    return control


@trio_test
async def test_where_and_ls_are_served_by_the_service_from_the_nodes_view(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        wire_control(cluster, "n2")
        cluster["n3"].put("d/far.txt", b"far")
        cluster["n1"].put("d/near.txt", b"near!")
        cluster["n4"].put("d/near.txt", b"near!")
        pool = cluster["n1"].pool  # asked over the network, as a client would
        holders = await pool.ask("n2", msg.Where("/d/near.txt"))
        assert [h["node"] for h in holders] == ["n1", "n4"]  # same site first
        assert holders[0]["export_path"] == str(cluster["n1"].path("d/near.txt"))
        assert holders[0]["rtt_ms"] < holders[1]["rtt_ms"]
        listing = await pool.ask("n2", msg.Ls("/d"))
        assert {(e.name, e.node) for e in listing.entries} == {("far.txt", "n3"), ("near.txt", "n1")}


@trio_test
async def test_stats_shutdown_and_renew_tls_without_tls(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        control = wire_control(cluster, "n1")
        stats = await cluster["n2"].pool.call("n1", "stats")
        assert stats["node"] == "n1" and stats["peer_handles"] == 0 and "inodes" not in stats  # nothing mounted
        with pytest.raises(OSError, match="node n1 does not use TLS") as info:
            await cluster["n2"].pool.call("n1", "renew_tls", "cert", "key")
        assert info.value.errno == errno.EINVAL
        assert not control.shutdown.is_set()
        await cluster["n2"].pool.call("n1", "shutdown")
        assert control.shutdown.is_set()


@trio_test
async def test_set_peers_installs_addresses_and_forgets_cached_misses(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        wire_control(cluster, "n1")
        locator = cluster["n1"].locator
        assert await locator.find("/late.txt") is None  # a cached miss (the harness's TTLs are long)
        cluster["n4"].put("late.txt", b"x")
        assert await locator.find("/late.txt") is None
        table = {name: [a.host, a.port] for name, a in cluster.addresses().items()}
        await cluster["n2"].pool.call("n1", "set_peers", table)
        found = await locator.find("/late.txt")
        assert found is not None and found.node == "n4"
