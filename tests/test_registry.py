"""The job registry (gmountpy.cluster.registry): a job counts as running exactly while its process runs."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gmountpy.cluster import registry


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(["sleep", "60"])
    yield process
    process.kill()
    process.wait()


def test_a_registered_job_runs_while_its_process_does(sleeper: subprocess.Popen[bytes]) -> None:
    path = registry.register("reg-a", "n3", "results/a.txt", sleeper.pid, kind="make", directory="/work")
    assert path is not None and os.path.exists(path)
    [job] = registry.running("reg-a")
    assert {k: job[k] for k in ("cluster", "node", "job", "kind", "directory", "pid")} == {
        "cluster": "reg-a", "node": "n3", "job": "results/a.txt", "kind": "make", "directory": "/work",
        "pid": sleeper.pid}
    assert job["host"] == os.uname().nodename and isinstance(job["started"], float)
    assert registry.running("another-cluster") == []
    sleeper.kill()
    sleeper.wait()
    assert registry.running("reg-a") == []
    assert not os.path.exists(path)  # the ended job's file is gone


def test_an_ended_but_unreaped_process_and_a_reused_pid_are_not_running(sleeper: subprocess.Popen[bytes]) -> None:
    path = registry.register("reg-b", "n1", "zombie", sleeper.pid)
    assert path is not None
    sleeper.kill()
    os.waitid(os.P_PID, sleeper.pid, os.WEXITED | os.WNOWAIT)  # ended, not yet reaped: a zombie
    assert registry.running("reg-b") == []
    # a registration whose pid now belongs to another process (other start time) is not that job
    fake = Path(registry.jobs_dir("reg-b")) / f"{os.getpid()}-1.json"
    fake.write_text('{"cluster": "reg-b"}')
    assert registry.running("reg-b") == [] and not fake.exists()


def test_names_with_quotes_and_other_scripts_survive(sleeper: subprocess.Popen[bytes]) -> None:
    name = 'out/"quoted" \\ back — データ.txt'
    registry.register("reg-c", "n2", name, sleeper.pid)
    assert [job["job"] for job in registry.running("reg-c")] == [name]


def test_registering_a_process_that_ended_records_nothing() -> None:
    process = subprocess.Popen(["true"])
    process.wait()
    assert registry.register("reg-d", "n1", "gone", process.pid) is None
    assert registry.running("reg-d") == []


def test_registering_imports_no_json() -> None:
    """make's wrapper registers every recipe: it must not pay for json (and re) there."""
    probe = ("import os, sys; from gmountpy.cluster import registry; "
             "assert registry.register('reg-e', 'n1', 'plain', os.getpid()); "
             "print(sorted(m for m in ('json', 're') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-S", "-c", probe], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_registrations_of_ended_jobs_do_not_pile_up_unread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nobody may run `gmount top` during a long make run: registering also removes ended jobs' files."""
    folder = Path(registry.jobs_dir("reg-f"))
    folder.mkdir(parents=True)
    for pid in range(1000, 1300):  # ended jobs (their start times cannot match)
        (folder / f"{pid}-1.json").write_text("{}")
    monkeypatch.setattr(registry, "PRUNE_EVERY", 1)
    path = registry.register("reg-f", "n1", "this one", os.getpid())
    assert [p.name for p in folder.iterdir()] == [os.path.basename(str(path))]
