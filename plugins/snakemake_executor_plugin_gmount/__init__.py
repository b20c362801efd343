"""Snakemake executor: every job runs on the gmount node that holds its inputs.

    snakemake --executor gmount -j 8          # from inside a node's mount
    snakemake --profile gmount                # the same, from `gmount snakemake-profile`

Run Snakemake inside any node's mount with plain paths. For each job this
plugin picks a node -- `resources.gmount_node` if the rule sets it, else
`Cluster.place(job inputs)` (the node holding most input bytes) -- and runs
the job's Snakemake command there, in the same directory of *that* node's
mount (a local process on a local cluster, over SSH on an SSH cluster), so
its outputs land in that node's export and its inputs are read locally.
Jobs see GMOUNT_NODE (and GMOUNT_SITE, GMOUNT_CLUSTER, GMOUNT_PLACEMENT_LOG).

Each finished job adds one JSON line to the placement log (default
`.gmount/snakemake-<time>-<pid>.jsonl`): rule, jobid, node, why, input
bytes read locally and remotely, seconds, exit status. Job stdout/stderr go
to `.gmount/snakemake-logs/`; a failing job's error shows the end of its
stderr. Ctrl-C stops every running job with everything it started.

Only the public gmountpy API is used (gmountpy.api), and DAG-aware staging
(gmountpy.jobs.prestage): each finished job's outputs are staged ahead of time to the
node its consumers are planned on, and a job runs on its planned node when the
placement rule counts that node as a candidate (GMOUNT_PRESTAGE=0 turns it off).
"""

# No `from __future__ import annotations`: Snakemake reads the settings' field types at run time.
import json
import os
import re
import shlex
import sys
import threading
import time
from collections.abc import AsyncGenerator
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
from gmountpy.jobs import prestage

