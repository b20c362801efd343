"""The export: every operation on a real directory, and no way out of it."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gmountpy.node import export as export_module
from gmountpy.node.export import Export, split_path
from gmountpy.protocol.attr import Attr

from .._trio import trio_test
from ..conftest import require

SECRET = b"the secret outside the export " * 10


@pytest.fixture
def base(tmp_path: Path) -> Path:
    """tmp/export (the export root) and tmp/outside (a directory it must never reach)."""
    (tmp_path / "export").mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(SECRET)
    return tmp_path


@pytest.fixture
def export(base: Path) -> Iterator[Export]:
    ex = Export(str(base / "export"))
    yield ex
    ex.close()


@pytest.fixture
def root(base: Path) -> Path:
    return base / "export"


@pytest.fixture
def outside(base: Path) -> Path:
    return base / "outside"


def read_all(ex: Export, path: str) -> bytes:
    fd = ex.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, 1 << 20, 0)
    finally:
        os.close(fd)


def raises_errno(code: int | tuple[int, ...], fn: Callable[..., Any], *args: Any) -> OSError:
    codes = code if isinstance(code, tuple) else (code,)
    with pytest.raises(OSError) as info:
        result = fn(*args)
        if isinstance(result, int) and fn.__name__ in ("open", "create"):
            os.close(result)
    assert info.value.errno in codes, f"{fn.__name__}{args}: {info.value!r}, wanted {codes}"
    return info.value


def xattrs_supported(path: Path) -> bool:
    try:
        os.setxattr(path, "user.gmount-test", b"1")
        os.removexattr(path, "user.gmount-test")
        return True
    except OSError:
        return False


# ---------------------------------------------------------------- paths


def test_split_path() -> None:
    assert split_path("/") == []
    assert split_path("/a") == ["a"]
    assert split_path("/a/b c/ü") == ["a", "b c", "ü"]
    assert split_path("/" + "x" * 255) == ["x" * 255]
    assert split_path("/..." ) == ["..."]
    assert split_path("/.hidden/..x") == [".hidden", "..x"]


@pytest.mark.parametrize("path, code", [
    ("", errno.EINVAL),
    ("a/b", errno.EINVAL),
    ("../outside/secret", errno.EINVAL),
    ("/..", errno.EINVAL),
    ("/../outside/secret", errno.EINVAL),
    ("/a/../../outside", errno.EINVAL),
    ("/a/..", errno.EINVAL),
    ("/.", errno.EINVAL),
    ("/./a", errno.EINVAL),
    ("/a/./b", errno.EINVAL),
    ("//a", errno.EINVAL),
    ("/a//b", errno.EINVAL),
    ("/a/", errno.EINVAL),
    ("/a\0b", errno.EINVAL),
    ("/\0", errno.EINVAL),
    ("/" + "x" * 256, errno.ENAMETOOLONG),
    ("/a/" + "é" * 128, errno.ENAMETOOLONG),       # 256 bytes in UTF-8
    ("/" + "\udcff" * 256, errno.ENAMETOOLONG),    # 256 raw bytes
])
def test_forbidden_paths_are_refused_by_every_operation(export: Export, root: Path, path: str, code: int) -> None:
    (root / "a").mkdir()
    before = sorted(os.listdir(root))
    operations: list[tuple[Callable[..., Any], tuple[Any, ...]]] = [
        (export.lstat, (path,)), (export.listdir, (path,)), (export.readlink, (path,)),
        (export.open, (path, os.O_RDONLY)), (export.create, (path, os.O_WRONLY, 0o644)),
        (export.mkdir, (path, 0o755)), (export.symlink, ("t", path)), (export.unlink, (path,)),
        (export.rmdir, (path,)), (export.rename, (path, "/ok")), (export.rename, ("/a", path)),
        (export.chmod, (path, 0o600)), (export.truncate, (path, 0)), (export.utimens, (path, 0, 0)),
        (export.getxattr, (path, "user.x")), (export.setxattr, (path, "user.x", b"v")),
        (export.listxattr, (path,)), (export.removexattr, (path, "user.x")), (export.local_path, (path,)),
    ]
    for fn, args in operations:
        raises_errno(code, fn, *args)
    assert sorted(os.listdir(root)) == before


@pytest.mark.parametrize("bad", [b"/a", None, 3, ["/a"]])
def test_non_string_paths_are_refused(export: Export, bad: Any) -> None:
    raises_errno(errno.EINVAL, export.lstat, bad)
    raises_errno(errno.EINVAL, export.create, bad, os.O_WRONLY, 0o644)


def test_absolute_paths_are_namespace_paths_not_host_paths(export: Export, root: Path, outside: Path) -> None:
    """'/tmp/.../outside/secret' names a file under the export root, never the host's file."""
    host_path = str(outside / "secret")
    raises_errno(errno.ENOENT, export.lstat, host_path)
    raises_errno(errno.ENOENT, export.open, host_path, os.O_RDONLY)
    fd = export.create(host_path, os.O_WRONLY, 0o644)
    os.close(fd)
    assert (root / host_path.lstrip("/")).is_file()
    assert (outside / "secret").read_bytes() == SECRET
    assert export.local_path(host_path) == str(root / host_path.lstrip("/"))


