"""`gmount make-include` and `gmount make`, registered through the `gmountpy.commands` entry points."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import sysconfig

import click

from gmountpy.cluster import mounts

from . import JOB_PROGRAM, MAKEFILE
from .plan import is_dry_run


@click.command("make-include")
def include_command() -> None:
    """Print the path of gmount.mk, for `include $(shell gmount make-include)` in a Makefile."""
    click.echo(MAKEFILE)


@click.command("make", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False,
                                         "help_option_names": []})
@click.argument("make_args", nargs=-1, type=click.UNPROCESSED)
def make_command(make_args: tuple[str, ...]) -> None:
    """Run GNU make with gmount.mk included (all arguments go to make): recipes run where their inputs are.

    With -n (a dry run) inside a mount: make's own -n output, then which node each recipe would
    run on and what it would read (`gmount plan`).
    """
    make = shutil.which("make")
    if make is None:
        raise click.ClickException("GNU make is not on PATH (Debian package `make`)")
    if is_dry_run(make_args) and mounts.find(os.getcwd()) is not None:
        from gmountpy.cli.plan import plan_make, render

        plan, printed = plan_make(make_args)
        click.echo(printed, nl=False)
        click.echo(render(plan))
        return
    wrapper = find_wrapper()
    if wrapper is not None:
        os.environ.setdefault("GMOUNT_SH_FALLBACK", wrapper)
        os.environ.setdefault("GMOUNT_SH", JOB_PROGRAM if os.access(JOB_PROGRAM, os.X_OK) else wrapper)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # Python ignores it; make and its recipes must not inherit that
    os.execv(make, [make, f"--eval=include {MAKEFILE}", *make_args])


def find_wrapper() -> str | None:
    """The Python gmount-sh from the same installation as this `gmount` (its bin directory), else from PATH."""
    for directory in (os.path.dirname(os.path.abspath(sys.argv[0])), sysconfig.get_path("scripts")):
        candidate = os.path.join(directory, "gmount-sh")
        if os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("gmount-sh")
