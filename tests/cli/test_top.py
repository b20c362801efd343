"""`gmount top` against a real running cluster: the jobs make and the API started, seen on their nodes; bytes
moving while a file is read through the mounts; the live view in a terminal; a node that died shown down."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import shutil
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gmountpy import Cluster

from ..conftest import LocalCluster, as_terminal_job, close_pipes, fuse_problem, local_cluster, require, wait_for

BIN = Path(sys.executable).parent
GMOUNT = str(BIN / "gmount")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    require("FUSE", fuse_problem())
    base = tmp_path_factory.mktemp("top")
    with local_cluster(base, f"top-{os.getpid()}", {"a": ["n1", "n2"], "b": ["n3"]}, [("a", "b", 5.0)]) as c:
        yield c


def top_json(name: str) -> dict[str, Any]:
    out = subprocess.run([GMOUNT, "top", name, "--once", "--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def by_node(view: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["node"]: row for row in view["nodes"]}


class Reader:
    """Reads a file through two mounts over and over, dropping its pages each time (so every read reaches
    the daemons), until stopped."""

    def __init__(self, *paths: Path) -> None:
        self.paths = paths
        self.stop = threading.Event()
        self.rounds = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            for path in self.paths:
                fd = os.open(path, os.O_RDONLY)
                try:
                    while os.read(fd, 1 << 20):
                        pass
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
            self.rounds += 1

    def __enter__(self) -> Reader:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=60)


def test_top_shows_registered_jobs_and_rates_while_a_file_is_read(cluster: LocalCluster, tmp_path: Path) -> None:
    name = cluster.spec.name
    (cluster.export("n2") / "top").mkdir()
    (cluster.export("n2") / "top" / "big.bin").write_bytes(os.urandom(32 << 20))
    cluster.rescan()
    api = Cluster.open(name)
    sleeper = api.spawn("sleep 120", on="n3", job="sleeper on n3")
    try:
        with Reader(cluster.mount("n1") / "top" / "big.bin", cluster.mount("n2") / "top" / "big.bin") as reader:
            assert wait_for(lambda: reader.rounds >= 1, timeout=60)
            view = top_json(name)
        nodes = by_node(view)
        assert view["cluster"] == name and view["interval"] == 1.0
        assert all(row["up"] for row in nodes.values()), nodes
        # the registered job, on its node, against its slots
        [job] = [j for j in view["jobs"] if j["job"] == "sleeper on n3"]
        assert (job["node"], job["kind"], job["directory"], job["pid"]) == ("n3", "api", "/", sleeper.pid)
        assert abs(job["started"] - time.time()) < 120
        assert (nodes["n3"]["running"], nodes["n3"]["slots"]) == (1, 2) and nodes["n1"]["running"] == 0
        # bytes moving: n1 reads n2's file remotely, n2 reads it locally and serves n1
        assert nodes["n1"]["rates"]["read_remote"] > 0, nodes["n1"]
        assert nodes["n2"]["rates"]["read_local"] > 0, nodes["n2"]
        assert nodes["n2"]["rates"]["served_read"] > 0 and nodes["n2"]["rates"]["requests_served"] > 0
        assert nodes["n3"]["rates"]["read_remote"] == 0
        assert nodes["n2"]["counters"]["served_read"] >= 32 << 20
    finally:
        sleeper.stop(grace=1)
    assert not [j for j in top_json(name)["jobs"] if j["job"] == "sleeper on n3"]  # ended: gone


def make_problem() -> str | None:
    if shutil.which("make") is None:
        return "GNU make is not installed (Debian package make)"
    if not os.access(BIN / "gmount-sh", os.X_OK):
        return f"gmount-sh is not installed beside {sys.executable}"
    return None


@pytest.mark.parametrize("wrapper", ["gmount-job", "gmount-sh"])
def test_top_shows_the_recipes_make_runs_with_gmount_mk(cluster: LocalCluster, wrapper: str) -> None:
    """make's C wrapper (the default) and the Python one (SSH nodes, daemons without a job socket)."""
    require("GNU make and gmount-sh", make_problem())
    name = f"top-make-{wrapper}"
    work = cluster.export("n1") / name
    work.mkdir()
    (cluster.export("n3") / name).mkdir()
    (cluster.export("n3") / name / "input.txt").write_text("held by n3\n")
    (work / "Makefile").write_text("include $(shell gmount make-include)\n\n"
                                   "slow.txt: input.txt\n\tsleep 120; cp $< $@\n")
    cluster.rescan()
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    if wrapper == "gmount-sh":
        env["GMOUNT_SH"] = str(BIN / "gmount-sh")
    make = subprocess.Popen(["make"], cwd=cluster.mount("n1") / name, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, preexec_fn=as_terminal_job,
                            start_new_session=True)
    try:
        seen = wait_for(lambda: [j for j in Cluster.open(cluster.spec.name).jobs() if j.kind == "make"],
                        timeout=60, interval=0.2)
        assert seen, "make's recipe was never registered"
        view = top_json(cluster.spec.name)
        [job] = [j for j in view["jobs"] if j["kind"] == "make"]
        assert (job["node"], job["job"], job["directory"]) == ("n3", "slow.txt", f"/{name}")
        assert by_node(view)["n3"]["running"] == 1
        os.killpg(make.pid, signal.SIGINT)  # Ctrl-C: to make and its recipes, as a terminal sends it
        make.wait(timeout=60)
    finally:
        if make.poll() is None:
            make.kill()
            make.wait()
        close_pipes(make)
    assert wait_for(lambda: not [j for j in Cluster.open(cluster.spec.name).jobs() if j.kind == "make"], timeout=15)