def test_root_cannot_be_removed_or_renamed(export: Export) -> None:
    raises_errno(errno.EBUSY, export.unlink, "/")
    raises_errno(errno.EBUSY, export.rmdir, "/")
    raises_errno(errno.EBUSY, export.rename, "/", "/x")
    raises_errno(errno.EBUSY, export.mkdir, "/", 0o755)


def test_export_root_given_through_a_symlink_is_resolved_once(base: Path) -> None:
    os.symlink(base / "export", base / "link-to-export")
    ex = Export(str(base / "link-to-export"))
    try:
        assert ex.root == str(base / "export")
        assert ex.lstat("/").is_dir
    finally:
        ex.close()


# ---------------------------------------------------------------- metadata


def test_lstat(export: Export, root: Path) -> None:
    (root / "f").write_bytes(b"12345")
    attr = export.lstat("/f")
    st_ = os.lstat(root / "f")
    assert attr == Attr.from_stat(st_, os.stat(root).st_dev)
    assert (attr.dev, attr.ino) == (0, st_.st_ino)  # 0: the export's own file system
    assert Attr.from_stat(st_).dev == st_.st_dev  # another file system's files keep their device
    assert attr.is_file and not attr.is_dir and attr.size == 5
    assert export.lstat("/").is_dir
    raises_errno(errno.ENOENT, export.lstat, "/missing")
    raises_errno(errno.ENOTDIR, export.lstat, "/f/below-a-file")


def test_attr_wire_round_trip() -> None:
    attr = Attr.from_stat(os.stat("/"))
    assert Attr.from_wire(list(attr)) == attr
    with pytest.raises(ValueError):
        Attr.from_wire([1, 2, 3])
    with pytest.raises(ValueError):
        Attr.from_wire([*attr[:-1], "x"])  # type: ignore[list-item]


def test_listdir_returns_attributes_without_following_symlinks(export: Export, root: Path, outside: Path) -> None:
    (root / "d").mkdir()
    (root / "d" / "f").write_bytes(b"abc")
    (root / "d" / "sub").mkdir()
    os.symlink(outside, root / "d" / "out")
    entries = dict(export.listdir("/d"))
    assert set(entries) == {"f", "sub", "out"}
    for name, attr in entries.items():
        assert attr == Attr.from_stat(os.lstat(root / "d" / name), os.stat(root).st_dev), name
    assert stat.S_ISLNK(entries["out"].mode)
    assert entries["sub"].is_dir and entries["f"].size == 3
    assert {name for name, _ in export.listdir("/")} == {"d"}
    assert export.listdir("/d/sub") == []
    raises_errno(errno.ENOENT, export.listdir, "/missing")
    raises_errno(errno.ENOTDIR, export.listdir, "/d/f")


