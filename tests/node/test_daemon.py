"""The daemon reports its own stalls: a blocked event loop writes every thread's traceback to the log."""

from __future__ import annotations

import time
from pathlib import Path

import trio

from gmountpy._trio import open_nursery
from gmountpy.node import daemon

from .._trio import trio_test


def block_the_loop_here(seconds: float) -> None:
    time.sleep(seconds)  # a synchronous call on the event loop: nothing else runs meanwhile


@trio_test
async def test_a_blocked_event_loop_leaves_its_traceback_in_the_log(tmp_path: Path) -> None:
    log = tmp_path / "node.log"
    with open(log, "a", buffering=1) as stream:
        async with open_nursery() as nursery:
            nursery.start_soon(daemon._report_stalls, stream, 0.3)
            await trio.sleep(0.7)  # re-armed while the loop runs: nothing is written
            assert log.read_text() == ""
            block_the_loop_here(1.0)
            nursery.cancel_scope.cancel()
    text = log.read_text()
    assert "Timeout (0:00:00.300000)!" in text
    assert "block_the_loop_here" in text and "test_daemon.py" in text


@trio_test
async def test_a_stalled_event_loop_gets_one_request_to_wake_the_fuse_reader(tmp_path: Path) -> None:
    """pyfuse3's blocking read of /dev/fuse can outlive the request that woke it (withdrawn by a
    killed process): the nudge thread then makes one request on the mount -- only while the loop
    does not run, one at a time."""
    pokes: list[str] = []
    nudge = daemon._FuseReaderNudge(str(tmp_path), after=0.3, poke=pokes.append)
    async with open_nursery() as nursery:
        nursery.start_soon(nudge.keep_beating)
        nudge.start()
        await trio.sleep(0.8)  # the loop runs: nobody is poked
        assert pokes == []
        block_the_loop_here(1.0)
        assert pokes and pokes[0] == str(tmp_path) and len(pokes) <= 1.0 / 0.15 + 1
        await trio.sleep(0.1)  # the loop beats again
        poked = len(pokes)
        await trio.sleep(0.8)  # running: no more
        assert len(pokes) == poked
        nudge.stop()
        nursery.cancel_scope.cancel()
