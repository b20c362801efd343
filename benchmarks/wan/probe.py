"""Measure an emulated path from inside the sites: TCP ping-pong RTT and bulk TCP throughput.

    python -m benchmarks.wan.probe serve HOST PORT            (in one site; one client, then exits)
    python -m benchmarks.wan.probe rtt HOST PORT COUNT         -> JSON {"rtt_ms": [...]}
    python -m benchmarks.wan.probe bulk HOST PORT SECONDS      -> JSON {"bytes": .., "seconds": ..}

Plain sockets, TCP_NODELAY, one byte each way for the ping-pong; no ICMP tools needed.
"""

from __future__ import annotations

import json
import socket
import sys
import time

CHUNK = 1 << 20


def serve(host: str, port: int) -> None:
    """Echo single bytes (ping-pong) or swallow a bulk stream, for one client."""
    with socket.create_server((host, port)) as server:
        print("LISTENING", flush=True)
        conn, _ = server.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            kind = conn.recv(1)
            if kind == b"p":
                while data := conn.recv(1):
                    conn.sendall(data)
            else:
                buf = bytearray(CHUNK)
                total = 0
                while n := conn.recv_into(buf):
                    total += n
                conn.sendall(str(total).encode())


def rtt(host: str, port: int, count: int) -> list[float]:
    with socket.create_connection((host, port), timeout=10) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.sendall(b"p")
        samples = []
        for _ in range(count + 1):
            start = time.perf_counter()
            conn.sendall(b"x")
            if conn.recv(1) != b"x":
                raise OSError("ping-pong peer closed the connection")
            samples.append((time.perf_counter() - start) * 1000)
        return samples[1:]  # the first exchange still grows the congestion window


def bulk(host: str, port: int, seconds: float) -> tuple[int, float]:
    payload = b"\0" * CHUNK
    with socket.create_connection((host, port), timeout=30) as conn:
        conn.sendall(b"b")
        sent = 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            conn.sendall(payload)
            sent += CHUNK
        conn.shutdown(socket.SHUT_WR)
        received = int(conn.recv(64).decode())
        elapsed = time.perf_counter() - start
        return received, elapsed


def main(argv: list[str]) -> int:
    what, host, port = argv[0], argv[1], int(argv[2])
    if what == "serve":
        serve(host, port)
    elif what == "rtt":
        print(json.dumps({"rtt_ms": rtt(host, port, int(argv[3]))}))
    elif what == "bulk":
        received, elapsed = bulk(host, port, float(argv[3]))
        print(json.dumps({"bytes": received, "seconds": elapsed}))
    else:
        print(f"unknown probe {what!r} (serve, rtt, bulk)", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
