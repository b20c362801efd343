from __future__ import annotations

import os
import shlex

import click

from ..api import CommandTimeout
from ..cluster import state as state_store
from ._cluster import cluster_option_help, open_cluster


@click.command("run", context_settings={"allow_interspersed_args": False})
@click.option("--on", "on", help="Run on this node.")
@click.option("--near", multiple=True, help="Run on the node holding most of this input (repeat for several).")
@click.option("--cluster", help=cluster_option_help())
@click.option("--cwd", help="Namespace directory to run in (default: the current directory's place in the "
                            "namespace when inside a mount, else /).")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), help="Kill the command after SECONDS.")
@click.argument("command", nargs=-1, required=True)
def command(on: str | None, near: tuple[str, ...], cluster: str | None, cwd: str | None, timeout: float | None,
            command: tuple[str, ...]) -> None:
    """Run COMMAND on a node, in that node's mount; exits with COMMAND's status.

    One COMMAND word is a shell command line (`gmount run --near a.txt -- 'wc -l a.txt'`);
    several are quoted as they are. The command sees GMOUNT_NODE, GMOUNT_SITE, GMOUNT_CLUSTER.
    """
    if on and near:
        raise click.UsageError("give --on NODE or --near PATH, not both")
    here = state_store.find_by_path(os.getcwd())
    the_cluster = open_cluster(cluster, near)
    if cwd is None:
        cwd = here.path if here is not None and here.state.name == the_cluster.name else "/"
    text = command[0] if len(command) == 1 else shlex.join(command)
    try:
        result = the_cluster.run(text, on=on, near=list(near) if near else None, timeout=timeout, cwd=cwd,
                                 capture=False)
    except CommandTimeout as exc:
        click.echo(f"gmount: {exc}", err=True)
        raise SystemExit(124) from None
    raise SystemExit(result.returncode)
