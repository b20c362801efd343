"""A deliberately slow file system for tests: one file whose every read takes DELAY seconds.

Run as `python -m tests.node.slowfs MOUNTPOINT DELAY [OPEN_DELAY [WRITE_DELAY]]`; it prints
"ready" once mounted, "opened" after each open (which takes OPEN_DELAY
seconds, 0 by default), and unmounts on SIGTERM. Mounted inside a node's export, it stands in
for a slow disk (or a hung network file system) under part of the export. A second file,
`slow.out` (empty at first, kept in memory), takes writes that each take WRITE_DELAY seconds
(0 by default) and prints "wrote N" once one of N bytes has landed.
"""

from __future__ import annotations

import errno
import os
import signal
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyfuse3
import trio

NAME = b"slow.bin"
DATA = b"slow data\n" * 400
FILE_INODE = pyfuse3.ROOT_INODE + 1
OUT_NAME = b"slow.out"
OUT_INODE = pyfuse3.ROOT_INODE + 2


@contextmanager
def mounted(mountpoint: Path, delay: float, open_delay: float = 0.0, write_delay: float = 0.0) -> Iterator[list[str]]:
    """slowfs at `mountpoint` (made here) for the block, always unmounted after; yields the lines it
    prints once ready ("opened", "wrote N"), collected as they come."""
    mountpoint.mkdir()
    process = subprocess.Popen([sys.executable, "-m", "tests.node.slowfs", str(mountpoint), str(delay),
                                str(open_delay), str(write_delay)],
                               cwd=Path(__file__).resolve().parents[2], stdout=subprocess.PIPE, text=True)
    said: list[str] = []
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "ready", "slowfs did not start"
        stdout = process.stdout
        threading.Thread(target=lambda: said.extend(line.strip() for line in stdout), daemon=True).start()
        yield said
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        with open("/proc/self/mounts") as f:
            if any(line.split(" ")[1] == str(mountpoint) for line in f):
                subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], capture_output=True, check=False)
        if process.stdout is not None:
            process.stdout.close()


class SlowFS(pyfuse3.Operations):
    def __init__(self, delay: float, open_delay: float = 0.0, write_delay: float = 0.0) -> None:
        super().__init__()
        self.delay = delay
        self.open_delay = open_delay
        self.write_delay = write_delay
        self.out = bytearray()

    def _attr(self, inode: int) -> pyfuse3.EntryAttributes:
        entry = pyfuse3.EntryAttributes()
        entry.st_ino = inode
        if inode == pyfuse3.ROOT_INODE:
            entry.st_mode, entry.st_nlink, entry.st_size = stat.S_IFDIR | 0o755, 2, 0
        elif inode == OUT_INODE:
            entry.st_mode, entry.st_nlink, entry.st_size = stat.S_IFREG | 0o644, 1, len(self.out)
        else:
            entry.st_mode, entry.st_nlink, entry.st_size = stat.S_IFREG | 0o644, 1, len(DATA)
        entry.st_uid, entry.st_gid = os.getuid(), os.getgid()
        entry.attr_timeout = entry.entry_timeout = 0 if inode == OUT_INODE else 300  # its size changes
        return entry

    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext | None = None) -> pyfuse3.EntryAttributes:
        return self._attr(inode)

    async def lookup(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext | None = None
                     ) -> pyfuse3.EntryAttributes:
        if parent_inode != pyfuse3.ROOT_INODE or name not in (NAME, OUT_NAME):
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attr(FILE_INODE if name == NAME else OUT_INODE)

    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        return inode

    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        if start_id == 0 and not pyfuse3.readdir_reply(token, NAME, self._attr(FILE_INODE), 1):
            return
        if start_id <= 1:
            pyfuse3.readdir_reply(token, OUT_NAME, self._attr(OUT_INODE), 2)

    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        await trio.sleep(self.open_delay)
        print("opened", flush=True)
        return pyfuse3.FileInfo(fh=inode, direct_io=True)  # no page cache: every read is slow

    async def read(self, fh: int, off: int, size: int) -> bytes:
        await trio.sleep(self.delay)
        return (self.out if fh == OUT_INODE else DATA)[off:off + size]

    async def write(self, fh: int, off: int, buf: bytes) -> int:
        if fh != OUT_INODE:
            raise pyfuse3.FUSEError(errno.EBADF)
        await trio.sleep(self.write_delay)
        self.out[off:off + len(buf)] = buf
        print("wrote", len(buf), flush=True)
        return len(buf)


def main() -> None:
    mountpoint, delay = sys.argv[1], float(sys.argv[2])
    open_delay = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
    write_delay = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
    pyfuse3.init(SlowFS(delay, open_delay, write_delay), mountpoint, set(pyfuse3.default_options) | {"fsname=slowfs"})

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            async def stop_on_signal() -> None:
                with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    async for _ in signals:
                        pyfuse3.terminate()
                        return
            nursery.start_soon(stop_on_signal)
            print("ready", flush=True)
            await pyfuse3.main()
            nursery.cancel_scope.cancel()

    try:
        trio.run(run)
    finally:
        pyfuse3.close(unmount=True)


if __name__ == "__main__":
    main()
