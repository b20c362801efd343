from __future__ import annotations

import os
import shutil
import sys

import click
from rich.table import Table

from .. import launch
from ..cluster import state as state_store
from ..cluster.config import load_spec
from ._common import console

DEMO_TOML = """\
# A 4-node, 2-site gmount cluster on this machine (launcher = "local").
name = "demo"
launcher = "local"

[defaults]
export = "{base}/{{node}}/export"
mountpoint = "{base}/{{node}}/mnt"

[sites.tsukuba]
nodes = ["n1", "n2"]

[sites.hongo]
nodes = ["n3", "n4"]

[[links]]
sites = ["tsukuba", "hongo"]
rtt_ms = 14.0
"""

# node -> files written into its export (path, text)
SAMPLE_DATA = {
    "n1": [("README.txt", "Files here live on four nodes; `gmount where` tells which.\n"),
           ("results/run-1.csv", "step,loss\n1,0.9\n2,0.5\n")],
    "n2": [("inputs/genome/chr1.fa", ">chr1\nACGTACGTTTGACCA\n"),
           ("shared/config.yaml", "owner: n2 (tsukuba, nearest for n1)\n")],
    "n3": [("inputs/survey/tile-001.txt", "tile 1 of the survey, on n3\n"),
           ("shared/config.yaml", "owner: n3 (hongo)\n")],
    "n4": [("inputs/survey/tile-002.txt", "tile 2 of the survey, on n4\n"),
           ("inputs/corpus/news.txt", "Yesterday the committee approved the plan.\n")],
}


def write_demo(base: str) -> str:
    """Write the demo cluster file and sample data (once); returns the cluster file."""
    os.makedirs(base, exist_ok=True)
    cluster_file = os.path.join(base, "cluster.toml")
    with open(cluster_file, "w") as f:
        f.write(DEMO_TOML.format(base=base))
    for node, files in SAMPLE_DATA.items():
        os.makedirs(os.path.join(base, node, "export"), exist_ok=True)  # gmount up refuses a missing export
        for rel, text in files:
            path = os.path.join(base, node, "export", rel)
            if not os.path.exists(path):
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w") as f:
                    f.write(text)
    return cluster_file


@click.command("demo")
@click.option("--dir", "base", default="/tmp/gm-demo", show_default=True,
              help="Where the demo's exports, mountpoints and cluster file go.")
def command(base: str) -> None:
    """Bring up a 4-node, 2-site demo cluster on this machine and show it working."""
    base = os.path.abspath(base)
    cluster_file = write_demo(base)
    spec = load_spec(cluster_file)
    if state_store.load(spec.name) is not None:
        console.print("a demo cluster was running; restarting it")
        launch.down(spec.name)
    state = launch.up(spec, progress=lambda node, what: console.print(f"  {node}: {what}"))
    mount = state.nodes["n1"].mountpoint
    table = Table(title=f"the namespace as seen from n1 ({mount})", show_edge=False, title_justify="left")
    for column in ("path", "opened from", "all holders, nearest first"):
        table.add_column(column)
    for root, dirs, files in os.walk(mount):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            holders = os.getxattr(path, "user.gmount.where").decode().split("\n")
            table.add_row(os.path.relpath(path, mount), os.getxattr(path, "user.gmount.node").decode(),
                          ", ".join(holders))
    console.print(table)
    gmount = _gmount_command()
    click.echo(f"""
Explore (every node mounts the same namespace):
  ls -R {mount}
  cat {mount}/shared/config.yaml          # n2's copy: same site as n1 wins
  cat {state.nodes['n3'].mountpoint}/shared/config.yaml   # n3's own copy
  echo hi > {mount}/new.txt && ls {base}/n1/export   # creates land on the local node
  {gmount} where {mount}/inputs/survey/tile-002.txt
  {gmount} status {cluster_file}
Stop it (exports stay as they are):
  {gmount} down {cluster_file}""")


def _gmount_command() -> str:
    """How the user can run this same gmount (e.g. from inside a nox virtualenv)."""
    beside = os.path.join(os.path.dirname(sys.executable), "gmount")
    on_path = shutil.which("gmount")
    if on_path and os.path.realpath(on_path) == os.path.realpath(beside):
        return "gmount"
    return beside if os.path.exists(beside) else "gmount"
