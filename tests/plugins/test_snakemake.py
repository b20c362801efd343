"""Real Snakemake runs with the gmount executor and storage plugins, on a local 4-node, 2-site cluster.

Each test runs `python -m snakemake` as a subprocess, as a user would.
Snakemake is slow to start on a busy machine, so the workflows are small
and the timeouts generous; nothing here asserts on speed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gmountpy import Cluster
from gmountpy.slurm import nodelist, slurm_extra

from ..conftest import LocalCluster, as_terminal_job, close_pipes, process_report, require, wait_for

REPO = Path(__file__).resolve().parents[2]
RUN_TIMEOUT = 900


def snakemake_problem() -> str | None:
    try:
        import snakemake  # noqa: F401

        import snakemake_executor_plugin_gmount  # noqa: F401
        import snakemake_storage_plugin_gmount  # noqa: F401
    except ImportError as exc:
        return (f"{exc}: install gmountpy[snakemake] (an editable install needs "
                "--config-settings editable_mode=strict to show the plugins)")
    return None


@pytest.fixture(autouse=True)
def _snakemake() -> None:
    require("snakemake and the gmount plugins", snakemake_problem())


def snakemake(cwd: Path, *args: str, check: bool = True, env: dict[str, str] | None = None
              ) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=cwd, capture_output=True, text=True,
                            timeout=RUN_TIMEOUT, env={**os.environ, **(env or {})})
    if check and result.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed ({result.returncode}):\n"
                             f"{result.stdout[-3000:]}\n{result.stderr[-6000:]}")
    return result


def spread(cluster: LocalCluster, workdir: str, files: dict[str, tuple[str, bytes]]) -> None:
    """Write each input into the export of the node named for it."""
    for rel, (node, data) in files.items():
        target = cluster.export(node) / workdir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    cluster.rescan()


def holder(cluster: LocalCluster, workdir: str, rel: str) -> list[str]:
    return [n for n in cluster.nodes if (cluster.export(n) / workdir / rel).is_file()]


def expected_node(cluster: LocalCluster, workdir: str, inputs: list[str]) -> str:
    """The node holding most input bytes, read straight from the exports (independent of the plugin)."""
    held = {n: 0 for n in cluster.nodes}
    for rel in inputs:
        for node in holder(cluster, workdir, rel):
            held[node] += (cluster.export(node) / workdir / rel).stat().st_size
    return max(cluster.nodes, key=lambda n: held[n])


def placement_records(log: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


@pytest.fixture
def workdir() -> Iterator[str]:
    name = f"smk-{uuid.uuid4().hex[:8]}"
    yield name


# -- the executor: a DAG with per-file steps, fan-out and a merge --------------------------------------

PIPELINE = """\
SAMPLES = ["s1", "s2", "s3", "s4"]

rule all:
    input: "merged.txt", expand("work/{s}.count", s=SAMPLES)

rule upper:
    input: "data/{s}.txt"
    output: "work/{s}.up"
    shell: "tr a-z A-Z < {input} > {output} && echo ${{GMOUNT_NODE:-plain}} > nodes/upper-{wildcards.s}.node"

rule count:
    input: "work/{s}.up"
    output: "work/{s}.count"
    shell: "wc -c < {input} > {output} && echo ${{GMOUNT_NODE:-plain}} > nodes/count-{wildcards.s}.node"

rule merge:
    input: expand("work/{s}.up", s=SAMPLES)
    output: "merged.txt"
    shell: "cat {input} > {output} && echo ${{GMOUNT_NODE:-plain}} > nodes/merge.node"
