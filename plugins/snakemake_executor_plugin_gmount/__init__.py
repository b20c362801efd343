"""Snakemake executor: every job runs on the gmount node that holds its inputs.

    snakemake --executor gmount -j 8          # from inside a node's mount
    snakemake --profile gmount                # the same, from `gmount snakemake-profile`

Run Snakemake inside any node's mount with plain paths. For each job this
plugin picks a node -- `resources.gmount_node` if the rule sets it, else the
node holding most input bytes, as the head node's daemon answers on its job
socket (`gmountpy.cluster.jobsocket`; the same rule here, `place`, when it has none) --
and runs the job there, in the same directory of *that* node's mount (a
local process on a local cluster, over SSH on an SSH cluster), so its
outputs land in that node's export and its inputs are read locally. Jobs
see GMOUNT_NODE (and GMOUNT_SITE, GMOUNT_CLUSTER, GMOUNT_PLACEMENT_LOG).

How a job runs (`via` in the placement log):
- "shell": a `shell:` rule's command, formatted here as Snakemake formats it
  (the same prefix, suffix, executable, threads and tmpdir variables), run
  with that shell on the node -- what Snakemake's local executor does, with
  nothing started per job but the shell. This process prepares the job
  first (`job.prepare()`: protected outputs, old outputs removed, output
  and log directories) and, as for every job, checks and records it after.
- "snakemake": everything else (`run:`, `script:`, `wrapper:`, `notebook:`,
  conda, containers, env modules, shadow, `benchmark:`, group jobs, storage
  files, between-workflow caching, rules from modules): the job's own
  Snakemake process on the node, as Snakemake's remote executors run jobs.
  `snakemake_because` says why.

Each finished job adds one JSON line to the placement log (default
`.gmount/snakemake-<time>-<pid>.jsonl`): rule, jobid, node, why, input
bytes read locally and remotely, seconds, exit status, via. Job
stdout/stderr go to `.gmount/snakemake-logs/`; a failing job's error shows
the end of its stderr. Ctrl-C stops every running job with everything it
started.

The public gmountpy API (gmountpy.api), the job socket's client, the placement rule and the
stdlib-only mount lookups (gmountpy.cluster.mounts) are used. `job_inputs`, `job_pin` and `place`
are what `gmount plan` shares with the executor to predict a run. DAG-aware staging
(gmountpy.jobs.prestage): each finished job's outputs are staged ahead of time to the node
its consumers are planned on, and the daemon runs a job on its planned node when the
placement rule counts that node as a candidate (GMOUNT_PRESTAGE=0 turns it off).
"""

# No `from __future__ import annotations`: Snakemake reads the settings' field types at run time.
import asyncio
import json
import os
import re
import shlex
import sys
import threading
import time
from collections.abc import AsyncGenerator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Optional

from snakemake_interface_common.exceptions import WorkflowError
from snakemake_interface_executor_plugins.executors.base import SubmittedJobInfo
from snakemake_interface_executor_plugins.executors.remote import RemoteExecutor
from snakemake_interface_executor_plugins.jobs import JobExecutorInterface
from snakemake_interface_executor_plugins.settings import CommonSettings, ExecutorSettingsBase

from gmountpy import GmountError
from gmountpy.api import Cluster, Spawned
from gmountpy.cluster import jobsocket, mounts
from gmountpy.jobs import prestage
from gmountpy.jobs.placement import JobPlacement, place_job
from gmountpy.jobs.runlog import with_run_summary

#: How often running jobs are polled: they are local processes (or local ssh clients), so a poll is a
#: waitpid per job; a job's end is seen this soon.
_POLL_SECONDS = 0.02
#: The longest command passed to the shell as an argument (Snakemake's own limit); longer ones go
#: through a script file, as Snakemake's shell() does.
_MAX_ARG_LEN = 16 * 4096 - 1


