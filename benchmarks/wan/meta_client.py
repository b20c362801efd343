"""One ParaMark-style metadata client: plain syscalls on a mount, one phase per op type.

Started by bench_meta.py, one per node. Reads one JSON line (its paths per op
type), answers READY, then for every `GO <op>` line runs that op on all of its
paths as fast as it can, one at a time, and answers one JSON line with the
elapsed seconds and the number of failed calls. The driver sends GO to every
client at once, so the phase's aggregate rate is all ops / the slowest client.

Before its timer starts a phase stats its working directory and a name that is
not in it (`_warm`), as a job would that has changed into its directory: the
path to it is resolved, and a system that keeps a directory's index builds it,
outside the time of the ops measured (no listing is asked for: that would hand
a client the names it is about to stat).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable

OPS = ("mkdir", "rmdir", "creat", "stat", "stat_missing", "access", "chmod", "utime", "open_close",
       "rename", "unlink")


def _creat(path: str) -> None:
    os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))


def _stat_missing(path: str) -> None:
    try:
        os.stat(path)
    except FileNotFoundError:
        return
    raise OSError(f"{path} exists but should not")


def _access(path: str) -> None:
    if not os.access(path, os.R_OK):
        raise OSError(f"access({path}, R_OK) is false")


def _open_close(path: str) -> None:
    os.close(os.open(path, os.O_RDONLY))


RUN: dict[str, Callable[[str], object]] = {
    "mkdir": os.mkdir,
    "rmdir": os.rmdir,
    "creat": _creat,
    "stat": os.stat,
    "stat_missing": _stat_missing,
    "access": _access,
    "chmod": lambda p: os.chmod(p, 0o600),
    "utime": lambda p: os.utime(p, (1_700_000_000, 1_700_000_000)),
    "open_close": _open_close,
    "rename": lambda p: os.rename(p, p + ".mv"),
    "unlink": os.unlink,
}


def _warm(paths: list[str]) -> None:
    """Resolve the phase's working directory and look one missing name up in it (untimed)."""
    if not paths:
        return
    directory = os.path.dirname(paths[0])
    os.stat(directory)
    try:
        os.stat(os.path.join(directory, ".warm-up"))
    except FileNotFoundError:
        pass


def main() -> int:
    config = json.loads(sys.stdin.readline())
    paths: dict[str, list[str]] = config["paths"]
    print("READY", flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] != "GO":
            break
        op = words[1]
        run = RUN[op]
        errors: list[str] = []
        _warm(paths[op])
        start = time.perf_counter()
        for path in paths[op]:
            try:
                run(path)
            except OSError as exc:
                if len(errors) < 3:
                    errors.append(f"{op} {path}: {exc}")
                else:
                    errors.append("")
        elapsed = time.perf_counter() - start
        print(json.dumps({"op": op, "seconds": elapsed, "count": len(paths[op]), "errors": len(errors),
                          "first_errors": [e for e in errors if e][:3]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
