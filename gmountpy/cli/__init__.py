"""The `gmount` command. One module per subcommand, listed in COMMANDS."""

from __future__ import annotations

import sys
from importlib.metadata import entry_points

import click

from ..errors import GmountError
from . import demo, down, ls, place, probe, run, slurm_extra, snakemake_profile, stage, status, up, where
from . import pipeline as pipeline_command

COMMANDS: list[click.Command] = [up.command, down.command, status.command, where.command, probe.command,
                                 ls.command, stage.command, place.command, run.command, demo.command,
                                 snakemake_profile.command, slurm_extra.command]
COMMANDS.append(pipeline_command.command)


class _Group(click.Group):
    """Turns expected failures into one line on stderr instead of a traceback."""

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


for _command in COMMANDS:
    main.add_command(_command)

# Subcommands shipped by plugins (`gmount make`, ...): entry points in group `gmountpy.commands`.
for _entry in entry_points(group="gmountpy.commands"):
    try:
        main.add_command(_entry.load())
    except ImportError as _exc:  # a half-installed plugin must not take the whole CLI down
        print(f"gmount: plugin command {_entry.name!r} is unusable ({_exc}); reinstall gmountpy", file=sys.stderr)
