"""GNU make with gmount.mk on a real 4-node, 2-site local cluster (n1 n2 | n3 n4, 14 ms apart).

make always runs in n1's mount; the inputs are written straight into the
exports of n1..n4, so where each recipe ran is known independently of
gmount: from which export holds its prerequisites on disk, checked against
the placement log and against a file each recipe writes naming $GMOUNT_NODE.
"""

from __future__ import annotations

import filecmp
import json
import os
import shutil
import signal
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gmountpy import Cluster
from gmountpy.cluster import jobsocket, mounts
from gmountpy_make import JOB_PROGRAM, MAKEFILE
from gmountpy_make.shell import json_line, json_string, strip_oneshell_prefixes

from ..conftest import (
    LocalCluster,
    as_terminal_job,
    close_pipes,
    descendants,
    fuse_problem,
    local_cluster,
    process_report,
    require,
    wait_for,
)

REPO = Path(__file__).resolve().parents[2]
BIN = os.path.dirname(sys.executable)
NODES = ["n1", "n2", "n3", "n4"]
INCLUDE = "include $(shell gmount make-include)\n"

# fan-out over in1..in4 (one per node, n times 2000 bytes), per-file steps up% and stats%, a merge, a report
WORKFLOW = """\
INPUTS := in1.txt in2.txt in3.txt in4.txt
UPS := $(INPUTS:in%=up%)
STATS := $(INPUTS:in%=stats%)

all: report.txt

up%.txt: in%.txt shared.cfg
\ttr a-z A-Z < $< > $@
\techo "$$GMOUNT_NODE" > $@.node

stats%.txt: up%.txt
\twc -c < $< > $@
\tsha256sum $< >> $@
\techo "$$GMOUNT_NODE" > $@.node

merged.txt: $(UPS)
\tcat $^ > $@
\techo "$$GMOUNT_NODE" > $@.node

report.txt: merged.txt $(STATS)
\t(wc -c < merged.txt; cat $(STATS)) > $@
\techo "$$GMOUNT_NODE" > $@.node
"""
OUTPUTS = ["up1.txt", "up2.txt", "up3.txt", "up4.txt", "stats1.txt", "stats2.txt", "stats3.txt", "stats4.txt",
           "merged.txt", "report.txt"]
DEPS = {**{f"up{i}.txt": [f"in{i}.txt", "shared.cfg"] for i in range(1, 5)},
        **{f"stats{i}.txt": [f"up{i}.txt"] for i in range(1, 5)},
        "merged.txt": [f"up{i}.txt" for i in range(1, 5)],
        "report.txt": ["merged.txt"] + [f"stats{i}.txt" for i in range(1, 5)]}


def make_problem() -> str | None:
    if shutil.which("make") is None:
        return "GNU make is not installed (Debian package make)"
    if not os.access(os.path.join(BIN, "gmount-sh"), os.X_OK):
        return f"gmount-sh is not installed beside {sys.executable} (pip install -e . again)"
    if not os.access(JOB_PROGRAM, os.X_OK):
        return f"gmount-job was not built at install ({JOB_PROGRAM}): pip install . again, with a C compiler"
    return None


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Default TTLs on purpose: make stats each target in n1's mount before another node creates it,
    so these runs also prove the cross-node hand-off (no stale "not found", close-to-open)."""
    require("FUSE", fuse_problem())
    require("GNU make and gmount-sh", make_problem())
    base = tmp_path_factory.mktemp("make")
    with local_cluster(base, f"mk-{os.getpid()}", {"tsukuba": ["n1", "n2"], "hongo": ["n3", "n4"]},
                       [("tsukuba", "hongo", 14.0)]) as c:
        yield c


def env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PATH": BIN + os.pathsep + os.environ["PATH"], **extra}


def make(cwd: Path, *args: str, timeout: float = 180, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["make", *args], check=False, cwd=cwd, env=env(**extra), capture_output=True, text=True,
                          timeout=timeout)


def put_inputs(cluster: LocalCluster, wf: str) -> dict[str, bytes]:
    """in<i>.txt on node n<i> (i * 2000 bytes), shared.cfg (small) on n2, the Makefile on n1."""
    written: dict[str, bytes] = {}
    for i, node in enumerate(NODES, start=1):
        data = "".join(f"{node} line {k} of input {i}\n" for k in range(i * 2000 // 24)).encode()
        written[f"in{i}.txt"] = data
        (cluster.export(node) / wf).mkdir(parents=True, exist_ok=True)
        (cluster.export(node) / wf / f"in{i}.txt").write_bytes(data)
    written["shared.cfg"] = b"threshold = 3\n"
    (cluster.export("n2") / wf / "shared.cfg").write_bytes(written["shared.cfg"])
    cluster.rescan()
    return written


def holder_on_disk(cluster: LocalCluster, wf: str, name: str) -> str:
    """The one node whose export holds wf/name, looked at directly on disk."""
    found = [n for n in NODES if (cluster.export(n) / wf / name).exists()]
    assert len(found) == 1, f"{wf}/{name} is in the exports of {found}"
    return found[0]


def expected_node(cluster: LocalCluster, wf: str, target: str) -> str:
    """The node holding the most bytes of the target's prerequisites, from the exports on disk."""
    held: dict[str, int] = {}
    for dep in DEPS[target]:
        node = holder_on_disk(cluster, wf, dep)
        held[node] = held.get(node, 0) + (cluster.export(node) / wf / dep).stat().st_size
    return max(held, key=lambda n: held[n])


def read_log(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][0] != "Z"
    except FileNotFoundError:
        return False


# --------------------------------------------------------------------------- pure parts


def test_make_oneshell_prefixes_are_stripped_as_make_does_for_posix_shells() -> None:
    assert strip_oneshell_prefixes("echo a") == "echo a"
    assert strip_oneshell_prefixes("cd x\n\t@echo a\n -rm b\n+touch c") == "cd x\necho a\nrm b\ntouch c"
    # a continued line is one logical line: its next physical line keeps its characters
    assert strip_oneshell_prefixes("echo a \\\n-n\n@echo b") == "echo a \\\n-n\necho b"
    assert strip_oneshell_prefixes("echo '\\\\'\n@x") == "echo '\\\\'\nx"


