"""`gmount shell`: a shell (or one command) whose programs use this node's files straight from the export."""

from __future__ import annotations

import os

import click

from ..cluster import state as state_store
from ..errors import GmountError
from ..jobs import bypass

#: The mount root's xattr through which a daemon offers the bypass (gmountpy/node/bypass.py).
BYPASS_XATTR = "user.gmount.bypass"


@click.command("shell", context_settings={"allow_interspersed_args": False})
@click.option("-C", "--directory", "directory", type=click.Path(file_okay=False), default=None,
              help="Start in this directory of a mount (default: the current directory).")
@click.argument("command", nargs=-1)
def command(directory: str | None, command: tuple[str, ...]) -> None:
    """Start $SHELL (or COMMAND) in a node's mount with the local bypass on.

    Its programs -- shell tools, Python, compiled code -- read and write the files this node
    holds at disk speed, straight from the node's export; everything else goes through the
    mount as before (docs/bypass.md). Statically linked programs always use the mount.
    `GMOUNT_BYPASS=0 CMD` inside the shell runs CMD without it.
    """
    where = os.path.abspath(directory or os.getcwd())
    found = state_store.find_by_path(where)
    if found is None or found.node is None:
        raise GmountError(f"{where} is not inside the mount of a running cluster on this machine: cd into a "
                          "node's mountpoint (or give one with -C) and run `gmount shell` again")
    node = found.state.nodes[found.node]
    if bypass.library() is None:
        raise GmountError(f"{bypass.LIBRARY} is missing: this gmountpy was not built; reinstall it with pip")
    try:
        os.getxattr(node.mountpoint, BYPASS_XATTR)
    except OSError:
        click.echo(f"gmount: node {found.node} does not offer the bypass (`bypass = false` in the cluster's "
                   "[tuning]?): this shell's programs use the mount", err=True)
    env = {**os.environ, "GMOUNT_NODE": found.node, "GMOUNT_SITE": node.site, "GMOUNT_CLUSTER": found.state.name,
           bypass.SWITCH: "1"}
    env.update(bypass.job_environment(env))
    argv = list(command) or [os.environ.get("SHELL") or "/bin/sh"]
    os.chdir(where)
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as exc:
        raise GmountError(f"cannot run {argv[0]}: {exc.strerror or exc}") from None