#: How often running jobs are polled (they are local processes: polling is cheap).
_POLL_SECONDS = 0.25


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
        self.directory = here.path  # the working directory as a namespace path
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.log_path = os.path.abspath(self.settings.placement_log
                                        or os.path.join(".gmount", f"snakemake-{stamp}-{os.getpid()}.jsonl"))
        self.output_dir = os.path.abspath(os.path.join(".gmount", "snakemake-logs", f"{stamp}-{os.getpid()}"))
        os.makedirs(os.path.dirname(self.log_path), exist_ok=True)
        os.makedirs(self.output_dir, exist_ok=True)
        self._log_lock = threading.Lock()
        self.next_seconds_between_status_checks = _POLL_SECONDS
        self.logger.info(f"gmount: cluster {self.cluster.name}, head node {self.head_node}; "
                         f"placement log {os.path.relpath(self.log_path)}")
        # DAG-aware staging: a finished job's outputs go ahead of time to where their consumers will run
        self.staging = prestage.SnakemakeStaging(
            self.cluster, cwd, self.directory, self.workflow,
            running=getattr(self.workflow.resource_settings, "nodes", None) or 1) if prestage.enabled() else None

    # -- choosing the node ---------------------------------------------------------

    def _inputs(self, job: JobExecutorInterface) -> list[str]:
        paths = []
        for item in job.input:
            text = str(item)
            if "://" in text or not text:
                continue  # storage queries are not in the namespace
            paths.append(text)
        return paths

    def _choose(self, job: JobExecutorInterface, inputs: list[str]) -> tuple[str, str]:
        asked = job.resources.get("gmount_node") if hasattr(job.resources, "get") else None
        if asked:
            node = str(asked)
            if node not in self.cluster.nodes:
                raise WorkflowError(f"gmount executor: rule {job.name} asks for gmount_node={node!r}, which is "
                                    f"not a node of cluster {self.cluster.name!r} "
                                    f"(nodes: {', '.join(self.cluster.nodes.names)})")
            return node, "resources.gmount_node"
        placement = self.cluster.place(inputs)
        planned = self.staging.planned(job) if self.staging is not None else None
        if planned is not None and any(row.node == planned and row.candidate for row in placement.rows):
            return planned, f"planned by DAG-aware staging; {placement.reason}"
        return placement.node, placement.reason

    def _input_bytes(self, inputs: list[str], node: str) -> tuple[int, int]:
        """(bytes of the inputs `node` holds, bytes it must read from other nodes)."""
        if not inputs:
            return 0, 0
        local = remote = 0
        for found in self.cluster.where(inputs):
            if not found.holders:
                continue
            if any(h.node == node for h in found.holders):
                local += next(h.size for h in found.holders if h.node == node)
            else:
                remote += found.holders[0].size
        return local, remote

    # -- running -----------------------------------------------------------------------

    def run_job(self, job: JobExecutorInterface) -> None:
        inputs = self._inputs(job)
        try:
            node, reason = self._choose(job, inputs)
            local, remote = self._input_bytes(inputs, node)
        except GmountError as exc:
            raise WorkflowError(f"gmount executor: cannot place job {job.name} ({job.jobid}): {exc}") from None
        target_mount = self.cluster.nodes[node].mountpoint.rstrip("/")
        command = self.format_job_exec(job)
        if target_mount != self.head_mount:  # absolute paths Snakemake wrote in the head node's mount
            command = command.replace(self.head_mount + "/", target_mount + "/")
        if self.cluster.spec.launcher == "ssh":  # another machine: its own Python (`python` in the cluster file)
            command = command.replace(f"{sys.executable} -m snakemake",
                                      f"{shlex.quote(self.cluster.spec.nodes[node].python)} -m snakemake")
        base = os.path.join(self.output_dir, f"{job.name}-{job.jobid}-attempt{job.attempt}")
        env = {"GMOUNT_PLACEMENT_LOG": self.log_path.replace(self.head_mount + "/", target_mount + "/")}
        with open(base + ".out", "wb") as out, open(base + ".err", "wb") as err:
            try:
                spawned = self.cluster.spawn(command, on=node, cwd=self.directory, env=env, stdout=out, stderr=err)
            except (GmountError, OSError) as exc:
                raise WorkflowError(f"gmount executor: cannot start job {job.name} on node {node}: {exc}") from None
        self.logger.info(f"gmount: job {job.name} ({job.jobid}) runs on {node} ({reason})")
        running = _Running(spawned, node, reason, inputs, local, remote, base + ".out", base + ".err")
        self.report_job_submission(SubmittedJobInfo(job, external_jobid=f"{node}:{spawned.pid}",
                                                    aux={"gmount": running}))

    async def check_active_jobs(self, active_jobs: list[SubmittedJobInfo]) -> AsyncGenerator[SubmittedJobInfo, None]:
        for job_info in active_jobs:
            running: _Running = job_info.aux["gmount"]
            status = running.spawned.poll()
            if status is None:
                yield job_info
                continue
            running.spawned.stop(grace=0)  # anything the job left running in the background
            self._log(job_info.job, running, status,
                      command_exit=None if status == 0 else _command_status(_read_tail(running.stderr)))
            if status == 0:
                if self.staging is not None:
                    self.staging.finished(job_info.job, running.node)
                self.report_job_success(job_info)
            else:
                text = _read_tail(running.stderr)
                command_status = _command_status(text)
                said = _command_stderr(text)
                why = (f"its command exited with status {command_status}" if command_status is not None
                       else f"it exited with status {status}")
                self.report_job_error(job_info, msg=(
                    f"gmount: job {job_info.job.name} ({job_info.job.jobid}) failed on node {running.node}: {why}. "
                    f"Its stderr there:\n{said}\n(whole log: {running.stderr})\n"), aux_logs=[running.stderr])

    def shutdown(self) -> None:
        if self.staging is not None:
            stats = self.staging.stop()
            self.logger.info(f"gmount: DAG-aware staging copied {stats.staged_files} files "
                             f"({stats.staged_bytes} bytes) ahead of their jobs"
                             + (f"; {len(stats.errors)} problems, first: {stats.errors[0]}" if stats.errors else ""))
        super().shutdown()

    def cancel_jobs(self, active_jobs: list[SubmittedJobInfo]) -> None:
        """Stop every running job (SIGTERM to its process group, SIGKILL after the grace time)."""
        jobs: list[tuple[SubmittedJobInfo, _Running]] = [(j, j.aux["gmount"]) for j in active_jobs
                                                          if j.aux and "gmount" in j.aux]
        if not jobs:
            return
        with ThreadPoolExecutor(max_workers=min(32, len(jobs))) as pool:
            statuses = list(pool.map(lambda item: item[1].spawned.stop(self.settings.stop_grace), jobs))
        for (job_info, running), status in zip(jobs, statuses, strict=True):
            self._log(job_info.job, running, status, cancelled=True)

    # -- the placement log --------------------------------------------------------------

    def _log(self, job: JobExecutorInterface, running: _Running, status: int, cancelled: bool = False,
             command_exit: Optional[int] = None) -> None:
        record: dict[str, Any] = {
            "rule": job.name, "jobid": job.jobid, "attempt": job.attempt, "node": running.node,
            "reason": running.reason, "inputs": running.inputs, "input_bytes_local": running.local_bytes,
            "input_bytes_remote": running.remote_bytes,
            "seconds": round(time.monotonic() - running.spawned.started, 3), "exit": status,
        }
        if job.is_group():
            record["rules"] = sorted(job.rules)
        if command_exit is not None:
            record["command_exit"] = command_exit
        if cancelled:
            record["cancelled"] = True
        with self._log_lock, open(self.log_path, "a") as log:
            log.write(json.dumps(record) + "\n")


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


__all__ = ["Executor", "ExecutorSettings", "common_settings"]
