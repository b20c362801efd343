"""The local bypass through real mounts: jobs gmount starts use their node's files straight from the export.

A 4-node, 2-site cluster (n1 n2 | n3 n4) with kernel passthrough off, so the mount is
the daemon's path and every direct access is the preload library's. Jobs run with
`Cluster.run` (what `gmount run`, gmount-sh and the executors use). Each program can
write its counters to GMOUNT_BYPASS_STATS (one line per process): evidence of which
opens and stats went straight to the export. The TTLs are long (attr 2 s), so a
home that did not learn a size would still be answering with the old one when the
next job looks.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gmountpy import Cluster, launch
from gmountpy.jobs import bypass
from gmountpy.protocol.client import call, run_sync

from ..conftest import FOUR_NODE_LINKS, FOUR_NODES, LocalCluster, fuse_problem, local_cluster, require, wait_for

TUNING = "attr_ttl = 2.0\nnegative_ttl = 2.0\npassthrough = false"

#: A compiled program: copies SRC to DST with read/write, checks mmap and pread of SRC agree.
RW_C = r"""
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int in = open(argv[1], O_RDONLY), out = open(argv[2], O_WRONLY | O_CREAT | O_TRUNC, 0644);
    struct stat st;
    if (in < 0 || out < 0 || fstat(in, &st) != 0) { perror("open"); return 2; }
    char *map = st.st_size ? mmap(NULL, st.st_size, PROT_READ, MAP_SHARED, in, 0) : NULL;
    static char buf[65536];
    long total = 0;
    for (ssize_t n; (n = read(in, buf, sizeof buf)) > 0; total += n) {
        if (map && memcmp(map + total, buf, n) != 0) { fprintf(stderr, "mmap differs\n"); return 3; }
        if (write(out, buf, n) != n) { perror("write"); return 4; }
    }
    if (total != st.st_size || close(out) != 0) { fprintf(stderr, "short copy\n"); return 5; }
    printf("%ld\n", total);
    return 0;
}
"""


def compiler_problem() -> str | None:
    return None if shutil.which("gcc") else "gcc is not installed (Debian package gcc)"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    require("FUSE", fuse_problem())
    require("the bypass library", None if bypass.library() else f"{bypass.LIBRARY} was not built")
    base = tmp_path_factory.mktemp("bypass")
    with local_cluster(base, f"bp-{os.getpid()}", FOUR_NODES, FOUR_NODE_LINKS, TUNING) as running:
        yield running


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The copy program, dynamically and statically linked."""
    require("a C compiler", compiler_problem())
    where = tmp_path_factory.mktemp("rw")
    (where / "rw.c").write_text(RW_C)
    built = {"dynamic": where / "rw", "static": where / "rw-static"}
    subprocess.run(["gcc", "-O2", "-o", built["dynamic"], where / "rw.c"], check=True)
    subprocess.run(["gcc", "-O2", "-static", "-o", built["static"], where / "rw.c"], check=True)
    return built


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def counters(path: Path) -> dict[str, int]:
    """The sums of the library's per-process counters written to GMOUNT_BYPASS_STATS `path`."""
    total: dict[str, int] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            for field in line.split()[1:]:
                key, value = field.split("=")
                total[key] = total.get(key, 0) + int(value)
    return total


def served(cluster: LocalCluster, node: str) -> dict[str, int]:
    return dict(run_sync(call, cluster.state, node, "stats")["bypass"])


def job(cluster: LocalCluster, node: str, cwd: str, script: str) -> str:
    result = Cluster.open(cluster.spec.name).run(script, on=node, cwd=cwd)
    assert result.returncode == 0, f"job on {node} failed ({result.returncode}): {result.stderr}"
    return result.stdout


