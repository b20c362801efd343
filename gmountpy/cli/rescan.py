from __future__ import annotations

import json

import click

from ._common import console, spec_from


@click.command("rescan")
@click.argument("cluster_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--node", "nodes", multiple=True, help="Only this node (repeat for more; default: every node).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
def command(cluster_file: str, nodes: tuple[str, ...], as_json: bool) -> None:
    """Tell the directory homes now of files copied straight into the nodes' exports.

    Under `lookup = "index"` such files are seen everywhere after the node's next export scan
    (about a second); run this after copying inputs in to skip the wait. Under flooding it
    does nothing (nothing needs telling).
    """
    from ..api import Cluster

    sent = Cluster.open(spec_from(cluster_file).name).rescan(nodes or None)
    if as_json:
        click.echo(json.dumps(sent, indent=2))
        return
    for node, count in sent.items():
        console.print(f"{node}: {count} changed {'directory' if count == 1 else 'directories'} sent to the homes")
