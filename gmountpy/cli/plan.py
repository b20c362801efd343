"""`gmount plan`: where each job of a make or Snakemake run would go, and what it would read, before running it.

The jobs come from the workflow engine itself: Snakemake's DAG (built
through its API, as `snakemake -n` builds it, with the gmount executor's
settings so group jobs and localrules are what a real run has), or the
recipes `make -n` would run (`gmountpy_make.plan`). Each job is placed, in
the order the engine would start them, with the rule the run would use:
`gmountpy.jobs.placement.place_job`, which the node daemon applies for the
Snakemake executor and for make's `gmount-job`, over the job's inputs as
the mount reports them -- and, for inputs that jobs of the same run write,
the node planned for their job, with an estimated size (their current size
if an older version exists, else their job's input bytes shared among its
outputs), shown with `~`. make rewrites a target that already exists where
it is (the mount opens the existing file); Snakemake removes old outputs
before a job, so they land on the job's node.
"""

from __future__ import annotations

import json
import os
import posixpath
from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from ..cluster import mounts
from ..errors import GmountError
from ..jobs.placement import JobPlacement, input_bytes, place_job

#: Holdings of a path: node -> bytes (as `gmountpy.jobs.placement` takes them)
Held = Mapping[str, int]

SNAKEFILES = ("Snakefile", "snakefile", "workflow/Snakefile", "workflow/snakefile")
MAKEFILES = ("GNUmakefile", "makefile", "Makefile")


@dataclass(frozen=True)
class Job:
    """A job of the run to place; paths are namespace paths (absolute), `inputs` keep their given names too."""

    label: str                              # what the user knows it by: rule and wildcards, or make's target
    cwd: str                                # the directory it runs in
    asked: str                              # the node whose mount the engine runs it from
    inputs: tuple[tuple[str, str], ...]     # (as the workflow names it, namespace path)
    outputs: tuple[str, ...]
    rule: str = ""
    jobids: tuple[int, ...] = ()
    pin: str = ""                           # resources.gmount_node
    on_head: str = ""                       # why it runs where the engine runs, whatever its inputs
    rewrites_in_place: bool = False         # make: an output that exists stays on its holder


@dataclass(frozen=True)
class PlannedJob:
    job: Job
    node: str
    reason: str
    bytes_local: int
    bytes_remote: int
    local_estimated: bool                   # bytes_local counts inputs jobs of this run write: sizes guessed
    remote_estimated: bool                  # bytes_remote does
    planned_inputs: tuple[str, ...]         # inputs written by jobs of this run (as named)
    missing: tuple[str, ...]                # inputs no node holds and no job of this run writes (as named)

    def as_json(self) -> dict[str, Any]:
        job = self.job
        return {"job": job.label, "rule": job.rule, "jobids": list(job.jobids), "cwd": job.cwd, "node": self.node,
                "reason": self.reason, "inputs": [name for name, _ in job.inputs],
                "planned_inputs": list(self.planned_inputs), "missing_inputs": list(self.missing),
                "outputs": list(job.outputs), "bytes_local": self.bytes_local, "bytes_remote": self.bytes_remote,
                "bytes_local_estimated": self.local_estimated, "bytes_remote_estimated": self.remote_estimated}

    @property
    def estimated(self) -> bool:
        return self.local_estimated or self.remote_estimated


@dataclass(frozen=True)
class Plan:
    workflow: str                           # "snakemake" or "make"
    source: str                             # the Snakefile, or make's arguments
    cluster: str
    head: str                               # the node the engine runs on
    cwd: str                                # its working directory (namespace path)
    jobs: tuple[PlannedJob, ...]
    per_node: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        counts: dict[str, int] = {}
        for planned in self.jobs:
            counts[planned.node] = counts.get(planned.node, 0) + 1
        object.__setattr__(self, "per_node", counts)

    @property
    def bytes_local(self) -> int:
        return sum(p.bytes_local for p in self.jobs)

    @property
    def bytes_remote(self) -> int:
        return sum(p.bytes_remote for p in self.jobs)

    @property
    def local_estimated(self) -> bool:
        return any(p.local_estimated for p in self.jobs)

    @property
    def remote_estimated(self) -> bool:
        return any(p.remote_estimated for p in self.jobs)

    def as_json(self) -> dict[str, Any]:
        return {"workflow": self.workflow, "source": self.source, "cluster": self.cluster, "head_node": self.head,
                "cwd": self.cwd, "jobs": [p.as_json() for p in self.jobs],
                "total": {"jobs": len(self.jobs), "per_node": self.per_node, "bytes_local": self.bytes_local,
                          "bytes_remote": self.bytes_remote, "bytes_local_estimated": self.local_estimated,
                          "bytes_remote_estimated": self.remote_estimated}}