"""


def pipeline_inputs() -> dict[str, tuple[str, bytes]]:
    # s4 is the big one, so the merge belongs on n4
    sizes = {"s1": 900, "s2": 1100, "s3": 1300, "s4": 12000}
    return {f"data/{s}.txt": (f"n{i}", (f"{s} line of text\n" * (size // 16 + 1)).encode()[:size])
            for i, (s, size) in enumerate(sizes.items(), start=1)}


def test_snakemake_runs_every_job_where_its_inputs_are(cluster4: LocalCluster, workdir: str,
                                                       tmp_path: Path) -> None:
    inputs = pipeline_inputs()
    spread(cluster4, workdir, inputs)
    head = cluster4.export("n1") / workdir
    head.mkdir(parents=True, exist_ok=True)
    (head / "Snakefile").write_text(PIPELINE)
    (head / "nodes").mkdir()
    for node in cluster4.nodes:  # each node's jobs write their node file into a directory of their own
        (cluster4.export(node) / workdir / "nodes").mkdir(parents=True, exist_ok=True)
    # the one-line change: a workflow profile written by the CLI, picked up by plain `snakemake`
    subprocess.run([sys.executable, "-m", "gmountpy", "snakemake-profile", str(head / "profiles" / "default"),
                    "--latency-wait", "5"], check=True, capture_output=True, timeout=60)
    cwd = cluster4.mount("n1") / workdir
    plan = gmount_plan(cwd)  # before the run: from Snakemake's DAG, nothing run
    assert not (cwd / "work").exists()
    run = snakemake(cwd, "-j4")
    assert "gmount: job upper" in run.stderr + run.stdout

    logs = sorted((cwd / ".gmount").glob("snakemake-*.jsonl"))
    assert len(logs) == 1, logs
    records = placement_records(logs[0])
    assert sorted(str(r["rule"]) for r in records) == ["count"] * 4 + ["merge"] + ["upper"] * 4
    for record in records:
        job_inputs = [str(p) for p in record["inputs"]]  # type: ignore[union-attr]
        node = record["node"]
        assert node == expected_node(cluster4, workdir, job_inputs), record
        assert record["exit"] == 0 and record["input_bytes_local"] > 0, record
        if record["rule"] != "merge":
            assert record["input_bytes_remote"] == 0, record
        # the job's own file naming $GMOUNT_NODE agrees with the log, and lies in that node's export
        sample = Path(job_inputs[0]).stem if record["rule"] != "merge" else ""
        name = f"nodes/{record['rule']}-{sample}.node" if sample else "nodes/merge.node"
        assert (cwd / name).read_text().strip() == node
        assert holder(cluster4, workdir, name) == [node]
    merge = next(r for r in records if r["rule"] == "merge")
    assert merge["node"] == "n4" and merge["input_bytes_remote"] > 0  # read n1..n3's outputs at once

    # the plan said it all beforehand: every job's node; the bytes of jobs whose inputs existed exactly,
    # the others' estimated (their inputs were outputs of planned jobs)
    assert plan["head_node"] == "n1" and plan["total"]["jobs"] == len(records) == 9
    planned = {(job["rule"], tuple(job["inputs"])): job for job in plan["jobs"]}
    for record in records:
        job = planned[(str(record["rule"]), tuple(record["inputs"]))]  # type: ignore[arg-type]
        assert job["node"] == record["node"], (job, record)
        if record["rule"] == "upper":
            assert (job["bytes_local"], job["bytes_remote"]) == (record["input_bytes_local"],
                                                                 record["input_bytes_remote"])
            assert not job["planned_inputs"] and not job["bytes_local_estimated"]
        else:
            assert job["planned_inputs"] == job["inputs"] and job["bytes_local_estimated"]
    assert plan["total"]["bytes_remote"] == sum(job["bytes_remote"] for job in plan["jobs"]) > 0

    # outputs land in the export of the node that made them
    for s, i in (("s1", 1), ("s2", 2), ("s3", 3), ("s4", 4)):
        assert holder(cluster4, workdir, f"work/{s}.up") == [f"n{i}"]
        assert holder(cluster4, workdir, f"work/{s}.count") == [f"n{i}"]
    assert holder(cluster4, workdir, "merged.txt") == ["n4"]

    # byte-identical to the same workflow on plain local disk, without the plugin
    plain = tmp_path / "plain"
    for rel, (_, data) in inputs.items():
        (plain / rel).parent.mkdir(parents=True, exist_ok=True)
        (plain / rel).write_bytes(data)
    (plain / "Snakefile").write_text(PIPELINE)
    (plain / "nodes").mkdir()
    snakemake(plain, "-j4")
    outputs = ["merged.txt"] + [f"work/s{i}.{kind}" for i in range(1, 5) for kind in ("up", "count")]
    for rel in outputs:
        assert (cwd / rel).read_bytes() == (plain / rel).read_bytes(), rel

    # a second run has nothing to do (mtimes and metadata agree across nodes)
    again = snakemake(cwd, "-j4")
    assert "Nothing to be done" in again.stdout + again.stderr


def gmount_plan(cwd: Path, *args: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "gmountpy", "plan", "--json", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=RUN_TIMEOUT, check=False)
    assert done.returncode == 0, done.stderr
    plan: dict[str, Any] = json.loads(done.stdout)
    return plan


CONFIGURED = """\
configfile: "config.yaml"
localrules: summary

