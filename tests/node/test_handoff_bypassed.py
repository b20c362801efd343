"""The workflow hand-off contract with the local bypass on.

The hand-off suites (test_handoff.py, test_handoff_kernel_cache.py) run again in a pytest
process that preloads the bypass library, as every job gmount starts does: their reads,
writes, stats and creates through the mounts go through the library, which takes this
node's files from the export. Then test_handoff.py runs once more on clusters whose
daemons use kernel passthrough. Each run must pass, and must show the bypass was used.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gmountpy.jobs import bypass

from ..conftest import fuse_problem, require
from .test_passthrough import passthrough_problem

REPO = Path(__file__).resolve().parents[2]
#: what a test asserts about the daemon's own read path, which the bypass skips on purpose
NOT_ABOUT_HANDOFF = ("tests/node/test_handoff_kernel_cache.py::"
                     "test_unchanged_local_file_is_read_again_from_the_page_cache")


def run_suite(tmp_path: Path, env: dict[str, str], *files: str, deselect: tuple[str, ...] = ()) -> str:
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", f"--basetemp={tmp_path / 'run'}",
               *files, *(arg for test in deselect for arg in ("--deselect", test))]
    result = subprocess.run(command, cwd=REPO, env={**os.environ, "GMOUNT_TEST_LOOKUP": "index", **env},
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    return result.stdout


def test_handoff_suites_through_the_preload_library(tmp_path: Path) -> None:
    require("FUSE", fuse_problem())
    lib = bypass.library()
    require("the bypass library", None if lib else "not built")
    assert lib is not None
    stats = tmp_path / "stats"
    run_suite(tmp_path, {"LD_PRELOAD": bypass.preload_value(os.environ.get("LD_PRELOAD", ""), lib),
                         "GMOUNT_BYPASS_STATS": str(stats)},
              "tests/node/test_handoff.py", "tests/node/test_handoff_kernel_cache.py", deselect=(NOT_ABOUT_HANDOFF,))
    seen: dict[str, int] = {}
    for line in stats.read_text().splitlines():
        for field in line.split()[1:]:
            key, value = field.split("=")
            seen[key] = seen.get(key, 0) + int(value)
    # hundreds of the suites' opens, stats and writes went to the exports
    assert seen["open_direct"] >= 200 and seen["stat_direct"] >= 20 and seen["close_notes"] >= 200, seen


def test_handoff_suite_with_kernel_passthrough(tmp_path: Path) -> None:
    require("FUSE", fuse_problem())
    require("kernel passthrough", passthrough_problem())
    # the tests of files written, read and kept open on one node and another (passthrough changes only how
    # a node's own files are read and written; the error paths of remote holders are the daemon's as before)
    run_suite(tmp_path, {"GMOUNT_TEST_TUNING": "passthrough = true"}, "tests/node/test_handoff.py",
              "-k", "close_to_open or open_file or release_after_rename or new_end or rotating_writers")
    logs = list((tmp_path / "run").rglob("*.log"))
    negotiated = [log for log in logs if "kernel passthrough negotiated" in log.read_text(errors="replace")]
    assert negotiated, f"no daemon log says passthrough was negotiated ({len(logs)} logs)"