@dataclass
class ExecutorSettings(ExecutorSettingsBase):
    """Command-line flags --gmount-cluster, --gmount-placement-log, --gmount-stop-grace."""

    cluster: Optional[str] = field(default=None, metadata={
        "help": "The gmount cluster (name, cluster file, or a path in a mount). Default: the cluster whose "
                "mount the working directory is in."})
    placement_log: Optional[str] = field(default=None, metadata={
        "help": "Where to append one JSON line per job (rule, node, input bytes local/remote, seconds). "
                "Default: .gmount/snakemake-<time>-<pid>.jsonl in the working directory."})
    stop_grace: float = field(default=5.0, metadata={
        "help": "Seconds a cancelled job gets after SIGTERM before SIGKILL."})


common_settings = CommonSettings(
    non_local_exec=True,
    implies_no_shared_fs=False,       # the mount is the shared file system
    job_deploy_sources=False,
    pass_default_storage_provider_args=True,
    pass_default_resources_args=True,
    pass_envvar_declarations_to_cmd=True,
    auto_deploy_default_storage_provider=False,
    init_seconds_before_status_checks=0,
)


@dataclass
class _Running:
    spawned: Spawned
    node: str
    reason: str
    inputs: list[str]
    local_bytes: int
    remote_bytes: int
    stdout: str
    stderr: str
    via: str                      # "shell" (the command itself) or "snakemake" (the job's own Snakemake)
    because: str = ""             # why the job needed its own Snakemake process
    placed_by: str = "daemon"     # "daemon" (its job socket) or "api" (Cluster.place: no job socket)
    cancelled: bool = False       # stopped by cancel_jobs (Snakemake may call it more than once)


