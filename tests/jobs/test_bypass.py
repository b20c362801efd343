"""The environment that turns the local bypass on for a job (gmountpy/jobs/bypass.py), without a cluster."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gmountpy.jobs import bypass


def test_preload_value_puts_the_library_first_and_keeps_the_rest() -> None:
    assert bypass.preload_value("", "/lib/a.so") == "/lib/a.so"
    assert bypass.preload_value("/x.so:/y.so", "/lib/a.so") == "/lib/a.so /x.so /y.so"
    assert bypass.preload_value("/x.so /lib/a.so", "/lib/a.so") == "/lib/a.so /x.so"  # not twice


@pytest.mark.parametrize("value", ["0", "off", "No", "false", " FALSE "])
def test_gmount_bypass_switches_it_off(value: str) -> None:
    assert not bypass.enabled({"GMOUNT_BYPASS": value})
    assert bypass.job_environment({"GMOUNT_BYPASS": value}) == {}


def test_a_job_environment_preloads_the_built_library() -> None:
    lib = bypass.library()
    assert lib is not None and os.path.exists(lib), "pip install . builds the library (setup.py C_TARGETS)"
    assert bypass.enabled({}) and bypass.enabled({"GMOUNT_BYPASS": "1"})
    assert bypass.job_environment({"LD_PRELOAD": "/other.so"}) == {"LD_PRELOAD": f"{lib} /other.so"}
    exported = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True).stdout.split()
    for symbol in ("open", "openat", "open64", "fopen", "stat", "statx", "close", "execve", "read", "write"):
        assert symbol in exported, symbol


def test_remote_prelude_finds_the_nodes_own_copy_without_importing_gmountpy() -> None:
    lib = bypass.library()
    assert lib is not None
    script = bypass.remote_prelude(sys.executable) + 'printf %s "$LD_PRELOAD"'
    got = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True,
                         env={"PATH": os.environ["PATH"], "LD_PRELOAD": ""}).stdout
    # the installed copy: the one this interpreter finds first (a checkout's tests may run from the source tree)
    assert got.split()[0].endswith("gmountpy/jobs/libgmount_preload.so")
    assert os.path.exists(got.split()[0])
    off = bypass.remote_prelude(sys.executable, {"GMOUNT_BYPASS": "0"})
    off += 'printf %s "${LD_PRELOAD-unset} $GMOUNT_BYPASS"'
    assert subprocess.run(["/bin/sh", "-c", off], capture_output=True, text=True,
                          env={"PATH": os.environ["PATH"]}).stdout == "unset 0"
    # a node whose python lacks gmountpy: nothing preloaded, the job still runs
    broken = bypass.remote_prelude("/nonexistent/python") + "echo ran"
    assert subprocess.run(["/bin/sh", "-c", broken], capture_output=True, text=True).stdout == "ran\n"


def test_shell_lines_are_what_eval_needs() -> None:
    lines = bypass.shell_lines({"LD_PRELOAD": "/x.so"})
    out = subprocess.run(["/bin/sh", "-c", lines + 'printf "%s|%s" "$LD_PRELOAD" "$GMOUNT_BYPASS"'],
                         capture_output=True, text=True, env={"PATH": os.environ["PATH"]}).stdout
    assert out == f"{bypass.library()} /x.so|1"