def test_make_include_prints_the_installed_makefile() -> None:
    out = subprocess.run([os.path.join(BIN, "gmount"), "make-include"], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == MAKEFILE and os.path.isfile(out)
    text = Path(out).read_text()
    assert "export GMOUNT_TARGET = $@" in text and "export GMOUNT_DEPS = $^" in text


# --------------------------------------------------------------------------- the workflow


def test_make_j4_runs_every_recipe_where_its_inputs_are(cluster: LocalCluster, tmp_path: Path) -> None:
    wf = "wf-dag"
    inputs = put_inputs(cluster, wf)
    (cluster.export("n1") / wf / "Makefile").write_text(INCLUDE + WORKFLOW)
    here = cluster.mount("n1") / wf
    result = make(here, "-j4")
    assert result.returncode == 0, result.stderr

    # the placement log: one per run of make, under .gmount/ in the working directory
    logs = list((here / ".gmount").glob("make-*.jsonl"))
    assert len(logs) == 1, logs
    entries = read_log(logs[0])
    assert {e["target"] for e in entries} == set(OUTPUTS)
    lines = {t: 3 if t.startswith("stats") else 2 for t in OUTPUTS}  # one log line per recipe line
    assert {t: sum(e["target"] == t for e in entries) for t in OUTPUTS} == lines
    for target in OUTPUTS:
        want = expected_node(cluster, wf, target)
        # proved three ways: the log, the file the recipe wrote, and where its output landed on disk
        assert {e["node"] for e in entries if e["target"] == target} == {want}, target
        assert (here / f"{target}.node").read_text().strip() == want, target
        assert holder_on_disk(cluster, wf, target) == want, target
        assert holder_on_disk(cluster, wf, f"{target}.node") == want, target
    assert {expected_node(cluster, wf, f"up{i}.txt") for i in range(1, 5)} == set(NODES)
    for entry in entries:
        assert entry["make_node"] == "n1" and entry["status"] == 0 and entry["cwd"] == f"/{wf}"
        assert isinstance(entry["seconds"], float) and entry["seconds"] >= 0
    merged = next(e for e in entries if e["target"] == "merged.txt")
    ups = [len(inputs[f"in{i}.txt"]) for i in range(1, 5)]
    assert merged["inputs"] == 4 and merged["bytes_local"] == ups[3] and merged["bytes_remote"] == sum(ups[:3])

    # the same placement as the library's Cluster.place
    api = Cluster.open(cluster.spec.name)
    for target in ("merged.txt", "report.txt", "up3.txt"):
        assert api.place([f"/{wf}/{d}" for d in DEPS[target]]).node == expected_node(cluster, wf, target)

    # byte-identical to the same Makefile run on plain local disk without the include
    plain = tmp_path / "plain"
    plain.mkdir()
    for name, data in inputs.items():
        (plain / name).write_bytes(data)
    (plain / "Makefile").write_text(WORKFLOW)
    baseline = make(plain, "-j4")
    assert baseline.returncode == 0, baseline.stderr
    for name in OUTPUTS:
        assert (here / name).read_bytes() == (plain / name).read_bytes(), name
    assert sorted(baseline.stdout.splitlines()) == sorted(result.stdout.splitlines())

    # nothing to do the second time: make sees every output, from n1's mount, as up to date
    again = make(here, "-j4")
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr


def test_make_failing_recipe_keeps_exit_status_and_stderr(cluster: LocalCluster, tmp_path: Path) -> None:
    wf = "wf-fail"
    put_inputs(cluster, wf)
    text = ("bad: in3.txt\n\t@echo \"bad on $$GMOUNT_NODE\" >&2; echo partial; exit 7\n"
            "good.txt: in4.txt\n\tcp $< $@\n")
    (cluster.export("n1") / wf / "Makefile").write_text(INCLUDE + text)
    here = cluster.mount("n1") / wf
    result = make(here, "bad")
    assert result.returncode == 2
    assert "bad on n3" in result.stderr and "partial" in result.stdout
    assert "[Makefile:3: bad] Error 7" in result.stderr  # make saw the recipe's own status
    # the line before make's own error names the node, as Snakemake's error does
    lines = result.stderr.splitlines()
    error = next(i for i, line in enumerate(lines) if line.endswith("[Makefile:3: bad] Error 7"))
    assert lines[error - 1] == "gmount: target bad failed on node n3: its recipe exited with status 7", lines
    entries = read_log(next((here / ".gmount").glob("make-*.jsonl")))
    assert [(e["target"], e["node"], e["status"]) for e in entries] == [("bad", "n3", 7)]

    # the wrapper on its own hands back the recipe's exit status, stdout and stderr
    direct = subprocess.run([os.path.join(BIN, "gmount-sh"), "-c", "echo out; echo err >&2; exit 42"],
                            check=False, cwd=here, env=env(GMOUNT_TARGET="x", GMOUNT_DEPS="in2.txt"),
                            capture_output=True, text=True)
    assert (direct.returncode, direct.stdout, direct.stderr) == (
        42, "out\n", "err\ngmount: target x failed on node n2: its recipe exited with status 42\n")

    # -k: the other target is still made (on its node), make still fails
    keep_going = make(here, "-k", "-j2", "bad", "good.txt")
    assert keep_going.returncode == 2 and "bad on n3" in keep_going.stderr
    assert holder_on_disk(cluster, wf, "good.txt") == "n4"
    assert (here / "good.txt").read_bytes() == (cluster.export("n4") / wf / "in4.txt").read_bytes()


def test_make_shell_function_oneshell_and_recursive_make(cluster: LocalCluster) -> None:
    wf = "wf-features"
    put_inputs(cluster, wf)
    (cluster.export("n3") / wf / "sub").mkdir(parents=True)
    (cluster.export("n3") / wf / "sub" / "data.txt").write_text("sub data on n3\n")
    (cluster.export("n1") / wf / "sub").mkdir(parents=True)
    (cluster.export("n1") / wf / "sub" / "Makefile").write_text(
        INCLUDE + "sub.txt: data.txt\n\techo \"$$GMOUNT_NODE $$(cat data.txt)\" > $@\n")
    text = (".ONESHELL:\n"
            "PARSED := $(shell echo \"$$PWD\" $$GMOUNT_NODE)\n"
            "all: one.txt sub/sub.txt parsed.txt\n"
            "parsed.txt:\n\techo '$(PARSED)' > $@\n\t@echo \"recipe $$GMOUNT_NODE\" >> $@\n"
            "one.txt: in3.txt\n\tcd sub\n\t@echo \"$$GMOUNT_NODE $$(pwd)\" > ../one.txt\n"
            "\t-true\n\t+echo \"lines $$GMOUNT_NODE\" >> ../one.txt\n"
            "sub/sub.txt:\n\t$(MAKE) -C sub sub.txt\n")
    (cluster.export("n1") / wf / "Makefile").write_text(INCLUDE + text)
    here = cluster.mount("n1") / wf
    result = make(here, "-j4")
    assert result.returncode == 0, result.stderr
    assert "jobserver" not in result.stderr  # -j reached the sub-make
    # $(shell ...) ran right here, in n1's mount, not placed
    assert (here / "parsed.txt").read_text() == f"{here}\nrecipe n1\n"
    # .ONESHELL: one shell (the cd holds), inner @ - + prefixes removed, on the node of in3.txt
    assert (here / "one.txt").read_text() == f"n3 {cluster.mount('n3') / wf / 'sub'}\nlines n3\n"
    # the sub-make ran on n1 (no prerequisites), its own recipe went to n3 where data.txt is
    assert (here / "sub" / "sub.txt").read_text() == "n3 sub data on n3\n"
    entries = read_log(next((here / ".gmount").glob("make-*.jsonl")))
    assert ("sub.txt", "n3") in {(e["target"], e["node"]) for e in entries}  # one log for the whole run
    assert ("sub/sub.txt", "n1") in {(e["target"], e["node"]) for e in entries}


def test_gmount_make_zero_line_form(cluster: LocalCluster, tmp_path: Path) -> None:
    wf = "wf-zero"
    put_inputs(cluster, wf)
    (cluster.export("n1") / wf / "Makefile").write_text(WORKFLOW)  # no include at all
    here = cluster.mount("n1") / wf
    log = tmp_path / "placement.jsonl"
    result = subprocess.run([os.path.join(BIN, "gmount"), "make", "-j4", "merged.txt"], check=False, cwd=here,
                            env=env(GMOUNT_PLACEMENT_LOG=str(log)), capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    entries = read_log(log)  # where the user said, not under .gmount/
    assert not (here / ".gmount").exists()
    assert {(e["target"], e["node"]) for e in entries} == {
        ("up1.txt", "n1"), ("up2.txt", "n2"), ("up3.txt", "n3"), ("up4.txt", "n4"), ("merged.txt", "n4")}
    assert (here / "merged.txt.node").read_text() == "n4\n"


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_make_interrupt_leaves_no_processes(cluster: LocalCluster, how: str) -> None:
    wf = f"wf-int-{how}"
    put_inputs(cluster, wf)
    text = "\n".join(f"t{i}: in{i}.txt\n\t@echo $$$$ > pid-{i}; sleep 300 & echo $$! > bg-{i}; sleep 300\n"
                     for i in (2, 3, 4))
    (cluster.export("n1") / wf / "Makefile").write_text(INCLUDE + "all: t2 t3 t4\n" + text)
    here = cluster.mount("n1") / wf
    process = subprocess.Popen(["make", "-j3"], cwd=here, env=env(), start_new_session=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=as_terminal_job)
    try:
        started = wait_for(lambda: all((here / f"bg-{i}").exists() and (here / f"bg-{i}").read_text().strip()
                                       for i in (2, 3, 4)), timeout=60)
        assert started, process.communicate()[1] if process.poll() is not None else "recipes did not start"
        below = descendants(process.pid)
        recipes = {int((here / f"{kind}-{i}").read_text()) for kind in ("pid", "bg") for i in (2, 3, 4)}
        assert recipes <= below and all(alive(p) for p in recipes)
        for i in (2, 3, 4):  # each recipe ran on its input's node
            assert holder_on_disk(cluster, wf, f"pid-{i}") == f"n{i}"
        if how == "ctrl-c":  # what the terminal does: SIGINT to make's whole foreground process group
            os.killpg(process.pid, signal.SIGINT)
        else:  # make forwards SIGTERM to its children (gmount-sh), which stop their recipe's group
            process.send_signal(signal.SIGTERM)
        try:
            process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"make did not stop within 30 s of {how}:\n"
                                 f"{process_report(process.pid, cluster)}") from None
        assert process.returncode != 0
        assert wait_for(lambda: not any(alive(p) for p in below), timeout=10), \
            [p for p in below if alive(p)]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        close_pipes(process)
        for i in (2, 3, 4):
            for kind in ("pid", "bg"):
                try:
                    pid = int((cluster.export(f"n{i}") / wf / f"{kind}-{i}").read_text())
                    if alive(pid) and pid in descendants(1):
                        os.kill(pid, signal.SIGKILL)
                except (FileNotFoundError, ValueError, ProcessLookupError):
                    pass


@given(st.text())
def test_json_string_writes_what_json_dumps_writes(text: str) -> None:
    assert json_string(text) == json.dumps(text)


def test_json_line_writes_what_json_dumps_writes() -> None:
    record: dict[str, str | int | float] = {
        "target": 'fits/fit.000.001.txt "q" \\ \t\n\x7f', "node": "n\u00e9\U0001f600", "odd": "\udcff",
        "inputs": 5, "bytes_remote": 10**20, "seconds": 0.000123, "time": 1795452491.1528616, "neg": -3.5e-9}
    assert json_line(record) == json.dumps(record)
    assert json.loads(json_line(record)) == record
    with pytest.raises(TypeError, match="not a string or a number"):
        json_line({"flag": True})


def test_gmount_sh_imports_only_cheap_modules(tmp_path: Path) -> None:
    """gmount-sh runs once per recipe: importing it (and the placement rule it loads when more than one
    node holds inputs) must not load json, re, dataclasses, typing, ... -- each costs milliseconds."""
    def loaded(code: str) -> set[str]:
        out = subprocess.run([sys.executable, "-c", code + "; import sys; print(' '.join(sys.modules))"],
                             cwd=tmp_path, check=True, capture_output=True, text=True).stdout
        return set(out.split())

    baseline = loaded("pass")
    added = loaded("import gmountpy_make.shell, gmountpy.jobs.placement, gmountpy.cluster.mounts") - baseline
    heavy = {"json", "re", "dataclasses", "typing", "inspect", "threading", "subprocess", "collections", "enum"}
    assert not added & heavy, sorted(added & heavy)


def test_mounts_holdings_of_many_prerequisites(cluster: LocalCluster) -> None:
    """Read in parallel, the holdings of many files (and a directory, and a missing file) are each
    file's holders with its size, in the order given, directories expanded in name order."""
    wf = "wf-holdings"
    expected: dict[str, dict[str, int]] = {}
    names = []
    for i in range(20):
        node = NODES[i % 4]
        (cluster.export(node) / wf).mkdir(parents=True, exist_ok=True)
        (cluster.export(node) / wf / f"f{i:02d}.txt").write_bytes(b"x" * (100 + i))
        names.append(f"f{i:02d}.txt")
        expected[f"/{wf}/f{i:02d}.txt"] = {node: 100 + i}
    for node, size in (("n2", 7), ("n4", 9)):
        (cluster.export(node) / wf / "sub").mkdir(parents=True, exist_ok=True)
        (cluster.export(node) / wf / "sub" / f"{node}.dat").write_bytes(b"y" * size)
    cluster.rescan()
    found = mounts.find(str(cluster.mount("n1") / wf))
    assert found is not None
    mounted = found[0]
    order = list(reversed(names)) + ["sub", "missing.txt", "/elsewhere/not-in-a-mount"]
    holdings = mounted.holdings(order, str(cluster.mount("n1") / wf))
    assert list(holdings) == [f"/{wf}/{n}" for n in reversed(names)] + \
        [f"/{wf}/sub/n2.dat", f"/{wf}/sub/n4.dat", f"/{wf}/missing.txt"]
    assert holdings == {**expected, f"/{wf}/sub/n2.dat": {"n2": 7}, f"/{wf}/sub/n4.dat": {"n4": 9},
                        f"/{wf}/missing.txt": {}}
    assert mounted.holdings(["f03.txt"], str(cluster.mount("n3") / wf)) == {f"/{wf}/f03.txt": {"n4": 103}}


# --------------------------------------------------------------------------- outside a mount: plain make

#: a workflow that exercises what a laptop run needs: pattern rules, -j, a sub-make, .ONESHELL-free recipes
LAPTOP = """\
all: total.txt sub/done.txt
up%.txt: in%.txt
\ttr a-z A-Z < $< > $@
total.txt: up1.txt up2.txt
\tcat $^ > $@
sub/done.txt:
\t$(MAKE) -C sub done.txt
clean:
\trm -f up1.txt up2.txt total.txt sub/done.txt
"""


def laptop_workflow(directory: Path, include: str = INCLUDE) -> None:
    (directory / "sub").mkdir(parents=True, exist_ok=True)
    (directory / "in1.txt").write_text("one\n")
    (directory / "in2.txt").write_text("two\n")
    (directory / "Makefile").write_text(include + LAPTOP)
    (directory / "sub" / "Makefile").write_text(include + "done.txt:\n\techo \"[$$GMOUNT_NODE]\" > $@\n")


def notices(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "gmount" in line]


def test_make_outside_a_mount_runs_recipes_here_with_one_notice(tmp_path: Path) -> None:
    """A Makefile with the include, in a plain directory: make runs every recipe itself (and the sub-make's),
    as without the include, says why in one line for the whole run, and `make clean` works."""
    require("GNU make and gmount-sh", make_problem())
    laptop_workflow(tmp_path)
    result = make(tmp_path, "-j4")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "total.txt").read_text() == "ONE\nTWO\n"
    assert (tmp_path / "sub" / "done.txt").read_text() == "[]\n"  # not placed: no GMOUNT_NODE
    assert notices(result.stderr) == [
        f"gmount: {tmp_path} is not inside a gmount mount: recipes run here, as plain make runs them"]
    assert "tr a-z A-Z < in1.txt > up1.txt" in result.stdout  # make's own echo of the recipe, unchanged
    assert not (tmp_path / ".gmount").exists()  # no placement log outside a mount

    cleaned = make(tmp_path, "clean")
    assert cleaned.returncode == 0, cleaned.stderr
    assert not (tmp_path / "total.txt").exists() and not (tmp_path / "sub" / "done.txt").exists()
    assert len(notices(cleaned.stderr)) == 1
    # the dry run too: one notice, make's own -n output
    dry = make(tmp_path, "-n")
    assert dry.returncode == 0 and len(notices(dry.stderr)) == 1 and "cat up1.txt up2.txt > total.txt" in dry.stdout


