#!/usr/bin/env python3
"""What the typed messages cost per message, in microseconds, without any I/O.

    python benchmarks/bench_codec.py [--repeats 7]

For a few requests of the hot path -- a lookup and its attributes, a 1 MiB read
and write, a listing of 50,000 entries, an index lookup -- the time to make the
request's wire arguments, to decode them on the server (the step every request
takes before a handler runs), to encode the reply, and to decode it on the
asker. msgpack and the transport are not included (bench_rpc.py has them). Each
number is CPU time of this process (`time.process_time`), so other processes on a
shared machine change it less than they change wall time; the medians of
`--repeats` runs are printed as one JSON line. The 1 MiB rows also say whether the
payload was copied (`copied`: the decoded bytes are not the very object given).

Runs against older versions too (as bench_rpc.py): with PYTHONPATH at a tree
whose messages have no server-side decoding, that step is left out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import msgpack

from gmountpy.protocol import messages as msg
from gmountpy.protocol.attr import Attr

MIB = b"\x5a" * (1 << 20)
ATTR = Attr.from_stat(os.stat(__file__))


def _per_call_us(function: Callable[[], Any], repeats: int) -> float:
    """Median CPU microseconds per call, over `repeats` runs of about 50 ms each."""
    count = 1
    while True:  # calls in one run: enough for about 50 ms
        start = time.process_time()
        for _ in range(count):
            function()
        if time.process_time() - start > 0.05:
            break
        count *= 2
    runs = []
    for _ in range(repeats):
        start = time.process_time()
        for _ in range(count):
            function()
        runs.append((time.process_time() - start) / count * 1e6)
    return statistics.median(runs)


def _to_wire(request: msg.Request[Any]) -> list[Any]:
    encode = getattr(request, "to_wire", None) or request.args
    return list(encode())


def _as_received(request: msg.Request[Any], reply: Any) -> Any:
    """The reply as the asker gets it: in this version's wire form, through msgpack."""
    encode_reply = getattr(request, "encode_reply", None)
    value = encode_reply(reply) if encode_reply is not None else msg._to_wire(reply)  # type: ignore[attr-defined]
    return msgpack.unpackb(msgpack.packb(value, use_bin_type=True), raw=False)


def _case(request: msg.Request[Any], reply: Any, repeats: int) -> dict[str, Any]:
    wire_reply = _as_received(request, reply)
    row: dict[str, Any] = {"request": round(_per_call_us(lambda: _to_wire(request), repeats), 3)}
    args = _to_wire(request)
    from_wire = getattr(type(request), "from_wire", None)
    if from_wire is not None:
        row["server_decode"] = round(_per_call_us(lambda: from_wire(args), repeats), 3)
    encode_reply = getattr(request, "encode_reply", None)
    if encode_reply is not None:
        row["reply_encode"] = round(_per_call_us(lambda: encode_reply(reply), repeats), 3)
    row["reply_decode"] = round(_per_call_us(lambda: request.decode(wire_reply), repeats), 3)
    if isinstance(reply, bytes):
        row["copied"] = request.decode(wire_reply) is not wire_reply
    if isinstance(request, msg.Write) and from_wire is not None:
        row["copied"] = from_wire(args).data is not request.data
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    options = parser.parse_args()
    repeats = options.repeats
    listing = [msg.DirEntry(f"file-{i:05d}.dat", ATTR) for i in range(50_000)]
    holders = (msg.IndexHolder("n1", ATTR, None), msg.IndexHolder("n2", ATTR, "n1"))
    looked_up = msg.IndexLookupReply(holders, True, False, 5.0, None, 0.0, None, 12, None)
    results = {
        "lookup": _case(msg.Lookup("/data/run-17/sample.bam"), ATTR, repeats),
        "read_1mib": _case(msg.Read(7, 1 << 20, len(MIB)), MIB, repeats),
        "write_1mib": _case(msg.Write(7, 1 << 20, MIB), len(MIB), repeats),
        "listdir_50k": _case(msg.Listdir("/data/run-17"), listing, max(3, repeats // 2)),
        "index_lookup": _case(msg.IndexLookup("/data/run-17", "sample.bam", "n2"), looked_up, repeats),
    }
    json.dump({"python": sys.version.split()[0], "microseconds": results}, sys.stdout)
    print()


if __name__ == "__main__":
    main()