def test_statfs(export: Export) -> None:
    values = export.statfs()
    assert len(values) == 9 and values[-1] == 255 and values[0] > 0


def test_readlink(export: Export, root: Path) -> None:
    os.symlink("../../anywhere", root / "l")
    assert export.readlink("/l") == "../../anywhere"
    (root / "f").touch()
    raises_errno(errno.EINVAL, export.readlink, "/f")


def test_local_path(export: Export, root: Path) -> None:
    (root / "d").mkdir()
    (root / "d" / "f").touch()
    assert export.local_path("/d/f") == str(root / "d" / "f")
    assert export.local_path("/") == str(root)
    raises_errno(errno.ENOENT, export.local_path, "/d/missing")


# ---------------------------------------------------------------- files


def test_open_read_write_at_offsets(export: Export, root: Path) -> None:
    (root / "f").write_bytes(b"0123456789")
    fd = export.open("/f", os.O_RDWR)
    try:
        assert os.pread(fd, 4, 3) == b"3456"
        os.pwrite(fd, b"xy", 8)
        os.pwrite(fd, b"!", 12)
    finally:
        os.close(fd)
    assert (root / "f").read_bytes() == b"01234567xy\0\0!"


def test_open_does_not_create_and_strips_o_direct(export: Export, root: Path) -> None:
    raises_errno(errno.ENOENT, export.open, "/missing", os.O_RDWR | os.O_CREAT)
    assert not (root / "missing").exists()
    (root / "f").write_bytes(b"x" * 4096)
    fd = export.open("/f", os.O_RDONLY | os.O_DIRECT)
    try:
        import fcntl
        assert not fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT
        assert os.pread(fd, 3, 1) == b"xxx"  # unaligned: would fail with O_DIRECT
    finally:
        os.close(fd)


def test_open_keeps_o_trunc_and_o_append(export: Export, root: Path) -> None:
    (root / "f").write_bytes(b"old")
    os.close(export.open("/f", os.O_WRONLY | os.O_TRUNC))
    assert (root / "f").read_bytes() == b""
    fd = export.open("/f", os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, b"a")
        os.write(fd, b"b")
    finally:
        os.close(fd)
    assert (root / "f").read_bytes() == b"ab"


def test_create_makes_parents(export: Export, root: Path) -> None:
    fd = export.create("/new/deep/dir/f", os.O_WRONLY, 0o640)
    try:
        os.write(fd, b"hello")
    finally:
        os.close(fd)
    assert (root / "new" / "deep" / "dir" / "f").read_bytes() == b"hello"
    assert (root / "new" / "deep").is_dir()
    assert stat.S_IMODE(os.stat(root / "new" / "deep" / "dir" / "f").st_mode) == 0o640 & ~current_umask()


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_create_without_parents_and_exclusive(export: Export, root: Path) -> None:
    raises_errno(errno.ENOENT, export.create, "/nodir/f", os.O_WRONLY, 0o644, False)
    assert not (root / "nodir").exists()
    os.close(export.create("/f", os.O_WRONLY | os.O_EXCL, 0o644))
    raises_errno(errno.EEXIST, export.create, "/f", os.O_WRONLY | os.O_EXCL, 0o644)
    (root / "f").write_bytes(b"kept")
    os.close(export.create("/f", os.O_RDONLY, 0o644))  # not exclusive: opens the existing file
    assert (root / "f").read_bytes() == b"kept"
    (root / "file").touch()
    raises_errno(errno.ENOTDIR, export.create, "/file/f", os.O_WRONLY, 0o644)


