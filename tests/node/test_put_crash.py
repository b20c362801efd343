"""A put's hidden temporary file: never shown while the put runs, and gone after a crash of its node.

The fault-injection soak found it: a put to n1 in flight when n1 was SIGKILLed left
soak/api/d4/.a00085.bin.gmount-put-1d9acfaf in n1's export, shown by `ls -a` on every node,
forever (node/service.py removed it on put_abort, put_close's failure and when the client's
connection closed -- none of which runs when the daemon itself is killed). node/puts.py keeps
a note of each put in progress, and a daemon starting up removes what its last run left.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import trio

from gmountpy import launch
from gmountpy.launch.orchestrate import pid_is_daemon
from gmountpy.protocol import messages as msg
from gmountpy.protocol.client import open_client, run_sync

from ..conftest import FOUR_NODE_LINKS, FOUR_NODES, fuse_problem, local_cluster, require, wait_for


def test_a_put_cut_short_by_a_crash_of_its_node_leaves_no_temporary_file(tmp_path: Path) -> None:
    require("FUSE", fuse_problem())
    with local_cluster(tmp_path, f"putcrash-{os.getpid()}", FOUR_NODES, FOUR_NODE_LINKS) as cluster:
        async def start_a_put() -> None:
            async with open_client(cluster.state) as client:
                handle = await client.ask("n2", msg.PutOpen("/data/big.bin", 0o644))
                await client.ask("n2", msg.Write(handle, 0, b"x" * 100_000))
                for node in cluster.nodes:  # a put in progress is nobody's file yet: no mount shows it
                    assert await trio.to_thread.run_sync(os.listdir, cluster.mount(node) / "data") == [], node
                os.kill(cluster.state.nodes["n2"].pid, signal.SIGKILL)  # the node dies mid-put

        run_sync(start_a_put)
        leftovers = sorted(p.name for p in (cluster.export("n2") / "data").iterdir())
        assert leftovers and all(".gmount-put-" in name for name in leftovers)  # what the crash left
        assert wait_for(lambda: not pid_is_daemon(cluster.state.nodes["n2"].pid), timeout=10)  # (it takes a moment)
        launch.up(cluster.spec)  # restarts n2
        assert wait_for(lambda: not list((cluster.export("n2") / "data").iterdir()), timeout=10), \
            sorted(p.name for p in (cluster.export("n2") / "data").iterdir())
        for node in cluster.nodes:
            assert os.listdir(cluster.mount(node) / "data") == [], node
