"""Run `async def` tests under trio without a pytest plugin, with a deadline so a hang fails fast."""

from __future__ import annotations

import functools
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
) -> Any:
    """Decorate an async test: it runs in a fresh trio.run and fails if it takes over `timeout` s.

    With `mock_clock`, the run uses trio's MockClock at real speed, so a test can
    expire caches at once with `trio.lowlevel.current_clock().jump(seconds)`
    while sockets and timeouts keep behaving normally.
    """

    def decorate(test: Callable[P, Awaitable[None]]) -> Callable[P, None]:
        @functools.wraps(test)
        def run(*args: P.args, **kwargs: P.kwargs) -> None:
            async def main() -> None:
                with trio.fail_after(timeout):
                    await test(*args, **kwargs)

            trio.run(main, clock=trio.testing.MockClock(rate=1.0) if mock_clock else None)

        return run

    if fn is not None:
        return decorate(fn)
    return decorate


def jump(seconds: float) -> None:
    """Advance the MockClock of the current run (see `trio_test(mock_clock=True)`)."""
    clock = trio.lowlevel.current_clock()
    assert isinstance(clock, trio.testing.MockClock), "use @trio_test(mock_clock=True)"
    clock.jump(seconds)
