from __future__ import annotations

import json

import click
from rich.table import Table
from rich.text import Text

from ..api.results import human_size
from ._cluster import cluster_option_help, open_cluster
from ._common import console, shown


@click.command("ls")
@click.argument("path", default=".")
@click.option("--cluster", help=cluster_option_help())
@click.option("--node", help="List as this node sees it (default: the node whose mount holds PATH).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
def command(path: str, cluster: str | None, node: str | None, as_json: bool) -> None:
    """List a directory of the namespace with the node each entry comes from.

    PATH is a path inside a mount or a namespace path such as /data.
    """
    listing = open_cluster(cluster, [path]).ls(path, from_node=node)
    if as_json:
        click.echo(json.dumps({"path": listing.path, "asked_from": listing.asked_from,
                               "unreachable": list(listing.unreachable),
                               "entries": [{"name": e.name, "type": e.kind, "size": e.size, "mtime_ns": e.mtime_ns,
                                            "node": e.node, "holders": list(e.holders)} for e in listing.entries]},
                              indent=2))
        return
    # names as `ls` shows them (a newline in a name cannot forge a row), never read as rich markup
    table = Table(title=Text(f"{shown(listing.path)} (as node {listing.asked_from} sees it)"), show_edge=False,
                  title_justify="left")
    for column in ("name", "size", "holder", "also on"):
        table.add_column(column)
    for e in listing.entries:
        name = Text(shown(e.name) + "/", style="bold blue") if e.kind == "directory" else Text(shown(e.name))
        table.add_row(name, "" if e.kind == "directory" else human_size(e.size), e.node,
                      ", ".join(h for h in e.holders if h != e.node))
    console.print(table)
    if listing.unreachable:
        console.print(f"[yellow]not answering (their entries are missing): {', '.join(listing.unreachable)}[/]")
