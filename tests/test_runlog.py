"""Placement logs read back (gmountpy.jobs.runlog): both plugins' formats, the summary line a run ends with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gmountpy.jobs.runlog import read_log, summarise, summary_line


def write(path: Path, *records: dict[str, object], tail: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)
    return path


def test_make_and_snakemake_lines_become_jobs(tmp_path: Path) -> None:
    make = write(tmp_path / "make.jsonl",
                 {"target": "a.o", "node": "n3", "make_node": "n1", "cluster": "c", "cwd": "/w", "inputs": 1,
                  "bytes_local": 1000, "bytes_remote": 0, "seconds": 2.5, "status": 0, "time": 110.0},
                 {"target": "app", "node": "n1", "make_node": "n1", "cluster": "c", "cwd": "/w", "inputs": 2,
                  "bytes_local": 10, "bytes_remote": 3000, "seconds": 1.0, "status": 2, "time": 112.0},
                 tail='{"target": "cut off by a ki')  # a run killed mid-write
    jobs = read_log(make)
    assert [(j.label, j.node, j.engine, j.start, j.failed) for j in jobs] == [
        ("a.o", "n3", "make", 107.5, False), ("app", "n1", "make", 111.0, True)]
    snake = write(tmp_path / "snakemake.jsonl",
                  {"rule": "count", "jobid": 4, "attempt": 2, "node": "n2", "reason": "r", "inputs": ["x"],
                   "input_bytes_local": 5, "input_bytes_remote": 7, "seconds": 0.5, "exit": 0, "time": 50.0},
                  {"rule": "g", "rules": ["a", "b"], "jobid": 9, "attempt": 1, "node": "n4", "reason": "r",
                   "inputs": [], "input_bytes_local": 0, "input_bytes_remote": 0, "seconds": 3.0, "exit": 0,
                   "cancelled": True})  # before end times were logged: no time
    jobs = read_log(snake)
    assert [(j.name, j.label, j.status, j.end, j.failed) for j in jobs] == [
        ("count", "count #4 (attempt 2)", 0, 50.0, False), ("a+b", "a+b #9", 0, None, True)]
    summary = summarise(read_log(make) + jobs)
    assert summary.per_node == {"n1": 1, "n2": 1, "n3": 1, "n4": 1}
    assert (summary.bytes_local, summary.bytes_remote, summary.failed) == (1015, 3007, 2)
    assert [j.label for j in summary.slowest] == ["a+b #9", "a.o", "app"]


def test_the_summary_line(tmp_path: Path) -> None:
    log = write(tmp_path / "make.jsonl",
                *[{"target": f"t{i}", "node": f"n{1 + i % 2}", "bytes_local": 2048, "bytes_remote": 1024 * i,
                   "seconds": float(i), "status": 0, "time": 100.0 + i} for i in range(1, 5)])
    assert summary_line([log]) == (
        "gmount: 4 jobs (n1 2, n2 2) in 4.0 s; input bytes 8.0 KiB local, 10.0 KiB remote (56% remote); "
        "slowest: t4 4.0 s on n1, t3 3.0 s on n2, t2 2.0 s on n1")
    assert summary_line([tmp_path / "missing.jsonl"]) is None
    assert summary_line([write(tmp_path / "empty.jsonl")]) is None


def test_a_file_of_another_kind_is_refused_with_its_line(tmp_path: Path) -> None:
    other = write(tmp_path / "other.jsonl", {"rule": "ok", "node": "n1"}, {"name": "not ours"})
    with pytest.raises(ValueError, match=r"other.jsonl:2: not a line of a gmount placement log"):
        read_log(other)
