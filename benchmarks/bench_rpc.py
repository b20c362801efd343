#!/usr/bin/env python3
"""The RPC transport alone, and a node's service over it: small round trips and 1 MiB replies,
server in another process.

    python benchmarks/bench_rpc.py [--tls] [--seconds 3]

The server is a real `gmountpy.protocol.rpc.serve` in a child process on 127.0.0.1
answering `small` with a few bytes and `mib` with 1 MiB (one reused
`bytes`), so those rows are what the wire, the framing and (without TLS)
the per-frame MAC cost, without any file system underneath. A second server
is a real NodeService on a temporary export: `lookup` of a file and 1 MiB
`read`s of it through a handle, asked with the typed messages as a node asks
(`lookup_rtt_us`, `read_GBps_*`): the transport's rows plus what decoding and
encoding the messages, and the service itself, add.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from gmountpy._trio import open_nursery
from gmountpy.node.export import Export
from gmountpy.node.service import NodeService
from gmountpy.protocol import messages as msg
from gmountpy.protocol import rpc
from gmountpy.protocol.tls import NodeCredentials, client_context, make_cluster_credentials, server_context

SECRET = b"b" * 32
MIB = b"\x5a" * (1 << 20)


def _server(port_queue: Any, credentials: dict[str, str] | None) -> None:
    async def dispatch(session: rpc.Session, op: str, args: list[Any]) -> Any:
        return MIB if op == "mib" else b"ok"

    async def main(root: str) -> None:
        context = server_context(NodeCredentials(**credentials)) if credentials else None
        with open(os.path.join(root, "f"), "wb") as f:
            f.write(MIB)
        service = NodeService(Export(root), {"node": "srv"})
        async with open_nursery() as nursery:
            for serve in (dispatch, service.dispatch):
                listeners = await nursery.start(lambda task_status, serve=serve: rpc.serve(
                    "127.0.0.1", 0, serve, secret=SECRET, name="srv", ssl_context=context, task_status=task_status))
                port_queue.put(listeners[0].socket.getsockname()[1])

    with tempfile.TemporaryDirectory() as root:
        trio.run(main, root)


def _arguments(request: msg.Request[Any]) -> list[Any]:
    """The request's wire arguments (`args()` before the messages were derived from annotations:
    this script also runs against older versions, see benchmarks/README.md)."""
    encode = getattr(request, "to_wire", None) or request.args
    return list(encode())


async def _ask(client: rpc.RpcClient, request: msg.Request[Any]) -> Any:
    return request.decode(await client.call(request.op, *_arguments(request)))


async def _median_rtt_us(call: Callable[[], Awaitable[Any]], seconds: float) -> float:
    for _ in range(200):  # warm up
        await call()
    samples = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e6


async def _mib_GBps(call: Callable[[], Awaitable[Any]], in_flight: int, seconds: float) -> float:
    """GB/s of `call`s that each answer 1 MiB, with `in_flight` of them at once."""
    done = 0
    deadline = time.perf_counter() + seconds
    start = time.perf_counter()

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            assert len(await call()) == len(MIB)
            done += 1

    async with open_nursery() as workers:
        for _ in range(in_flight):
            workers.start_soon(worker)
    return done * len(MIB) / (time.perf_counter() - start) / 1e9


async def _measure(port: int, ca: str | None, mine: NodeCredentials | None, seconds: float,
                   service: bool) -> dict[str, float]:
    """The transport alone (`small`, `mib`), or a NodeService asked as a node asks: `lookup` and 1 MiB
    `read`s, typed requests and replies (`service`)."""
    results: dict[str, float] = {}
    async with open_nursery() as nursery:
        client = await rpc.connect(nursery, "127.0.0.1", port, secret=SECRET, name="bench", peer="srv",
                                   ssl_context=client_context(ca, mine) if ca else None)
        if service:
            lookup = msg.Lookup("/f")
            results["lookup_rtt_us"] = await _median_rtt_us(lambda: _ask(client, lookup), seconds)
            read = msg.Read((await _ask(client, msg.Open("/f", os.O_RDONLY))).handle, 0, len(MIB))
            for in_flight in (1, 4):
                results[f"read_GBps_{in_flight}_in_flight"] = await _mib_GBps(lambda: _ask(client, read), in_flight,
                                                                              seconds)
        else:
            results["small_rtt_us"] = await _median_rtt_us(lambda: client.call("small"), seconds)
            for in_flight in (1, 4):
                results[f"mib_GBps_{in_flight}_in_flight"] = await _mib_GBps(lambda: client.call("mib"), in_flight,
                                                                             seconds)
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
        port, service_port = queue.get(timeout=10), queue.get(timeout=10)
        results = trio.run(_measure, port, ca, mine, args.seconds, False)
        results.update(trio.run(_measure, service_port, ca, mine, args.seconds, True))
    finally:
        server.terminate()
        server.join(5)
    json.dump({"tls": args.tls, **{k: round(v, 3) for k, v in results.items()}}, sys.stdout)
    print()


if __name__ == "__main__":
    main()
