"""Synchronous calls that work in a plain script, inside Jupyter, and inside trio.

The library API is synchronous, but underneath it runs an event loop of its
own (trio for RPC, asyncio for asyncssh). Starting one in a thread that
already runs a loop is what breaks in a Jupyter kernel (its asyncio loop is
running while a cell executes: `asyncio.run` refuses, and `trio.run` would
take over the thread's signal wakeup fd behind the kernel's back). So when a
loop runs in the calling thread, the work runs in a short-lived worker
thread instead and the caller blocks until it is done -- which is what a
synchronous call means anyway. Elsewhere it runs in the calling thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import trio

T = TypeVar("T")


def loop_running_here() -> bool:
    """Whether this thread is inside a running asyncio loop or trio run."""
    if asyncio._get_running_loop() is not None:
        return True
    try:
        trio.lowlevel.current_trio_token()
    except RuntimeError:
        return False
    return True


def blocking(func: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """Call `func` (which may start its own event loop) and return its result."""
    if not loop_running_here():
        return func(*args, **kwargs)
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            outcome["value"] = func(*args, **kwargs)
        except BaseException as exc:  # handed to the caller's thread below
            outcome["error"] = exc

    worker = threading.Thread(target=work, name="gmountpy-call", daemon=True)
    worker.start()
    worker.join()
    if "error" in outcome:
        raise outcome["error"]
    value: T = outcome["value"]
    return value
