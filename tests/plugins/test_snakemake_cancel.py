"""Ctrl-C stops every job the Snakemake executor started, also those its status loop holds.

Snakemake's `RemoteExecutor.cancel` passes `cancel_jobs` only the jobs in `active_jobs`; its status
loop takes them all out of that list while it polls them. A Ctrl-C in that window once left a job
running after Snakemake exited (seen in CI). These tests open that window on purpose, with real
processes: no cluster is needed, the executor's job-stopping code is what is tested.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path
from typing import Any

from snakemake_interface_executor_plugins.executors.base import SubmittedJobInfo

from gmountpy.jobs.spawn import local_argv, start
from snakemake_executor_plugin_gmount import Executor, ExecutorSettings, _Running


class _Job:
    """The few attributes of a Snakemake job the executor's log reads."""

    def __init__(self, jobid: int) -> None:
        self.name, self.jobid, self.attempt = "slow", jobid, 1

    def is_group(self) -> bool:
        return False


def _executor(log: Path) -> Any:
    """An Executor with only the state its job tracking and cancelling use (no workflow)."""
    executor: Any = Executor.__new__(Executor)
    executor.settings = ExecutorSettings(stop_grace=1.0)
    executor.lock = threading.Lock()        # RemoteExecutor's
    executor.active_jobs = []
    executor._log_lock = threading.Lock()
    executor._jobs_lock = threading.Lock()
    executor._live = {}
    executor._cancelling = False
    executor.log_path = str(log)
    return executor


def _spawn(executor: Any, jobid: int, tmp_path: Path) -> SubmittedJobInfo:
    spawned = start("n1", "sleep 600", str(tmp_path), local_argv("sleep 600"), os.environ,
                    over_ssh=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    running = _Running(spawned, "n1", "test", [], 0, 0, "", "", "shell")
    info = SubmittedJobInfo(_Job(jobid), external_jobid=f"n1:{spawned.pid}", aux={"gmount": running})  # type: ignore[arg-type]
    executor._track(info)
    with executor.lock:
        executor.active_jobs.append(info)   # what report_job_submission does
    return info


def _alive(info: SubmittedJobInfo) -> bool:
    running: _Running = info.aux["gmount"]
    return running.spawned.poll() is None


def test_cancel_stops_jobs_the_status_loop_is_polling(tmp_path: Path) -> None:
    executor = _executor(tmp_path / "placement.jsonl")
    jobs = [_spawn(executor, i, tmp_path) for i in range(3)]
    try:
        with executor.lock:                 # the status loop took them out to poll them
            executor.active_jobs.clear()
        with executor.lock:                 # what RemoteExecutor.cancel passes
            visible = list(executor.active_jobs)
        executor.cancel_jobs(visible)
        assert not any(_alive(j) for j in jobs)
        records = [json.loads(line) for line in (tmp_path / "placement.jsonl").read_text().splitlines()]
        assert sorted(r["jobid"] for r in records) == [0, 1, 2] and all(r["cancelled"] for r in records)
        executor.cancel_jobs(jobs)          # Snakemake may cancel twice: nothing stopped or logged again
        assert len((tmp_path / "placement.jsonl").read_text().splitlines()) == 3
    finally:
        for job in jobs:
            job.aux["gmount"].spawned.stop(grace=0)


def test_a_job_started_while_cancelling_is_stopped_at_once(tmp_path: Path) -> None:
    executor = _executor(tmp_path / "placement.jsonl")
    executor.cancel_jobs([])                # Ctrl-C while run_job was still starting the next job
    job = _spawn(executor, 7, tmp_path)
    try:
        assert not _alive(job)
        assert json.loads((tmp_path / "placement.jsonl").read_text())["cancelled"] is True
    finally:
        job.aux["gmount"].spawned.stop(grace=0)
