from __future__ import annotations

import click
from rich.markup import escape
from rich.table import Table

from ..launch.probe import links_toml, probe, write_links
from ._common import console, err_console, spec_from


@click.command("probe")
@click.argument("cluster_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--count", default=7, show_default=True, type=click.IntRange(1, 100),
              help="Round trips per site pair; the median is kept.")
@click.option("--write", "write", is_flag=True,
              help="Replace the [[links]] tables of CLUSTER_FILE by the measured ones.")
def command(cluster_file: str, count: int, write: bool) -> None:
    """Measure the RTT between sites and print (or --write) the [[links]] table.

    For launcher = "ssh" this runs before launch, on the nodes, over SSH. A
    local cluster has no network between its sites: probe then times RPCs to
    its running daemons over loopback and says so.
    """
    spec = spec_from(cluster_file)
    with console.status("measuring round trips") as status:
        report = probe(spec, count, progress=lambda what: status.update(f"measuring {what}"))
    table = Table(title=f"round trips in {spec.name}", show_edge=False, title_justify="left")
    for column in ("sites", "from", "to", "median ms", "min ms", "max ms"):
        table.add_column(column)
    for r in report.rtts:
        sites = f"{r.sites[0]} <-> {r.sites[1]}" if r.sites[0] != r.sites[1] else f"{r.sites[0]} (within)"
        if r.problem:
            table.add_row(sites, r.nodes[0], r.nodes[1], f"[red]{escape(r.problem)}[/]", "", "")
        else:
            table.add_row(sites, r.nodes[0], r.nodes[1], f"{r.median_ms:.3f}", f"{min(r.samples_ms):.3f}",
                          f"{max(r.samples_ms):.3f}")
    console.print(table)
    click.echo(links_toml(report), nl=False)  # plain: the user pastes it into the cluster file
    if write:
        write_links(cluster_file, report)
        console.print(f"wrote the [[links]] above into {cluster_file}", markup=False)
    elif not report.writable:
        err_console.print(report.refusal.replace("not writing", "note: --write would refuse", 1),
                          markup=False, highlight=False, soft_wrap=True)
    if any(r.problem for r in report.links):
        raise SystemExit(1)
