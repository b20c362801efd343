from __future__ import annotations

import json

import click
from rich.table import Table
from rich.text import Text

from ..cluster import state as state_store
from ..cluster.state import ClusterState
from ..errors import GmountError
from ..protocol.client import ask, run_sync
from ..protocol.messages import HolderRow, Where
from ._common import console, print_whole, shown


def _resolve(path: str, cluster_file: str | None, node: str | None) -> tuple[ClusterState, str, str]:
    """(cluster, asking node, namespace path) for a PATH argument."""
    if cluster_file is not None:
        state = state_store.resolve(cluster_file).state
        asking = node or next(iter(state.nodes))
        if asking not in state.nodes:
            raise GmountError(f"--node {asking!r} is not a node of cluster {state.name!r} "
                              f"(nodes: {', '.join(state.nodes)})")
        return state, asking, "/" + path.strip("/")
    found = state_store.find_by_path(path)
    if found is None or found.node is None:
        raise GmountError(f"{path} is not inside the mount of any running cluster; "
                          "give a path under a node's mountpoint, or use --cluster CLUSTER.toml")
    return found.state, node or found.node, found.path


@click.command("where")
@click.argument("paths", nargs=-1, required=True)
@click.option("--cluster", "cluster_file", type=click.Path(exists=True, dir_okay=False),
              help="Cluster file; PATHS are then paths inside the namespace.")
@click.option("--node", help="Ask as this node (default: the node whose mount holds PATH).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
def command(paths: tuple[str, ...], cluster_file: str | None, node: str | None, as_json: bool) -> None:
    """Print the nodes holding each PATH, nearest first."""
    results: dict[str, list[HolderRow]] = {}
    missing = []
    for path in paths:
        state, asking, inner = _resolve(path, cluster_file, node)
        holders = run_sync(ask, state, asking, Where(inner))
        results[path] = holders
        if not holders:
            missing.append(path)
    if as_json:
        click.echo(json.dumps(results, indent=2))
    else:
        for path, holders in results.items():
            if not holders:
                console.print(Text(shown(path), style="red"), Text(": no node holds it"), sep="")
                continue
            # paths as `ls` shows them (a newline in a name cannot forge a row), never read as rich markup
            table = Table(title=Text(shown(path)), show_edge=False, title_justify="left")
            for column in ("node", "site", "size", "rtt ms", "path on node"):
                table.add_column(column, overflow="fold")  # a path too wide for the terminal wraps, never cut
            for h in holders:
                table.add_row(h["node"], h["site"], str(h["size"]), f"{h['rtt_ms']:g}", Text(shown(h["export_path"])))
            print_whole(table)
    if missing:
        raise SystemExit(1)