def test_jobs_get_the_library_and_read_and_write_correct_bytes(cluster: LocalCluster, programs: dict[str, Path],
                                                                 tmp_path: Path) -> None:
    top = unique("bp-rw")
    (cluster.mount("n1") / top).mkdir()
    local = os.urandom(3 * 1024 * 1024 + 17)
    remote = os.urandom(700_000)
    (cluster.mount("n1") / top / "local.bin").write_bytes(local)
    (cluster.mount("n3") / top / "remote.bin").write_bytes(remote)
    stats = tmp_path / "stats"
    stats.mkdir()
    before = served(cluster, "n1")
    script = f"""
        echo "$LD_PRELOAD" > preload.txt
        GMOUNT_BYPASS_STATS={stats}/cat cat local.bin > cat.out
        GMOUNT_BYPASS_STATS={stats}/cp cp local.bin cp.out
        GMOUNT_BYPASS_STATS={stats}/dd dd if=local.bin of=dd.out bs=64k status=none
        GMOUNT_BYPASS_STATS={stats}/py {sys.executable} -c '
import os
data = open("local.bin", "rb").read()
with open("py.out", "wb") as f:
    f.write(data)
os.stat("local.bin"); os.stat("remote.bin")'
        GMOUNT_BYPASS_STATS={stats}/c {programs["dynamic"]} local.bin c.out > /dev/null
        GMOUNT_BYPASS_STATS={stats}/remote cat remote.bin > remote.out
    """
    job(cluster, "n1", f"/{top}", script)
    assert (cluster.mount("n1") / top / "preload.txt").read_text().split()[0] == bypass.library()
    expected = {"cat.out": local, "cp.out": local, "dd.out": local, "py.out": local, "c.out": local,
                "remote.out": remote}
    for name, data in expected.items():
        # the outputs are on n1's disk, and another node reads exactly them -- size at once, from the home
        assert (cluster.export("n1") / top / name).read_bytes() == data, name
        assert (cluster.mount("n4") / top / name).stat().st_size == len(data), name
        assert (cluster.mount("n3") / top / name).read_bytes() == data, name
    for program in ("cat", "cp", "dd", "py", "c"):
        seen = counters(stats / program)
        assert seen.get("open_direct", 0) >= 1, (program, seen)  # it read local.bin from the export
    assert counters(stats / "py")["stat_direct"] >= 1  # os.stat of local.bin (remote.bin and directories: the mount)
    remote_counts = counters(stats / "remote")
    assert remote_counts["open_direct"] == 0 and remote_counts["open_mount"] == 1  # n3's file: through the mount
    after = served(cluster, "n1")
    assert after["W"] - before["W"] >= 5 and after["C"] - before["C"] >= 5  # outputs written and closed directly
    # the bytes still count as n1's local reads and writes, to the byte (what locality reports add up),
    # also those of programs writing through a descriptor the shell opened for them (`> cat.out`)
    preload_line = len((cluster.mount("n1") / top / "preload.txt").read_bytes())
    assert after["bytes_read"] - before["bytes_read"] == 5 * len(local)
    assert after["bytes_written"] - before["bytes_written"] == 5 * len(local) + len(remote) + preload_line
    counted = Cluster.open(cluster.spec.name).counters()["n1"]
    assert counted["read_local"] >= 5 * len(local) and counted["write_local"] >= 5 * len(local) + len(remote)
    # A job on n3 reads n1's outputs as it would have before: from n1, through its own mount
    digest = job(cluster, "n3", f"/{top}", "sha256sum c.out py.out").split()
    assert digest[0] == digest[2] == hashlib.sha256(local).hexdigest()


