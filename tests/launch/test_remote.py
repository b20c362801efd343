"""The programs the SSH launcher runs on a node (gmountpy/launch/remote/), run here exactly as it runs
them there: the Python ones as `python - ARGS` with the program on stdin, the sh functions on the
stdin of `sh`. No SSH needed: what they check and print is tested on its own."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import gmountpy
from gmountpy.launch import remote
from gmountpy.launch.remote import preflight, rtt


def run_python(name: str, *args: str, python: list[str] | None = None) -> dict[str, object]:
    result = subprocess.run([*(python or [sys.executable]), "-", *args], input=remote.text(name),
                            capture_output=True, text=True, timeout=60)
    marker = {"preflight.py": preflight.MARKER, "rtt.py": rtt.MARKER}[name]
    lines = [line for line in result.stdout.splitlines() if line.startswith(marker)]
    assert len(lines) == 1, (result.stdout, result.stderr)
    answer: dict[str, object] = json.loads(lines[0][len(marker):])
    return answer


def node(name: str, export: Path, mountpoint: Path, *, create: bool = False, listen: str = "127.0.0.1",
         port: int = 0) -> dict[str, object]:
    return {"name": name, "export": str(export), "create_export": create, "mountpoint": str(mountpoint),
            "listen": listen, "port": port}


def test_preflight_reports_every_problem_of_every_node(tmp_path: Path) -> None:
    (tmp_path / "export").mkdir()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    (tmp_path / "a-file").write_text("x")
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    port = busy.getsockname()[1]
    try:
        nodes = [
            node("good", tmp_path / "export", tmp_path / "new-mnt"),
            node("typo", tmp_path / "no-export", tmp_path / "full", port=port),
            node("made", tmp_path / "to-make" / "export", tmp_path / "a-file", create=True, listen="192.0.2.1"),
            node("mounted", tmp_path / "a-file", Path("/proc")),
        ]
        answer = run_python("preflight.py", json.dumps({"requires": ["trio", "msgpack"], "nodes": nodes}))
    finally:
        busy.close()
    assert answer["version"] == gmountpy.__version__ and "import_error" not in answer
    assert answer["python"] == ".".join(map(str, sys.version_info[:3])) and answer["executable"] == sys.executable
    problems = answer["nodes"]
    assert isinstance(problems, dict)
    assert problems["good"] == []
    assert problems["typo"] == [
        f"export {tmp_path}/no-export does not exist: create it, fix `export` in the cluster file, "
        "or set create_export = true to have it made",
        f"mountpoint {tmp_path}/full is not empty: choose an empty directory",
        f"port {port} on 127.0.0.1 is in use by another program: choose another port, or port = 0 for any free one",
    ]
    assert problems["made"] == [f"mountpoint {tmp_path}/a-file is not a directory",
                                "listen address 192.0.2.1 is not an address of this host: fix listen"]
    assert problems["mounted"][0] == f"export {tmp_path}/a-file is not a directory"
    assert problems["mounted"][1].startswith("mountpoint /proc is already mounted: run `gmount down`")
    assert not (tmp_path / "to-make").exists() and not (tmp_path / "new-mnt").exists()  # it only looks


def test_preflight_names_what_the_interpreter_lacks(tmp_path: Path) -> None:
    nodes = [node("n1", tmp_path, tmp_path / "mnt")]
    lacking = run_python("preflight.py", json.dumps({"requires": ["trio", "no_such_module_for_gmount"],
                                                     "nodes": nodes}))
    assert lacking["import_error"] == "gmountpy is there but not no_such_module_for_gmount"
    # -I -S: an interpreter without the site-packages gmountpy is installed in
    bare = run_python("preflight.py", json.dumps({"requires": [], "nodes": nodes}), python=[sys.executable, "-I", "-S"])
    assert bare["import_error"] == "ModuleNotFoundError: No module named 'gmountpy'" and "version" not in bare


def test_rtt_times_connects_and_says_why_it_stopped() -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    port = server.getsockname()[1]
    try:
        timed = run_python("rtt.py", "127.0.0.1", str(port), "3")
    finally:
        server.close()
    samples = timed["ms"]
    assert timed["error"] is None and isinstance(samples, list) and len(samples) == 3
    assert all(0 < ms < 1000 for ms in samples)
    refused = run_python("rtt.py", "127.0.0.1", str(port), "3")  # nothing listens there now
    assert refused["ms"] == [] and str(refused["error"]).startswith(f"127.0.0.1:{port}: ")


# --- daemons.sh: the functions `gmount down` and `gmount status` run with sh ---------------------

FAKE_DAEMON = "import signal, sys, time\n" \
              "if sys.argv[2] == 'stubborn': signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" \
              "print('ready', flush=True)\ntime.sleep(120)\n"


@pytest.fixture
def daemons() -> Iterator[dict[str, subprocess.Popen[str]]]:
    """Processes whose command line names gmountpy.node as the real daemon's does; one ignores SIGTERM."""
    started = {kind: subprocess.Popen([sys.executable, "-c", FAKE_DAEMON, "gmountpy.node", kind],
                                      stdout=subprocess.PIPE, text=True) for kind in ("polite", "stubborn")}
    other = subprocess.Popen(["sleep", "120"])
    for process in started.values():
        assert process.stdout is not None and process.stdout.readline() == "ready\n"  # SIGTERM is set up
    yield {**started, "other": other}  # type: ignore[dict-item]
    for process in [*started.values(), other]:
        if process.poll() is None:
            process.kill()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()


def sh(script: str) -> list[str]:
    result = subprocess.run(["sh"], input=remote.text("daemons.sh") + script, capture_output=True, text=True,
                            timeout=60, check=True)
    return result.stdout.splitlines()


def test_check_tells_a_daemon_from_a_reused_pid_and_reads_the_mount_table(
        daemons: dict[str, subprocess.Popen[str]], tmp_path: Path) -> None:
    polite, other = daemons["polite"].pid, daemons["other"].pid
    assert sh(f"check n1 {polite} /proc\ncheck n2 {other} {tmp_path}\ncheck n3 0 /proc\n") == [
        "GMOUNT CHECK n1 1 1", "GMOUNT CHECK n2 0 0", "GMOUNT CHECK n3 0 1"]


def test_term_and_settle_stop_daemons_and_kill_the_stubborn_only(daemons: dict[str, subprocess.Popen[str]]) -> None:
    polite, stubborn, other = (daemons[k].pid for k in ("polite", "stubborn", "other"))
    started = time.monotonic()
    out = sh(f"term n1:{polite} n2:{stubborn} n3:{other}\nsettle 10 n1:{polite} n2:{stubborn} n3:{other}\n"
             f"unmount n1 /nowhere /nowhere\n")
    assert out == [f"GMOUNT TERM n1:{polite}", f"GMOUNT TERM n2:{stubborn}", f"GMOUNT KILLED n2:{stubborn}"]
    assert time.monotonic() - started < 10  # settle 10: one second at most, then SIGKILL
    assert daemons["polite"].wait(5) == -signal.SIGTERM and daemons["stubborn"].wait(5) == -signal.SIGKILL
    assert daemons["other"].poll() is None  # not a gmount daemon: never signalled
    os.kill(other, 0)
