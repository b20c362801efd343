"""`gmount report`: a run of make or Snakemake through gmount, from its placement log -- one summary line
and an HTML page with the timeline per node and the input bytes local/remote per job."""

from __future__ import annotations

import glob
import os

import click

from ..errors import GmountError
from ..jobs.runlog import describe, read_log


@click.command("report")
@click.argument("logs", nargs=-1, type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False),
              help="The HTML page to write (default: report.html beside the first log).")
@click.option("--no-html", is_flag=True, help="Print the summary lines only.")
def command(logs: tuple[str, ...], output: str | None, no_html: bool) -> None:
    """Summarise runs from their placement logs (default: the newest .gmount/*.jsonl here): per run one
    line -- jobs per node, input bytes read locally and from other nodes, the slowest jobs -- and an
    HTML page with each run's jobs per node over time, its input bytes local/remote per job, and its
    slowest and failed jobs. make writes .gmount/make-*.jsonl (gmount.mk), the Snakemake executor
    .gmount/snakemake-*.jsonl."""
    chosen = list(logs) or _newest_log()
    runs = []
    for log in chosen:
        try:
            jobs = read_log(log)
        except ValueError as exc:
            raise GmountError(str(exc)) from None
        runs.append((os.path.basename(log), jobs))
        click.echo(f"{log}: {describe(jobs) or 'no jobs'}")
    if no_html:
        return
    from ..pipelines.report import write_run_page  # matplotlib: only to draw

    page = output or os.path.join(os.path.dirname(os.path.abspath(chosen[0])), "report.html")
    write_run_page(page, runs)
    click.echo(f"wrote {page}")


def _newest_log() -> list[str]:
    found = glob.glob(os.path.join(".gmount", "*.jsonl"))
    if not found:
        raise GmountError(f"no placement log in {os.path.join(os.getcwd(), '.gmount')}: name the logs "
                          "(make with gmount.mk writes .gmount/make-*.jsonl, the Snakemake executor "
                          ".gmount/snakemake-*.jsonl in the directory it ran in)")
    return [max(found, key=os.path.getmtime)]