def test_a_stat_through_the_bypass_is_the_mounts(cluster: LocalCluster, tmp_path: Path) -> None:
    """stat, lstat, fstat and statx of a local file in a job show what a stat through the mount
    shows -- the mount's st_dev, the file's identity as st_ino (the same on every node), st_nlink
    -- not the export's numbers, though they are answered from the export."""
    top = unique("bp-stat")
    (cluster.mount("n1") / top).mkdir()
    (cluster.mount("n1") / top / "a.txt").write_bytes(b"x" * 1000)
    os.link(cluster.mount("n1") / top / "a.txt", cluster.mount("n1") / top / "b.txt")
    stats = tmp_path / "stats"
    script = f"""
        GMOUNT_BYPASS_STATS={stats} {sys.executable} -c '
import os
fd = os.open("a.txt", os.O_RDONLY)
for st in (os.stat("a.txt"), os.lstat("b.txt"), os.fstat(fd), os.stat("a.txt", dir_fd=None)):
    print(st.st_dev, st.st_ino, st.st_nlink)'
        GMOUNT_BYPASS_STATS={stats} stat -c "%d %i %h" a.txt b.txt
    """
    seen = [tuple(map(int, line.split())) for line in job(cluster, "n1", f"/{top}", script).splitlines()]
    through_mount = os.stat(cluster.mount("n1") / top / "a.txt")
    expected = (through_mount.st_dev, through_mount.st_ino, through_mount.st_nlink)
    exported = os.stat(cluster.export("n1") / top / "a.txt")
    assert through_mount.st_nlink == 2 and through_mount.st_ino != exported.st_ino
    assert seen == [expected] * 6
    assert os.stat(cluster.mount("n3") / top / "b.txt").st_ino == through_mount.st_ino  # one identity everywhere
    assert counters(stats)["stat_direct"] >= 4  # answered from the export, not by the mount


