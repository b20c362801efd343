"""Run a reference pipeline on a cluster (or one local directory) and measure it.

One run = write the inputs where they would sit after acquisition (each
site's nodes hold their own), run the Makefile or Snakefile with an engine,
then recover from the files left behind which node ran each job (a job's
output lands in the export of the node that ran it), read the daemons' byte
counters before and after, and compare the result with the same pipeline
run on one plain local directory.

Placements:
- `locality`: the gmount make include / Snakemake executor place each job
  (the plugins; see plugins/).
- `random`, `single`: baselines without the plugins. The engine runs with a
  small shell wrapper (make's SHELL, Snakemake's shell executable) that
  runs each job in another node's mount -- a node picked from a hash of the
  job's target and a seed, or always the same node. Set through environment
  variables GMOUNT_PLACEMENT=random|single, GMOUNT_PLACEMENT_NODES,
  GMOUNT_PLACEMENT_NODE, GMOUNT_PLACEMENT_SEED (the plugins may honour the
  same variables).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from ..api import Cluster
from ..errors import GmountError
from ..jobs import prestage
from .base import Job, Options, Pipeline

ENGINES = ("make", "snakemake")
PLACEMENTS = ("locality", "random", "single")
#: directories engines and plugins keep their own state in: not pipeline files
_ENGINE_DIRS = (".snakemake", ".gmount", ".jobs")

PLACEMENT_SH = """\
#!/bin/sh
# gmount pipeline's placement baselines: make's SHELL / Snakemake's shell executable.
# Runs the job in the same relative directory of another node's mount: the node is
# GMOUNT_PLACEMENT_NODE (single) or picked by a hash of the job (random).
case "$GMOUNT_PLACEMENT" in
  single) node=$GMOUNT_PLACEMENT_NODE ;;
  random)
    key=${GMOUNT_TARGET:-$*}
    count=$(echo $GMOUNT_PLACEMENT_NODES | wc -w)
    hash=$(printf '%s %s' "$GMOUNT_PLACEMENT_SEED" "$key" | cksum | cut -d' ' -f1)
    node=$(echo $GMOUNT_PLACEMENT_NODES | cut -d' ' -f$((hash % count + 1))) ;;
  *) node= ;;
esac
mount=
for pair in $GMOUNT_PLACEMENT_MOUNTS; do
  case $pair in "$node="*) mount=${pair#*=} ;; esac
done
if [ -z "$mount" ]; then
  echo "gmount pipeline: no mount for node '$node' (GMOUNT_PLACEMENT=$GMOUNT_PLACEMENT)" >&2
  exit 2
fi
case $PWD in
  "$GMOUNT_PLACEMENT_HOME"*) cd "$mount${PWD#"$GMOUNT_PLACEMENT_HOME"}" || exit 2 ;;
esac
GMOUNT_NODE=$node
export GMOUNT_NODE
if [ -n "$GMOUNT_PLACEMENT_SETTLE" ]; then
  # a file system that publishes a closed file's size a moment after close() (Gfarm): the next
  # job, maybe on another node, must not start before
  ${GMOUNT_PLACEMENT_SHELL:-/bin/sh} "$@"
  status=$?
  sleep "$GMOUNT_PLACEMENT_SETTLE"
  exit $status
