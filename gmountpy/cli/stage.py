from __future__ import annotations

import json

import click
from rich.markup import escape

from ..api.results import StageError, StageReport, human_size
from ._cluster import cluster_option_help, open_cluster
from ._common import console, err_console, shown


def _print(report: StageReport, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({
            "target": report.target,
            "files": [vars(f) for f in report.files],
            "failures": [vars(f) for f in report.failures],
        }, indent=2))
        return
    for f in report.files:
        console.print(f"{escape(shown(f.path))}: [green]{f.status}[/] from {f.source} ({human_size(f.size)}, "
                      f"{f.seconds:.2f}s)")
    copied = [f for f in report.files if f.status == "copied"]
    console.print(f"{len(copied)} copied ({human_size(report.copied_bytes)}), "
                  f"{len(report.files) - len(copied)} already on {report.target}")


@click.command("stage")
@click.argument("paths", nargs=-1, required=True)
@click.option("--to", "target", required=True, help="Node to copy the files to.")
@click.option("--cluster", help=cluster_option_help())
@click.option("-j", "--jobs", default=4, show_default=True, type=click.IntRange(min=1),
              help="Files copied at once.")
@click.option("--progress/--no-progress", default=None, help="Progress bar (default: for 64 MiB or more).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
def command(paths: tuple[str, ...], target: str, cluster: str | None, jobs: int, progress: bool | None,
            as_json: bool) -> None:
    """Copy files (directories: all files below) into node TO's export, verified.

    Afterwards the copy wins lookups on that node while its source is
    unchanged. Files already up to date there are not copied again.
    """
    try:
        report = open_cluster(cluster, paths).stage(list(paths), to=target, concurrency=jobs, progress=progress)
    except StageError as exc:
        _print(exc.report, as_json)
        for failure in exc.report.failures:
            err_console.print(f"gmount: cannot stage {shown(failure.path)} to {target}: {failure.error}",
                              highlight=False, markup=False)
        raise SystemExit(1) from None
    _print(report, as_json)
