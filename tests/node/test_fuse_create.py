"""The FUSE layer's create, without a mount: a create that fails after the file was opened
closes it (the kernel never gets the handle, so it never releases it)."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyfuse3
import pytest

from gmountpy.node.fuse import ROOT_INODE, GmountOperations
from gmountpy.node.namespace import FileHandle

from .._trio import trio_test
from .harness import open_cluster


def files_open(directory: Path) -> list[str]:
    """What this process has open under `directory`."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(f"{directory}/"):
            found.append(target)
    return found


@trio_test
async def test_a_create_that_fails_after_opening_the_file_closes_it(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    if os.geteuid() != 0:
        pytest.skip("a root daemon gives new files to their creator: that is the step made to fail here")
    async with open_cluster(tmp_path) as cluster:
        ns = cluster["n1"].namespace
        ops = GmountOperations(ns, attr_ttl=1.0)
        opened: list[FileHandle] = []
        real_create = ns.create

        async def create(path: str, flags: int, mode: int) -> FileHandle:
            opened.append(await real_create(path, flags, mode))
            return opened[-1]

        async def refuse_chown(path: str, uid: int, gid: int) -> Any:
            raise PermissionError(errno.EPERM, "this export's file system refuses chown (vfat, root_squash NFS)")

        monkeypatch.setattr(ns, "create", create)
        monkeypatch.setattr(ns, "chown", refuse_chown)
        caller = SimpleNamespace(uid=4242, gid=4242, pid=os.getpid(), umask=0o022)  # another user's process
        for attempt in range(3):
            with pytest.raises(pyfuse3.FUSEError) as info:
                await ops.create(ROOT_INODE, f"f{attempt}".encode(), 0o100644, os.O_WRONLY | os.O_CREAT, caller)
            assert info.value.errno == errno.EPERM
        assert len(opened) == 3 and all(handle.fd is not None for handle in opened)
        assert files_open(cluster["n1"].root) == []  # every descriptor closed again
        assert ops._files == {} and all(ops.inodes.lookups(ops.inodes.inode(f"/f{i}") or 0) == 0 for i in range(3))