def test_mkdir(export: Export, root: Path) -> None:
    attr = export.mkdir("/a/b/c", 0o750)
    assert attr.is_dir and (root / "a" / "b" / "c").is_dir()
    raises_errno(errno.EEXIST, export.mkdir, "/a/b/c", 0o755)
    raises_errno(errno.ENOENT, export.mkdir, "/x/y", 0o755, False)


def test_symlink_is_made_but_never_followed(export: Export, root: Path, outside: Path) -> None:
    attr = export.symlink(str(outside / "secret"), "/links/s")
    assert stat.S_ISLNK(attr.mode) and attr.size == len(str(outside / "secret"))
    assert os.readlink(root / "links" / "s") == str(outside / "secret")
    raises_errno(errno.ELOOP, export.open, "/links/s", os.O_RDONLY)
    raises_errno(errno.EINVAL, export.symlink, "bad\0target", "/t")
    raises_errno(errno.EEXIST, export.symlink, "x", "/links/s")


def test_unlink_and_rmdir(export: Export, root: Path) -> None:
    (root / "d").mkdir()
    (root / "d" / "f").touch()
    raises_errno((errno.EISDIR, errno.EPERM), export.unlink, "/d")
    raises_errno(errno.ENOTEMPTY, export.rmdir, "/d")
    raises_errno(errno.ENOTDIR, export.rmdir, "/d/f")
    export.unlink("/d/f")
    export.rmdir("/d")
    assert os.listdir(root) == []
    raises_errno(errno.ENOENT, export.unlink, "/d/f")


def test_rename_creates_destination_parents(export: Export, root: Path) -> None:
    (root / "f").write_bytes(b"data")
    export.rename("/f", "/x/y/z/g")
    assert (root / "x" / "y" / "z" / "g").read_bytes() == b"data" and not (root / "f").exists()
    (root / "other").write_bytes(b"replaced")
    export.rename("/x/y/z/g", "/other")
    assert (root / "other").read_bytes() == b"data"
    (root / "dir" / "sub").mkdir(parents=True)
    (root / "dir" / "sub" / "leaf").touch()
    export.rename("/dir", "/moved/dir2")
    assert (root / "moved" / "dir2" / "sub" / "leaf").exists() and not (root / "dir").exists()
    raises_errno(errno.ENOENT, export.rename, "/missing", "/anything")
    assert not (root / "anything").exists()


def test_a_failed_rename_makes_no_destination_directories(export: Export, root: Path) -> None:
    raises_errno(errno.ENOENT, export.rename, "/missing", "/new/parents/dst")
    raises_errno(errno.ENOENT, export.rename, "/no/such/dir/src", "/new/parents/dst")
    assert not (root / "new").exists()


def test_chmod(export: Export, root: Path, outside: Path) -> None:
    (root / "f").touch()
    attr = export.chmod("/f", 0o600)
    assert stat.S_IMODE(attr.mode) == 0o600 == stat.S_IMODE(os.stat(root / "f").st_mode)
    os.symlink(outside / "secret", root / "l")
    mode = os.stat(outside / "secret").st_mode
    raises_errno(errno.EOPNOTSUPP, export.chmod, "/l", 0o777)
    assert os.stat(outside / "secret").st_mode == mode


def test_truncate(export: Export, root: Path) -> None:
    (root / "f").write_bytes(b"0123456789")
    assert export.truncate("/f", 4).size == 4
    assert (root / "f").read_bytes() == b"0123"
    assert export.truncate("/f", 6).size == 6
    assert (root / "f").read_bytes() == b"0123\0\0"
    (root / "d").mkdir()
    raises_errno(errno.EISDIR, export.truncate, "/d", 0)


def test_utimens(export: Export, root: Path) -> None:
    (root / "f").touch()
    attr = export.utimens("/f", 1_000_000_000_123, 2_000_000_000_456)
    assert (attr.atime_ns, attr.mtime_ns) == (1_000_000_000_123, 2_000_000_000_456)
    attr = export.utimens("/f", None, 3_000_000_000_000)
    assert (attr.atime_ns, attr.mtime_ns) == (1_000_000_000_123, 3_000_000_000_000)
    attr = export.utimens("/f", 5, None)
    assert (attr.atime_ns, attr.mtime_ns) == (5, 3_000_000_000_000)
    assert os.stat(root / "f").st_mtime_ns == 3_000_000_000_000