rule all:
    input: "summary.txt"

rule align:
    input: "reads/{sample}.fq"
    output: "aligned/{sample}.txt"
    shell: "wc -c < {input} > {output}"

rule summary:
    input: expand("aligned/{sample}.txt", sample=config["samples"])
    output: "summary.txt"
    shell: "cat {input} > {output}"
"""


def test_gmount_plan_follows_config_targets_and_localrules(cluster4: LocalCluster, workdir: str) -> None:
    """Snakemake's own DAG: --config and the configfile decide the jobs, a target narrows them, a local rule
    stays on the node Snakemake runs on; the text form names every job and the totals."""
    spread(cluster4, workdir, {"reads/a.fq": ("n2", b"a" * 3000), "reads/b.fq": ("n3", b"b" * 5000),
                               "reads/c.fq": ("n4", b"c" * 7000)})
    head = cluster4.export("n1") / workdir
    head.mkdir(parents=True, exist_ok=True)
    (head / "Snakefile").write_text(CONFIGURED)
    (head / "config.yaml").write_text("samples: [a, b]\n")
    cwd = cluster4.mount("n1") / workdir
    plan = gmount_plan(cwd)
    assert [(job["job"], job["node"]) for job in plan["jobs"]] == [
        ("align sample=a", "n2"), ("align sample=b", "n3"), ("summary", "n1")]
    summary = plan["jobs"][2]
    assert summary["reason"] == "local rule: runs where Snakemake runs (n1)"
    assert summary["planned_inputs"] == ["aligned/a.txt", "aligned/b.txt"] and summary["bytes_remote_estimated"]
    assert plan["jobs"][1]["bytes_local"] == 5000 and plan["jobs"][1]["bytes_remote"] == 0

    every = gmount_plan(cwd, "--config", "samples=[a, b, c]")
    assert [job["node"] for job in every["jobs"]] == ["n2", "n3", "n4", "n1"]
    one = gmount_plan(cwd, "aligned/c.txt", "--config", "samples=[a, b, c]")
    assert [(job["job"], job["node"]) for job in one["jobs"]] == [("align sample=c", "n4")]

    text = subprocess.run([sys.executable, "-m", "gmountpy", "plan"], cwd=cwd, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT, check=False)
    assert text.returncode == 0, text.stderr
    assert f"plan of Snakefile {cwd / 'Snakefile'} in /{workdir}: cluster {cluster4.spec.name}, run from node n1" \
        in text.stdout
    assert "total: 3 jobs (n1 1, n2 1, n3 1); input bytes read locally 7.8 KiB, from other nodes ~" in text.stdout
    assert not (cwd / "aligned").exists() and not (cwd / "summary.txt").exists()

    # a Snakefile that cannot be built: Snakemake's reason, one line, no traceback
    (head / "config.yaml").write_text("samples: [a, zz]\n")
    broken = subprocess.run([sys.executable, "-m", "gmountpy", "plan"], cwd=cwd, capture_output=True, text=True,
                            timeout=RUN_TIMEOUT, check=False)
    assert broken.returncode == 1 and "Traceback" not in broken.stderr
    assert broken.stderr.startswith("gmount: Snakemake cannot build the DAG: ") and "reads/zz.fq" in broken.stderr


def test_executor_without_a_job_socket_places_with_the_same_rule(cluster4: LocalCluster, workdir: str) -> None:
    """A head daemon without a job socket: the executor decides itself with the rule the daemon applies
    (`place`, shared with gmount plan), from what the mount says: the log says "api", the nodes agree."""
    from gmountpy.cluster import jobsocket

    spread(cluster4, workdir, {"data/a.txt": ("n3", b"a" * 4000), "data/b.txt": ("n4", b"b" * 1000),
                               "data/dir/x": ("n2", b"x" * 500), "data/dir/y": ("n2", b"y" * 700)})
    head = cluster4.export("n1") / workdir
    head.mkdir(parents=True, exist_ok=True)
    (head / "Snakefile").write_text(
        'rule all:\n    input: "ab.txt", "dir.txt", "none.txt"\n'
        'rule ab:\n    input: "data/a.txt", "data/b.txt"\n    output: "ab.txt"\n    shell: "cat {input} > {output}"\n'
        'rule dir:\n    input: "data/dir"\n    output: "dir.txt"\n    shell: "ls {input} > {output}"\n'
        'rule none:\n    output: "none.txt"\n    shell: "echo $GMOUNT_NODE > {output}"\n')
    cwd = cluster4.mount("n1") / workdir
    plan = {job["job"]: job["node"] for job in gmount_plan(cwd)["jobs"]}
    sock = Path(jobsocket.socket_path(os.path.realpath(cluster4.mount("n1"))))
    hidden = sock.with_name(sock.name + ".hidden")
    sock.rename(hidden)
    try:
        snakemake(cwd, "--executor", "gmount", "-j4", "--gmount-placement-log", "placement.jsonl")
    finally:
        hidden.rename(sock)
    records = {str(r["rule"]): r for r in placement_records(cwd / "placement.jsonl")}
    assert {rule: (r["node"], r["placed_by"]) for rule, r in records.items()} == {
        "ab": ("n3", "api"), "dir": ("n2", "api"), "none": ("n1", "api")}
    assert (records["ab"]["input_bytes_local"], records["ab"]["input_bytes_remote"]) == (4000, 1000)
    assert records["dir"]["input_bytes_local"] == 1200
    assert plan == {rule: r["node"] for rule, r in records.items()}


# -- failures, --keep-going, retries, group jobs, pinned nodes ---------------------------------------------

FAILURES = """\
rule all:
    input: "good.txt", "flaky.txt", "bad.txt", "grouped/b.txt", "pinned.txt"