# --------------------------------------------------------------------------- placing a run (no I/O)


class _Files:
    """Who holds each existing file, looked up by path or by a directory above it."""

    def __init__(self, existing: Mapping[str, Held]) -> None:
        self._held = existing
        self._sorted = sorted(existing)

    def at(self, path: str) -> dict[str, Held]:
        """The files `path` names (itself, or every file below a directory): {} held -> missing."""
        if path in self._held:
            return {path: self._held[path]}
        prefix = path.rstrip("/") + "/"
        found = {}
        for key in self._sorted[bisect_left(self._sorted, prefix):]:
            if not key.startswith(prefix):
                break
            found[key] = self._held[key]
        return found


#: The decision for one job: (its inputs' holdings, the node asked, the pinned node or "") -> where it goes
Decide = Callable[[Mapping[str, Held], str, str], JobPlacement]


def predict(jobs: Sequence[Job], existing: Mapping[str, Held], decide: Decide) -> list[PlannedJob]:
    """Place `jobs` (in the order the engine starts them) with `decide`, as the run would, given who
    holds the files that exist now (`existing`: namespace path -> holders, a path no node holds -> {})."""
    files = _Files(existing)
    produced: dict[str, dict[str, int]] = {}  # outputs of jobs placed so far: where they will be, how big
    planned_jobs = []
    for job in jobs:
        holdings: dict[str, Held] = {}
        planned: list[str] = []
        missing: list[str] = []
        for name, path in job.inputs:
            source = _produced(produced, path)
            if source is not None:
                holdings[path] = source
                planned.append(name)
                continue
            found = files.at(path)
            if not any(found.values()):
                missing.append(name)
            for key, held in found.items() or [(path, {})]:
                holdings.setdefault(key, held)
        if job.on_head:
            node, reason = job.asked, job.on_head
            local, remote = input_bytes(holdings, node)
        else:
            placed = decide(holdings, job.asked, job.pin)
            node, reason, local, remote = placed.node, placed.reason, placed.bytes_local, placed.bytes_remote
        guessed = [holdings[path] for name, path in job.inputs if name in planned and holdings[path]]
        planned_jobs.append(PlannedJob(job, node, reason, local, remote, any(node in held for held in guessed),
                                       any(node not in held for held in guessed), tuple(planned), tuple(missing)))
        # What its outputs will be: an older version's size if there is one, else its input bytes shared out.
        share = sum(max(held.values()) for held in holdings.values() if held) // max(len(job.outputs), 1)
        for output in job.outputs:
            old = {key: held for key, held in files.at(output).items() if held}
            if old and job.rewrites_in_place:
                holders: dict[str, int] = {}
                for held in old.values():
                    for holder, size in held.items():
                        holders[holder] = holders.get(holder, 0) + size
                produced[output] = holders
            else:
                produced[output] = {node: sum(max(h.values()) for h in old.values()) if old else share}
    return planned_jobs


def _produced(produced: Mapping[str, dict[str, int]], path: str) -> dict[str, int] | None:
    """Where a job of the run writes `path` (or a directory above it), if one does."""
    while True:
        if path in produced:
            return produced[path]
        if path in ("/", ""):
            return None
        path = posixpath.dirname(path)


# --------------------------------------------------------------------------- the mount


def _where_we_are(cwd: str) -> tuple[mounts.MountedCluster, str]:
    found = mounts.find(cwd)
    if found is None:
        raise GmountError(f"{cwd} is not inside a running gmount cluster's mount on this machine: make and "
                          "Snakemake would run every job here (cd <mountpoint>/... to plan a run on a cluster)")
    return found[0], found[1]


def _namespace(cluster: mounts.MountedCluster, directory: str, name: str) -> str | None:
    found = cluster.node_for_path(os.path.join(directory, name))
    return None if found is None else found[1]