def test_xattrs(export: Export, root: Path) -> None:
    require("user xattrs", None if xattrs_supported(root) else "the test directory's file system has none")
    (root / "f").touch()
    export.setxattr("/f", "user.color", b"blue")
    assert export.getxattr("/f", "user.color") == b"blue"
    assert "user.color" in export.listxattr("/f")
    assert os.getxattr(root / "f", "user.color") == b"blue"
    export.removexattr("/f", "user.color")
    raises_errno(errno.ENODATA, export.getxattr, "/f", "user.color")
    export.setxattr("/", "user.on-root", b"r")
    assert export.getxattr("/", "user.on-root") == b"r"
    (root / "d").mkdir()
    export.setxattr("/d", "user.on-dir", b"d")
    assert os.getxattr(root / "d", "user.on-dir") == b"d"
    raises_errno(errno.ENOENT, export.getxattr, "/missing", "user.x")


# ---------------------------------------------------------------- symlinks: never followed


@pytest.fixture
def planted(root: Path, outside: Path) -> Path:
    """Symlinks in the export to outside (dir, file, dangling) and inside."""
    (root / "d").mkdir()
    (root / "d" / "f").write_bytes(b"inside")
    os.symlink(outside, root / "out")
    os.symlink(outside / "secret", root / "outfile")
    os.symlink(outside / "created-through-link", root / "dangling")
    os.symlink("d", root / "in")
    os.symlink("d/f", root / "infile")
    if xattrs_supported(outside / "secret"):
        os.setxattr(outside / "secret", "user.secret", SECRET)
    return root