fi
exec ${GMOUNT_PLACEMENT_SHELL:-/bin/sh} "$@"
"""


@dataclass(frozen=True)
class EngineRun:
    seconds: float
    returncode: int
    output: str


def _engine_command(engine: str, jobs: int, extra: Sequence[str] = ()) -> list[str]:
    if engine == "make":
        return ["make", f"-j{jobs}", f"PYTHON={sys.executable}", *extra]
    if engine == "snakemake":
        return [sys.executable, "-m", "snakemake", "-j", str(jobs), "--nolock", *extra]
    raise ValueError(f"unknown engine {engine!r}: choose make or snakemake")


def _run_engine(command: list[str], cwd: str, env: dict[str, str], log_path: str) -> EngineRun:
    path_dirs = [os.path.dirname(sys.executable), os.environ.get("PATH", "")]
    full_env = {**os.environ, "PATH": os.pathsep.join(path_dirs), **env}
    started = time.monotonic()
    with open(log_path, "w") as log:
        process = subprocess.run(command, cwd=cwd, env=full_env, stdout=log, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, check=False)
    seconds = time.monotonic() - started
    with open(log_path, errors="replace") as log:
        output = log.read()
    return EngineRun(seconds, process.returncode, output)


def _copy_workflow(pipe: Pipeline, directory: str) -> None:
    for name in ("Makefile", "Snakefile"):
        shutil.copyfile(os.path.join(pipe.directory, name), os.path.join(directory, name))


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


# --------------------------------------------------------------------------- one plain directory


def run_single_directory(pipe: Pipeline, size: int, engine: str, directory: str, jobs: int = 2,
                         options: Options | None = None) -> dict[str, Any]:
    """The reference: the same pipeline on one local directory, no gmount involved."""
    if os.path.exists(directory):
        shutil.rmtree(directory)
    os.makedirs(directory)
    pipe.generate(size, {"local": ["local"]}, lambda node: directory, options or {})
    _copy_workflow(pipe, directory)
    extra = ["GMOUNT_OFF=1"] if engine == "make" else []
    run = _run_engine(_engine_command(engine, jobs, extra), directory, {}, os.path.join(directory, "engine.log"))
    if run.returncode != 0:
        raise GmountError(f"the single-directory {pipe.name} run failed ({engine} exit {run.returncode}) in "
                          f"{directory}:\n{_tail(run.output)}")
    return {"directory": directory, "makespan_s": round(run.seconds, 3), "engine": engine, **(options or {})}


# --------------------------------------------------------------------------- on a cluster


def _placement_env(cluster: Cluster, placement: str, home: str, single_node: str, seed: int,
                   shell: str) -> dict[str, str]:
    return placement_env({n.name: n.mountpoint for n in cluster.nodes}, cluster.name, placement, home, single_node,
                         seed, shell)


def placement_env(mounts: Mapping[str, str], cluster: str, placement: str, home: str, single_node: str, seed: int,
                  shell: str) -> dict[str, str]:
    """The environment PLACEMENT_SH reads: each node's mount, the placement, the node or seed. Jobs also
    see GMOUNT_CLUSTER (and the node they run on, GMOUNT_NODE), as the plugins give them."""
    for node, mount in mounts.items():
        if any(c.isspace() for c in mount + node):
            raise GmountError(f"node {node}'s mountpoint {mount!r} contains white space: the placement "
                              "baselines cannot use it")
    return {"GMOUNT_PLACEMENT": placement, "GMOUNT_PLACEMENT_NODES": " ".join(mounts),
            "GMOUNT_PLACEMENT_NODE": single_node, "GMOUNT_PLACEMENT_SEED": str(seed),
            "GMOUNT_PLACEMENT_MOUNTS": " ".join(f"{n}={m}" for n, m in mounts.items()),
            "GMOUNT_PLACEMENT_HOME": mounts[home], "GMOUNT_PLACEMENT_SHELL": shell, "GMOUNT_CLUSTER": cluster}


def _write_wrapper(scratch: str) -> str:
    wrapper = os.path.join(scratch, "placement.sh")
    with open(wrapper, "w") as f:
        f.write(PLACEMENT_SH)
    os.chmod(wrapper, os.stat(wrapper).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return wrapper


def _baseline_args(engine: str, wrapper: str) -> list[str]:
    if engine == "make":
        return ["GMOUNT_OFF=1", f"SHELL={wrapper}", "GMOUNT_TARGET=$@"]
    return ["--config", f"shell={wrapper}"]


def _walk(cluster: Cluster, root: str) -> dict[str, Any]:
    """Every file under a namespace directory: relative path -> Entry (with its holders); no data is read."""
    files: dict[str, Any] = {}
    pending = [root]
    while pending:
        directory = pending.pop()
        for entry in cluster.ls(directory):
            rel = entry.path[len(root):].lstrip("/")
            if entry.kind == "directory":
                if rel.split("/")[0] not in _ENGINE_DIRS:
                    pending.append(entry.path)
            elif entry.kind == "file" and not rel.endswith(".tmp"):
                files[rel] = entry
    return files


def _delta(after: dict[str, dict[str, int]], before: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    return {node: {k: v - before.get(node, {}).get(k, 0) for k, v in row.items()} for node, row in after.items()}


def job_table(jobs: list[Job], files: dict[str, Any], ran_on: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Each job with the node that ran it and its input bytes held there / elsewhere.

    `ran_on` (output -> node, from the plugins' placement logs) says where a job ran; without it, the first
    holder of its output (wrong once the output was staged elsewhere: a replica may be listed first)."""
    rows = []
    for job in jobs:
        out = files[job.output]
        node = (ran_on or {}).get(job.output) or out.holders[0]
        held: dict[str, int] = {}
        local = remote = 0
        for path in job.inputs:
            entry = files.get(path)
            if entry is None:
                continue
            for holder in entry.holders:
                held[holder] = held.get(holder, 0) + entry.size
            if node in entry.holders:
                local += entry.size
            else:
                remote += entry.size
        best = max(held.values(), default=0)
        rows.append({"stage": job.stage, "output": job.output, "node": node, "holders_of_output": list(out.holders),
                     "input_bytes_local": local, "input_bytes_remote": remote,
                     "holds_most_inputs": 2 * held.get(node, 0) >= best, "done_ns": out.mtime_ns})
    return rows