def test_the_live_view_in_a_terminal_refreshes_until_ctrl_c(cluster: LocalCluster) -> None:
    api = Cluster.open(cluster.spec.name)
    sleeper = api.spawn("sleep 120", on="n2", job="live-sleeper")
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 140, 0, 0))
    top = subprocess.Popen([GMOUNT, "top", cluster.spec.name, "--interval", "0.5"], stdin=slave, stdout=slave,
                           stderr=slave, env={**os.environ, "TERM": "xterm-256color"}, preexec_fn=as_terminal_job)
    os.close(slave)
    shown = b""
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and shown.count(b"live-sleeper") < 3:  # three refreshes
            if select.select([master], [], [], 0.5)[0]:
                shown += os.read(master, 65536)
        top.send_signal(signal.SIGINT)
        assert top.wait(timeout=30) == 0
        while select.select([master], [], [], 0.2)[0]:
            try:
                shown += os.read(master, 65536)
            except OSError:
                break
    finally:
        if top.poll() is None:
            top.kill()
            top.wait()
        os.close(master)
        sleeper.stop(grace=1)
    text = shown.decode(errors="replace")
    assert text.count("live-sleeper") >= 3, text[-3000:]
    assert "1 job running" in text and "Ctrl-C quits" in text and "n3" in text
    assert "Traceback" not in text


def test_once_into_a_pipe_prints_the_tables_whole(cluster: LocalCluster) -> None:
    label = "a job whose name is much longer than any terminal would show in its column " * 2
    sleeper = Cluster.open(cluster.spec.name).spawn("sleep 120", on="n1", job=label.strip())
    try:
        out = subprocess.run([GMOUNT, "top", cluster.spec.name, "--once"], capture_output=True, text=True,
                             timeout=60, env={**os.environ, "COLUMNS": "80"})
    finally:
        sleeper.stop(grace=1)
    assert out.returncode == 0, out.stderr
    assert "rates over 1 s" in out.stdout and "1 job running" in out.stdout
    assert label.strip() in out.stdout and "…" not in out.stdout


def test_a_node_whose_daemon_died_shows_down(cluster: LocalCluster) -> None:
    """Last in this module: it kills n3's daemon (the fixture cleans up the dead node's mount)."""
    os.kill(cluster.state.nodes["n3"].pid, signal.SIGKILL)
    assert wait_for(lambda: not by_node(top_json(cluster.spec.name))["n3"]["up"], timeout=30)
    nodes = by_node(top_json(cluster.spec.name))
    assert nodes["n3"]["detail"] and nodes["n3"]["rates"] == {} and nodes["n1"]["up"] and nodes["n2"]["up"]
