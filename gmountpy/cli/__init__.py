"""The `gmount` command. One module per subcommand, listed in COMMANDS.

Subcommands are imported when they run, not at startup: `gmount make-include`
is expanded by make on every run (and by every sub-make), so the CLI must not
import the API, trio and networkx just to print a path.
"""

from __future__ import annotations

import importlib
import sys
from importlib.metadata import entry_points

import click

from ..errors import GmountError

#: subcommand name -> module in gmountpy.cli defining `command`
COMMANDS: dict[str, str] = {
    **{name: name for name in ("up", "down", "status", "where", "probe", "ls", "stage", "place", "run", "demo",
                               "rescan", "plan", "top", "report", "shell", "env")},
    "snakemake-profile": "snakemake_profile",
    "slurm-extra": "slurm_extra",
    "audit": "audit",
    "pipeline": "pipeline",
    "dask": "dask",
}


def _plugin_commands() -> dict[str, str]:
    """Subcommands shipped by plugins (`gmount make`, `gmount pegasus`, ...): entry points `gmountpy.commands`."""
    return {entry.name: entry.value for entry in entry_points(group="gmountpy.commands")}


class _Group(click.Group):
    """Loads subcommands on demand; turns expected failures into one line on stderr instead of a traceback."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *_plugin_commands(), *self.commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.commands:
            return self.commands[cmd_name]
        if cmd_name in COMMANDS:
            command: click.Command = importlib.import_module(f".{COMMANDS[cmd_name]}", __name__).command
            return command
        target = _plugin_commands().get(cmd_name)
        if target is None:
            return None
        module, _, attr = target.partition(":")
        try:
            loaded: click.Command = getattr(importlib.import_module(module), attr)
        except ImportError as exc:  # a half-installed plugin must not take the whole CLI down
            print(f"gmount: plugin command {cmd_name!r} is unusable ({exc}); reinstall gmountpy", file=sys.stderr)
            return None
        return loaded

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except GmountError as exc:
            click.echo(f"gmount: {exc}", err=True)
            sys.exit(1)
        except OSError as exc:
            click.echo(f"gmount: {exc}", err=True)
            sys.exit(1)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="gmountpy")
def main() -> None:
    """One locality-aware namespace over the local disks of many machines."""