def run_on_cluster(cluster: Cluster, pipe: Pipeline, size: int, engine: str, placement: str, *,
                   scratch: str, seed: int = 1, single_node: str | None = None,
                   options: Options | None = None) -> dict[str, Any]:
    """One run of `pipe` on a running cluster; returns the report (a JSON-able dict). `options`: the
    pipeline's input options (Montage: tile_pixels), recorded in the report."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}: choose {' or '.join(ENGINES)}")
    if placement not in PLACEMENTS:
        raise ValueError(f"unknown placement {placement!r}: choose {', '.join(PLACEMENTS)}")
    nodes = cluster.nodes
    for node in nodes:
        if not os.path.isdir(node.mountpoint):
            raise GmountError(f"node {node.name}'s mount {node.mountpoint} is not on this machine: gmount pipeline "
                              "writes inputs and runs the engines through the mounts, so it needs a local cluster")
    home = nodes[0].name
    single = single_node or home
    mounts = {n.name: n.mountpoint for n in nodes}
    stamp = time.strftime("%Y%m%d-%H%M%S")
    workdir = f"/pipelines/{pipe.name}-{size}-{engine}-{placement}-{stamp}-{os.getpid()}"
    sites = {site: list(names) for site, names in cluster.sites.items()}
    pipe.generate(size, sites, lambda node: mounts[node] + workdir, options or {})
    home_dir = mounts[home] + workdir
    _copy_workflow(pipe, home_dir)
    slots = {n.name: n.slots for n in nodes}
    parallel = slots[single] if placement == "single" else sum(slots.values())

    os.makedirs(scratch, exist_ok=True)
    env: dict[str, str] = {}
    extra: list[str] = []
    if placement == "locality":
        # outputs written on another node reach the head node's view within the attribute TTL
        extra = ["--executor", "gmount", "--latency-wait", "10"] if engine == "snakemake" else []
    else:
        wrapper = _write_wrapper(scratch)
        shell = "/bin/sh" if engine == "make" else (shutil.which("bash") or "/bin/sh")
        env = _placement_env(cluster, placement, home, single, seed, shell)
        extra = _baseline_args(engine, wrapper)

    staging = placement == "locality" and engine == "make" and prestage.enabled()
    if staging:  # the make plugin's placement log, where the prestager learns which recipes finished
        env["GMOUNT_PLACEMENT_LOG"] = os.path.join(home_dir, ".gmount", f"make-{stamp}.jsonl")
    before = cluster.counters()
    started_ns = time.time_ns()
    with ExitStack() as stack:
        follower = None
        if staging:  # DAG-aware staging: outputs go ahead of time to where their consumers will run
            follower = stack.enter_context(prestage.follow(cluster, home_dir, workdir, env["GMOUNT_PLACEMENT_LOG"],
                                                           running=parallel))
        run = _run_engine(_engine_command(engine, parallel, extra), home_dir, env,
                          os.path.join(scratch, f"{pipe.name}-{engine}-{placement}.log"))
    after = cluster.counters()
    if run.returncode != 0:
        raise GmountError(f"the {pipe.name} pipeline failed on cluster {cluster.name} ({engine}, {placement} "
                          f"placement, exit {run.returncode}) in {home_dir}:\n{_tail(run.output)}")
    files = _walk(cluster, workdir)
    rows = job_table(pipe.jobs(list(files)), files, placement_log_nodes(home_dir))
    counters = _delta(after, before)
    report = _report(pipe, size, engine, placement, cluster, workdir, home_dir, run, started_ns, rows, counters)
    report["job_seconds"] = placement_log_seconds(home_dir, rows, pipe.rules)
    report["recipe_gaps"] = placement_log_gaps(home_dir)
    report["job_log"] = placement_log_jobs(home_dir, started_ns / 1e9)
    report["prestage"] = follower.stats.to_dict() if follower is not None else None
    report.update(options or {})
    return report


def run_on_mounts(pipe: Pipeline, size: int, engine: str, mounts: Mapping[str, str], sites: Mapping[str, Sequence[str]],
                  *, system: str, scratch: str, placement: str = "random", seed: int = 1,
                  inputs_at: Mapping[str, str] | None = None, options: Options | None = None,
                  settle: float = 0.0, slots: int = 1, cluster: str | None = None) -> dict[str, Any]:
    """One run of `pipe` on another shared file system mounted on every node (Gfarm, a central server):
    the jobs spread by the baseline wrapper (`random`: a hash of the job; `single`: all on the first node),
    each in the same directory of its node's mount. Inputs are written through each holding node's mount,
    or under `inputs_at[node]` (a central server's own directory) -- where they sit after acquisition.
    `settle`: seconds each job waits after it ended, for a file system that shows a closed file's size
    on other nodes only a moment later. `slots`: jobs a node runs at once (make -j: slots x nodes).
    `cluster`: the GMOUNT_CLUSTER jobs see, with GMOUNT_NODE (default `system`; what puts a job on its
    node's CPUs where something watches for them)."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}: choose {' or '.join(ENGINES)}")
    if placement not in ("random", "single"):
        raise ValueError(f"unknown placement {placement!r} for another file system: choose random or single")
    home = next(iter(mounts))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    workdir = f"/pipelines/{pipe.name}-{size}-{engine}-{system}-{placement}-{stamp}-{os.getpid()}"
    where = inputs_at or mounts
    pipe.generate(size, sites, lambda node: where[node] + workdir, options or {})
    home_dir = mounts[home] + workdir
    _copy_workflow(pipe, (where[home]) + workdir)
    os.makedirs(scratch, exist_ok=True)
    wrapper = _write_wrapper(scratch)
    shell = "/bin/sh" if engine == "make" else (shutil.which("bash") or "/bin/sh")
    env = placement_env(mounts, cluster or system, placement, home, home, seed, shell)
    if settle > 0:
        env["GMOUNT_PLACEMENT_SETTLE"] = f"{settle:g}"
    parallel = slots * (len(mounts) if placement == "random" else 1)
    started_ns = time.time_ns()
    run = _run_engine(_engine_command(engine, parallel, _baseline_args(engine, wrapper)), home_dir, env,
                      os.path.join(scratch, f"{pipe.name}-{engine}-{system}-{placement}.log"))
    if run.returncode != 0:
        raise GmountError(f"the {pipe.name} pipeline failed on {system} ({engine}, {placement} placement, exit "
                          f"{run.returncode}) in {home_dir}:\n{_tail(run.output)}")
    files = _plain_walk(home_dir)
    jobs = pipe.jobs(list(files))
    input_bytes = sum(files.get(path, 0) for job in jobs for path in job.inputs)
    return {"pipeline": pipe.name, pipe.size_name: size, "engine": engine, "placement": placement, "system": system,
            "nodes": {n: s for s, ns in sites.items() for n in ns}, "workdir": workdir, "directory": home_dir,
            "makespan_s": round(run.seconds, 3), "jobs": len(jobs), "declared_input_bytes": {"total": input_bytes},
            "started_ns": started_ns, "settle_s": settle, **(options or {})}


def _plain_walk(root: str) -> dict[str, int]:
    """Every file under a directory of a plain mount: relative path -> size."""
    files: dict[str, int] = {}
    for directory, dirs, names in os.walk(root):
        rel_dir = os.path.relpath(directory, root)
        dirs[:] = [d for d in dirs if not (rel_dir == "." and d in _ENGINE_DIRS)]
        for name in names:
            rel = os.path.normpath(os.path.join(rel_dir, name))
            if not rel.endswith(".tmp"):
                files[rel] = os.path.getsize(os.path.join(directory, name))
    return files


def _placement_records(directory: str) -> Iterator[dict[str, Any]]:
    log_dir = os.path.join(directory, ".gmount")
    for name in sorted(os.listdir(log_dir)) if os.path.isdir(log_dir) else []:
        if name.endswith(".jsonl"):
            with open(os.path.join(log_dir, name)) as f:
                for line in f:
                    yield json.loads(line)


def placement_log_nodes(directory: str) -> dict[str, str]:
    """Target -> the node its recipe ran on, from make's placement logs (.gmount/*.jsonl) in `directory`."""
    return {str(r["target"]): str(r["node"]) for r in _placement_records(directory)
            if "target" in r and "node" in r and r.get("status", 0) == 0}


def placement_log_seconds(directory: str, rows: list[dict[str, Any]],
                          rules: Mapping[str, str] | None = None) -> dict[str, dict[str, float]]:
    """Per stage: jobs and their seconds, from the plugins' placement logs (.gmount/*.jsonl), if any.

    make's log has one line per recipe line (target), Snakemake's one per job (rule).
    """
    stage_of = {r["output"]: r["stage"] for r in rows}
    per_target: dict[tuple[str, str], float] = {}
    for record in _placement_records(directory):
        if "target" in record:
            stage = stage_of.get(record["target"], record["target"])
            key = (stage, record["target"])
        else:
            rule = str(record.get("rule"))
            key = ((rules or {}).get(rule, rule), str(record.get("jobid")))
        per_target[key] = per_target.get(key, 0.0) + float(record.get("seconds", 0.0))
    result: dict[str, dict[str, float]] = {}
    for (stage, _), seconds in per_target.items():
        entry = result.setdefault(stage, {"jobs": 0, "seconds": 0.0, "max_seconds": 0.0})
        entry["jobs"] += 1
        entry["seconds"] = round(entry["seconds"] + seconds, 3)
        entry["max_seconds"] = round(max(entry["max_seconds"], seconds), 3)
    return result


def placement_log_gaps(directory: str) -> dict[str, float | int]:
    """What each recipe waited after a slot freed: from the last recipe end before it to its own command
    starting (make noticing the end, picking the next recipe, gmount-job placing it, the spawn), from
    make's placement log (each recipe's end time and seconds). The median says what a recipe costs
    beyond its command; the maximum also holds make waiting for a prerequisite."""
    spans = [(float(r["time"]) - float(r.get("seconds", 0.0)), float(r["time"]))
             for r in _placement_records(directory) if "target" in r and "time" in r]
    ends = sorted(end for _, end in spans)
    gaps = []
    for start, _ in spans:
        before = [end for end in ends if end <= start]
        if before:
            gaps.append(start - before[-1])
    if not gaps:
        return {}
    gaps.sort()
    return {"recipes": len(gaps), "median_s": round(gaps[len(gaps) // 2], 3), "max_s": round(gaps[-1], 3),
            "total_s": round(sum(gaps), 3)}


def placement_log_jobs(directory: str, started: float) -> list[dict[str, Any]]:
    """Each recipe make's placement log holds, in the order they started: its target, the node it ran on,
    its start (seconds after `started`, a Unix time), its seconds and the input bytes it read locally and
    remotely -- the timeline a slow run is read from."""
    jobs = [{"target": r["target"], "node": r.get("node"), "start_s": round(float(r["time"]) - float(r["seconds"])
                                                                          - started, 3),
             "seconds": round(float(r["seconds"]), 3), "bytes_local": int(r.get("bytes_local", 0)),
             "bytes_remote": int(r.get("bytes_remote", 0))}
            for r in _placement_records(directory) if "target" in r and "time" in r and "seconds" in r]
    return sorted(jobs, key=lambda job: job["start_s"])


def _report(pipe: Pipeline, size: int, engine: str, placement: str, cluster: Cluster, workdir: str, home_dir: str,
            run: EngineRun, started_ns: int, rows: list[dict[str, Any]],
            counters: dict[str, dict[str, int]]) -> dict[str, Any]:
    stages: dict[str, dict[str, Any]] = {}
    for stage in pipe.stages:
        done = [(r["done_ns"] - started_ns) / 1e9 for r in rows if r["stage"] == stage]
        if done:
            stages[stage] = {"jobs": len(done), "first_done_s": round(min(done), 3), "last_done_s": round(max(done), 3)}
    per_node: dict[str, dict[str, int]] = {n.name: {} for n in cluster.nodes}
    for r in rows:
        per_node[r["node"]][r["stage"]] = per_node[r["node"]].get(r["stage"], 0) + 1
    read_local = sum(c.get("read_local", 0) for c in counters.values())
    read_remote = sum(c.get("read_remote", 0) for c in counters.values())
    declared_local = sum(r["input_bytes_local"] for r in rows)
    declared_remote = sum(r["input_bytes_remote"] for r in rows)
    return {
        "pipeline": pipe.name, pipe.size_name: size, "engine": engine, "placement": placement,
        "cluster": cluster.name, "nodes": {n.name: n.site for n in cluster.nodes}, "workdir": workdir,
        "directory": home_dir, "makespan_s": round(run.seconds, 3), "jobs": len(rows),
        "stages": stages, "jobs_per_node": per_node,
        "bytes_read": {"local": read_local, "remote": read_remote,
                       "remote_fraction": round(read_remote / (read_local + read_remote), 4)
                       if read_local + read_remote else 0.0},
        "counters": counters,
        "declared_input_bytes": {"local": declared_local, "remote": declared_remote},
        "jobs_not_on_their_data": [r["output"] for r in rows if not r["holds_most_inputs"]],
        "job_rows": rows,
    }


def check_against(report: dict[str, Any], pipe: Pipeline, reference_dir: str) -> str | None:
    """Compare a cluster run's result (read through its home mount) with the single-directory run's."""
    def ours(rel: str) -> bytes:
        with open(os.path.join(report["directory"], rel), "rb") as f:
            return f.read()

    def reference(rel: str) -> bytes:
        with open(os.path.join(reference_dir, rel), "rb") as f:
            return f.read()

    return pipe.compare(ours, reference)