def test_make_without_gmount_installed_runs_plain(tmp_path: Path) -> None:
    """`include $(shell gmount make-include)` where gmount is not on PATH: make says so once and runs
    the recipes itself; the documented quiet form says nothing."""
    require("GNU make", None if shutil.which("make") else "GNU make is not installed")
    no_gmount = {**os.environ, "PATH": "/usr/bin:/bin"}
    assert subprocess.run(["sh", "-c", "command -v gmount"], env=no_gmount, check=False).returncode != 0
    laptop_workflow(tmp_path)
    result = subprocess.run(["make", "-j4"], cwd=tmp_path, env=no_gmount, capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "total.txt").read_text() == "ONE\nTWO\n"
    assert [line for line in result.stderr.splitlines() if "make[" not in line] == [
        "make: gmount: No such file or directory"]
    cleaned = subprocess.run(["make", "clean"], cwd=tmp_path, env=no_gmount, capture_output=True, text=True,
                             timeout=120, check=False)
    assert cleaned.returncode == 0 and not (tmp_path / "total.txt").exists(), cleaned.stderr

    quiet = tmp_path / "quiet"
    quiet.mkdir()
    laptop_workflow(quiet, "-include $(shell gmount make-include 2>/dev/null)\n")
    result = subprocess.run(["make", "-j4"], cwd=quiet, env=no_gmount, capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert (quiet / "total.txt").read_text() == "ONE\nTWO\n"
    # and with gmount on PATH, the quiet form is the include: one notice here, outside a mount
    placed = make(quiet, "-B", "total.txt")
    assert placed.returncode == 0 and len(notices(placed.stderr)) == 1, placed.stderr


def test_make_in_a_mount_no_daemon_to_ask_runs_recipes_here(cluster: LocalCluster, tmp_path: Path) -> None:
    """In a mount whose daemon has no job socket and whose cluster this machine does not know (no launcher
    state): nothing can place a recipe, so make runs them itself, in n1's mount, with one notice."""
    wf = "wf-nodaemon"
    put_inputs(cluster, wf)
    (cluster.export("n1") / wf / "Makefile").write_text(INCLUDE + WORKFLOW)
    here = cluster.mount("n1") / wf
    sock = job_socket(cluster, "n1")
    hidden = sock.with_name(sock.name + ".hidden")
    sock.rename(hidden)
    try:
        result = make(here, "-j4", "merged.txt", XDG_STATE_HOME=str(tmp_path / "no-state"))
    finally:
        hidden.rename(sock)
    assert result.returncode == 0, result.stderr
    assert notices(result.stderr) == [f"gmount: {here} is not inside a running gmount cluster's mount on this "
                                      "machine: recipes run here, as plain make runs them"]
    assert (here / "merged.txt.node").read_text() == "\n"  # no GMOUNT_NODE: not placed
    assert holder_on_disk(cluster, wf, "merged.txt") == "n1"
    assert not (here / ".gmount").exists()


def test_mounts_agree_with_the_overlay_and_the_state(cluster: LocalCluster) -> None:
    from gmountpy import Overlay
    found = mounts.find(str(cluster.mount("n3") / "a" / "b"))
    assert found is not None
    mounted, node, ns_path = found
    assert (mounted.name, node, ns_path) == (cluster.spec.name, "n3", "/a/b")
    overlay = Overlay(cluster.spec)
    for a in NODES:
        for b in NODES:
            assert mounted.rtt(a, b) == overlay.rtt(a, b)
    assert mounted.path_on("n2", "/a/b") == str(cluster.mount("n2") / "a" / "b")
    assert mounts.find("/") is None


# --------------------------------------------------------------------------- gmount plan / gmount make -n


def gmount(cwd: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([os.path.join(BIN, "gmount"), *args], check=False, cwd=cwd, env=env(**extra),
                          capture_output=True, text=True, timeout=180)


def test_gmount_plan_for_a_makefile_predicts_where_the_run_goes(cluster: LocalCluster) -> None:
    """`gmount plan` (from make's own -n) says job -> node and bytes before the run; the run then goes
    exactly there (its placement log), with exactly those bytes for the jobs whose inputs exist."""
    wf = "wf-plan"
    inputs = put_inputs(cluster, wf)
    (cluster.export("n1") / wf / "Makefile").write_text(INCLUDE + WORKFLOW)
    here = cluster.mount("n1") / wf

    done = gmount(here, "plan", "-f", "Makefile", "--json")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert (plan["workflow"], plan["cluster"], plan["head_node"], plan["cwd"]) == (
        "make", cluster.spec.name, "n1", f"/{wf}")
    jobs = {job["job"]: job for job in plan["jobs"]}
    assert sorted(jobs) == sorted(OUTPUTS) and len(plan["jobs"]) == len(OUTPUTS)
    order = [job["job"] for job in plan["jobs"]]
    assert order.index("merged.txt") > max(order.index(f"up{i}.txt") for i in range(1, 5))
    assert not list(here.glob("up*.txt")), "the plan ran something"
    cfg = len(inputs["shared.cfg"])
    for i, node in enumerate(NODES, start=1):  # inputs that exist: exact bytes
        up = jobs[f"up{i}.txt"]
        size = len(inputs[f"in{i}.txt"])
        assert up["node"] == node and up["inputs"] == [f"in{i}.txt", "shared.cfg"]
        assert (up["bytes_local"], up["bytes_remote"]) == ((size + cfg, 0) if node == "n2" else (size, cfg))
        assert not up["bytes_local_estimated"] and not up["bytes_remote_estimated"] and not up["planned_inputs"]
    merged = jobs["merged.txt"]  # its inputs are written by this run: on their job's node, estimated
    assert merged["node"] == "n4" and merged["planned_inputs"] == [f"up{i}.txt" for i in range(1, 5)]
    assert merged["bytes_local_estimated"] and merged["bytes_remote_estimated"]
    assert merged["bytes_remote"] == sum(len(inputs[f"in{i}.txt"]) + cfg for i in range(1, 4))
    assert plan["total"]["bytes_remote"] == sum(job["bytes_remote"] for job in plan["jobs"])
    assert plan["total"]["per_node"] == {"n1": 2, "n2": 2, "n3": 2, "n4": 4}

    # the text form: a line per job, the total, the estimate said
    text = gmount(here, "plan")
    assert text.returncode == 0, text.stderr
    rows = {line.split()[0]: line.split() for line in text.stdout.splitlines()[2:2 + len(OUTPUTS)]}
    assert {target: row[1] for target, row in rows.items()} == {j: jobs[j]["node"] for j in jobs}
    assert rows["merged.txt"][3].startswith("~") and not rows["up1.txt"][3].startswith("~")
    assert "total: 10 jobs (n1 2, n2 2, n3 2, n4 4); input bytes read locally ~" in text.stdout
    assert "~ estimated: " in text.stdout

    # the run goes where the plan said
    run = make(here, "-j4")
    assert run.returncode == 0, run.stderr
    entries = read_log(next((here / ".gmount").glob("make-*.jsonl")))
    assert {e["target"]: e["node"] for e in entries} == {j: jobs[j]["node"] for j in jobs}
    for entry in entries:
        if entry["target"].startswith("up"):
            assert (entry["bytes_local"], entry["bytes_remote"]) == (
                jobs[entry["target"]]["bytes_local"], jobs[entry["target"]]["bytes_remote"])

    # afterwards: nothing to do; with -B every recipe again, each on the node that ran it
    assert json.loads(gmount(here, "plan", "--json").stdout)["jobs"] == []
    again = json.loads(gmount(here, "plan", "--json", "-B").stdout)
    assert {job["job"]: job["node"] for job in again["jobs"]} == {j: jobs[j]["node"] for j in jobs}


def test_gmount_make_n_prints_make_n_then_the_plan_and_make_n_points_to_it(cluster: LocalCluster) -> None:
    wf = "wf-plan-n"
    put_inputs(cluster, wf)
    (cluster.export("n1") / wf / "Makefile").write_text(INCLUDE + WORKFLOW)
    (cluster.export("n1") / wf / "sub").mkdir()
    (cluster.export("n3") / wf / "sub").mkdir()
    (cluster.export("n3") / wf / "sub" / "data.txt").write_text("on n3\n")
    (cluster.export("n1") / wf / "sub" / "Makefile").write_text(INCLUDE + "out.txt: data.txt\n\tcp $< $@\n")
    here = cluster.mount("n1") / wf
    done = gmount(here, "make", "-n", "merged.txt", "sub-run", "--eval=sub-run:; $(MAKE) -C sub out.txt")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "cat up1.txt up2.txt up3.txt up4.txt > merged.txt" in out  # make's own -n output first
    plan_at = out.index("plan of make -n merged.txt")
    assert out.index("cat up1.txt") < plan_at
    rows = {line.split()[0]: line.split()[1] for line in out[plan_at:].splitlines()[2:]
            if line and not line.startswith(("total:", "~"))}
    assert rows == {"up1.txt": "n1", "up2.txt": "n2", "up3.txt": "n3", "up4.txt": "n4", "merged.txt": "n4",
                    "sub-run": "n1", "sub/out.txt": "n3"}  # the sub-make's recipe too, from its directory
    assert not (here / "merged.txt").exists() and not (here / "sub" / "out.txt").exists()

    plain = make(here, "-n", "merged.txt")
    assert plain.returncode == 0 and "cat up1.txt" in plain.stdout
    assert notices(plain.stderr) == ["gmount: make -n does not say where recipes would run; gmount make -n "
                                     "(same arguments) or gmount plan does"]


def test_gmount_plan_outside_a_mount_says_so(tmp_path: Path) -> None:
    require("GNU make and gmount-sh", make_problem())
    laptop_workflow(tmp_path)
    done = gmount(tmp_path, "plan")
    assert done.returncode == 1
    assert done.stderr == (f"gmount: {tmp_path} is not inside a running gmount cluster's mount on this machine: "
                           "make and Snakemake would run every job here (cd <mountpoint>/... to plan a run on a "
                           "cluster)\n")
    # gmount make -n outside a mount is make -n (with the one notice)
    dry = gmount(tmp_path, "make", "-n")
    assert dry.returncode == 0 and "cat up1.txt up2.txt > total.txt" in dry.stdout and len(notices(dry.stderr)) == 1


# --------------------------------------------------------------------------- packaging


@pytest.mark.slow
def test_make_wheel_ships_the_plugin_and_gmount_sh_runs_from_it(cluster: LocalCluster, tmp_path: Path) -> None:
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                            "-w", str(tmp_path / "dist"), str(REPO)],
                           check=False, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    wheel = next((tmp_path / "dist").glob("gmountpy-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for member in ("gmountpy_make/gmount.mk", "gmountpy_make/shell.py", "gmountpy_make/cli.py",
                   "gmountpy/cluster/mounts.py", "gmountpy/jobs/placement.py"):
        assert member in names, member
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "gmount-sh = gmountpy_make.shell:main" in entry_points
    assert "make = gmountpy_make.cli:make_command" in entry_points

    # a plain (non-editable) install in a fresh virtualenv; gmount-sh needs only the standard library
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
                                "-q", "--no-deps", "--no-index", str(wheel)],
                               check=False, capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr
    mk = next(venv.glob("lib/python*/site-packages/gmountpy_make/gmount.mk"))
    wf = "wf-wheel"
    put_inputs(cluster, wf)
    (cluster.export("n1") / wf / "Makefile").write_text(f"include {mk}\nout.txt: in3.txt\n\techo $$GMOUNT_NODE > $@\n")
    here = cluster.mount("n1") / wf
    # PATH without any gmount: gmount.mk finds the gmount-sh installed beside it
    result = subprocess.run(["make", "out.txt"], check=False, cwd=here, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert (here / "out.txt").read_text() == "n3\n" and holder_on_disk(cluster, wf, "out.txt") == "n3"
    assert filecmp.cmp(mk, MAKEFILE, shallow=False)


def test_make_example_workflow_runs_where_the_tiles_are(cluster: LocalCluster) -> None:
    for node, tile in (("n3", "tile-001"), ("n4", "tile-002")):
        d = cluster.export(node) / "inputs" / "survey"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{tile}.txt").write_text(f"{tile} of the survey, on {node}\n")
    (cluster.export("n1") / "make-example").mkdir()
    shutil.copy(REPO / "examples" / "make" / "Makefile", cluster.export("n1") / "make-example" / "Makefile")
    cluster.rescan()
    here = cluster.mount("n1") / "make-example"
    result = make(here, "-j4")
    assert result.returncode == 0, result.stderr
    assert (here / "tile-001.node").read_text() == "tile-001 n3\n"
    assert (here / "tile-002.node").read_text() == "tile-002 n4\n"
    assert holder_on_disk(cluster, "make-example", "tile-001.words.txt") == "n3"
    summary = (here / "survey-summary.txt").read_text()
    assert summary.startswith("tile-001: 6 words\ntile-002: 6 words\n") and "TILE-002 OF THE SURVEY" in summary


# --------------------------------------------------------------------------- the fast path: gmount-job and the daemon


def job_socket(cluster: LocalCluster, node: str) -> Path:
    return Path(jobsocket.socket_path(os.path.realpath(cluster.mount(node))))


def test_make_recipes_are_placed_by_the_daemon_not_the_python_fallback(cluster: LocalCluster) -> None:
    """make's SHELL is the C gmount-job and every recipe is placed by the node daemon: if the fast
    path fell back to the Python wrapper (no socket, a wrong socket path, a bad reply), `via` says so."""
    wf = "wf-fast"
    put_inputs(cluster, wf)
    (cluster.export("n1") / wf / "Makefile").write_text(
        INCLUDE + WORKFLOW + "shell.txt:\n\techo '$(SHELL)' > $@\n")
    here = cluster.mount("n1") / wf
    result = make(here, "-j4", "all", "shell.txt")
    assert result.returncode == 0, result.stderr
    assert (here / "shell.txt").read_text().strip() == JOB_PROGRAM
    entries = read_log(next((here / ".gmount").glob("make-*.jsonl")))
    assert len(entries) == 2 * len(OUTPUTS) + 4 + 1  # stats recipes have three lines
    assert {e["via"] for e in entries} == {"daemon"}, [e for e in entries if e["via"] != "daemon"]
    for target in OUTPUTS:
        assert {e["node"] for e in entries if e["target"] == target} == {expected_node(cluster, wf, target)}


def test_make_falls_back_to_python_gmount_sh_without_a_job_socket(cluster: LocalCluster) -> None:
    """A daemon without a job socket (an older one): the recipes still run where their inputs are,
    through the Python wrapper, and the log says so."""
    wf = "wf-nosocket"
    put_inputs(cluster, wf)
    (cluster.export("n1") / wf / "Makefile").write_text(INCLUDE + WORKFLOW)
    here = cluster.mount("n1") / wf
    sock = job_socket(cluster, "n1")
    hidden = sock.with_name(sock.name + ".hidden")
    sock.rename(hidden)
    try:
        result = make(here, "-j4", "merged.txt")
    finally:
        hidden.rename(sock)
    assert result.returncode == 0, result.stderr
    entries = read_log(next((here / ".gmount").glob("make-*.jsonl")))
    assert {e["via"] for e in entries} == {"python"}
    assert {(e["target"], e["node"]) for e in entries} == {
        ("up1.txt", "n1"), ("up2.txt", "n2"), ("up3.txt", "n3"), ("up4.txt", "n4"), ("merged.txt", "n4")}
    # and with the socket back, the daemon places again
    again = make(here, "-B", "up3.txt", GMOUNT_PLACEMENT_LOG=str(here / "again.jsonl"))
    assert again.returncode == 0, again.stderr
    assert [(e["node"], e["via"]) for e in read_log(here / "again.jsonl")] == [("n3", "daemon")] * 2


def test_make_error_names_the_node_through_the_daemon_and_the_python_path(cluster: LocalCluster) -> None:
    """The line before make's error says the node and the status -- from gmount-job (the daemon placed the
    recipe) and from the Python gmount-sh (no job socket) alike; a recipe killed by a signal too."""
    wf = "wf-errors"
    put_inputs(cluster, wf)
    (cluster.export("n1") / wf / "Makefile").write_text(INCLUDE + (
        "exit4: in4.txt\n\t@exit 4\n"
        "killed: in2.txt\n\t@kill -TERM $$$$\n"
        "notfound: in3.txt\n\t@no-such-command-here\n"
        "ignored: in3.txt\n\t-@exit 5\n"))
    here = cluster.mount("n1") / wf

    def line_before_error(result: subprocess.CompletedProcess[str], target: str) -> str:
        lines = result.stderr.splitlines()
        at = next(i for i, line in enumerate(lines) if line.startswith("make: ") and f" {target}]" in line)
        return lines[at - 1]

    def check() -> None:
        result = make(here, "-k", "exit4", "killed", "notfound")
        assert result.returncode == 2
        assert line_before_error(result, "exit4") == \
            "gmount: target exit4 failed on node n4: its recipe exited with status 4"
        assert line_before_error(result, "killed") == \
            "gmount: target killed failed on node n2: its recipe was killed by signal 15 (Terminated)"
        assert line_before_error(result, "notfound") == \
            "gmount: target notfound failed on node n3: its recipe exited with status 127"
        ignored = make(here, "ignored")
        assert ignored.returncode == 0 and "Error 5 (ignored)" in ignored.stderr
        assert "gmount: target ignored failed on node n3: its recipe exited with status 5" in ignored.stderr

    check()  # gmount-job, placed by the daemon
    sock = job_socket(cluster, "n1")
    hidden = sock.with_name(sock.name + ".hidden")
    sock.rename(hidden)
    try:
        check()  # the Python gmount-sh, placing by asking the mount
    finally:
        hidden.rename(sock)
    entries = [e for log in (here / ".gmount").glob("make-*.jsonl") for e in read_log(log)]
    assert {e["via"] for e in entries} == {"daemon", "python"}


def test_gmount_job_writes_the_log_line_json_dumps_writes(cluster: LocalCluster, tmp_path: Path) -> None:
    """The C program's JSON: a target with quotes, controls, non-ASCII and an undecodable byte reads
    back as the string Python sees in the environment; a recipe's status and node are its own."""
    wf = "wf-json"
    put_inputs(cluster, wf)
    here = cluster.mount("n1") / wf
    log = tmp_path / "log" / "placement.jsonl"  # its directory is made
    target = 'fits/"odd"\\ name\t\x01\x7f \u00e9\U0001f600 '.encode() + b"\xff\xc3("
    environ = {**env(GMOUNT_PLACEMENT_LOG=str(log), GMOUNT_DEPS="in3.txt missing.txt /etc/hostname")}
    environb = {os.fsencode(k): os.fsencode(v) for k, v in environ.items()}
    environb[b"GMOUNT_TARGET"] = target
    done = subprocess.run([JOB_PROGRAM, "-c", "echo $GMOUNT_NODE $PWD; exit 3"], cwd=here, env=environb,
                          capture_output=True, text=True, errors="surrogateescape", timeout=60, check=False)
    assert done.returncode == 3
    assert done.stdout == f"n3 {cluster.mount('n3') / wf}\n"
    assert done.stderr == f"gmount: target {os.fsdecode(target)} failed on node n3: its recipe exited with status 3\n"
    line = log.read_text()
    entry = json.loads(line)
    assert entry["target"] == os.fsdecode(target)
    assert json.dumps(os.fsdecode(target)) in line
    assert {k: entry[k] for k in ("node", "make_node", "cluster", "cwd", "inputs", "bytes_local", "bytes_remote",
                                  "status", "via")} == {
        "node": "n3", "make_node": "n1", "cluster": cluster.spec.name, "cwd": f"/{wf}", "inputs": 2,
        "bytes_local": (cluster.export("n3") / wf / "in3.txt").stat().st_size, "bytes_remote": 0, "status": 3,
        "via": "daemon"}
    assert isinstance(entry["seconds"], float) and isinstance(entry["time"], float)


def test_gmount_job_dies_of_the_signal_that_killed_the_recipe(cluster: LocalCluster) -> None:
    wf = "wf-killed"
    put_inputs(cluster, wf)
    here = cluster.mount("n1") / wf
    done = subprocess.run([JOB_PROGRAM, "-c", "kill -TERM $$"], cwd=here, check=False, timeout=60,
                          env=env(GMOUNT_TARGET="t", GMOUNT_DEPS="in2.txt", GMOUNT_PLACEMENT_LOG=""))
    assert done.returncode == -signal.SIGTERM


def test_gmount_job_without_target_is_the_recipe_shell(tmp_path: Path) -> None:
    """$(shell ...) and a direct call without GMOUNT_TARGET: the recipe shell, here, nothing asked."""
    require("GNU make and gmount-job", make_problem())
    done = subprocess.run([JOB_PROGRAM, "-c", "echo $0 $PWD; exit 5"], cwd=tmp_path, check=False, timeout=60,
                          capture_output=True, text=True, env=env(GMOUNT_RECIPE_SHELL="/bin/bash", PWD=str(tmp_path)))
    assert (done.returncode, done.stdout) == (5, f"/bin/bash {tmp_path}\n")


@pytest.mark.slow
def test_wheel_carries_gmount_job_built_and_make_uses_it(cluster: LocalCluster, tmp_path: Path) -> None:
    """`pip wheel` compiles gmount-job (setup.py) into a platform wheel, executable; installed from it,
    gmount.mk makes it SHELL and the daemon places the recipe (not the Python fallback)."""
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"),
                            str(REPO)], check=False, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    wheel = next((tmp_path / "dist").glob("gmountpy-*.whl"))
    assert not wheel.name.endswith("-none-any.whl"), wheel.name  # a compiled program inside: a platform wheel
    member = zipfile.ZipFile(wheel).getinfo("gmountpy_make/gmount-job")
    assert (member.external_attr >> 16) & 0o111, oct(member.external_attr >> 16)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
                                "-q", "--no-deps", "--no-index", str(wheel)],
                               check=False, capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr
    mk = next(venv.glob("lib/python*/site-packages/gmountpy_make/gmount.mk"))
    assert os.access(mk.parent / "gmount-job", os.X_OK)
    wf = "wf-wheel-job"
    put_inputs(cluster, wf)
    (cluster.export("n1") / wf / "Makefile").write_text(f"include {mk}\nout.txt: in4.txt\n\techo $$GMOUNT_NODE > $@\n")
    here = cluster.mount("n1") / wf
    result = subprocess.run(["make", "out.txt"], check=False, cwd=here, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert (here / "out.txt").read_text() == "n4\n"
    assert [(e["node"], e["via"]) for e in read_log(next((here / ".gmount").glob("make-*.jsonl")))] == [
        ("n4", "daemon")]


def _three_inputs_on_n3(cluster: LocalCluster, wf: str, rules: str) -> Path:
    """A workflow directory whose three inputs in0-2.dat (5000 B each) n3 holds, with a Makefile made
    of `rules` for out0-2 in n1's export; returns it in n1's mount."""
    (cluster.export("n3") / wf).mkdir(parents=True, exist_ok=True)
    for i in range(3):
        (cluster.export("n3") / wf / f"in{i}.dat").write_bytes(b"x" * 5000)
    (cluster.export("n1") / wf).mkdir(parents=True, exist_ok=True)
    (cluster.export("n1") / wf / "Makefile").write_text(INCLUDE + "all: out0 out1 out2\n" + rules)
    cluster.rescan()
    return cluster.mount("n1") / wf


def test_make_sends_a_recipe_whose_holder_is_full_to_a_free_node(cluster: LocalCluster) -> None:
    """Three recipes whose inputs all sit on n3 (2 slots), started together by make -j3: two run on
    n3, the third on a free node (n4: same site, the lowest cost to read the input) instead of sharing
    n3's slots while the others idle."""
    here = _three_inputs_on_n3(cluster, "wf-full", "out%: in%.dat\n\tsleep 2; echo $$GMOUNT_NODE > $@\n")
    result = make(here, "-j3")
    assert result.returncode == 0, result.stderr
    ran = {f"out{i}": (here / f"out{i}").read_text().strip() for i in range(3)}
    assert sorted(ran.values()) == ["n3", "n3", "n4"], ran
    entries = read_log(next((here / ".gmount").glob("make-*.jsonl")))
    moved = [e for e in entries if e["node"] == "n4"]
    assert len(moved) == 1 and moved[0]["bytes_remote"] == 5000 and moved[0]["bytes_local"] == 0


def test_make_waits_for_the_holder_that_frees_a_slot_within_the_floor(cluster: LocalCluster) -> None:
    """As above, but out0's recipe is short: n3 frees a slot well within WAIT_FLOOR, so the third
    recipe waits for it and runs on n3 too, reading nothing remotely (delay scheduling,
    gmountpy.jobs.placement), instead of leaving its data for the free node. out1 and out2 start
    0.2 s after out0 (`go`, an order-only prerequisite with no input, runs on make's node), so out0
    is the one running and not the one waiting, whatever order make's requests arrive in."""
    here = _three_inputs_on_n3(cluster, "wf-soon", "go:\n\tsleep 0.2; touch $@\n"
                                                   "out0: in0.dat\n\tsleep 0.6; echo $$GMOUNT_NODE > $@\n"
                                                   "out%: in%.dat | go\n\tsleep 3; echo $$GMOUNT_NODE > $@\n")
    result = make(here, "-j3")
    assert result.returncode == 0, result.stderr
    ran = {f"out{i}": (here / f"out{i}").read_text().strip() for i in range(3)}
    assert ran == {"out0": "n3", "out1": "n3", "out2": "n3"}, ran
    entries = [e for e in read_log(next((here / ".gmount").glob("make-*.jsonl"))) if e["target"] != "go"]
    assert [e["bytes_remote"] for e in entries] == [0, 0, 0], entries
