"""Run `async def` tests under trio without a pytest plugin, with a deadline so a hang fails fast.

Clocks for tests of TTLs, leases and timeouts (trio.testing.MockClock):

- ``@trio_test(autojump=True)``: ``MockClock(autojump_threshold=0)`` for the whole run. Whenever
  every task waits, the clock jumps to the next deadline, so ``await trio.sleep(ttl)`` takes no
  real time and lands exactly on the TTL. Only for code that does no real I/O: trio cannot tell a
  task waiting for a socket or a worker thread from one waiting for the clock, and jumps then too,
  firing a timeout early (measured on the four-node harness: a remote write, served in a worker
  thread, timed out in 5 of 10 runs).
- ``@trio_test(frozen_clock=True)``: for the harness (real sockets, worker threads). The clock stands
  still, so no timeout fires while a request is on its way; ``await elapse(seconds)`` lets exactly
  that much time pass by switching autojump on while the test sleeps (nothing else in flight).

Both have a real-time watchdog (`timeout`), since a deadline on a mock clock would be jumped to.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec

import trio
import trio.testing

P = ParamSpec("P")


def trio_test(
    fn: Callable[P, Awaitable[None]] | None = None,
    *,
    timeout: float = 15.0,
    mock_clock: bool = False,
    autojump: bool = False,
    frozen_clock: bool = False,
) -> Any:
    """Decorate an async test: it runs in a fresh trio.run and fails if it takes over `timeout` s.

    With `mock_clock`, the run uses trio's MockClock at real speed, so a test can
    expire caches at once with `trio.lowlevel.current_clock().jump(seconds)`
    while sockets and timeouts keep behaving normally. `autojump` and
    `frozen_clock`: see the module docstring.
    """
    if sum((mock_clock, autojump, frozen_clock)) > 1:
        raise ValueError("choose one of `mock_clock`, `autojump` and `frozen_clock`")

    def decorate(test: Callable[P, Awaitable[None]]) -> Callable[P, None]:
        @functools.wraps(test)
        def run(*args: P.args, **kwargs: P.kwargs) -> None:
            if autojump or frozen_clock:
                clock = trio.testing.MockClock(autojump_threshold=0 if autojump else math.inf)
                trio.run(_with_watchdog, functools.partial(test, *args, **kwargs), timeout, clock=clock)
                return

            async def main() -> None:
                with trio.fail_after(timeout):
                    await test(*args, **kwargs)

            trio.run(main, clock=trio.testing.MockClock(rate=1.0) if mock_clock else None)

        return run

    if fn is not None:
        return decorate(fn)
    return decorate


async def _with_watchdog(test: Callable[[], Awaitable[None]], timeout: float) -> None:
    """Run `test`, cancelled after `timeout` seconds of real time (the run's clock may be a mock)."""
    token = trio.lowlevel.current_trio_token()
    with trio.CancelScope() as scope:
        def expire() -> None:
            try:
                token.run_sync_soon(scope.cancel)
            except trio.RunFinishedError:
                pass

        watchdog = threading.Timer(timeout, expire)
        watchdog.start()
        try:
            await test()
        finally:
            watchdog.cancel()
    if scope.cancelled_caught:
        raise AssertionError(f"the test did not finish within {timeout:g} s of real time")


def jump(seconds: float) -> None:
    """Advance the MockClock of the current run (see `trio_test(mock_clock=True)`)."""
    clock = trio.lowlevel.current_clock()
    assert isinstance(clock, trio.testing.MockClock), "use @trio_test(mock_clock=True)"
    clock.jump(seconds)


async def elapse(seconds: float) -> None:
    """Let exactly `seconds` pass on the run's MockClock, at once; tasks due meanwhile run in order.

    Under `trio_test(frozen_clock=True)` the clock autojumps only during this wait, after
    every task has settled, so no request still on its way can be timed out by the jump.
    """
    await elapse_until(trio.current_time() + seconds)


async def elapse_until(when: float) -> None:
    """`elapse` to an absolute time on the run's clock (e.g. the moment a cache entry expires)."""
    clock = trio.lowlevel.current_clock()
    assert isinstance(clock, trio.testing.MockClock), "use @trio_test(autojump=True) or (frozen_clock=True)"
    if clock.autojump_threshold == 0:
        await trio.sleep_until(when)
        return
    await trio.testing.wait_all_tasks_blocked()
    clock.autojump_threshold = 0
    try:
        await trio.sleep_until(when)
    finally:
        clock.autojump_threshold = math.inf
