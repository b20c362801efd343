#!/usr/bin/env python3
"""The job bench_core.py starts on n1 (with `Cluster.run`, as gmount starts every job) to measure local I/O.

Each measurement is made twice in a row in this one process: on the export directly (the
baseline) and on the same kind of file through TARGET -- n1's mount, with the job's bypass
library on or off (GMOUNT_BYPASS), or an sshfs mount of n1's export. One JSON object on
stdout: {op: [direct, target]} for one repeat.

    python bypass_job.py --export EXPORT_DIR --target TARGET_DIR --big REL --stat-direct DIR
                         --stat-target DIR --write-mib N --random N
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time

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


def stat_all(directory: str) -> float:
    """os.stat of every file of a directory never stat'ed before, per second."""
    names = [os.path.join(directory, name) for name in sorted(os.listdir(directory))]
    stat = os.stat
    t0 = time.perf_counter()
    for name in names:
        stat(name)
    return len(names) / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--export", required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--big", required=True, help="the read fixture, relative to both directories")
    parser.add_argument("--stat-direct", required=True)
    parser.add_argument("--stat-target", required=True)
    parser.add_argument("--write-mib", type=int, default=512)
    parser.add_argument("--random", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    direct, target = os.path.join(args.export, args.big), os.path.join(args.target, args.big)
    size = os.path.getsize(direct)
    out: dict[str, list[float]] = {}
    # sequential read, every cache dropped (the export file's; a mount's own pages too)
    drop(direct)
    first = read_all(direct)
    drop(direct)
    drop(target)
    out["read_cold"] = [first, read_all(target)]
    # sequential read, in the page cache (each side read once before)
    read_all(direct)
    read_all(target)
    out["read_warm"] = [read_all(direct), read_all(target)]
    offsets = [random.Random(args.seed).randrange(0, size // 4096) * 4096 for _ in range(args.random)]
    out["random_4k"] = [random_reads(direct, offsets), random_reads(target, offsets)]
    size_w = args.write_mib * MiB
    out["write"] = [write_new(os.path.join(args.export, f"written-direct-{os.getpid()}.bin"), size_w),
                    write_new(os.path.join(args.target, f"written-target-{os.getpid()}.bin"), size_w)]
    out["stat_cold"] = [stat_all(args.stat_direct), stat_all(args.stat_target)]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