def test_a_job_creates_in_a_directory_it_made_straight_in_the_export(cluster: LocalCluster, tmp_path: Path) -> None:
    """A directory a job makes is homed at its node and owned there: the job's creates in it go
    straight to the export, telling nobody -- yet the next job on another node sees every file,
    with its bytes (the other node's first question ends the ownership: rule 1), a create of an
    existing name there fails on either node (no twin), and the node owns it again later."""
    top = unique("bp-own")
    (cluster.mount("n1") / top).mkdir()
    stats = tmp_path / "stats"
    before = served(cluster, "n1")
    script = f"""
        mkdir out
        GMOUNT_BYPASS_STATS={stats} {sys.executable} -c '
import os
for i in range(50):
    fd = os.open(f"out/f{{i}}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(fd, str(i).encode() * 100)
    os.close(fd)
try:
    os.open("out/f7", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
except FileExistsError:
    print("exists")'
    """
    assert job(cluster, "n1", f"/{top}", script).split() == ["exists"]
    seen = counters(stats)
    assert seen.get("create_direct", 0) == 50, seen
    after = served(cluster, "n1")
    assert after["C"] == before["C"]  # no close told: nobody holds a lease there
    expected = {f"f{i}": str(i).encode() * 100 for i in range(50)}
    assert {p.name for p in (cluster.export("n1") / top / "out").iterdir()} == set(expected)
    # the next job, on n3: every name, with its bytes; n4 lists all of them
    listing = job(cluster, "n3", f"/{top}/out", "cat f0; echo; cat f49; echo; ls").split()
    assert listing[0] == "0" * 100 and listing[1] == "49" * 100 and set(listing[2:]) == set(expected)
    assert sorted(os.listdir(cluster.mount("n4") / top / "out")) == sorted(expected)
    assert (cluster.mount("n2") / top / "out" / "f7").read_bytes() == expected["f7"]
    # no twin: a name made on n3 now, then by a job on n1, and the other way round
    (cluster.mount("n3") / top / "out" / "from-n3").write_bytes(b"n3")
    exists = f"""{sys.executable} -c '
import os, sys
for name in sys.argv[1:]:
    try:
        os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        print("made", name)
    except FileExistsError:
        print("exists", name)' from-n3 f8"""
    assert job(cluster, "n1", f"/{top}/out", exists).split() == ["exists", "from-n3", "exists", "f8"]
    with pytest.raises(FileExistsError):
        os.open(cluster.mount("n4") / top / "out" / "f9", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    assert [n for n in ("n1", "n2", "n3", "n4") if (cluster.export(n) / top / "out" / "from-n3").exists()] == ["n3"]


def test_output_of_a_program_that_inherited_the_descriptor_reaches_the_home(cluster: LocalCluster) -> None:
    """`cmd > out`: the shell opens out, the program it execs writes and exits without a close()
    of its own -- the daemon's inotify watch tells the home the final size."""
    top = unique("bp-inherit")
    (cluster.mount("n1") / top).mkdir()
    assert not (cluster.mount("n4") / top / "out.txt").exists()  # n4 caches "not found", then the home is asked
    job(cluster, "n1", f"/{top}", f"""{sys.executable} -c 'import sys; sys.stdout.write("x" * 300000)' > out.txt""")
    assert wait_for(lambda: (cluster.mount("n4") / top / "out.txt").stat().st_size == 300_000, timeout=1.0), \
        (cluster.mount("n4") / top / "out.txt").stat().st_size
    assert (cluster.mount("n4") / top / "out.txt").read_bytes() == b"x" * 300_000


def test_a_stale_replica_is_never_read_through_the_bypass(cluster: LocalCluster, tmp_path: Path) -> None:
    name = unique("bp-replica") + ".txt"
    (cluster.mount("n3") / name).write_text("version 1")
    assert run_sync(call, cluster.state, "n1", "stage", f"/{name}")["status"] == "copied"
    stats = tmp_path / "stats"
    assert job(cluster, "n1", "/", f"GMOUNT_BYPASS_STATS={stats} cat {name}") == "version 1"
    assert counters(stats)["open_direct"] == 1  # the fresh replica, read from n1's export
    (cluster.mount("n4") / name).write_text("version 2, changed at the source")
    stats.unlink()
    # no wait for any TTL: the replica is marked, so the library asks, and the daemon checks the source
    assert job(cluster, "n1", "/", f"GMOUNT_BYPASS_STATS={stats} cat {name}") == "version 2, changed at the source"
    assert counters(stats)["open_direct"] == 0


def test_a_static_binary_goes_through_the_mount(cluster: LocalCluster, programs: dict[str, Path]) -> None:
    top = unique("bp-static")
    (cluster.mount("n1") / top).mkdir()
    data = os.urandom(1_000_001)
    (cluster.mount("n1") / top / "in.bin").write_bytes(data)
    before = served(cluster, "n1")
    out = job(cluster, "n1", f"/{top}", f'test -n "$LD_PRELOAD" && {programs["static"]} in.bin out.bin')
    assert out.strip() == str(len(data))
    assert (cluster.mount("n3") / top / "out.bin").read_bytes() == data
    assert served(cluster, "n1")["W"] == before["W"]  # the library was not loaded: nothing asked


def test_switched_off_by_gmount_bypass_0(cluster: LocalCluster, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    top = unique("bp-off")
    (cluster.mount("n1") / top).mkdir()
    (cluster.mount("n1") / top / "in.txt").write_text("mine")
    stats = tmp_path / "stats"
    monkeypatch.setenv("GMOUNT_BYPASS", "0")
    assert job(cluster, "n1", f"/{top}", f'echo "[$LD_PRELOAD]"; GMOUNT_BYPASS_STATS={stats} cat in.txt') == \
        "[]\nmine"
    # the library itself obeys it too (a program may switch it off for itself)
    monkeypatch.delenv("GMOUNT_BYPASS")
    assert job(cluster, "n1", f"/{top}", f"GMOUNT_BYPASS=0 GMOUNT_BYPASS_STATS={stats} cat in.txt") == "mine"
    assert not stats.exists()  # no open was counted: the library left every call alone


def test_directories_symlinks_and_paths_with_dotdot_go_through_the_mount(cluster: LocalCluster,
                                                                          tmp_path: Path) -> None:
    top = unique("bp-paths")
    (cluster.mount("n1") / top / "sub").mkdir(parents=True)
    (cluster.mount("n1") / top / "sub" / "f.txt").write_text("file")
    os.symlink("sub", cluster.mount("n1") / top / "link")
    stats = tmp_path / "stats"
    program = ("import os\n"
               "print(open('link/f.txt').read(), open('sub/../sub/f.txt').read(), os.path.isdir('sub'), "
               "os.path.islink('link'), open('./sub//f.txt').read())\n"
               "for wrong in ('sub/f.txt/', 'sub/f.txt/.'):\n"
               "    try:\n        os.stat(wrong)\n    except NotADirectoryError:\n        print('ENOTDIR')")
    out = job(cluster, "n1", f"/{top}", f'GMOUNT_BYPASS_STATS={stats} {sys.executable} -c "{program}"')
    assert out.split() == ["file", "file", "True", "True", "file", "ENOTDIR", "ENOTDIR"]
    seen = counters(stats)
    assert seen["open_direct"] == 1  # ./sub//f.txt only: a symlink or a ".." on the way is the mount's
    assert seen["open_mount"] >= 1


def test_a_leading_dotdot_from_the_working_directory_is_bypassed(cluster: LocalCluster, tmp_path: Path) -> None:
    """Montage's recipes run `cd proj && mBackground ... ../corr/x.fits`: the leading ".." steps up
    the working directory, which the kernel names without symlinks, so those reads and writes go to
    the export, not through the daemon. A ".." after a name of the caller's path stays the mount's."""
    top = unique("bp-up")
    for sub in ("proj", "corr"):
        (cluster.mount("n1") / top / sub).mkdir(parents=True)
    (cluster.mount("n1") / top / "in.txt").write_text("input")
    os.symlink(f"{top}/proj", cluster.mount("n1") / f"{top}-link")
    stats = tmp_path / "stats"
    out = job(cluster, "n1", f"/{top}/proj",
              f"GMOUNT_BYPASS_STATS={stats} sh -c 'cp ../in.txt ../corr/out.txt && cat ../corr/out.txt; exit 0'")
    assert out == "input"
    seen = counters(stats)
    assert tuple(seen.get(key, 0) for key in ("open_direct", "create_direct", "open_mount")) == (2, 1, 0), seen
    assert (cluster.export("n1") / top / "corr" / "out.txt").read_text() == "input"
    assert (cluster.mount("n2") / top / "corr" / "out.txt").read_text() == "input"  # close-to-open
    stats.unlink()
    out = job(cluster, "n1", f"/{top}/proj", f"GMOUNT_BYPASS_STATS={stats} cat ../../{top}-link/../in.txt")
    assert out == "input"
    assert counters(stats).get("open_direct", 0) == 0  # ".." after a name (here a symlink's): the mount's


def test_served_off_when_the_cluster_says_bypass_false(tmp_path: Path) -> None:
    require("FUSE", fuse_problem())
    with local_cluster(tmp_path / "c", f"bpoff-{os.getpid()}", {"s": ["a", "b"]}, [],
                       "attr_ttl = 0.5\nnegative_ttl = 0.5\nbypass = false\npassthrough = false") as off:
        (off.mount("a") / "in.txt").write_text("held by a")
        with pytest.raises(OSError):
            os.getxattr(off.mount("a"), "user.gmount.bypass")
        stats = tmp_path / "stats"
        assert job(off, "a", "/", f"GMOUNT_BYPASS_STATS={stats} cat in.txt") == "held by a"
        seen = counters(stats)
        assert seen["open_direct"] == 0 and seen["open_mount"] == 1


def test_off_within_the_lease_once_the_daemon_is_gone(tmp_path: Path) -> None:
    """A job's library takes the daemon's word for about a second: once the daemon is gone, the
    job's calls go to the (dead) mount and fail, as they would have without the bypass."""
    require("FUSE", fuse_problem())
    with local_cluster(tmp_path / "c", f"bpgone-{os.getpid()}", {"s": ["a", "b"]}, [],
                       "attr_ttl = 0.5\nnegative_ttl = 0.5") as gone:
        (gone.mount("a") / "in.txt").write_text("held by a")
        lib = bypass.library()
        assert lib is not None
        probe = ("import os, sys, time\n"
                 "path = sys.argv[1]\n"
                 "print(os.stat(path).st_size, flush=True)\n"
                 "sys.stdin.readline()\n"
                 "time.sleep(1.5)\n"
                 "try:\n    os.stat(path)\n    print('still served')\nexcept OSError as exc:\n    print(exc.errno)\n")
        with subprocess.Popen([sys.executable, "-c", probe, str(gone.mount("a") / "in.txt")], text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              env={**os.environ, "LD_PRELOAD": lib,
                                   "GMOUNT_BYPASS_STATS": str(tmp_path / "stats")}) as job:
            assert job.stdout is not None and job.stdin is not None
            assert job.stdout.readline() == "9\n"  # served from a's export
            os.kill(gone.state.nodes["a"].pid, 9)
            job.stdin.write("go\n")
            job.stdin.flush()
            assert job.stdout.readline().strip() == str(errno.ENOTCONN)  # the mount's answer, not the export's
        assert counters(tmp_path / "stats")["stat_direct"] == 1


def test_a_killed_owners_outputs_are_out_of_reach_then_back_with_it(tmp_path: Path) -> None:
    """kill -9 of the node that owns a directory its job made: the directory and its files are on
    that node's disk alone, so they are out of reach meanwhile and no other node can make a
    name in it (no twin); once the node is up again every node sees every file, each on one
    node. The restarted daemon owns nothing: its jobs' creates there go through the mount
    until it may own the directory again."""
    require("FUSE", fuse_problem())
    require("the bypass library", None if bypass.library() else f"{bypass.LIBRARY} was not built")
    with local_cluster(tmp_path / "c", f"bpkill-{os.getpid()}", FOUR_NODES, FOUR_NODE_LINKS,
                       TUNING + "\nindex_rescan = 30.0") as killed:
        made = {f"f{i}": str(i).encode() * 10 for i in range(5)}
        script = "\n".join(["import sys", "for i in range(5):", "    with open(f\"out/f{i}\", \"x\") as f:",
                            "        f.write(str(i) * 10)"])
        stats = tmp_path / "stats"
        job(killed, "n2", "/", f"mkdir out && GMOUNT_BYPASS_STATS={stats} {sys.executable} -c '{script}'")
        assert counters(stats).get("create_direct", 0) == 5
        os.kill(killed.state.nodes["n2"].pid, signal.SIGKILL)
        for node in ("n1", "n3"):
            assert not os.path.exists(killed.mount(node) / "out" / "f0")  # on n2's disk alone: out of reach
        # The directory is on n2's disk alone, as everything made in it: nobody else can make a
        # name in it meanwhile (so no twin of a name n2 made), nor the directory itself yet
        with pytest.raises(FileNotFoundError):
            (killed.mount("n4") / "out" / "f0").write_bytes(b"a twin?")
        with pytest.raises(OSError) as refused:
            os.mkdir(killed.mount("n4") / "out")
        assert refused.value.errno == errno.EAGAIN  # n2's claim of it is recent (CLAIM_GRACE)
        launch.up(killed.spec)
        assert wait_for(lambda: os.path.isdir(killed.mount("n2") / "out"), timeout=10)
        expected = sorted(made)
        for node in ("n1", "n2", "n3", "n4"):
            assert wait_for(lambda node=node: sorted(os.listdir(killed.mount(node) / "out")) == expected, timeout=5), \
                (node, sorted(os.listdir(killed.mount(node) / "out")))
            assert (killed.mount(node) / "out" / "f3").read_bytes() == made["f3"]
        holders = {name: [n for n in ("n1", "n2", "n3", "n4") if (killed.export(n) / "out" / name).exists()]
                   for name in expected}
        assert holders == dict.fromkeys(made, ["n2"])
        stats.unlink()
        job(killed, "n2", "/out", f"GMOUNT_BYPASS_STATS={stats} touch again")
        assert counters(stats).get("create_direct", 0) == 0
        assert (killed.mount("n3") / "out" / "again").exists()