rule good:
    input: "data/g.txt"
    output: "good.txt"
    shell: "cp {input} {output}"

rule flaky:  # fails on its first attempt only
    input: "data/g.txt"
    output: "flaky.txt"
    shell: "if [ ! -e flaky.flag ]; then touch flaky.flag; echo first-try-fails >&2; exit 1; fi; cp {input} {output}"

rule bad:
    input: "data/b.txt"
    output: "bad.txt"
    shell: "echo boom-on-$GMOUNT_NODE >&2; exit 3"

rule group_a:
    input: "data/grp.txt"
    output: "grouped/a.txt"
    group: "g"
    shell: "cat {input} > {output}; echo $GMOUNT_NODE >> {output}"

rule group_b:
    input: "grouped/a.txt"
    output: "grouped/b.txt"
    group: "g"
    shell: "cat {input} > {output}; echo $GMOUNT_NODE >> {output}"

rule pinned:
    input: "data/g.txt"
    output: "pinned.txt"
    resources: gmount_node="n1"
    shell: "echo $GMOUNT_NODE > {output}"
"""


def test_failures_keep_going_retries_groups_and_pins(cluster4: LocalCluster, workdir: str) -> None:
    spread(cluster4, workdir, {"data/g.txt": ("n3", b"good data\n"), "data/b.txt": ("n2", b"bad data\n"),
                               "data/grp.txt": ("n4", b"group data\n")})
    head = cluster4.export("n1") / workdir
    head.mkdir(parents=True, exist_ok=True)
    (head / "Snakefile").write_text(FAILURES)
    cwd = cluster4.mount("n1") / workdir
    plan = {job["job"]: job for job in gmount_plan(cwd)["jobs"]}
    assert {name: job["node"] for name, job in plan.items()} == {
        "good": "n3", "flaky": "n3", "bad": "n2", "group g: group_a, group_b": "n4", "pinned": "n1"}
    assert plan["pinned"]["reason"] == "resources.gmount_node"
    assert plan["group g: group_a, group_b"]["inputs"] == ["data/grp.txt"]  # what the group reads from outside
    run = snakemake(cwd, "--executor", "gmount", "-j4", "--latency-wait", "5", "--keep-going", "--retries", "1",
                    "--gmount-placement-log", "placement.jsonl", check=False)
    output = run.stdout + run.stderr
    assert run.returncode != 0, output
    # the failing job: its exit status, its node, and its stderr
    assert "failed on node n2: its command exited with status 3. Its stderr there:\nboom-on-n2\n" in output, \
        output[-4000:]
    # --keep-going: everything else finished; retries: the flaky job made it on attempt 2
    assert (cwd / "good.txt").read_bytes() == b"good data\n"
    assert (cwd / "flaky.txt").read_bytes() == b"good data\n"
    assert not (cwd / "bad.txt").exists()
    records = placement_records(cwd / "placement.jsonl")
    flaky = sorted((r["attempt"], r["exit"]) for r in records if r["rule"] == "flaky")
    assert flaky == [(1, 1), (2, 0)]
    assert sorted((r["attempt"], r["command_exit"], r["node"]) for r in records if r["rule"] == "bad") == [
        (1, 3, "n2"), (2, 3, "n2")]
    # the group job ran as one job, on the node holding its input; both outputs stayed there
    group = [r for r in records if r.get("rules")]
    assert len(group) == 1 and group[0]["node"] == "n4" and group[0]["rules"] == ["group_a", "group_b"]
    assert (cwd / "grouped/b.txt").read_text() == "group data\nn4\nn4\n"
    assert holder(cluster4, workdir, "grouped/b.txt") == ["n4"]
    # resources.gmount_node wins over placement
    assert (cwd / "pinned.txt").read_text() == "n1\n"
    assert next(r for r in records if r["rule"] == "pinned")["reason"] == "resources.gmount_node"


# -- Ctrl-C ---------------------------------------------------------------------------------------------

def processes_mentioning(token: str) -> list[tuple[int, str]]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = (Path("/proc") / entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if token in cmdline:
            found.append((int(entry), cmdline))
    return found


def test_ctrl_c_stops_every_job_and_leaves_no_process(cluster4: LocalCluster, workdir: str) -> None:
    token = f"{uuid.uuid4().int % 1000}.{uuid.uuid4().int % 100000:05d}"  # a unique `sleep` argument
    spread(cluster4, workdir, {f"data/{i}.txt": (node, b"x") for i, node in enumerate(cluster4.nodes)})
    head = cluster4.export("n1") / workdir
    head.mkdir(parents=True, exist_ok=True)
    (head / "Snakefile").write_text(f"""\
