#!/usr/bin/env python3
"""The job bench_core.py starts on n1 (with `Cluster.run`, as gmount starts every job) to measure local I/O.

Each measurement is made in this one process on the export directly (the baseline) and on
the same kind of file through TARGET -- n1's mount, with the job's bypass library on or off
(GMOUNT_BYPASS), or an sshfs mount of n1's export -- twice each, in the order direct, target,
target, direct. One JSON object on stdout: {op: [direct, target]} for one repeat.

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


def read_all(path: str) -> float:
    """MB/s of one sequential read with 1 MiB reads."""
    buf = bytearray(MiB)
    with open(path, "rb", buffering=0) as f:
        total = 0
        t0 = time.perf_counter()
        while got := f.readinto(buf):
            total += got
        return total / (time.perf_counter() - t0) / 1e6


def random_reads(path: str, offsets: list[int]) -> float:
    """4 KiB preads at these offsets, per second."""
    fd = os.open(path, os.O_RDONLY)
    try:
        pread = os.pread
        t0 = time.perf_counter()
        for offset in offsets:
            pread(fd, 4096, offset)
        return len(offsets) / (time.perf_counter() - t0)
    finally:
        os.close(fd)


def write_new(path: str, size: int) -> float:
    """MB/s of creating `path` and writing `size` bytes in 1 MiB writes, then closing it; the file
    is removed afterwards (unwritten-back pages of a removed file cost the disk nothing)."""
    block = os.urandom(MiB)
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for _ in range(size // MiB):
            os.write(fd, block)
    finally:
        os.close(fd)
    rate = size / (time.perf_counter() - t0) / 1e6
    os.unlink(path)
    return rate


def stat_all(names: list[str]) -> float:
    """os.stat of files never stat'ed before (by name: a listing would warm the kernel's caches), per second."""
    stat = os.stat
    t0 = time.perf_counter()
    for name in names:
        stat(name)
    return len(names) / (time.perf_counter() - t0)


def abba(direct: Callable[[int], float], target: Callable[[int], float]) -> list[float]:
    """[direct, target]: each measured twice, in the order direct, target, target, direct, and averaged, so
    that neither side is always the first (caches, writeback, a burst of load elsewhere)."""
    first, second, third, fourth = direct(0), target(0), target(1), direct(1)
    return [(first + fourth) / 2, (second + third) / 2]


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
    out: dict[str, list[float]] = {}

    def cold(path: str) -> Callable[[int], float]:
        def measure(_: int) -> float:
            drop(direct)  # the export file's pages (the same file for every side)
            if path != direct:
                drop(path)  # a mount's own pages of it
            return read_all(path)
        return measure

    out["read_cold"] = abba(cold(direct), cold(target))
    read_all(direct)
    read_all(target)
    out["read_warm"] = abba(lambda _: read_all(direct), lambda _: read_all(target))
    offsets = [random.Random(args.seed).randrange(0, size // 4096) * 4096 for _ in range(args.random)]
    out["random_4k"] = abba(lambda _: random_reads(direct, offsets), lambda _: random_reads(target, offsets))
    size_w = args.write_mib * MiB
    out["write"] = abba(lambda i: write_new(os.path.join(args.export, f"written-direct-{os.getpid()}-{i}.bin"), size_w),
                        lambda i: write_new(os.path.join(args.target, f"written-target-{os.getpid()}-{i}.bin"), size_w))
    half = args.stat_files // 2

    def names(directory: str, part: int) -> list[str]:
        return [os.path.join(directory, f"f{i:05d}") for i in range(part * half, (part + 1) * half)]

    out["stat_cold"] = abba(lambda i: stat_all(names(args.stat_direct, i)),
                            lambda i: stat_all(names(args.stat_target, i)))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
