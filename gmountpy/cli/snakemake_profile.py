from __future__ import annotations

import os
from pathlib import Path

import click

from ..errors import GmountError

_PROFILE = """\
# Written by `gmount snakemake-profile`: every job runs on the gmount node that
# holds most of its input bytes, in that node's mount (outputs land there).
# Run Snakemake inside any node's mount with plain paths.
executor: gmount
jobs: {jobs}
# outputs written on one node are seen by the head node after the cache TTL
latency-wait: {latency_wait}
{cluster}# gmount-placement-log: .gmount/placement.jsonl   # default: .gmount/snakemake-<time>-<pid>.jsonl
# A rule may pin its node:   resources: gmount_node="n3"
"""


def default_dir() -> Path:
    """Where `snakemake --profile gmount` looks: $XDG_CONFIG_HOME/snakemake/gmount."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    return Path(base) / "snakemake" / "gmount"


@click.command("snakemake-profile")
@click.argument("directory", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=16, show_default=True,
              help="Jobs running at once.")
@click.option("--cluster", help="Cluster name or file (default: the cluster whose mount Snakemake runs in).")
@click.option("--latency-wait", type=click.IntRange(min=0), default=10, show_default=True,
              help="Seconds Snakemake waits for outputs written on another node.")
@click.option("--force", is_flag=True, help="Overwrite an existing config.yaml.")
def command(directory: Path | None, jobs: int, cluster: str | None, latency_wait: int, force: bool) -> None:
    """Write a Snakemake profile that runs every job where its inputs are.

    Without DIRECTORY: ~/.config/snakemake/gmount, used by `snakemake --profile gmount`.
    With `profiles/default` inside a workflow: used by plain `snakemake`, no flags.
    """
    target = directory if directory is not None else default_dir()
    config = target / "config.yaml"
    if config.exists() and not force:
        raise GmountError(f"{config} exists: pass --force to overwrite it")
    target.mkdir(parents=True, exist_ok=True)
    config.write_text(_PROFILE.format(jobs=jobs, latency_wait=latency_wait,
                                      cluster=f"gmount-cluster: {cluster}\n" if cluster else ""))
    click.echo(str(config))
    how = "snakemake --profile gmount" if directory is None else (
        "snakemake   (in the workflow directory)" if target.as_posix().endswith("profiles/default")
        else f"snakemake --profile {target}")
    click.echo(f"run, inside a node's mount: {how}", err=True)