class Executor(RemoteExecutor):
    def __post_init__(self) -> None:
        settings: Optional[ExecutorSettings] = self.workflow.executor_settings
        self.settings = settings if settings is not None else ExecutorSettings()
        cwd = os.getcwd()
        try:
            self.cluster = Cluster.open(self.settings.cluster or cwd)
            here = self.cluster.where(cwd)[0]
        except GmountError as exc:
            raise WorkflowError(f"gmount executor: {exc}") from None
        mount = self.cluster.nodes[here.asked_from].mountpoint
        if here.asked_from != self.cluster.home or not (cwd == mount or cwd.startswith(mount.rstrip("/") + "/")):
            raise WorkflowError(
                f"gmount executor: run Snakemake inside a node's mount of cluster {self.cluster.name!r} "
                f"(for example cd {self.cluster.nodes[self.cluster.home].mountpoint}/...), not in {cwd}; "
                "outside a mount use the gmount storage plugin (gmount://...) instead")
        self.head_node = here.asked_from
        self.head_mount = mount.rstrip("/")
        self.head_mount_real = os.path.realpath(self.head_mount)  # as the kernel names it: the job socket's key
        self.directory = here.path  # the working directory as a namespace path
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.log_path = os.path.abspath(self.settings.placement_log
                                        or os.path.join(".gmount", f"snakemake-{stamp}-{os.getpid()}.jsonl"))
        self.output_dir = os.path.abspath(os.path.join(".gmount", "snakemake-logs", f"{stamp}-{os.getpid()}"))
        os.makedirs(os.path.dirname(self.log_path), exist_ok=True)
        os.makedirs(self.output_dir, exist_ok=True)
        # Job logs are written and read in the head node's export itself, not through the mount: two
        # files per job that only this process and the job write (the mount shows them once the
        # node's export scan has seen them, within a second).
        self.head_export = self.cluster.nodes[self.head_node].export.rstrip("/")
        os.makedirs(self._on_disk(self.output_dir), exist_ok=True)
        self._log_lock = threading.Lock()
        # Every job started and not yet seen ending. Snakemake's `cancel` passes only the jobs its
        # polling loop is not holding at that instant, so Ctrl-C stops these instead.
        self._jobs_lock = threading.Lock()
        self._live: dict[int, SubmittedJobInfo] = {}
        self._cancelling = False
        self.logger.info(f"gmount: cluster {self.cluster.name}, head node {self.head_node}; "
                         f"placement log {os.path.relpath(self.log_path)}")
        # DAG-aware staging: a finished job's outputs go ahead of time to where their consumers will run
        self.staging = prestage.SnakemakeStaging(
            self.cluster, cwd, self.directory, self.workflow,
            running=getattr(self.workflow.resource_settings, "nodes", None) or 1) if prestage.enabled() else None

    def _on_disk(self, path: str) -> str:
        """The head node's own file at `path` (in its mount), in its export directory."""
        if path.startswith(self.head_mount + "/"):
            return self.head_export + path[len(self.head_mount):]
        return path

    # -- choosing the node ---------------------------------------------------------

    def _place(self, job: JobExecutorInterface, inputs: list[str]) -> tuple[str, str, int, int, str]:
        """(node, why, input bytes it holds, input bytes it reads from others, "daemon" or "api").

        The head node's daemon answers from its warm state on its job socket; without one (a
        daemon that has none), the same rule here over what the mount says (`place`)."""
        pinned = job_pin(job, self.cluster.nodes.names, self.cluster.name)
        planned = self.staging.planned(job) if self.staging is not None else None
        try:
            reply = jobsocket.place(self.head_mount_real, os.getcwd(), inputs, pin=pinned, planned=planned)
        except jobsocket.JobsError as exc:
            raise GmountError(str(exc)) from None
        except (OSError, ValueError):
            found = mounts.find(os.getcwd())
            if found is None:
                raise GmountError(f"{os.getcwd()} is no longer inside a mount of cluster {self.cluster.name!r}") \
                    from None
            mounted, head, _ = found
            placed = place(mounted.holdings(inputs), mounted, head, pinned, planned)
            return placed.node, placed.reason, placed.bytes_local, placed.bytes_remote, "api"
        reason = PINNED if pinned else reply["reason"]
        return reply["node"], reason, int(reply["bytes_local"]), int(reply["bytes_remote"]), "daemon"

    # -- running -----------------------------------------------------------------------

    def run_job(self, job: JobExecutorInterface) -> None:
        inputs = job_inputs(job)
        try:
            node, reason, local, remote, placed_by = self._place(job, inputs)
        except GmountError as exc:
            raise WorkflowError(f"gmount executor: cannot place job {job.name} ({job.jobid}): {exc}") from None
        target_mount = self.cluster.nodes[node].mountpoint.rstrip("/")
        base = os.path.join(self.output_dir, f"{job.name}-{job.jobid}-attempt{job.attempt}")
        env = {"GMOUNT_PLACEMENT_LOG": self.log_path.replace(self.head_mount + "/", target_mount + "/")}
        direct, because = _direct_command(job)
        if direct is not None:
            # What the job's own Snakemake would do before its command (it runs here, with this
            # process's view of the namespace), then the command alone on the node.
            self.workflow.async_run(job.prepare())
            executable, text = direct
            env.update(_command_env(job))
            command = self._shell_line(executable, text, base)
        else:
            command = self.format_job_exec(job)
            if self.cluster.spec.launcher == "ssh":  # another machine: its own Python (`python` in the cluster file)
                command = command.replace(f"{sys.executable} -m snakemake",
                                          f"{shlex.quote(self.cluster.spec.nodes[node].python)} -m snakemake")
        if target_mount != self.head_mount:  # absolute paths Snakemake wrote in the head node's mount
            command = command.replace(self.head_mount + "/", target_mount + "/")
        with open(self._on_disk(base + ".out"), "wb") as out, open(self._on_disk(base + ".err"), "wb") as err:
            try:
                spawned = self.cluster.spawn(command, on=node, cwd=self.directory, env=env, stdout=out, stderr=err,
                                             job=f"{job.name} #{job.jobid}", kind="snakemake")
            except (GmountError, OSError) as exc:
                raise WorkflowError(f"gmount executor: cannot start job {job.name} on node {node}: {exc}") from None
        via = "shell" if direct is not None else "snakemake"
        self.logger.info(f"gmount: job {job.name} ({job.jobid}) runs on {node} ({reason}; {via})")
        running = _Running(spawned, node, reason, inputs, local, remote, base + ".out", base + ".err", via, because,
                           placed_by)
        job_info = SubmittedJobInfo(job, external_jobid=f"{node}:{spawned.pid}", aux={"gmount": running})
        self._track(job_info)
        self.report_job_submission(job_info)

    def _track(self, job_info: SubmittedJobInfo) -> None:
        """Remember a started job until it is seen ending; stop it now if Ctrl-C came while it started."""
        with self._jobs_lock:
            self._live[id(job_info.aux["gmount"])] = job_info
            late = self._cancelling
        if late:
            self.cancel_jobs([job_info])

    def _shell_line(self, executable: str, command: str, base: str) -> str:
        """The line /bin/sh runs for a direct job: `exec EXECUTABLE -c COMMAND` (a script file if too long)."""
        if len(command.replace("'", "'\\''")) + 2 <= _MAX_ARG_LEN:
            return "exec " + shlex.join([executable, "-c", command])
        script = base + ".sh"
        with open(script, "w") as f:  # through the mount: the job's node reads it at once
            print(command, file=f)
        return "exec " + shlex.join([executable, script])

    async def check_active_jobs(self, active_jobs: list[SubmittedJobInfo]) -> AsyncGenerator[SubmittedJobInfo, None]:
        for job_info in active_jobs:
            running: _Running = job_info.aux["gmount"]
            if running.cancelled:  # cancel_jobs stopped it and logged it: Snakemake is stopping
                continue
            status = running.spawned.poll()
            if status is None:
                yield job_info
                continue
            running.spawned.stop(grace=0)  # anything the job left running in the background
            with self._jobs_lock:
                self._live.pop(id(running), None)
            text = "" if status == 0 else _read_tail(self._on_disk(running.stderr))
            command_status = status if running.via == "shell" else _command_status(text)
            self._log(job_info.job, running, status, command_exit=None if status == 0 else command_status)
            if status == 0:
                if self.staging is not None:
                    self.staging.finished(job_info.job, running.node)
                self.report_job_success(job_info)
            else:
                said = _tail_lines(text) if running.via == "shell" else _command_stderr(text)
                why = (f"its command exited with status {command_status}" if command_status is not None
                       else f"it exited with status {status}")
                self.report_job_error(job_info, msg=(
                    f"gmount: job {job_info.job.name} ({job_info.job.jobid}) failed on node {running.node}: {why}. "
                    f"Its stderr there:\n{said}\n(whole log: {running.stderr})\n"), aux_logs=[running.stderr])

    @with_run_summary  # the run's summary line at its end
    def shutdown(self) -> None:
        if self.staging is not None:
            stats = self.staging.stop()
            self.logger.info(f"gmount: DAG-aware staging copied {stats.staged_files} files "
                             f"({stats.staged_bytes} bytes) ahead of their jobs"
                             + (f"; {len(stats.errors)} problems, first: {stats.errors[0]}" if stats.errors else ""))
        RemoteExecutor.shutdown(self)

    def cancel_jobs(self, active_jobs: list[SubmittedJobInfo]) -> None:
        """Stop every running job (SIGTERM to its process group, SIGKILL after the grace time).

        Every job this executor started and has not seen end, not only `active_jobs`: Snakemake's
        list leaves out the jobs its status loop is polling at that moment."""
        with self._jobs_lock:
            self._cancelling = True
            infos = {id(j.aux["gmount"]): j for j in active_jobs if j.aux and "gmount" in j.aux}
            infos.update(self._live)
            jobs: list[tuple[SubmittedJobInfo, _Running]] = [(j, j.aux["gmount"]) for j in infos.values()
                                                              if not j.aux["gmount"].cancelled]
            for _, running in jobs:
                running.cancelled = True
        if not jobs:
            return
        with ThreadPoolExecutor(max_workers=min(32, len(jobs))) as pool:
            statuses = list(pool.map(lambda item: item[1].spawned.stop(self.settings.stop_grace), jobs))
        for (job_info, running), status in zip(jobs, statuses, strict=True):
            self._log(job_info.job, running, status, cancelled=True)

    async def sleep(self) -> None:
        """Between two polls of the running jobs. Not Snakemake's `next_seconds_between_status_checks`:
        its waiting thread starts before `__post_init__`, so the first wait took the default 10 s."""
        await asyncio.sleep(_POLL_SECONDS)

    # -- the placement log --------------------------------------------------------------

    def _log(self, job: JobExecutorInterface, running: _Running, status: int, cancelled: bool = False,
             command_exit: Optional[int] = None) -> None:
        record: dict[str, Any] = {
            "rule": job.name, "jobid": job.jobid, "attempt": job.attempt, "node": running.node,
            "reason": running.reason, "inputs": running.inputs, "input_bytes_local": running.local_bytes,
            "input_bytes_remote": running.remote_bytes,
            "seconds": round(time.monotonic() - running.spawned.started, 3), "exit": status,
            "via": running.via, "placed_by": running.placed_by, "time": round(time.time(), 3),
        }
        if running.because:
            record["snakemake_because"] = running.because
        if job.is_group():
            record["rules"] = sorted(job.rules)
        if command_exit is not None:
            record["command_exit"] = command_exit
        if cancelled:
            record["cancelled"] = True
        with self._log_lock, open(self.log_path, "a") as log:
            log.write(json.dumps(record) + "\n")