def _outcome(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """What a call returns, or the errno it fails with."""
    try:
        return fn(*args, **kwargs)
    except OSError as exc:
        return exc.errno


def snapshot(top: Path, skip: Path | None = None) -> dict[str, Any]:
    """Everything observable about a tree, without following symlinks."""
    state: dict[str, Any] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        if skip is not None and Path(dirpath) == skip.parent:
            dirnames[:] = [d for d in dirnames if Path(dirpath, d) != skip]
        for name in [".", *dirnames, *filenames]:
            path = Path(dirpath, name)
            st_ = os.lstat(path)
            entry: list[Any] = [st_.st_mode, st_.st_size, st_.st_mtime_ns, st_.st_ctime_ns, st_.st_nlink]
            if stat.S_ISREG(st_.st_mode):
                entry.append(path.read_bytes())
            if stat.S_ISLNK(st_.st_mode):
                entry.append(os.readlink(path))
            else:
                try:
                    entry.append(sorted((n, os.getxattr(path, n)) for n in os.listxattr(path)))
                except OSError:
                    pass
            state[str(path.relative_to(top))] = entry
    return state


def test_symlinks_to_outside_are_never_followed(export: Export, planted: Path, outside: Path) -> None:
    before = snapshot(outside)
    link = export.lstat("/out")
    assert stat.S_ISLNK(link.mode) and not link.is_dir
    assert stat.S_ISLNK(export.lstat("/outfile").mode)
    for path in ("/out/secret", "/in/f"):
        raises_errno(errno.ENOTDIR, export.lstat, path)
        raises_errno(errno.ENOTDIR, export.open, path, os.O_RDONLY)
        raises_errno(errno.ENOTDIR, export.truncate, path, 0)
        raises_errno(errno.ENOTDIR, export.chmod, path, 0o777)
        raises_errno(errno.ENOTDIR, export.utimens, path, 0, 0)
        raises_errno(errno.ENOTDIR, export.getxattr, path, "user.secret")
        raises_errno(errno.ENOTDIR, export.listxattr, path)
        raises_errno(errno.ENOTDIR, export.setxattr, path, "user.x", b"1")
        raises_errno(errno.ENOTDIR, export.unlink, path)
        raises_errno(errno.ENOTDIR, export.local_path, path)
        raises_errno(errno.ENOTDIR, export.readlink, path)
    for path in ("/out", "/in"):
        raises_errno(errno.ENOTDIR, export.listdir, path)
        raises_errno(errno.ENOTDIR, export.rmdir, path)
    for path in ("/outfile", "/infile", "/out", "/dangling"):
        raises_errno(errno.ELOOP, export.open, path, os.O_RDONLY)
        raises_errno(errno.ELOOP, export.open, path, os.O_WRONLY | os.O_TRUNC)
        raises_errno(errno.ELOOP, export.truncate, path, 0)
        raises_errno(errno.EOPNOTSUPP, export.chmod, path, 0o777)
        # xattrs act on the link itself, as ext4's l*xattr calls do: never on its target
        raises_errno(errno.ENODATA, export.getxattr, path, "user.secret")
        assert _outcome(export.getxattr, path, "security.selinux") == _outcome(  # what `ls -l` asks
            os.getxattr, str(planted) + path, "security.selinux", follow_symlinks=False)  # as the disk answers
        assert export.listxattr(path) == []
        raises_errno(errno.EPERM, export.setxattr, path, "user.x", b"1")  # no user.* on a symlink
        raises_errno(errno.EPERM, export.removexattr, path, "user.secret")
        # utimens touches the link itself, never its target
        export.utimens(path, 7, 7)
        assert export.lstat(path).mtime_ns == 7
    assert snapshot(outside) == before


def test_creating_under_a_symlinked_directory_fails_instead_of_writing_outside(
        export: Export, planted: Path, outside: Path) -> None:
    before = snapshot(outside)
    for path in ("/out/new", "/out/sub/new", "/in/new"):
        raises_errno(errno.ENOTDIR, export.create, path, os.O_WRONLY, 0o644)
        raises_errno(errno.ENOTDIR, export.mkdir, path, 0o755)
        raises_errno(errno.ENOTDIR, export.symlink, "x", path)
        raises_errno(errno.ENOTDIR, export.rename, "/d/f", path)
    raises_errno(errno.ELOOP, export.create, "/dangling", os.O_WRONLY, 0o644)
    raises_errno(errno.EEXIST, export.create, "/dangling", os.O_WRONLY | os.O_EXCL, 0o644)
    raises_errno(errno.ELOOP, export.create, "/outfile", os.O_WRONLY | os.O_TRUNC, 0o644)
    raises_errno(errno.EEXIST, export.mkdir, "/dangling", 0o755)
    assert snapshot(outside) == before
    assert (planted / "d" / "f").read_bytes() == b"inside"


def test_removing_and_renaming_a_symlink_acts_on_the_link(export: Export, planted: Path, outside: Path) -> None:
    before = snapshot(outside)
    export.rename("/outfile", "/moved/link")
    assert os.readlink(planted / "moved" / "link") == str(outside / "secret")
    export.unlink("/moved/link")
    export.unlink("/out")
    assert snapshot(outside) == before


def test_a_directory_swapped_for_a_symlink_between_calls(export: Export, root: Path, outside: Path) -> None:
    (outside / "f").write_bytes(SECRET)
    fd = export.create("/d/f", os.O_WRONLY, 0o644)
    os.write(fd, b"inside")
    os.close(fd)
    assert read_all(export, "/d/f") == b"inside"
    before = snapshot(outside)
    os.rename(root / "d", root / "d.old")
    os.symlink(outside, root / "d")
    raises_errno(errno.ENOTDIR, export.lstat, "/d/f")
    raises_errno(errno.ENOTDIR, export.open, "/d/f", os.O_RDONLY)
    raises_errno(errno.ENOTDIR, export.create, "/d/f", os.O_WRONLY | os.O_TRUNC, 0o644)
    raises_errno(errno.ENOTDIR, export.create, "/d/g", os.O_WRONLY, 0o644)
    raises_errno(errno.ENOTDIR, export.truncate, "/d/f", 0)
    raises_errno(errno.ENOTDIR, export.listdir, "/d")
    raises_errno(errno.ENOTDIR, export.unlink, "/d/f")
    raises_errno(errno.ENOTDIR, export.rename, "/d/f", "/stolen")
    assert snapshot(outside) == before
    # and back: a real directory again works again
    os.unlink(root / "d")
    os.rename(root / "d.old", root / "d")
    assert read_all(export, "/d/f") == b"inside"


def test_a_descriptor_opened_before_a_swap_stays_on_the_inside_file(export: Export, root: Path,
                                                                    outside: Path) -> None:
    (root / "d").mkdir()
    (root / "d" / "f").write_bytes(b"inside")
    fd = export.open("/d/f", os.O_RDONLY)
    try:
        os.rename(root / "d", root / "d.old")
        os.symlink(outside, root / "d")
        assert os.pread(fd, 100, 0) == b"inside"
    finally:
        os.close(fd)


# ---------------------------------------------------------------- hostile paths, generated

_OUTSIDE_MARKER = "only-outside-marker"
_NAMES = ["out", "outfile", "dangling", "in", "infile", "d", "f", "up", "upup", "abs", "loop", "secret", "new",
          "outside", "..."]
_FORBIDDEN = ["..", ".", "", "x\0y", "\0"]


def hostile_paths() -> st.SearchStrategy[str]:
    """Mostly walkable paths through the planted symlinks, now and then a forbidden component."""
    components = st.lists(st.sampled_from(_NAMES * 6 + _FORBIDDEN), min_size=1, max_size=3)
    prefix = st.sampled_from(["/"] * 12 + ["", "//", "../", "/../"])
    return st.tuples(prefix, components).map(lambda pair: pair[0] + "/".join(pair[1]))


_OPERATIONS = ["lstat", "listdir", "readlink", "read", "write", "truncate_open", "create", "create_excl",
               "mkdir", "symlink", "unlink", "rmdir", "rename", "chmod", "truncate", "utimens", "getxattr",
               "setxattr", "listxattr", "removexattr", "local_path"]


def run_operation(ex: Export, op: str, path: str, other: str) -> Any:
    if op == "read":
        fd = ex.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            return os.pread(fd, 1 << 16, 0)
        finally:
            os.close(fd)
    if op in ("write", "truncate_open", "create", "create_excl"):
        flags = os.O_WRONLY | os.O_NONBLOCK
        if op == "truncate_open":
            flags |= os.O_TRUNC
        if op == "create_excl":
            flags |= os.O_EXCL
        fd = ex.open(path, flags) if op in ("write", "truncate_open") else ex.create(path, flags, 0o644)
        try:
            os.pwrite(fd, b"OVERWRITTEN", 0)
        finally:
            os.close(fd)
        return None
    call: dict[str, Callable[[], Any]] = {
        "lstat": lambda: ex.lstat(path),
        "listdir": lambda: ex.listdir(path),
        "readlink": lambda: ex.readlink(path),
        "mkdir": lambda: ex.mkdir(path, 0o777),
        "symlink": lambda: ex.symlink(other, path),
        "unlink": lambda: ex.unlink(path),
        "rmdir": lambda: ex.rmdir(path),
        "rename": lambda: ex.rename(path, other),
        "chmod": lambda: ex.chmod(path, 0o777),
        "truncate": lambda: ex.truncate(path, 0),
        "utimens": lambda: ex.utimens(path, 1, 1),
        "getxattr": lambda: ex.getxattr(path, "user.secret"),
        "setxattr": lambda: ex.setxattr(path, "user.secret", b"OVERWRITTEN"),
        "listxattr": lambda: ex.listxattr(path),
        "removexattr": lambda: ex.removexattr(path, "user.secret"),
        "local_path": lambda: ex.local_path(path),
    }
    return call[op]()


def make_hostile_world() -> tuple[Path, Path, Path]:
    base = Path(tempfile.mkdtemp(prefix="gm-export-fuzz-"))
    root, outside = base / "export", base / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret").write_bytes(SECRET)
    (outside / _OUTSIDE_MARKER).mkdir()
    (outside / "d").mkdir()
    (outside / "d" / "f").write_bytes(SECRET)
    try:
        os.setxattr(outside / "secret", "user.secret", SECRET)
    except OSError:
        pass
    (root / "d").mkdir()
    (root / "d" / "f").write_bytes(b"inside")
    os.symlink(outside, root / "out")
    os.symlink(outside / "secret", root / "outfile")
    os.symlink(outside / "new", root / "dangling")
    os.symlink("d", root / "in")
    os.symlink("d/f", root / "infile")
    os.symlink("..", root / "up")
    os.symlink("../..", root / "d" / "upup")
    os.symlink("/", root / "abs")
    os.symlink("loop", root / "loop")
    os.symlink(outside, root / "d" / "out")
    return base, root, outside


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(_OPERATIONS), hostile_paths(), hostile_paths()), min_size=1, max_size=6))
def test_no_hostile_path_reaches_outside_the_export(steps: list[tuple[str, str, str]]) -> None:
    base, root, outside = make_hostile_world()
    ex = Export(str(root))
    try:
        before = snapshot(base, skip=root)
        for op, path, other in steps:
            try:
                result = run_operation(ex, op, path, other)
            except OSError as exc:
                event(f"{errno.errorcode.get(exc.errno or 0, exc.errno)}")
                continue
            event(f"ok {op}")
            if isinstance(result, bytes):
                assert SECRET not in result, f"{op} {path!r} read the secret"
            if op == "listdir":
                assert _OUTSIDE_MARKER not in {name for name, _ in result}, f"listdir {path!r} listed outside"
                assert all(attr.size != len(SECRET) for _, attr in result)
            if op == "lstat":
                assert result.size != len(SECRET), f"lstat {path!r} saw the secret file"
            if op == "listxattr":
                assert "user.secret" not in result
            if op == "local_path":
                assert result.startswith(str(root) + "/") or result == str(root)
                assert ".." not in result.split("/")
        assert snapshot(base, skip=root) == before
    finally:
        ex.close()
        shutil.rmtree(base)


