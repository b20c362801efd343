"""`allow_other` in the cluster file: other local users use the mounts, the kernel checks modes.

Run as root, the tests act as user `nobody` and as a second unprivileged user (made
for the tests when missing, removed after) with setpriv, on clusters made in a
world-traversable directory. What several users do through a mount is compared with
what they do in a directory of the same file system without FUSE (the oracle): renames
and unlinks as the directory's mode and sticky bit allow, set-uid and set-gid bits
cleared by their writes, paths near PATH_MAX.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gmountpy.errors import GmountError
from gmountpy.node.daemon import check_allow_other

from ..conftest import LocalCluster, fuse_problem, local_cluster, require, wait_for
from . import posix_conformance

NOBODY = 65534
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
#: The second user the multi-user tests act as besides nobody.
OTHER_USER = "gmount-test-other"


def as_nobody(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*AS_NOBODY, "sh", "-c", command], capture_output=True, text=True, timeout=30, check=False)


def as_user(uid: int, command: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "sh", "-c", command],
                          capture_output=True, text=True, timeout=30, check=False, cwd=cwd)


def can_act_as_others() -> None:
    require("acting as another user", None if os.geteuid() == 0 and shutil.which("setpriv")
            else "needs root and setpriv (util-linux)")
    require("FUSE", fuse_problem())


def world_traversable_directory() -> Path:
    base = Path(tempfile.mkdtemp(prefix="gmount-other-", dir="/tmp"))
    base.chmod(0o755)
    return base


@pytest.fixture
def open_base() -> Iterator[Path]:
    """A directory other users may traverse (pytest's own tmp directories are root-only)."""
    can_act_as_others()
    base = world_traversable_directory()
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


# ------------------------------------------------- several users through one mount, against the oracle


@pytest.fixture(scope="module")
def other_uid() -> Iterator[int]:
    """The uid of a second unprivileged user, made if missing (the tests give it the group of that number)."""
    can_act_as_others()
    made = False
    try:
        pwd.getpwnam(OTHER_USER)
    except KeyError:
        result = subprocess.run(["useradd", "--system", "--user-group", "--no-create-home",
                                 "--shell", "/usr/sbin/nologin", OTHER_USER], capture_output=True, text=True)
        made = result.returncode == 0
        if result.returncode not in (0, 9):  # 9: made meanwhile by another test run
            pytest.fail(f"useradd {OTHER_USER} failed: {result.stderr}")
    user = pwd.getpwnam(OTHER_USER)
    assert user.pw_uid not in (0, NOBODY)
    try:
        yield user.pw_uid
    finally:
        if made:
            subprocess.run(["userdel", OTHER_USER], capture_output=True)


@pytest.fixture(scope="module")
def shared(other_uid: int) -> Iterator[tuple[LocalCluster, Path]]:
    """An allow_other cluster (n1, n2 at one site, n3 at another) and an oracle directory beside it."""
    base = world_traversable_directory()
    try:
        with local_cluster(base / "c", f"mu-{os.getpid()}", {"a": ["n1", "n2"], "b": ["n3"]}, [("a", "b", 5.0)],
                           top="allow_other = true") as cluster:
            oracle = base / "oracle"
            oracle.mkdir(mode=0o755)
            yield cluster, oracle
    finally:
        shutil.rmtree(base, ignore_errors=True)


def outcome(result: subprocess.CompletedProcess[str]) -> str:
    """What a command came to, as a user sees it: done, or the error it reported."""
    if result.returncode == 0:
        return f"ok {result.stdout.strip()}".strip()
    for text, name in (("Permission denied", "EACCES"), ("Operation not permitted", "EPERM"),
                       ("No such file", "ENOENT"), ("File name too long", "ENAMETOOLONG")):
        if text in result.stderr:
            return name
    return f"failed {result.returncode}: {result.stderr.strip()}"


def tree(top: Path) -> dict[str, str]:
    """Names below `top` with type, mode and owner (not times: the two trees are made at different times)."""
    shown = {}
    for path in sorted(top.rglob("*")):
        st = os.lstat(path)
        shown[str(path.relative_to(top))] = f"{stat.filemode(st.st_mode)} {st.st_uid}:{st.st_gid}"
    return shown


#: (user, command) run in the directory under test: nobody (A) and the second user (B) work in a
#: world-writable directory and in a sticky one (/tmp's mode), both root's, with a root file in each.
STEPS = [
    ("A", "echo a > open/a.txt && echo a > sticky/a.txt"),
    ("A", "mv open/a.txt open/a2.txt"),
    ("A", "mv sticky/a.txt sticky/a2.txt"),
    ("B", "mv open/a2.txt open/b.txt"),            # not sticky: anyone who may write the directory
    ("B", "mv sticky/a2.txt sticky/b.txt"),        # sticky: only the file's or the directory's owner
    ("B", "rm -f sticky/a2.txt"),
    ("B", "rm -f open/root.txt"),
    ("B", "rm -f sticky/root.txt"),
    ("A", "mv sticky/root.txt sticky/mine.txt"),
    ("A", "rm sticky/a2.txt && ls sticky"),
    ("A", "rm open/b.txt && ls open"),
    ("B", "mkdir open/d && echo b > open/d/f && mv open/d open/e && ls open/e"),
    ("A", "mv open/e/f open/f && rm open/f"),      # out of B's directory, which A may not write
    ("B", "echo b > sticky/b2 && mv sticky/b2 open/b3 && cat open/b3 && rm open/b3"),
    ("A", "touch closed/x"),
    ("A", "ln open/e/f open/link"),                # hard links: protected_hardlinks decides, as on the oracle
]


@pytest.mark.parametrize("holder", ["n1", "n3"])
def test_other_users_rename_and_unlink_as_the_directorys_mode_and_sticky_bit_allow(
        shared: tuple[LocalCluster, Path], other_uid: int, holder: str) -> None:
    """The directories are held by `holder` and used through n1's mount: a create by another user in
    n3's directory makes n1's copy of it, which must show n3's mode and owner (before, root's 0755:
    every rename or unlink after it was EACCES)."""
    cluster, oracle = shared
    name = f"multi-{holder}"
    users = {"A": NOBODY, "B": other_uid}
    tops = {"oracle": oracle / name, "mount": cluster.mount("n1") / name}
    made = {"oracle": tops["oracle"], "mount": cluster.export(holder) / name}
    for top in made.values():
        for sub, mode in (("", 0o755), ("open", 0o777), ("sticky", 0o1777), ("closed", 0o755)):
            (top / sub).mkdir(exist_ok=True)
            (top / sub).chmod(mode)
        for sub in ("open", "sticky"):
            (top / sub / "root.txt").write_text("root's\n")
    cluster.rescan(holder)
    seen: dict[str, list[str]] = {label: [] for label in tops}
    for user, command in STEPS:
        for label, top in tops.items():
            seen[label].append(f"{user}: {command}: {outcome(as_user(users[user], command, cwd=top))}")
    assert seen["mount"] == seen["oracle"]
    assert tree(tops["mount"]) == tree(tops["oracle"])
    assert "EACCES" not in " ".join(seen["mount"][:4]) and "EPERM" in seen["mount"][4]


#: Writes and truncates by nobody to a world-writable file of another user, as set-uid and set-gid.
KILL_MODES = [0o4777, 0o6777, 0o2777, 0o2767, 0o6766, 0o4766]
KILL_OPS = ["echo y >> {f}", "echo y > {f}", "truncate -s 1 {f}", "truncate -s 0 {f}",
            "dd if=/dev/zero of={f} bs=1 count=1 seek=5 conv=notrunc status=none"]


@pytest.mark.parametrize("holder", ["n1", "n3"])
def test_a_write_by_another_user_clears_set_uid_and_set_gid_as_the_export_does(
        shared: tuple[LocalCluster, Path], other_uid: int, holder: str) -> None:
    """The kernel's FUSE code clears set-uid, and set-gid with group-exec; set-gid without
    group-exec is cleared when the writer is not in the file's group (ext4's rule), by the daemon."""
    cluster, oracle = shared
    name = f"kill-{holder}"
    directories = {"oracle": oracle / name, "holder": cluster.export(holder) / name}
    for directory in directories.values():
        directory.mkdir(mode=0o777)
        directory.chmod(0o777)
    cases = [(mode, op, owner) for mode in KILL_MODES for op in KILL_OPS for owner in (0, other_uid)]
    for i, (mode, _, owner) in enumerate(cases):
        for directory in directories.values():
            path = directory / f"f{i}"
            path.write_text("content\n")
            os.chown(path, owner, owner)
            path.chmod(mode)
    cluster.rescan(holder)
    differ = []
    for i, (mode, op, owner) in enumerate(cases):
        oracle_file, held = directories["oracle"] / f"f{i}", directories["holder"] / f"f{i}"
        expected = outcome(as_user(NOBODY, op.format(f=oracle_file)))
        got = outcome(as_user(NOBODY, op.format(f=cluster.mount("n1") / name / f"f{i}")))
        modes = stat.filemode(os.lstat(oracle_file).st_mode), stat.filemode(os.lstat(held).st_mode)
        if got != expected or modes[0] != modes[1] or os.lstat(held).st_size != os.lstat(oracle_file).st_size:
            differ.append(f"{op} on {mode:o} of uid {owner}: export {expected} {modes[0]}, mount {got} {modes[1]}")
    assert not differ, "\n".join(differ)
    # the mount shows the cleared bits too (its attributes were refreshed, not kept for attr_ttl)
    last = len(cases) - 1
    assert wait_for(lambda: os.stat(cluster.mount("n1") / name / f"f{last}").st_mode
                    == os.lstat(directories["holder"] / f"f{last}").st_mode, timeout=2.0)


@pytest.mark.parametrize("holder", ["n1", "n3"])
def test_a_path_near_path_max_of_255_byte_names_works_through_the_mount(
        shared: tuple[LocalCluster, Path], holder: str) -> None:
    """A 1,023-byte path of four 255-byte names (and one of 4,095 bytes relative to the mount, as
    much as a system call takes), made by another user: stat, open, rename and unlink through the
    mount of n1 and the mount of the other node, as in the export."""
    cluster, oracle = shared
    top = ("t" if holder == "n1" else "u") * 255
    for base in (oracle, cluster.export(holder)):
        (base / top).mkdir(mode=0o777)
        (base / top).chmod(0o777)
    cluster.rescan(holder)
    names = [top, "b" * 255, "c" * 255, "d" * 255]
    path = "/".join(names)
    assert len(path) == 1023
    deep = "/".join([top, *["e" * 255] * 14])
    last = "f" * (4095 - len(deep) - 1)
    script = (f"mkdir {names[0]}/{names[1]} {names[0]}/{names[1]}/{names[2]} && echo deep > {path} && "
              f"stat -c '%s %F' {path} && cat {path} && mv {path} {names[0]}/{names[1]}/{'g' * 255} && "
              f"cat {names[0]}/{names[1]}/{'g' * 255} && ls {names[0]}/{names[1]} | wc -l && "
              f"mkdir -p {deep} && echo deeper > {deep}/{last} && stat -c %s {deep}/{last} && "
              f"cat {deep}/{last} && rm {deep}/{last}")
    assert len(f"{deep}/{last}") == 4095
    expected = outcome(as_user(NOBODY, script, cwd=oracle))
    assert expected.startswith("ok 5 regular file")
    assert outcome(as_user(NOBODY, script, cwd=cluster.mount("n1"))) == expected
    other = cluster.mount("n3" if holder == "n1" else "n2")
    seen: list[str] = []

    def read_there() -> bool:
        seen.append(outcome(as_user(NOBODY, f"cat {names[0]}/{names[1]}/{'g' * 255}", cwd=other)))
        return seen[-1] == "ok deep"

    assert wait_for(read_there, timeout=15), seen  # each try starts two processes: seconds on a loaded machine


def test_a_create_of_a_name_another_node_made_meanwhile_checks_the_callers_permission(open_base: Path) -> None:
    """The kernel, which cached the name as missing (negative_ttl), asks to create it and checks only
    the directory; another node has made it meanwhile, and the daemon opens that file instead (no
    twin). It must check the caller's permission on it as the kernel would have: before, nobody
    truncated another user's 0644 file and was given it (the daemon opened and chowned it as root)."""
    tuning = 'attr_ttl = 0.5\nnegative_ttl = 5.0\nlookup = "flood"'  # flooding: a file copied in is not announced
    with local_cluster(open_base, f"neg-{os.getpid()}", {"a": ["n1"], "b": ["n3"]}, [("a", "b", 5.0)], tuning,
                       top="allow_other = true") as cluster:
        shared = cluster.export("n3") / "w"
        shared.mkdir(mode=0o777)
        shared.chmod(0o777)
        mount = cluster.mount("n1") / "w"
        for name, mode in (("theirs", 0o644), ("open", 0o666)):
            assert outcome(as_nobody(f"stat {mount}/{name}")) == "ENOENT"  # cached as missing by n1's kernel
            (shared / name).write_text("someone's data\n")
            os.chown(shared / name, 4321, 4321)
            (shared / name).chmod(mode)
        assert outcome(as_nobody(f"echo mine > {mount}/theirs")) == "EACCES"
        assert (shared / "theirs").read_text() == "someone's data\n" and (shared / "theirs").stat().st_uid == 4321
        assert outcome(as_nobody(f"echo mine > {mount}/open")) == "ok"  # allowed: written, still theirs
        assert (shared / "open").read_text() == "mine\n" and (shared / "open").stat().st_uid == 4321
        assert not (cluster.export("n1") / "w").exists()  # no twin either way
        # a rename over such a name in a sticky directory (/tmp's mode): the sticky bit protects it
        sticky = cluster.export("n3") / "t"
        sticky.mkdir(mode=0o1777)
        sticky.chmod(0o1777)
        assert outcome(as_nobody(f"echo mine > {mount}/../t/mine && stat {mount}/../t/theirs")) == "ENOENT"
        (sticky / "theirs").write_text("someone's data\n")
        os.chown(sticky / "theirs", 4321, 4321)
        assert outcome(as_nobody(f"mv {mount}/../t/mine {mount}/../t/theirs")) == "EPERM"
        assert (sticky / "theirs").read_text() == "someone's data\n"


def test_the_posix_conformance_run_differs_from_the_export_only_where_docs_posix_md_says(
        shared: tuple[LocalCluster, Path]) -> None:
    """tests/node/posix_conformance.py through n1's mount and in n1's export: what differs is exactly
    the deliberate list (docs/posix.md) -- inode numbers, link counts and the multi-user checks agree."""
    cluster, _ = shared
    results = posix_conformance.compare(cluster.mount("n1"), cluster.export("n1"))
    differ = {name: (there, here) for name, there, here in results if there != here}
    assert set(differ) == set(posix_conformance.DELIBERATE), differ
    assert len(results) == len(posix_conformance.CHECKS) > 50