# -- the placement decision: shared with `gmount plan`, which predicts a run -------------------------

#: The reason a pinned job gives (the placement log's `reason`).
PINNED = "resources.gmount_node"


def job_inputs(job: Any) -> list[str]:
    """The inputs of `job` placement looks at: storage queries (`x://...`) are not in the namespace."""
    paths = []
    for item in job.input:
        text = str(item)
        if "://" in text or not text:
            continue
        paths.append(text)
    return paths


def job_pin(job: Any, nodes: Sequence[str], cluster: str) -> Optional[str]:
    """The node `job` names with `resources: gmount_node=...`, if any (WorkflowError if not a node)."""
    asked = job.resources.get("gmount_node") if hasattr(job.resources, "get") else None
    if not asked:
        return None
    node = str(asked)
    if node not in nodes:
        raise WorkflowError(f"gmount executor: rule {job.name} asks for gmount_node={node!r}, which is "
                            f"not a node of cluster {cluster!r} (nodes: {', '.join(nodes)})")
    return node


def place(holdings: Mapping[str, Mapping[str, int]], cluster: mounts.MountedCluster, head: str,
          pin: Optional[str], planned: Optional[str] = None) -> JobPlacement:
    """Where a job with inputs held as `holdings` runs when Snakemake runs on node `head`: the rule the
    head's daemon applies (`gmountpy.jobs.placement.place_job`, `planned` the node DAG-aware staging
    planned), with a pin's reason as the log says it."""
    placed = place_job(holdings, list(cluster.nodes), asked=head, rtt=cluster.rtt, pin=pin or "",
                       planned=planned or "", slots={name: node.slots for name, node in cluster.nodes.items()})
    if pin:
        return JobPlacement(placed.node, PINNED, placed.bytes_local, placed.bytes_remote)
    return placed


