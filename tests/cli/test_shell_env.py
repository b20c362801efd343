"""`gmount shell` and `gmount env`: a user's own processes with the local bypass on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gmountpy.jobs import bypass

from ..conftest import LocalCluster

GMOUNT = [sys.executable, "-m", "gmountpy"]


def counted(stats: Path) -> dict[str, int]:
    total: dict[str, int] = {}
    for line in stats.read_text().splitlines():
        for field in line.split()[1:]:
            key, value = field.split("=")
            total[key] = total.get(key, 0) + int(value)
    return total


def test_gmount_shell_runs_with_the_bypass_on_in_the_mount(cluster4: LocalCluster, tmp_path: Path) -> None:
    (cluster4.mount("n1") / "shell-in").mkdir()
    (cluster4.mount("n1") / "shell-in" / "mine.txt").write_text("held by n1\n")
    stats = tmp_path / "stats"
    result = subprocess.run([*GMOUNT, "shell", "-C", str(cluster4.mount("n1") / "shell-in"), "--", "sh", "-c",
                             'cat mine.txt; echo "$GMOUNT_NODE $PWD"'], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "GMOUNT_BYPASS_STATS": str(stats)})
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"held by n1\nn1 {cluster4.mount('n1') / 'shell-in'}\n"
    assert counted(stats)["open_direct"] == 1  # cat read n1's file from n1's export


def test_gmount_shell_outside_a_mount_says_where_to_go(tmp_path: Path) -> None:
    result = subprocess.run([*GMOUNT, "shell", "-C", str(tmp_path), "--", "true"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 1
    assert "is not inside the mount of a running cluster" in result.stderr and "cd into a node's mountpoint" in \
        result.stderr


def test_gmount_env_lines_turn_it_on_and_off(cluster4: LocalCluster, tmp_path: Path) -> None:
    (cluster4.mount("n2") / "env-in.txt").write_text("held by n2")
    stats = tmp_path / "stats"
    on = subprocess.run([*GMOUNT, "env"], capture_output=True, text=True, check=True).stdout
    off = subprocess.run([*GMOUNT, "env", "--off"], capture_output=True, text=True, check=True).stdout
    assert bypass.library() in on and off == "export GMOUNT_BYPASS=0\n"
    script = (f'eval "$({" ".join(GMOUNT)} env)"; cat {cluster4.mount("n2")}/env-in.txt; echo; '
              f'eval "$({" ".join(GMOUNT)} env --off)"; cat {cluster4.mount("n2")}/env-in.txt')
    result = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "GMOUNT_BYPASS_STATS": str(stats)})
    assert result.stdout == "held by n2\nheld by n2"
    seen = counted(stats)
    assert seen["open_direct"] == 1  # the first cat only: the second ran with GMOUNT_BYPASS=0
