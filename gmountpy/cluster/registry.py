"""Jobs running on a cluster's nodes, registered by whoever started them: what `gmount top` shows.

Whatever starts a job on a node -- make's wrappers (the C `gmount-job`
through plugins/gmountpy_make/gmount_registry.h, which writes the same
files, and `gmount-sh`), the Snakemake executor, `Cluster.run` and
`Cluster.spawn` -- calls `register` once, with
the pid of a process on this machine that lives exactly as long as the job
(the recipe's shell, the local `ssh` client). That writes one small file,

    <state>/gmountpy/jobs/<cluster>/<pid>-<process start>.json

naming the node the job runs on, what it is (a make target, a Snakemake
rule) and when it started. The job counts as running while that process
does: there is nothing to unregister, and a starter killed with SIGKILL
leaves no job behind (`running` removes the files of ended processes). The
process's start time (from /proc) is part of the key, so a reused pid is
not taken for the job.

The daemons of this machine report these files (`msg.Jobs`, served by
node.control), so `gmount top` sees the jobs started on every machine of
the cluster. Standard library only, and no `json` on the writing side:
make's wrapper registers every recipe.
"""

from __future__ import annotations

import os
import time

TYPE_CHECKING = False  # typing is not imported at run time: per-job wrappers import this module
if TYPE_CHECKING:
    from typing import Any

__all__ = ["jobs_dir", "process_start", "register", "running", "unregister"]

#: registrations of ended jobs are removed by readers, and by about one registration in this many
#: (those of pids divisible by it): a long run that nobody watches leaves about this many behind
PRUNE_EVERY = 64
#: what each registration holds (the daemons' `jobs` reply, one dict per job)
FIELDS = ("cluster", "node", "job", "kind", "directory", "started", "host", "pid")


def jobs_dir(cluster: str) -> str:
    """Where this machine's registrations for `cluster` live (beside the launcher's state)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return os.path.join(base, "gmountpy", "jobs", cluster)


def register(cluster: str, node: str, job: str, pid: int, *, kind: str = "job", directory: str = "") -> str | None:
    """Record that process `pid` of this machine runs `job` on `node` of `cluster` until it ends.

    `job` is what a person recognises (a make target, a Snakemake rule); `kind`
    who started it ("make", "snakemake", "api"); `directory` the job's working
    directory in the namespace. Returns the registration's path (for `unregister`),
    or None when it could not be written: a job never fails for want of a registration.
    """
    started = _start_ticks(pid)
    if started is None:
        return None  # already gone: nothing to show
    record: dict[str, str | int | float] = {
        "cluster": cluster, "node": node, "job": job, "kind": kind, "directory": directory,
        "started": round(time.time(), 3), "host": os.uname().nodename, "pid": pid}
    folder = jobs_dir(cluster)
    path = os.path.join(folder, f"{pid}-{started}.json")
    data = _json_object(record).encode()
    for attempt in (1, 2):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        except FileNotFoundError:
            if attempt == 2:
                return None
            try:
                os.makedirs(folder, mode=0o700, exist_ok=True)
            except OSError:
                return None
            continue
        except OSError:
            return None
        try:
            os.write(fd, data)  # one write of a few hundred bytes: a reader sees all of it or an empty file
        except OSError:
            return None
        finally:
            os.close(fd)
        if pid % PRUNE_EVERY == 0:  # about one registration in PRUNE_EVERY: nobody may be reading them
            _live(folder)
        return path
    return None


def unregister(path: str | None) -> None:
    """End a registration before its process ends (a job run inside a longer-lived process)."""
    if path:
        try:
            os.unlink(path)
        except OSError:
            pass


def running(cluster: str) -> list[dict[str, Any]]:
    """The jobs registered on this machine for `cluster` whose process still runs, oldest first.

    Registrations of ended processes are removed on the way.
    """
    import json

    found = []
    for path in _live(jobs_dir(cluster)):
        try:
            with open(path, "rb") as f:
                record = json.loads(f.read())
        except (OSError, ValueError):
            continue  # being written, or removed meanwhile
        if isinstance(record, dict) and all(key in record for key in FIELDS):
            found.append({key: record[key] for key in FIELDS})
    return sorted(found, key=lambda r: (r["started"], r["pid"]))


def _live(folder: str) -> list[str]:
    """The registrations in `folder` whose process still runs; the others' files are removed."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    live = []
    for name in names:
        pid_text, _, rest = name.partition("-")
        ticks = rest.removesuffix(".json")
        if not (pid_text.isdigit() and ticks.isdigit() and name.endswith(".json")):
            continue
        path = os.path.join(folder, name)
        if _start_ticks(int(pid_text)) == int(ticks):
            live.append(path)
        else:
            unregister(path)  # its process ended (or the pid now belongs to another process)
    return live


def process_start(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot): with the pid, a key no later process reuses;
    None if it does not run."""
    return _start_ticks(pid)


def _start_ticks(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot), None if it does not run (or is a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
    except OSError:
        return None
    # after the command name: state is field 3 of stat(5), starttime field 22
    if len(fields) < 20 or fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


def _json_object(record: dict[str, str | int | float]) -> str:
    """A flat record as JSON, without importing json (and `re`) for the usual plain ASCII values."""
    parts = []
    for key, value in record.items():
        text = _json_string(value) if isinstance(value, str) else repr(value)  # ints, finite floats: the fields above
        parts.append(f'"{key}": {text}')
    return "{" + ", ".join(parts) + "}"


def _json_string(text: str) -> str:
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return f'"{text}"'
    import json  # rare: a target with quotes, backslashes or non-ASCII characters

    return json.dumps(text)