rule all:
    input: expand("out/{{i}}.txt", i=range(4))

rule slow:
    input: "data/{{i}}.txt"
    output: "out/{{i}}.txt"
    shell: "touch started-{{wildcards.i}}-$GMOUNT_NODE; sleep {token}; sleep {token} & wait; touch {{output}}"
""")
    cwd = cluster4.mount("n1") / workdir
    process = subprocess.Popen([sys.executable, "-m", "snakemake", "--executor", "gmount", "-j4",
                                "--gmount-placement-log", "placement.jsonl", "--gmount-stop-grace", "3"],
                               cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               preexec_fn=as_terminal_job)
    try:
        started = wait_for(lambda: len(list(cwd.glob("started-*"))) == 4, timeout=RUN_TIMEOUT, interval=0.5)
        assert started, "the four jobs did not start"
        assert {p.name.split("-")[-1] for p in cwd.glob("started-*")} == set(cluster4.nodes)
        assert processes_mentioning(f"sleep {token}")
        process.send_signal(signal.SIGINT)
        try:
            out, _ = process.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            raise AssertionError("snakemake did not stop within 120 s of Ctrl-C:\n"
                                 f"{process_report(process.pid, cluster4)}") from None
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        close_pipes(process)
    assert process.returncode != 0, out
    assert wait_for(lambda: not processes_mentioning(f"sleep {token}") and not processes_mentioning(workdir),
                    timeout=15), (processes_mentioning(f"sleep {token}"), processes_mentioning(workdir))
    records = placement_records(cwd / "placement.jsonl")
    assert len(records) == 4 and all(r.get("cancelled") for r in records), json.dumps(records, indent=0)
    assert not list(cwd.glob("out/*"))


# -- the storage plugin, outside any mount -------------------------------------------------------------------

def test_storage_plugin_in_a_real_run_outside_the_mount(cluster4: LocalCluster, workdir: str,
                                                        tmp_path: Path) -> None:
    name = cluster4.spec.name
    samples = {"a": ("n2", b"alpha\n" * 100), "b": ("n3", b"beta\n" * 7), "c": ("n4", os.urandom(70_000))}
    spread(cluster4, workdir, {f"in/{s}.dat": v for s, v in samples.items()})
    outside = tmp_path / "laptop"
    outside.mkdir()
    (outside / "Snakefile").write_text(f"""\