# ---------------------------------------------------------------- short writes


@trio_test
async def test_a_write_cut_short_by_a_full_disk_returns_what_landed(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """On a file system that takes RWF_NOWAIT writes (xfs, btrfs) the part that could not be written
    without waiting goes to a worker thread; if the disk fills there, the write returns the bytes
    the first part stored (a short write), never an error that hides them."""
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    real_pwritev = os.pwritev

    def nowait_then_full(fd: int, buffers: list[bytes], offset: int, flags: int = 0) -> int:
        return real_pwritev(fd, [buffers[0][:1000]], offset)  # as xfs: some pages without waiting

    def full(*args: Any) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(export_module, "_nowait_writes", True)
    monkeypatch.setattr(os, "pwritev", nowait_then_full)
    monkeypatch.setattr(os, "pwrite", full)
    try:
        assert await export_module.pwrite(fd, b"x" * 5000, 0) == 1000
        assert os.fstat(fd).st_size == 1000
        monkeypatch.setattr(os, "pwritev", lambda *args: (_ for _ in ()).throw(OSError(errno.EAGAIN, "would block")))
        with pytest.raises(OSError) as info:  # nothing landed: the error
            await export_module.pwrite(fd, b"x" * 5000, 1000)
        assert info.value.errno == errno.ENOSPC
    finally:
        os.close(fd)