def place_run(cluster: mounts.MountedCluster, jobs: Sequence[Job], decide: Decide, workflow: str, source: str,
              head: str, cwd: str) -> Plan:
    """Ask the mount who holds what the jobs read (and what their outputs are now), then `predict`."""
    paths = sorted({p for job in jobs for _, p in job.inputs} | {p for job in jobs for p in job.outputs})
    existing = cluster.holdings([cluster.path_on(head, path) for path in paths]) if paths else {}
    return Plan(workflow, source, cluster.name, head, cwd, tuple(predict(jobs, existing, decide)))


def daemon_rule(cluster: mounts.MountedCluster) -> Decide:
    """What a node daemon decides for make's gmount-job (`gmountpy.node.jobs`): `place_job` over the cluster."""
    nodes = list(cluster.nodes)
    slots = {name: node.slots for name, node in cluster.nodes.items()}

    def decide(holdings: Mapping[str, Held], asked: str, pin: str) -> JobPlacement:
        return place_job(holdings, nodes, asked=asked, slots=slots, rtt=cluster.rtt, pin=pin)

    return decide


# --------------------------------------------------------------------------- make


def plan_make(make_args: Sequence[str]) -> tuple[Plan, str]:
    """The plan of `make MAKE_ARGS` run here, and what `make -n` printed."""
    from gmountpy_make.plan import dry_run

    here = os.getcwd()
    cluster, head = _where_we_are(here)
    run = dry_run(make_args)
    jobs = []
    for recipe in run.recipes:
        found = cluster.node_for_path(recipe.directory)
        if found is None:
            continue  # a sub-make outside the mounts: its recipes are not placed
        asked, cwd = found
        label = recipe.target if recipe.directory == here else \
            posixpath.join(os.path.relpath(recipe.directory, here), recipe.target)
        inputs = tuple((name, path) for name in recipe.prerequisites
                       if (path := _namespace(cluster, recipe.directory, name)) is not None)
        output = _namespace(cluster, recipe.directory, recipe.target)
        jobs.append(Job(label, cwd, asked, inputs, (output,) if output else (), rule=recipe.target,
                        rewrites_in_place=True))
    source = " ".join(["make", *make_args])
    return place_run(cluster, jobs, daemon_rule(cluster), "make", source, head,
                     _namespace(cluster, here, ".") or "/"), run.stdout


# --------------------------------------------------------------------------- Snakemake


def plan_snakemake(snakefile: str | None, targets: Sequence[str], config: Sequence[str],
                   configfiles: Sequence[str], forceall: bool, forcerun: Sequence[str]) -> Plan:
    """The plan of a Snakemake run here with the gmount executor (its DAG: jobs that would run)."""
    try:
        from snakemake.api import SnakemakeApi  # type: ignore[import-untyped]
        from snakemake.cli import parse_config  # type: ignore[import-untyped]
        from snakemake.settings.types import (  # type: ignore[import-untyped]
            ConfigSettings,
            DAGSettings,
            ExecutionSettings,
            OutputSettings,
            Quietness,
            ResourceSettings,
        )
        from snakemake_interface_executor_plugins.registry import ExecutorPluginRegistry

        from snakemake_executor_plugin_gmount import job_inputs, job_pin, place
    except ImportError as exc:
        raise GmountError(f"planning a Snakefile needs Snakemake and the gmount plugins ({exc}): "
                          "pip install 'gmountpy[snakemake]'") from None
    here = os.getcwd()
    cluster, head = _where_we_are(here)
    nodes = list(cluster.nodes)
    output = OutputSettings(quiet={Quietness.ALL}, enable_file_logging=False)
    try:
        with SnakemakeApi(output) as api:
            workflow_api = api.workflow(
                resource_settings=ResourceSettings(cores=1),
                config_settings=ConfigSettings(config=parse_config(list(config)),
                                               configfiles=[Path(f) for f in configfiles]),
                snakefile=Path(snakefile) if snakefile else None)
            dag_api = workflow_api.dag(DAGSettings(targets=frozenset(targets), forceall=forceall,
                                                   forcerun=frozenset(forcerun)))
            # What `snakemake --executor gmount` builds before it runs: the same DAG, with the
            # executor's settings (group jobs formed, localrules on the head), nothing locked or run.
            workflow = dag_api.workflow_api._workflow
            workflow.execution_settings = ExecutionSettings()
            workflow._executor_plugin = ExecutorPluginRegistry().get_plugin("gmount")
            workflow._prepare_dag(forceall=forceall, ignore_incomplete=True, lock_warn_only=True, nolock=True)
            workflow._build_dag()
            workflow.async_run(workflow.dag.postprocess(update_needrun=False))
            workdir = os.getcwd()  # the Snakefile's `workdir:` if it has one
            jobs = [_snakemake_job(unit, members, cluster, head, workdir, job_inputs, job_pin, nodes)
                    for unit, members in _units(workflow.dag)]
            snakefile_path = str(workflow.main_snakefile)
    except GmountError:
        raise
    except Exception as exc:  # Snakemake's own errors (missing input, syntax, ...): its message says it
        raise GmountError(f"Snakemake cannot build the DAG: {exc}") from None
    finally:
        os.chdir(here)
    def decide(holdings: Mapping[str, Held], asked: str, pin: str) -> JobPlacement:
        return place(holdings, cluster, asked, pin or None)  # the executor's own decision

    return place_run(cluster, jobs, decide, "snakemake", snakefile_path, head, _namespace(cluster, here, ".") or "/")