SAMPLES = glob_wildcards(storage.gmount("gmount://{name}/{workdir}/in/{{s}}.dat")).s

rule all:
    input: storage.gmount("gmount://{name}/{workdir}/out/total.txt")

rule size:
    input: storage.gmount("gmount://{name}/{workdir}/in/{{s}}.dat")
    output: storage.gmount("gmount://{name}/{workdir}/out/{{s}}.sha")
    shell: "sha256sum < {{input}} > {{output}}"

rule total:
    input: storage.gmount(expand("gmount://{name}/{workdir}/out/{{s}}.sha", s=sorted(SAMPLES)))
    output: storage.gmount("gmount://{name}/{workdir}/out/total.txt")
    shell: "cat {{input}} > {{output}}"
""")
    assert Cluster.open(name).where(str(outside))[0].holders == ()  # really outside every mount
    snakemake(outside, "-j2", "--storage-gmount-node", "n3")
    import hashlib
    expected = "".join(f"{hashlib.sha256(data).hexdigest()}  -\n" for _, (_, data) in sorted(samples.items()))
    assert (cluster4.export("n3") / workdir / "out/total.txt").read_text() == expected  # stored on n3
    for s in samples:
        assert holder(cluster4, workdir, f"out/{s}.sha") == ["n3"]
    # mtimes come from the cluster: a second run has nothing to do
    again = snakemake(outside, "-j2", "--storage-gmount-node", "n3")
    assert "Nothing to be done" in again.stdout + again.stderr


# -- one line for SLURM users ------------------------------------------------------------------------------

def test_slurm_extra_names_the_node_holding_the_inputs(cluster4: LocalCluster, workdir: str) -> None:
    spread(cluster4, workdir, {"a.bin": ("n3", b"a" * 5000), "b.bin": ("n2", b"b" * 100)})
    name = cluster4.spec.name
    assert slurm_extra([f"/{workdir}/a.bin", f"/{workdir}/b.bin"], cluster=name) == "--nodelist=n3"
    assert nodelist(f"/{workdir}/b.bin", cluster=name) == "n2"
    assert slurm_extra([f"/{workdir}/b.bin"], cluster=name, extra="--exclusive") == "--nodelist=n2 --exclusive"
    # relative paths are taken in the working directory's mount, as Snakemake passes `input`
    here = cluster4.mount("n1") / workdir
    cli = subprocess.run([sys.executable, "-m", "gmountpy", "slurm-extra", "a.bin", "b.bin"], cwd=here,
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0 and cli.stdout == "--nodelist=n3\n", cli.stderr
    # the exact expression a profile puts under default-resources, evaluated as Snakemake does
    from snakemake.resources import Resource
    expression = "__import__('gmountpy.slurm').slurm.slurm_extra(input, cluster='" + name + "')"
    value = Resource.cli_evaluator("slurm_extra", expression, wildcards=None, input=[f"/{workdir}/a.bin"],
                                   attempt=1, async_run=None)  # type: ignore[arg-type]
    assert value == "--nodelist=n3"


def test_snakemake_profile_for_the_profile_flag(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "config")}
    made = subprocess.run([sys.executable, "-m", "gmountpy", "snakemake-profile", "--jobs", "6",
                           "--cluster", "demo"], env=env, capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    config = tmp_path / "config" / "snakemake" / "gmount" / "config.yaml"
    assert made.stdout.strip() == str(config)
    assert yaml.safe_load(config.read_text()) == {"executor": "gmount", "jobs": 6, "latency-wait": 10,
                                                   "gmount-cluster": "demo"}
    again = subprocess.run([sys.executable, "-m", "gmountpy", "snakemake-profile"], env=env, capture_output=True,
                           text=True, timeout=60)
    assert again.returncode == 1 and "--force" in again.stderr


# -- discovery from a normal (non-editable) install ----------------------------------------------------------

def test_plugins_are_discovered_from_an_installed_wheel(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", str(REPO), "-w", str(wheels)],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    wheel = next(wheels.glob("gmountpy-*.whl"))
    installed = subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "-q", str(wheel)],
                               capture_output=True, text=True, timeout=600)
    assert installed.returncode == 0, installed.stderr[-3000:]
    # dependencies (snakemake itself and the rest) come from the shared environment, after the venv's own
    site = next((venv / "lib").glob("python3.*/site-packages"))
    shared = [p for p in sys.path if p.endswith("site-packages") and Path(p, "snakemake").is_dir()]
    (site / "zz_shared_deps.pth").write_text("\n".join(shared) + "\n")
    where = subprocess.run([str(python), "-c", "import snakemake_executor_plugin_gmount as e, "
                            "snakemake_storage_plugin_gmount as s; print(e.__file__); print(s.__file__)"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert where.returncode == 0, where.stderr
    assert all(line.startswith(str(site)) for line in where.stdout.split()), where.stdout
    helped = subprocess.run([str(python), "-m", "snakemake", "--help"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=300)
    assert helped.returncode == 0, helped.stderr[-3000:]
    assert "--gmount-placement-log" in helped.stdout and "--storage-gmount-node" in helped.stdout
    shutil.rmtree(venv)


# -- shell: jobs run alone on their node; Snakemake's semantics hold ---------------------------------------

SEMANTICS = """\
rule all:
    input: "final.txt", "py.txt"

