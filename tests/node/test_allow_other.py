"""`allow_other` in the cluster file: other local users use the mounts, the kernel checks modes.

Run as root, the test acts as user `nobody` (setpriv) on clusters made in a
world-traversable directory, with and without allow_other.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gmountpy.errors import GmountError
from gmountpy.node.daemon import check_allow_other

from ..conftest import fuse_problem, local_cluster, require

NOBODY = 65534
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]


def as_nobody(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*AS_NOBODY, "sh", "-c", command], capture_output=True, text=True, timeout=30, check=False)


@pytest.fixture
def open_base() -> Iterator[Path]:
    """A directory other users may traverse (pytest's own tmp directories are root-only)."""
    require("acting as another user", None if os.geteuid() == 0 and shutil.which("setpriv")
            else "needs root and setpriv (util-linux)")
    require("FUSE", fuse_problem())
    base = Path(tempfile.mkdtemp(prefix="gmount-other-", dir="/tmp"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_other_users_read_through_the_mount_only_with_allow_other(open_base: Path) -> None:
    name = f"ao-{os.getpid()}"
    with local_cluster(open_base / "with", name, {"a": ["n1"], "b": ["n2"]}, [("a", "b", 5.0)],
                       top="allow_other = true") as cluster:
        shared = cluster.export("n2") / "shared.txt"
        shared.write_text("for everyone\n")
        shared.chmod(0o644)
        (cluster.export("n2") / "private.txt").write_text("root only\n")
        (cluster.export("n2") / "private.txt").chmod(0o600)
        mount = cluster.mount("n1")
        read = as_nobody(f"cat {mount}/shared.txt")
        assert read.returncode == 0 and read.stdout == "for everyone\n", read.stderr
        denied = as_nobody(f"cat {mount}/private.txt")
        assert denied.returncode != 0 and "Permission denied" in denied.stderr
        # access(2) answers from the modes (default_permissions), as on the export
        assert as_nobody(f"test -r {mount}/shared.txt && ! test -r {mount}/private.txt "
                         f"&& ! test -w {mount}/shared.txt").returncode == 0

        # A new file of another user is that user's (a root daemon gives it away), and
        # chown follows the kernel's rules: own group yes, giving the file to root no.
        (cluster.export("n1") / "drop").mkdir(mode=0o777)
        (cluster.export("n1") / "drop").chmod(0o777)
        made = as_nobody(f"echo mine > {mount}/drop/mine.txt && mkdir {mount}/drop/sub && mkfifo {mount}/drop/p")
        assert made.returncode == 0, made.stderr
        for entry in ("mine.txt", "sub", "p"):
            on_disk = os.lstat(cluster.export("n1") / "drop" / entry)
            assert (on_disk.st_uid, on_disk.st_gid) == (NOBODY, NOBODY), entry
        assert as_nobody(f"chgrp {NOBODY} {mount}/drop/mine.txt").returncode == 0
        refused = as_nobody(f"chown 0 {mount}/drop/mine.txt")
        assert refused.returncode != 0 and "Operation not permitted" in refused.stderr
        assert os.lstat(cluster.export("n1") / "drop" / "mine.txt").st_uid == NOBODY

    with local_cluster(open_base / "without", name + "-no", {"a": ["n1"]}, []) as cluster:
        (cluster.export("n1") / "shared.txt").write_text("for everyone\n")
        (cluster.export("n1") / "shared.txt").chmod(0o644)
        refused = as_nobody(f"cat {cluster.mount('n1')}/shared.txt")
        assert refused.returncode != 0 and "Permission denied" in refused.stderr


def test_allow_other_for_a_non_root_daemon_needs_user_allow_other(tmp_path: Path) -> None:
    conf = tmp_path / "fuse.conf"
    conf.write_text("# mount_max = 1000\n#user_allow_other\n")
    with pytest.raises(GmountError) as raised:
        check_allow_other("n3", 1000, str(conf))
    message = str(raised.value)
    assert message.startswith("node n3:") and "user_allow_other" in message and str(conf) in message
    with pytest.raises(GmountError):
        check_allow_other("n3", 1000, str(tmp_path / "missing.conf"))
    conf.write_text("user_allow_other\n")
    check_allow_other("n3", 1000, str(conf))
    conf.write_text("")
    check_allow_other("n3", 0, str(conf))  # root may always


def test_allow_other_is_off_by_default_and_parsed(tmp_path: Path) -> None:
    from gmountpy.cluster.config import ClusterSpec, parse_spec
    data = {"name": "x", "defaults": {"export": str(tmp_path / "{node}/e"), "mountpoint": str(tmp_path / "{node}/m")},
            "sites": {"a": {"nodes": ["n1"]}}}
    assert parse_spec(data).allow_other is False
    spec = parse_spec({**data, "allow_other": True})
    assert spec.allow_other is True and ClusterSpec.from_dict(spec.to_dict()).allow_other is True
    with pytest.raises(ValueError, match="allow_other"):
        parse_spec({**data, "allow_other": "yes"})
