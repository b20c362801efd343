#!/usr/bin/env python3
"""The RPC transport alone: small round trip and 1 MiB replies, server in another process.

    python benchmarks/bench_rpc.py [--tls] [--seconds 3]

The server is a real `gmountpy.protocol.rpc.serve` in a child process on 127.0.0.1
answering `small` with a few bytes and `mib` with 1 MiB (one reused
`bytes`), so the numbers are what the wire, the framing and (without TLS)
the per-frame MAC cost, without any file system underneath.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import time
from typing import Any

import trio

from gmountpy._trio import open_nursery
from gmountpy.protocol import rpc
from gmountpy.protocol.tls import NodeCredentials, client_context, make_cluster_credentials, server_context

SECRET = b"b" * 32
MIB = b"\x5a" * (1 << 20)


def _server(port_queue: Any, credentials: dict[str, str] | None) -> None:
    async def dispatch(session: rpc.Session, op: str, args: list[Any]) -> Any:
        return MIB if op == "mib" else b"ok"

    async def main() -> None:
        context = server_context(NodeCredentials(**credentials)) if credentials else None
        async with open_nursery() as nursery:
            listeners = await nursery.start(lambda task_status: rpc.serve(
                "127.0.0.1", 0, dispatch, secret=SECRET, name="srv", ssl_context=context, task_status=task_status))
            port_queue.put(listeners[0].socket.getsockname()[1])

    trio.run(main)


async def _measure(port: int, ca: str | None, mine: NodeCredentials | None, seconds: float) -> dict[str, float]:
    results: dict[str, float] = {}
    async with open_nursery() as nursery:
        client = await rpc.connect(nursery, "127.0.0.1", port, secret=SECRET, name="bench", peer="srv",
                                   ssl_context=client_context(ca, mine) if ca else None)
        for _ in range(200):
            await client.call("small")
        samples = []
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            await client.call("small")
            samples.append(time.perf_counter() - start)
        results["small_rtt_us"] = statistics.median(samples) * 1e6
        for in_flight in (1, 4):
            done = 0
            deadline = time.perf_counter() + seconds
            start = time.perf_counter()

            async def worker(until: float) -> None:
                nonlocal done
                while time.perf_counter() < until:
                    await client.call("mib")
                    done += 1

            async with open_nursery() as workers:
                for _ in range(in_flight):
                    workers.start_soon(worker, deadline)
            results[f"mib_GBps_{in_flight}_in_flight"] = done * len(MIB) / (time.perf_counter() - start) / 1e9
        await client.aclose()
        nursery.cancel_scope.cancel()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tls", action="store_true", help="TLS instead of the per-frame MAC")
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    ca = credentials = mine = None
    if args.tls:  # mutual: the client presents a certificate of its own
        ca, creds = make_cluster_credentials("bench", ["srv", "bench"], SECRET)
        credentials, mine = creds["srv"].to_dict(), creds["bench"]
    queue: Any = multiprocessing.Queue()
    server = multiprocessing.Process(target=_server, args=(queue, credentials), daemon=True)
    server.start()
    try:
        port = queue.get(timeout=10)
        results = trio.run(_measure, port, ca, mine, args.seconds)
    finally:
        server.terminate()
        server.join(5)
    json.dump({"tls": args.tls, **{k: round(v, 3) for k, v in results.items()}}, sys.stdout)
    print()


if __name__ == "__main__":
    main()