rule first:
    input: "data/in.txt"
    output: temp("tmp/first.txt")
    log: "logs/first.log"
    threads: 2
    params: tag=lambda wildcards: "tag-" + "x"
    shell: "echo $OMP_NUM_THREADS {params.tag} {threads} $(ls .snakemake/incomplete | wc -l) > {output}; "
           "echo logged-on-$GMOUNT_NODE > {log}"

rule second:
    input: "tmp/first.txt"
    output: protected("final.txt")
    shell: "cat {input} > {output}"

rule python:
    input: "data/in.txt"
    output: "py.txt"
    run:
        shell("echo from-run-on-$GMOUNT_NODE > {output}")

rule partial:
    input: "data/in.txt"
    output: "partial.txt"
    shell: "echo half > {output}; echo partial-fails >&2; exit 4"
"""


def test_shell_jobs_run_alone_on_their_node_with_snakemakes_semantics(cluster4: LocalCluster, workdir: str) -> None:
    """A `shell:` rule's command runs by itself on the node holding its inputs (no Snakemake process
    per job: the placement log says "shell", and must -- a silent fall back to the job's own Snakemake
    fails here), with what Snakemake gives a command: threads, params, logs, temp(), protected(),
    incomplete markers while it runs, and a failed job's outputs removed. A `run:` rule keeps its own
    Snakemake process."""
    spread(cluster4, workdir, {"data/in.txt": ("n3", b"input on n3\n" * 50)})
    head = cluster4.export("n1") / workdir
    head.mkdir(parents=True, exist_ok=True)
    (head / "Snakefile").write_text(SEMANTICS)
    cwd = cluster4.mount("n1") / workdir
    run = snakemake(cwd, "--executor", "gmount", "-j4", "--gmount-placement-log", "placement.jsonl")
    assert "gmount: job first" in run.stdout + run.stderr
    records = {str(r["rule"]): r for r in placement_records(cwd / "placement.jsonl")}
    assert {rule: (r["node"], r["via"], r["placed_by"]) for rule, r in records.items()} == {
        "first": ("n3", "shell", "daemon"), "second": ("n3", "shell", "daemon"),
        "python": ("n3", "snakemake", "daemon")}
    assert records["python"]["snakemake_because"] == "run: directive (or no shell command)"
    # threads and params as Snakemake formats them; the job's own incomplete marker was there
    threads, tag, formatted, markers = (cwd / "final.txt").read_text().split()
    assert (threads, tag, formatted) == ("2", "tag-x", "2") and int(markers) >= 1
    assert (cwd / "logs" / "first.log").read_text() == "logged-on-n3\n"
    assert (cwd / "py.txt").read_text() == "from-run-on-n3\n"
    assert holder(cluster4, workdir, "final.txt") == ["n3"]
    # temp(): removed once its consumer finished; protected(): write-protected where it lies
    assert not (cwd / "tmp" / "first.txt").exists() and holder(cluster4, workdir, "tmp/first.txt") == []
    assert (cluster4.export("n3") / workdir / "final.txt").stat().st_mode & 0o222 == 0
    assert not list((cwd / ".snakemake" / "incomplete").glob("*"))  # markers gone after success
    again = snakemake(cwd, "--executor", "gmount", "-j4")
    assert "Nothing to be done" in again.stdout + again.stderr

    # a failing command: Snakemake removes what it wrote, the error names the node and shows its stderr
    failed = snakemake(cwd, "--executor", "gmount", "-j4", "--gmount-placement-log", "failed.jsonl",
                       "partial.txt", check=False)
    output = failed.stdout + failed.stderr
    assert failed.returncode != 0
    assert "failed on node n3: its command exited with status 4. Its stderr there:\npartial-fails\n" in output
    assert "Removing output files of failed job partial" in output
    assert not (cwd / "partial.txt").exists() and holder(cluster4, workdir, "partial.txt") == []
    assert [(r["via"], r["exit"], r["command_exit"]) for r in placement_records(cwd / "failed.jsonl")] == [
        ("shell", 4, 4)]


def test_variant_calling_workflow_through_the_profile_matches_plain_snakemake(cluster4: LocalCluster,
                                                                              workdir: str, tmp_path: Path) -> None:
    """The tutorial's bwa -> samtools -> bcftools workflow with the gmount profile inside a mount, each
    sample's reads on another node, against plain Snakemake in a plain directory: the same bytes, and
    every per-sample job ran on its sample's node as a plain shell job."""
    from benchmarks import bench_variants as variants

    require("bwa, samtools, bcftools", variants.tools_problem())
    files = variants.prepare(20, 2000, tmp_path / "inputs")
    variants.place_inputs(files, {name: cluster4.export(variants.node_of(name)) / workdir for name in files})
    cluster4.rescan()
    head = cluster4.export("n1") / workdir
    (head / "Snakefile").write_text(variants.SNAKEFILE)
    variants.write_profile(head)
    plain = tmp_path / "plain"
    variants.place_inputs(files, {name: plain for name in files})
    (plain / "Snakefile").write_text(variants.SNAKEFILE)
    cwd = cluster4.mount("n1") / workdir
    variants.run_snakemake(cwd, 4, timeout=RUN_TIMEOUT)
    variants.run_snakemake(plain, 4, timeout=RUN_TIMEOUT)
    assert variants.differences(cwd, plain) == []
    records = placement_records(next((cwd / ".gmount").glob("snakemake-*.jsonl")))
    assert {(r["via"], r["placed_by"]) for r in records} == {("shell", "daemon")}
    for sample, node in variants.SAMPLES.items():
        assert holder(cluster4, workdir, f"sorted_reads/{sample}.bam") == [node]
        assert holder(cluster4, workdir, f"sorted_reads/{sample}.bam.bai") == [node]
        assert holder(cluster4, workdir, f"logs/bwa_map/{sample}.log") == [node]
        assert holder(cluster4, workdir, f"mapped_reads/{sample}.bam") == []  # temp(), removed
    assert holder(cluster4, workdir, "data/genome.fa.bwt") == ["n1"]