def _direct_command(job: JobExecutorInterface) -> tuple[Optional[tuple[str, str]], str]:
    """((shell executable, command), "") for a job whose command can run alone on its node, else
    (None, why it needs its own Snakemake process)."""
    if job.is_group():
        return None, "group job"
    rule = getattr(job, "rule", None)
    if rule is None or not getattr(rule, "shellcmd", None):
        kinds = [name for name in ("script", "notebook", "wrapper", "cwl", "template_engine")
                 if rule is not None and getattr(rule, name, None)]
        return None, f"{kinds[0]}: directive" if kinds else "run: directive (or no shell command)"
    checks = (
        (getattr(rule, "shadow_depth", None) is not None, "shadow: directive"),
        (getattr(job, "benchmark", None) is not None, "benchmark: directive"),
        (getattr(rule, "conda_env", None) is not None, "conda: directive"),
        (bool(getattr(rule, "container_img", None)) or bool(getattr(job, "container_img_url", None)),
         "container: directive"),
        (bool(getattr(rule, "env_modules", None)), "envmodules: directive"),
        (_caches_output(rule), "cache: directive"),
        (bool(getattr(rule, "is_handover", False)), "handover: directive"),
        (getattr(rule, "module_globals", None) not in (None, rule.workflow.globals), "rule from a module"),
        (any(getattr(f, "is_storage", False) for f in [*job.input, *job.output]), "storage files"),
    )
    for applies, why in checks:
        if applies:
            return None, why
    try:
        from snakemake.shell import shell  # type: ignore[import-untyped]  # Snakemake's own, as the job uses
    except ImportError:
        return None, "snakemake.shell not found"
    try:
        command = job.shellcmd
        executable = job.resources.get("shell_exec") or shell.get_executable() or "/bin/sh"
        prefix = shell._get_process_prefix(executable)
        suffix = shell._process_suffix
    except (AttributeError, WorkflowError) as exc:  # another Snakemake than the one this follows
        return None, f"the command could not be formatted here ({exc})"
    if "<TBD>" in command:  # a resource Snakemake evaluates on the node only (e.g. {resources.tmpdir})
        return None, "a resource to be determined on the node"
    return (str(executable), " ".join((prefix, command, suffix)).strip()), ""


