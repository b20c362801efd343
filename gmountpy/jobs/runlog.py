"""A run as its placement log tells it: jobs per node, input bytes local and remote, the slowest jobs.

make (gmount.mk) and the Snakemake executor append one JSON line per job to
a placement log (`.gmount/make-*.jsonl`, `.gmount/snakemake-*.jsonl`):

- make, per recipe line: target, node, make_node, cluster, cwd, inputs,
  bytes_local, bytes_remote, seconds, status, time (when it ended);
- Snakemake, per job: rule, jobid, attempt, node, reason, inputs,
  input_bytes_local, input_bytes_remote, seconds, exit (command_exit,
  cancelled, rules for group jobs), time (when it ended).

`read_log` reads either into `JobRecord`s, `summarise` adds them up, and
`summary_line` is the one line a run ends with. `with_run_summary` gives an
executor's shutdown that line. Standard library only: the plugins call it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["JobRecord", "RunSummary", "describe", "read_log", "summarise", "summary_line", "with_run_summary"]


@dataclass(frozen=True)
class JobRecord:
    """One job of a run: what it was, where it ran, how long, and the input bytes it found local or remote."""

    name: str                 # make: the target; Snakemake: the rule (rules of a group job, joined by +)
    label: str                # unique within a run: the target, or "rule #jobid"
    engine: str               # "make" or "snakemake"
    node: str
    seconds: float
    bytes_local: int
    bytes_remote: int
    status: int               # 0: succeeded
    end: float | None         # seconds since the epoch; None in logs written before it was recorded
    cancelled: bool = False

    @property
    def start(self) -> float | None:
        return None if self.end is None else self.end - self.seconds

    @property
    def failed(self) -> bool:
        return self.status != 0 or self.cancelled


def read_log(path: str | os.PathLike[str]) -> list[JobRecord]:
    """The jobs of one placement log, in the order they ended. A line that is not a job is skipped
    (a run killed mid-write leaves a partial last line); a file of neither format is a ValueError."""
    records = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
            except ValueError:
                continue
            if not isinstance(raw, dict):
                continue
            record = _from_make(raw) if "target" in raw else _from_snakemake(raw) if "rule" in raw else None
            if record is None:
                raise ValueError(f"{os.fspath(path)}:{number}: not a line of a gmount placement log "
                                 "(.gmount/make-*.jsonl or .gmount/snakemake-*.jsonl)")
            records.append(record)
    return records


def _from_make(raw: dict[str, Any]) -> JobRecord:
    target = str(raw["target"])
    return JobRecord(target, target, "make", str(raw.get("node", "?")), float(raw.get("seconds", 0.0)),
                     int(raw.get("bytes_local", 0)), int(raw.get("bytes_remote", 0)), int(raw.get("status", 0)),
                     _float_or_none(raw.get("time")))


def _from_snakemake(raw: dict[str, Any]) -> JobRecord:
    rules = raw.get("rules")
    name = "+".join(str(r) for r in rules) if isinstance(rules, list) and rules else str(raw["rule"])
    label = f"{name} #{raw['jobid']}" if "jobid" in raw else name
    if int(raw.get("attempt", 1)) > 1:
        label += f" (attempt {raw['attempt']})"
    return JobRecord(name, label, "snakemake", str(raw.get("node", "?")), float(raw.get("seconds", 0.0)),
                     int(raw.get("input_bytes_local", 0)), int(raw.get("input_bytes_remote", 0)),
                     int(raw.get("exit", 0)), _float_or_none(raw.get("time")), bool(raw.get("cancelled", False)))


def _float_or_none(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class RunSummary:
    """A run added up."""

    jobs: int
    per_node: dict[str, int]
    bytes_local: int
    bytes_remote: int
    failed: int
    slowest: list[JobRecord] = field(default_factory=list)
    span: float | None = None        # seconds from the first job's start to the last job's end

    @property
    def remote_fraction(self) -> float:
        total = self.bytes_local + self.bytes_remote
        return self.bytes_remote / total if total else 0.0


def summarise(records: Iterable[JobRecord], slowest: int = 3) -> RunSummary:
    jobs = list(records)
    per_node: dict[str, int] = {}
    for job in jobs:
        per_node[job.node] = per_node.get(job.node, 0) + 1
    timed = [job for job in jobs if job.end is not None]
    span = None
    if timed:
        span = max(job.end or 0.0 for job in timed) - min(job.start or 0.0 for job in timed)
    return RunSummary(len(jobs), dict(sorted(per_node.items())), sum(j.bytes_local for j in jobs),
                      sum(j.bytes_remote for j in jobs), sum(1 for j in jobs if j.failed),
                      sorted(jobs, key=lambda j: -j.seconds)[:slowest], span)


def summary_line(logs: Iterable[str | os.PathLike[str]]) -> str | None:
    """One line for the end of a run: jobs per node, input bytes local/remote, the slowest jobs.

    None when the logs hold no job (nothing ran) or cannot be read.
    """
    records: list[JobRecord] = []
    for log in logs:
        try:
            records += read_log(log)
        except (OSError, ValueError):
            continue
    return describe(records)


def describe(records: Iterable[JobRecord]) -> str | None:
    """`summary_line` of jobs already read; None for no jobs."""
    s = summarise(records)
    if not s.jobs:
        return None
    nodes = ", ".join(f"{node} {count}" for node, count in s.per_node.items())
    slowest = ", ".join(f"{job.label} {job.seconds:.1f} s on {job.node}" for job in s.slowest)
    line = (f"gmount: {s.jobs} {'job' if s.jobs == 1 else 'jobs'} ({nodes})"
            f"{f' in {s.span:.1f} s' if s.span is not None else ''}; input bytes "
            f"{_size(s.bytes_local)} local, {_size(s.bytes_remote)} remote "
            f"({100 * s.remote_fraction:.0f}% remote); slowest: {slowest}")
    if s.failed:
        line += f"; {s.failed} failed"
    return line


def with_run_summary(shutdown: Callable[[Any], None]) -> Callable[[Any], None]:
    """An executor's `shutdown` that, after `shutdown`, logs `summary_line` of its placement log.

    For an executor class with a `log_path` (its placement log) and a `logger`:
    `shutdown = with_run_summary(RemoteExecutor.shutdown)`.
    """

    def shutdown_and_summarise(executor: Any) -> None:
        shutdown(executor)
        line = summary_line([executor.log_path])
        if line is not None:
            executor.logger.info(f"{line} (`gmount report {os.path.relpath(executor.log_path)}` draws it)")

    shutdown_and_summarise.__doc__ = shutdown.__doc__
    return shutdown_and_summarise


def _size(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"
