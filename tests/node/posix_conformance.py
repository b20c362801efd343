"""A differential POSIX check: the same operations in a mount and in its own export.

The export's file system is the oracle: every check runs once in a fresh
directory of the export (directly, without FUSE) and once in a fresh directory
of the mount that shows that export, and the two outcomes (values or errno
names) are compared. Run as root through a running cluster with `allow_other =
true` (the multi-user checks act as user nobody):

    python -m tests.node.posix_conformance MOUNT_DIR EXPORT_DIR

MOUNT_DIR is a node's mount and EXPORT_DIR that node's own export (creates
through the mount land there, so both runs use the same file system). Prints
one line per check (export | mount) and a summary; exits 1 if anything
differs but the deliberate differences (DELIBERATE, docs/posix.md).
test_allow_other.py runs it on a cluster of its own. Behaviour with files held
by other nodes is tested in test_posix_ops.py and test_allow_other.py.
(pjdfstest is not reachable from here: no GitHub access.)
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
import stat
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

libc = ctypes.CDLL(None, use_errno=True)
CHECKS: list[tuple[str, Callable[[Path], Any]]] = []
#: Checks a mount answers differently on purpose, and why (docs/posix.md).
DELIBERATE = {
    "fallocate_call": "pyfuse3 3.5 has no fallocate handler (posix_fallocate works)",
    "seek_hole_data": "pyfuse3 3.5 has no lseek handler: the kernel's generic answer",
    "o_tmpfile": "pyfuse3 3.5 has no tmpfile operation",
    "mknod_char_device": "FUSE mounts are nodev",
}
#: The unprivileged user the multi-user checks act as.
NOBODY = 65534


def check(func: Callable[[Path], Any]) -> Callable[[Path], Any]:
    CHECKS.append((func.__name__, func))
    return func


def outcome(func: Callable[[Path], Any], directory: Path) -> str:
    try:
        return repr(func(directory))
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc.errno))


def as_nobody(func: Callable[[], Any]) -> Any:
    """Run `func` in a child process acting as user nobody (no groups); its outcome (value or errno name)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            try:
                result = repr(func())
            except OSError as exc:
                result = errno.errorcode.get(exc.errno or 0, str(exc.errno))
            os.write(write, result.encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        result = pipe.read().decode()
    os.waitpid(pid, 0)
    return result


def mode_of(path: Path) -> str:
    st = os.lstat(path)
    return f"{stat.filemode(st.st_mode)} nlink={st.st_nlink} size={st.st_size}"


# -- files -----------------------------------------------------------------------


@check
def create_excl_existing(d: Path) -> Any:
    (d / "f").write_text("x")
    os.open(d / "f", os.O_CREAT | os.O_EXCL | os.O_WRONLY)


@check
def open_missing(d: Path) -> Any:
    os.open(d / "missing", os.O_RDONLY)


@check
def open_dir_for_writing(d: Path) -> Any:
    (d / "sub").mkdir()
    os.open(d / "sub", os.O_WRONLY)


@check
def o_directory_on_file(d: Path) -> Any:
    (d / "f").write_text("x")
    os.open(d / "f", os.O_RDONLY | os.O_DIRECTORY)


@check
def o_trunc_and_sizes(d: Path) -> Any:
    (d / "f").write_bytes(b"x" * 10000)
    os.close(os.open(d / "f", os.O_WRONLY | os.O_TRUNC))
    return mode_of(d / "f")


@check
def truncate_grow_shrink(d: Path) -> Any:
    (d / "f").write_bytes(b"abc")
    os.truncate(d / "f", 10)
    grown = (d / "f").read_bytes()
    os.truncate(d / "f", 1)
    return grown, (d / "f").read_bytes()


@check
def ftruncate_on_open_file(d: Path) -> Any:
    fd = os.open(d / "f", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"hello world")
        os.ftruncate(fd, 5)
        return os.fstat(fd).st_size, os.pread(fd, 100, 0)
    finally:
        os.close(fd)


@check
def append_two_handles(d: Path) -> Any:
    a = os.open(d / "f", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    b = os.open(d / "f", os.O_WRONLY | os.O_APPEND)
    try:
        for i in range(3):
            os.write(a, b"a%d" % i)
            os.write(b, b"b%d" % i)
    finally:
        os.close(a)
        os.close(b)
    return (d / "f").read_bytes()


@check
def read_write_same_node_two_handles(d: Path) -> Any:
    writer = os.open(d / "f", os.O_WRONLY | os.O_CREAT, 0o644)
    reader = os.open(d / "f", os.O_RDONLY)
    try:
        os.write(writer, b"first")
        seen = os.pread(reader, 100, 0)
        os.write(writer, b" second")
        return seen, os.pread(reader, 100, 0)
    finally:
        os.close(writer)
        os.close(reader)


@check
def mmap_shared_write(d: Path) -> Any:
    (d / "f").write_bytes(b"\0" * 4096)
    fd = os.open(d / "f", os.O_RDWR)
    try:
        with mmap.mmap(fd, 4096) as m:
            m[:5] = b"mmap!"
            m.flush()
    finally:
        os.close(fd)
    return (d / "f").read_bytes()[:5]


@check
def unlinked_open_file(d: Path) -> Any:
    (d / "f").write_bytes(b"still here")
    fd = os.open(d / "f", os.O_RDONLY)
    try:
        os.unlink(d / "f")
        return os.pread(fd, 100, 0), os.fstat(fd).st_size, os.fstat(fd).st_nlink
    finally:
        os.close(fd)


@check
def fstat_after_rename(d: Path) -> Any:
    (d / "f").write_bytes(b"12345")
    fd = os.open(d / "f", os.O_RDONLY)
    try:
        os.rename(d / "f", d / "g")
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


@check
def fallocate_call(d: Path) -> Any:
    fd = os.open(d / "f", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
        if libc.fallocate(fd, 0, 0, 65536) != 0:
            raise OSError(ctypes.get_errno(), "fallocate")
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


@check
def posix_fallocate_call(d: Path) -> Any:
    fd = os.open(d / "f", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.posix_fallocate(fd, 0, 65536)
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


@check
def seek_hole_data(d: Path) -> Any:
    fd = os.open(d / "f", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, b"x", 1 << 20)
        return os.lseek(fd, 0, os.SEEK_DATA), os.lseek(fd, 0, os.SEEK_HOLE)
    finally:
        os.close(fd)


@check
def o_tmpfile(d: Path) -> Any:
    fd = os.open(d, os.O_TMPFILE | os.O_RDWR, 0o600)
    os.close(fd)
    return "ok"


@check
def copy_file_range_call(d: Path) -> Any:
    (d / "src").write_bytes(b"copy me" * 1000)
    src, dst = os.open(d / "src", os.O_RDONLY), os.open(d / "dst", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        return os.copy_file_range(src, dst, 7000)
    finally:
        os.close(src)
        os.close(dst)


@check
def flock_and_fcntl_locks(d: Path) -> Any:
    fd = os.open(d / "f", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return "locked"
    finally:
        os.close(fd)


# -- directories and names ----------------------------------------------------------


@check
def mkdir_existing(d: Path) -> Any:
    (d / "sub").mkdir()
    (d / "sub").mkdir()


@check
def rmdir_not_empty(d: Path) -> Any:
    (d / "sub").mkdir()
    (d / "sub" / "f").write_text("x")
    os.rmdir(d / "sub")


@check
def rmdir_of_file(d: Path) -> Any:
    (d / "f").write_text("x")
    os.rmdir(d / "f")


@check
def unlink_of_directory(d: Path) -> Any:
    (d / "sub").mkdir()
    os.unlink(d / "sub")


@check
def directory_nlink(d: Path) -> Any:
    (d / "sub").mkdir()
    (d / "sub" / "a").mkdir()
    (d / "sub" / "b").mkdir()
    return os.lstat(d / "sub").st_nlink


@check
def name_too_long(d: Path) -> Any:
    (d / ("n" * 256)).write_text("x")


@check
def rename_file_over_directory(d: Path) -> Any:
    (d / "f").write_text("x")
    (d / "sub").mkdir()
    os.rename(d / "f", d / "sub")


@check
def rename_directory_over_nonempty(d: Path) -> Any:
    (d / "a").mkdir()
    (d / "b").mkdir()
    (d / "b" / "f").write_text("x")
    os.rename(d / "a", d / "b")


@check
def rename_directory_into_itself(d: Path) -> Any:
    (d / "a").mkdir()
    os.rename(d / "a", d / "a" / "b")


@check
def rename_over_existing_file(d: Path) -> Any:
    (d / "a").write_text("new")
    (d / "b").write_text("old")
    os.rename(d / "a", d / "b")
    return sorted(os.listdir(d)), (d / "b").read_text()


@check
def rename_hard_links_of_one_file(d: Path) -> Any:
    (d / "a").write_text("x")
    os.link(d / "a", d / "b")
    os.rename(d / "a", d / "b")
    return sorted(os.listdir(d))


@check
def rename_noreplace(d: Path) -> Any:
    (d / "a").write_text("x")
    (d / "b").write_text("y")
    if libc.renameat2(-100, os.fsencode(d / "a"), -100, os.fsencode(d / "b"), 1) != 0:
        raise OSError(ctypes.get_errno(), "renameat2")


@check
def symlink_readlink_lstat(d: Path) -> Any:
    os.symlink("target/elsewhere", d / "l")
    return os.readlink(d / "l"), stat.S_ISLNK(os.lstat(d / "l").st_mode), os.lstat(d / "l").st_size


@check
def readlink_of_file(d: Path) -> Any:
    (d / "f").write_text("x")
    os.readlink(d / "f")


@check
def symlink_loop(d: Path) -> Any:
    os.symlink("b", d / "a")
    os.symlink("a", d / "b")
    os.open(d / "a", os.O_RDONLY)


@check
def hard_link_counts(d: Path) -> Any:
    (d / "a").write_text("x")
    os.link(d / "a", d / "b")
    return os.lstat(d / "a").st_nlink, os.lstat(d / "b").st_nlink


@check
def hard_link_same_inode_number(d: Path) -> Any:
    (d / "a").write_text("x")
    os.link(d / "a", d / "b")
    return os.lstat(d / "a").st_ino == os.lstat(d / "b").st_ino


@check
def inode_kept_across_renames(d: Path) -> Any:
    (d / "f").write_text("x")
    (d / "sub").mkdir()
    before = os.lstat(d / "f").st_ino, os.lstat(d / "sub").st_ino
    os.rename(d / "f", d / "g")
    os.rename(d / "g", d / "sub" / "h")
    os.rename(d / "sub", d / "dir")
    return before == (os.lstat(d / "dir" / "h").st_ino, os.lstat(d / "dir").st_ino)


@check
def hard_link_count_after_unlink_of_one_link(d: Path) -> Any:
    (d / "a").write_text("x")
    os.link(d / "a", d / "b")
    counts = [os.lstat(d / "a").st_nlink, os.lstat(d / "b").st_nlink]
    os.unlink(d / "b")
    return counts + [os.lstat(d / "a").st_nlink]


@check
def hard_link_to_directory(d: Path) -> Any:
    (d / "sub").mkdir()
    os.link(d / "sub", d / "l")


@check
def hard_link_existing_target(d: Path) -> Any:
    (d / "a").write_text("x")
    (d / "b").write_text("y")
    os.link(d / "a", d / "b")


@check
def mkfifo_and_socket(d: Path) -> Any:
    os.mkfifo(d / "p", 0o640)
    os.mknod(d / "s", stat.S_IFSOCK | 0o600)
    return mode_of(d / "p"), mode_of(d / "s")


@check
def mknod_char_device(d: Path) -> Any:
    os.mknod(d / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    fd = os.open(d / "null", os.O_WRONLY)
    os.close(fd)
    return mode_of(d / "null")


# -- attributes ------------------------------------------------------------------------


@check
def chmod_and_ctime(d: Path) -> Any:
    (d / "f").write_text("x")
    before = os.lstat(d / "f").st_ctime_ns
    time.sleep(0.01)
    os.chmod(d / "f", 0o600)
    return stat.filemode(os.lstat(d / "f").st_mode), os.lstat(d / "f").st_ctime_ns > before


@check
def chmod_of_symlink(d: Path) -> Any:
    os.symlink("x", d / "l")
    if libc.fchmodat(-100, os.fsencode(d / "l"), 0o600, 0x100) != 0:  # AT_SYMLINK_NOFOLLOW
        raise OSError(ctypes.get_errno(), "fchmodat")


@check
def chown_and_lchown(d: Path) -> Any:
    (d / "f").write_text("x")
    os.symlink("f", d / "l")
    os.chown(d / "f", 4242, 4343)
    os.lchown(d / "l", 4444, -1)
    return os.lstat(d / "f").st_uid, os.lstat(d / "f").st_gid, os.lstat(d / "l").st_uid


@check
def setuid_bit_cleared_by_write(d: Path) -> Any:
    (d / "f").write_text("x")
    os.chmod(d / "f", 0o4755)
    with open(d / "f", "a") as f:
        f.write("y")
    return stat.filemode(os.lstat(d / "f").st_mode)


@check
def other_users_write_clears_set_uid_and_set_gid(d: Path) -> Any:
    """nobody appends to root's world-writable files: set-uid goes, set-gid with group-exec goes,
    and set-gid without group-exec goes too (nobody is not in the file's group)."""
    modes = {}
    for mode in (0o4777, 0o6777, 0o2767):
        (d / f"f{mode:o}").write_text("x")
        os.chmod(d / f"f{mode:o}", mode)
        as_nobody(lambda mode=mode: os.write(os.open(d / f"f{mode:o}", os.O_WRONLY | os.O_APPEND), b"y"))
        modes[f"{mode:o}"] = stat.filemode(os.lstat(d / f"f{mode:o}").st_mode)
    return modes


@check
def other_users_rename_and_unlink_in_a_world_writable_directory(d: Path) -> Any:
    os.chmod(d, 0o777)
    (d / "roots").write_text("x")
    renamed = as_nobody(lambda: os.rename(d / "roots", d / "moved"))
    made = as_nobody(lambda: (d / "mine").write_text("y"))
    return renamed, made, as_nobody(lambda: os.rename(d / "mine", d / "mine2")), \
        as_nobody(lambda: os.unlink(d / "moved")), sorted(os.listdir(d))


@check
def other_users_rename_and_unlink_in_a_sticky_directory(d: Path) -> Any:
    os.chmod(d, 0o1777)
    (d / "roots").write_text("x")
    return as_nobody(lambda: os.rename(d / "roots", d / "moved")), as_nobody(lambda: os.unlink(d / "roots")), \
        as_nobody(lambda: (d / "mine").write_text("y")), as_nobody(lambda: os.rename(d / "mine", d / "mine2")), \
        as_nobody(lambda: os.unlink(d / "mine2")), sorted(os.listdir(d))


@check
def path_max_relative_path(d: Path) -> Any:
    """A 4,095-byte relative path of 255-byte names (what a system call takes), opened from its top."""
    top = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        parts = ["p" * 255] * 15
        for depth in range(1, len(parts) + 1):
            os.mkdir("/".join(parts[:depth]), dir_fd=top)
        path = "/".join(parts) + "/" + "f" * (4095 - 15 * 256)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=top)
        os.write(fd, b"deep")
        os.close(fd)
        return len(path), os.stat(path, dir_fd=top).st_size
    finally:
        os.close(top)


@check
def utimes_explicit_and_symlink(d: Path) -> Any:
    (d / "f").write_text("x")
    os.utime(d / "f", ns=(1_000_000_000_123, 2_000_000_000_456))
    os.symlink("f", d / "l")
    os.utime(d / "l", ns=(5_000_000_000, 6_000_000_000), follow_symlinks=False)
    return (os.lstat(d / "f").st_atime_ns, os.lstat(d / "f").st_mtime_ns, os.lstat(d / "l").st_mtime_ns,
            os.stat(d / "f").st_mtime_ns)


@check
def xattrs(d: Path) -> Any:
    (d / "f").write_text("x")
    os.setxattr(d / "f", "user.k", b"v")
    values = os.getxattr(d / "f", "user.k"), sorted(n for n in os.listxattr(d / "f") if not n.startswith("user.gmount"))
    os.removexattr(d / "f", "user.k")
    try:
        os.getxattr(d / "f", "user.k")
    except OSError as exc:
        return values, errno.errorcode[exc.errno or 0]
    return values, "still there"


@check
def statvfs_namemax(d: Path) -> Any:
    return os.statvfs(d).f_namemax, os.statvfs(d).f_bsize


def compare(mount: Path, export: Path) -> list[tuple[str, str, str]]:
    """Every check, run in the export and in the mount: (name, export's outcome, mount's outcome)."""
    tag = uuid.uuid4().hex[:8]
    results = []
    for name, func in CHECKS:
        outcomes = []
        for label, base in (("export", export), ("mount", mount)):
            directory = base / f"posix-{tag}" / label / name
            directory.mkdir(parents=True)
            outcomes.append(outcome(func, directory))
        results.append((name, outcomes[0], outcomes[1]))
    return results


def run(mount: Path, export: Path) -> int:
    results = compare(mount, export)
    differ = [name for name, there, here in results if there != here]
    for name, there, here in results:
        label = "same" if there == here else "deliberate" if name in DELIBERATE else "DIFF"
        print(f"{label:10} {name:58} {there} | {here}")
    print(f"{len(results) - len(differ)} of {len(results)} checks answer as the export's file system; "
          f"{len(differ)} differ ({len(set(differ) & set(DELIBERATE))} deliberately)")
    return 1 if set(differ) - set(DELIBERATE) else 0


if __name__ == "__main__":
    sys.exit(run(Path(sys.argv[1]), Path(sys.argv[2])))