def _units(dag: Any) -> list[tuple[Any, list[Any]]]:
    """The jobs Snakemake would submit (a group job once, for all its jobs), in an order it could start them,
    each with its jobs (a group's in the order they run)."""
    jobs = [job for level in dag.toposorted() for job in sorted(level, key=lambda j: j.jobid)
            if dag.needrun(job) and not dag.finished(job) and not job.is_norun]
    unit_of = {job: dag.get_job_group(job) or job for job in jobs}
    order: list[Any] = list(dict.fromkeys(unit_of[job] for job in jobs))
    after: dict[Any, set[Any]] = {unit: set() for unit in order}
    for job in jobs:
        for dependency in dag.dependencies[job]:
            if dependency in unit_of and unit_of[dependency] is not unit_of[job]:
                after[unit_of[job]].add(unit_of[dependency])
    done: set[Any] = set()
    ordered: list[Any] = []
    while len(ordered) < len(order):  # Kahn, keeping Snakemake's order among the ready ones
        unit = next((u for u in order if u not in done and after[u] <= done), None)
        if unit is None:
            raise GmountError("the jobs of this DAG form a cycle through a group")
        done.add(unit)
        ordered.append(unit)
    return [(unit, [job for job in jobs if unit_of[job] is unit]) for unit in ordered]


def _snakemake_job(unit: Any, members: list[Any], cluster: mounts.MountedCluster, head: str, workdir: str,
                   job_inputs: Callable[[Any], list[str]], job_pin: Callable[[Any, Sequence[str], str], str | None],
                   nodes: Sequence[str]) -> Job:
    cwd = _namespace(cluster, workdir, ".") or "/"
    labels = []
    for member in members:
        wildcards = " ".join(f"{k}={v}" for k, v in member.wildcards_dict.items())
        labels.append(f"{member.rule.name} {wildcards}".strip())
    label = f"group {members[0].group}: {', '.join(labels)}" if unit.is_group() else labels[0]
    inputs = tuple((name, path) for name in job_inputs(unit)
                   if (path := _namespace(cluster, workdir, name)) is not None)
    outputs = tuple(path for member in members for name in member.output if "://" not in str(name)
                    if (path := _namespace(cluster, workdir, str(name))) is not None)
    on_head = "" if unit.is_group() or not unit.is_local else \
        f"local rule: runs where Snakemake runs ({head})"
    return Job(label, cwd, head, inputs, outputs, rule=members[0].rule.name if not unit.is_group() else "group",
               jobids=tuple(int(m.jobid) for m in members), pin=job_pin(unit, nodes, cluster.name) or "",
               on_head=on_head)


# --------------------------------------------------------------------------- output


def human(size: int, estimated: bool = False) -> str:
    """`size` as people read it (the API's units, without importing the API); "~" when estimated."""
    value, unit = float(size), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            break
        value /= 1024
    text = f"{size} B" if unit == "B" else f"{value:.1f} {unit}"
    return ("~" if estimated else "") + text


