"""`gmount where`'s table: whole paths into a pipe or a file, wrapped (never cut) in a narrow terminal."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
from pathlib import Path

from ..conftest import LocalCluster

GMOUNT = str(Path(sys.executable).parent / "gmount")
LONG = "/".join(f"a-rather-long-directory-name-{i:02d}" for i in range(5)) + "/and-a-file-with-a-long-name.txt"


def long_file(cluster: LocalCluster) -> tuple[Path, Path]:
    """(its path in n1's mount, its path on n3's disk): far wider than 80 columns."""
    on_disk = cluster.export("n3") / "where-wide" / LONG
    on_disk.parent.mkdir(parents=True, exist_ok=True)
    on_disk.write_text("far away\n")
    cluster.rescan("n3")
    return cluster.mount("n1") / "where-wide" / LONG, on_disk


def test_where_into_a_pipe_prints_every_path_whole(cluster4: LocalCluster) -> None:
    in_mount, on_disk = long_file(cluster4)
    out = subprocess.run([GMOUNT, "where", str(in_mount)], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "COLUMNS": "80"})  # a terminal's width must not matter here
    assert out.returncode == 0, out.stderr
    assert str(on_disk) in out.stdout, out.stdout  # on one line, uncut
    assert "…" not in out.stdout and str(in_mount) in out.stdout


def test_where_in_a_narrow_terminal_wraps_the_path(cluster4: LocalCluster) -> None:
    in_mount, on_disk = long_file(cluster4)
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 80, 0, 0))
    where = subprocess.Popen([GMOUNT, "where", str(in_mount)], stdin=slave, stdout=slave, stderr=slave,
                             env={**os.environ, "TERM": "dumb"})
    os.close(slave)
    shown = b""
    try:
        while True:
            if select.select([master], [], [], 30)[0]:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the other end closed
                    break
                if not chunk:
                    break
                shown += chunk
            else:
                break
        assert where.wait(timeout=30) == 0
    finally:
        if where.poll() is None:
            where.kill()
            where.wait()
        os.close(master)
    lines = shown.decode().replace("\r", "").splitlines()
    assert lines and max(len(line) for line in lines) <= 80, lines
    assert "…" not in shown.decode()
    # the path column's pieces, read down the rows, are the whole path
    column = "".join(line.rsplit("│", 1)[1].strip() for line in lines if line.count("│") == 4)
    assert column == str(on_disk), lines