def _caches_output(rule: Any) -> bool:
    """Whether the rule's outputs go through Snakemake's between-workflow cache (`cache: True`)."""
    cache = getattr(rule, "cache", None)
    output = getattr(cache, "output", False) if cache is not None else False
    return bool(output() if callable(output) else output)


def _command_env(job: JobExecutorInterface) -> dict[str, str]:
    """What Snakemake's shell() puts in a command's environment: thread counts, and the job's tmpdir."""
    threads = str(job.threads)
    env = {name: threads for name in ("OMP_NUM_THREADS", "GOTO_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                      "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")}
    tmpdir = job.resources.get("tmpdir") if hasattr(job.resources, "get") else None
    if tmpdir:
        env.update(TMPDIR=str(tmpdir), TMP=str(tmpdir), TEMPDIR=str(tmpdir), TEMP=str(tmpdir))
    return env


def _tail_lines(text: str, lines: int = 20) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:]) or "(empty)"


def _read_tail(path: str, size: int = 65536) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - size))
            return f.read().decode(errors="replace")
    except OSError as exc:
        return f"(cannot read {path}: {exc.strerror})"


_STATUS = re.compile(r"returned non-zero exit status (\d+)")


def _command_status(text: str) -> Optional[int]:
    """The exit status of the rule's own command, as the job's Snakemake reported it."""
    found = _STATUS.findall(text)
    return int(found[-1]) if found else None


def _command_stderr(text: str, lines: int = 20) -> str:
    """What the rule's command wrote, without the job's Snakemake banner and error block around it."""
    all_lines = text.rstrip().splitlines()
    starts = [i for i, line in enumerate(all_lines) if line.startswith("    resources: ")]
    if starts:
        body = all_lines[starts[-1] + 1:]
        for i, line in enumerate(body):
            if line.startswith(("RuleException", "Error in rule", "[")):
                body = body[:i]
                break
        if body:
            return "\n".join(body[-lines:])
    return "\n".join(all_lines[-lines:]) or "(empty)"


__all__ = ["PINNED", "Executor", "ExecutorSettings", "common_settings", "job_inputs", "job_pin", "place"]
