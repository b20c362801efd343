"""The embedded default: every node a local process on this machine.

Each daemon is its own session (it survives the shell that ran `gmount up`),
with its own export, mountpoint and port on the loopback address.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

from ..cluster.config import NodeSpec
from ..cluster.state import ClusterState, NodeRecord
from ..errors import GmountError
from ..node.directories import unseal_mountpoint
from .orchestrate import pid_is_daemon


class LocalProcess:
    """A daemon started as a child; its pipes are read in worker threads."""

    def __init__(self, node: str, process: subprocess.Popen[bytes]) -> None:
        self.node = node
        self._process = process

    async def write_line(self, text: str) -> None:
        assert self._process.stdin is not None
        stdin = self._process.stdin

        def write() -> None:
            stdin.write(text.encode() + b"\n")
            stdin.flush()

        await asyncio.to_thread(write)

    async def read_line(self) -> str:
        assert self._process.stdout is not None
        return (await asyncio.to_thread(self._process.stdout.readline)).decode(errors="replace")

    async def error_output(self) -> str:
        assert self._process.stderr is not None
        stderr = self._process.stderr
        os.set_blocking(stderr.fileno(), False)
        try:
            return (stderr.read(64 * 1024) or b"").decode(errors="replace")
        except OSError:
            return ""

    async def abort(self, pid: int | None) -> None:
        """Stop a daemon that did not finish starting (it unmounts on SIGTERM)."""
        if pid is not None:
            await asyncio.to_thread(terminate_pid, pid, 10.0)
        await self.release()

    async def release(self) -> None:
        """Drop our ends of the pipes; the daemon itself runs on in its own session."""
        try:
            await asyncio.to_thread(self._process.wait, 10)  # the child exits right after forking
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        for stream in (self._process.stdin, self._process.stdout, self._process.stderr):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass


async def spawn_local(node: NodeSpec) -> LocalProcess:
    # A node with `netns` runs in that network namespace but in this mount namespace
    # (nsenter --net only), so its FUSE mount is visible here; nsenter execs, keeping the pid.
    prefix = ["nsenter", f"--net=/run/netns/{node.netns}", "--"] if node.netns else []
    try:
        process = subprocess.Popen(
            [*prefix, sys.executable, "-m", "gmountpy.node"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True, close_fds=True,
            cwd="/",  # not the caller's directory: `python -m` puts it first on sys.path (another checkout's gmountpy)
        )
    except OSError as exc:
        raise GmountError(f"cannot start {prefix[0] if prefix else sys.executable}: {exc}") from None
    return LocalProcess(node.name, process)


def terminate_pid(pid: int, timeout: float) -> bool:
    """SIGTERM a daemon of ours and wait; SIGKILL if it lingers. True if it needed force."""
    if not pid_is_daemon(pid):
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_is_daemon(pid):
            return False
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return True


def stop_local(state: ClusterState, timeout: float = 15.0, *, unseal: bool = True) -> dict[str, str]:
    """SIGTERM every daemon, wait, then make sure nothing stays mounted.

    A daemon that stops unmounts and unseals its mountpoint itself; the dead mount of one
    that died is unmounted here, and with `unseal` its directory made writable again --
    not when the node is about to be restarted: until its new daemon mounts, the bare
    directory must take no files (node.directories).

    Returns node -> problem for nodes that needed force; exports are never touched.
    """
    problems: dict[str, str] = {}
    waiting: dict[str, NodeRecord] = {}
    for name, record in state.nodes.items():
        if pid_is_daemon(record.pid):
            try:
                os.kill(record.pid, signal.SIGTERM)
                waiting[name] = record
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + timeout
    while waiting and time.monotonic() < deadline:
        for name in [n for n, r in waiting.items() if not pid_is_daemon(r.pid)]:
            del waiting[name]
        time.sleep(0.05)
    for name, record in waiting.items():
        problems[name] = f"daemon pid {record.pid} ignored SIGTERM for {timeout:g}s; killed"
        try:
            os.kill(record.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for name, record in state.nodes.items():
        if _is_mounted(record.mountpoint):
            if not pid_is_daemon(record.pid):
                abort_connection(record.mountpoint)
            result = subprocess.run(["fusermount3", "-u", "-z", record.mountpoint], capture_output=True, text=True)
            if result.returncode != 0:
                problems[name] = f"could not unmount {record.mountpoint}: {result.stderr.strip()}"
                continue
        if unseal and not _is_mounted(record.mountpoint):
            unseal_mountpoint(record.mountpoint)
    return problems


#: Where the kernel's FUSE control file system is mounted (systemd mounts it at boot).
FUSECTL = "/sys/fs/fuse/connections"


def abort_connection(mountpoint: str) -> bool:
    """Abort the FUSE connection of a dead daemon's mount; True if it was aborted.

    A daemon killed while one of its threads waits in the kernel (an entry invalidation
    waiting for a directory lock that a rename through the mount holds) never finishes
    exiting, so /dev/fuse stays open and every process using the mount waits forever.
    Aborting the connection (fusectl's `abort`, writable by the mount's owner) ends their
    requests with ENOTCONN and lets the daemon exit. As root, fusectl is mounted for this
    when it is not, and unmounted after.
    """
    device = _mount_device(mountpoint)
    if device is None or not device.startswith("0:"):
        return False
    abort = os.path.join(FUSECTL, device.split(":")[1], "abort")
    mounted_here = False
    if not os.path.exists(abort) and os.geteuid() == 0 and not _is_mounted(FUSECTL):
        mounted_here = subprocess.run(["mount", "-t", "fusectl", "fusectl", FUSECTL],
                                      capture_output=True).returncode == 0
    try:
        with open(abort, "w") as f:
            f.write("1")
        return True
    except OSError:
        return False  # no fusectl (a user on a host without it): the lazy unmount below still detaches it
    finally:
        if mounted_here:
            subprocess.run(["umount", FUSECTL], capture_output=True)


def _mount_device(path: str) -> str | None:
    """The "major:minor" of the file system mounted at `path` (/proc/self/mountinfo; no stat, which a
    dead FUSE mount would block)."""
    try:
        with open("/proc/self/mountinfo") as f:
            found = [line.split(" ")[2] for line in f if _unescape(line.split(" ")[4]) == path]
    except OSError:
        return None
    return found[-1] if found else None


def _unescape(field: str) -> str:
    r"""A path as /proc/self/mount* print it: space, tab, newline and backslash as \040, \011, \012, \134."""
    return (field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n")
            .replace("\\134", "\\"))


def _is_mounted(path: str) -> bool:
    try:
        with open("/proc/self/mounts") as f:
            return any(line.split(" ")[1] == path for line in f)
    except OSError:
        return os.path.ismount(path)