def render(plan: Plan) -> str:
    """The plan as text: a line per job (never cut: long labels widen their column), then the totals."""
    what = f"Snakefile {plan.source}" if plan.workflow == "snakemake" else plan.source
    lines = [f"plan of {what} in {plan.cwd}: cluster {plan.cluster}, run from node {plan.head}, "
             f"{len(plan.jobs)} job{'s' if len(plan.jobs) != 1 else ''}"]
    columns = ("job", "node", "inputs", "local", "remote", "why")
    rows = [(p.job.label, p.node, str(len(p.job.inputs)), human(p.bytes_local, p.local_estimated),
             human(p.bytes_remote, p.remote_estimated), p.reason) for p in plan.jobs]
    widths = [max([len(c)] + [len(r[i]) for r in rows]) for i, c in enumerate(columns)]
    for row in (columns, *rows):
        lines.append("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
    per_node = ", ".join(f"{node} {count}" for node, count in sorted(plan.per_node.items()))
    local, remote = human(plan.bytes_local, plan.local_estimated), human(plan.bytes_remote, plan.remote_estimated)
    lines.append(f"total: {len(plan.jobs)} jobs ({per_node or 'none'}); input bytes read locally {local}, "
                 f"from other nodes {remote}")
    if plan.local_estimated or plan.remote_estimated:
        lines.append("~ estimated: some inputs are written by jobs of this run; they are counted on the node "
                     "planned for their job, sized as an older version of them or as their job's inputs")
    missing = sorted({name for p in plan.jobs for name in p.missing})
    if missing:
        lines.append(f"no node holds, and no job of this run writes: {', '.join(missing)}")
    return "\n".join(lines)


def _workflow_file() -> tuple[str, str]:
    for name in SNAKEFILES:
        if os.path.isfile(name):
            return "snakemake", name
    for name in MAKEFILES:
        if os.path.isfile(name):
            return "make", name
    raise GmountError(f"no Snakefile or Makefile in {os.getcwd()}: name one with -s SNAKEFILE or -f MAKEFILE")


@click.command("plan", context_settings={"ignore_unknown_options": True})
@click.option("-s", "--snakefile", help="Plan a Snakemake run of this Snakefile (default: ./Snakefile, "
              "./workflow/Snakefile).")
@click.option("-f", "--makefile", help="Plan a make run with this Makefile (default: ./Makefile when there is "
              "no Snakefile).")
@click.option("--config", multiple=True, metavar="KEY=VALUE", help="Snakemake: set a config value.")
@click.option("--configfile", multiple=True, help="Snakemake: read config values from this file.")
@click.option("-F", "--forceall", is_flag=True, help="Snakemake: plan every job, as if nothing existed "
              "(make: pass -B).")
@click.option("-R", "--forcerun", multiple=True, metavar="RULE", help="Snakemake: plan these rules' jobs again.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON for scripts.")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def command(snakefile: str | None, makefile: str | None, config: tuple[str, ...], configfile: tuple[str, ...],
            forceall: bool, forcerun: tuple[str, ...], as_json: bool, args: tuple[str, ...]) -> None:
    """Say where each job of a run would go, before running it.

    Run it where you would run snakemake or make (inside a node's mount).
    ARGS are Snakemake's targets, or make's arguments (targets, VAR=value,
    -C DIR, -B, ...). Prints job -> node with the input bytes each job would
    read locally and from other nodes, and the run's total.
    """
    if snakefile and makefile:
        raise click.UsageError("give -s SNAKEFILE or -f MAKEFILE, not both")
    workflow = "snakemake" if snakefile else "make" if makefile else _workflow_file()[0]
    if workflow == "make":
        plan, _ = plan_make([*(["-f", makefile] if makefile else []), *args])
    else:
        options = [o for o in args if o.startswith("-")]
        if options:
            raise click.UsageError(f"no such option for a Snakefile: {options[0]}")
        plan = plan_snakemake(snakefile, args, config, configfile, forceall, forcerun)
    show(plan, as_json)


def show(plan: Plan, as_json: bool) -> None:
    click.echo(json.dumps(plan.as_json(), indent=2) if as_json else render(plan))
