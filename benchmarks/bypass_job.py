#!/usr/bin/env python3
"""The job bench_core.py starts on n1 (with `Cluster.run`, as gmount starts every job) to measure local I/O.

Each measurement is made in this one process on the export directly (the baseline) and on
the same file (or kind of file) through TARGET -- n1's mount, with the job's bypass library
on or off (GMOUNT_BYPASS), or an sshfs mount of n1's export -- the two sides taking turns in
slices of tens of milliseconds, so that the load of a shared machine falls on both alike.
One JSON object on stdout: {op: [direct, target]} for one repeat.

    python bypass_job.py --export EXPORT_DIR --target TARGET_DIR --big REL --stat-direct DIR
                         --stat-target DIR --stat-files N --write-mib N --random N
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from collections.abc import Callable

MiB = 1 << 20


def drop(path: str) -> None:
    """Empty the page cache of this file (clean pages: the fixture is fsync'ed)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


class Interleaved:
    """Time two sides in alternating slices (direct, target, direct, ...): a burst of load from
    elsewhere hits both sides alike, which one measurement after the other would not (a shared
    2-core machine is busy most of the time). `rates` is work per second of the faster half of
    each side's slices: on a machine where a dozen processes share two CPUs, a good part of the
    slices are stretched by waiting for a CPU, which says nothing about either side."""

    TRIM = 0.5

    def __init__(self) -> None:
        self.slices: list[list[tuple[float, float]]] = [[], []]  # (work, seconds) per side

    def slice(self, side: int, work: float, action: Callable[[], object]) -> None:
        t0 = time.perf_counter()
        action()
        self.slices[side].append((work, time.perf_counter() - t0))

    def rates(self, scale: float = 1.0) -> list[float]:
        result = []
        for side in self.slices:
            fixed = [s for s in side if s[0] == 0]  # opening, closing: always counted
            timed = sorted((s for s in side if s[0] > 0), key=lambda s: s[0] / s[1], reverse=True)
            kept = timed[:max(1, len(timed) - int(len(timed) * self.TRIM))] + fixed
            result.append(sum(w for w, _ in kept) / sum(t for _, t in kept) / scale)
        return result


def reads(direct: str, target: str, chunk: int) -> list[float]:
    """MB/s of sequential 1 MiB reads, direct and target taking turns chunk by chunk through the file
    (each side reads every other chunk, on its own descriptor, so each keeps its read-ahead)."""
    buf = bytearray(MiB)
    timing = Interleaved()
    fds = [os.open(direct, os.O_RDONLY), os.open(target, os.O_RDONLY)]
    try:
        size = os.fstat(fds[0]).st_size
        for n, start in enumerate(range(0, size, chunk)):
            side = n % 2

            def read_chunk(fd: int = fds[side], start: int = start) -> None:
                for offset in range(start, min(start + chunk, size), MiB):
                    os.preadv(fd, [buf], offset)

            timing.slice(side, min(chunk, size - start), read_chunk)
    finally:
        for fd in fds:
            os.close(fd)
    return timing.rates(1e6)


def random_reads(direct: str, target: str, offsets: list[int], block: int = 1000) -> list[float]:
    """4 KiB preads per second at these offsets, direct and target taking turns every `block` reads."""
    timing = Interleaved()
    fds = [os.open(direct, os.O_RDONLY), os.open(target, os.O_RDONLY)]
    pread = os.pread
    try:
        for n, start in enumerate(range(0, len(offsets), block)):
            part = offsets[start:start + block]

            def read_part(fd: int = fds[n % 2], part: list[int] = part) -> None:
                for offset in part:
                    pread(fd, 4096, offset)

            timing.slice(n % 2, len(part), read_part)
    finally:
        for fd in fds:
            os.close(fd)
    return timing.rates()


def writes(direct: str, target: str, size: int, chunk: int) -> list[float]:
    """MB/s of creating a new file and writing it in 1 MiB writes, then closing it, the two files taking
    turns chunk by chunk; the files are removed afterwards (pages never written back cost nothing)."""
    block = os.urandom(MiB)
    timing = Interleaved()
    fds: list[int] = []
    for side, path in enumerate((direct, target)):
        timing.slice(side, 0, lambda path=path: fds.append(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                                                                   0o644)))
    for n in range(2 * (size // chunk)):

        def write_chunk(fd: int = fds[n % 2]) -> None:
            for _ in range(chunk // MiB):
                os.write(fd, block)

        timing.slice(n % 2, chunk, write_chunk)
    for side in (0, 1):
        timing.slice(side, 0, lambda fd=fds[side]: os.close(fd))
    os.unlink(direct)
    os.unlink(target)
    return timing.rates(1e6)


def stats(direct: list[str], target: list[str], block: int = 50) -> list[float]:
    """os.stat per second of files never stat'ed before (by name: a listing would warm the kernel's
    caches), direct and target taking turns every `block` files."""
    timing = Interleaved()
    stat = os.stat
    for n, start in enumerate(range(0, len(direct), block)):
        for side in ((0, 1) if n % 2 == 0 else (1, 0)):
            part = (direct, target)[side][start:start + block]

            def stat_part(part: list[str] = part) -> None:
                for name in part:
                    stat(name)

            timing.slice(side, len(part), stat_part)
    return timing.rates()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--export", required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--big", required=True, help="the read fixture, relative to both directories")
    parser.add_argument("--stat-direct", required=True)
    parser.add_argument("--stat-target", required=True)
    parser.add_argument("--stat-files", type=int, required=True, help="files f00000... in each stat directory")
    parser.add_argument("--write-mib", type=int, default=512)
    parser.add_argument("--random", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    direct, target = os.path.join(args.export, args.big), os.path.join(args.target, args.big)
    size = os.path.getsize(direct)
    chunk = max(MiB, min(8 * MiB, size // 16 // MiB * MiB))
    out: dict[str, list[float]] = {}
    drop(direct)  # the export file's pages (the same file on both sides)
    if target != direct:
        drop(target)  # a mount's own pages of it
    out["read_cold"] = reads(direct, target, chunk)
    reads(direct, target, chunk)  # the first pass left every chunk of one side uncached on the other
    reads(target, direct, chunk)
    warm = [reads(direct, target, chunk) for _ in range(5)]
    out["read_warm"] = [sum(w[side] for w in warm) / 5 for side in (0, 1)]
    offsets = [random.Random(args.seed).randrange(0, size // 4096) * 4096 for _ in range(args.random)]
    out["random_4k"] = random_reads(direct, target, offsets)
    out["write"] = writes(os.path.join(args.export, f"written-direct-{os.getpid()}.bin"),
                          os.path.join(args.target, f"written-target-{os.getpid()}.bin"), args.write_mib * MiB,
                          max(MiB, min(4 * MiB, args.write_mib * MiB // 8 // MiB * MiB)))
    names = [f"f{i:05d}" for i in range(args.stat_files)]
    out["stat_cold"] = stats([os.path.join(args.stat_direct, n) for n in names],
                             [os.path.join(args.stat_target, n) for n in names])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
