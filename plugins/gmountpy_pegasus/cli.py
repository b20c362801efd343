"""`gmount pegasus WORKFLOW.yml`: the same as `prepare` for a workflow already written to YAML.

Registered by gmountpy.cli when this plugin is importable. Pegasus itself is
imported only when the command runs, so `gmount` starts as fast without it.
"""

from __future__ import annotations

import click

from gmountpy.api import Cluster
from gmountpy.errors import GmountError


@click.command("pegasus")
@click.argument("workflow", type=click.Path(exists=True, dir_okay=False))
@click.option("--cluster", required=True, envvar="GMOUNT_CLUSTER",
              help="Cluster name or cluster file (default: $GMOUNT_CLUSTER).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="gmount-pegasus", show_default=True,
              help="Directory for workflow.yml, sites.yml, replicas.yml and pegasus.properties.")
@click.option("--root", default="/", show_default=True, help="Namespace directory the workflow's LFNs are in.")
@click.option("--base", default="pegasus", show_default=True,
              help="Directory in every mount for the sites' scratch and storage.")
@click.option("--callout", is_flag=True,
              help="Also configure gmount's site selector for the jobs with no located input.")
def command(workflow: str, cluster: str, out_dir: str, root: str, base: str, callout: bool) -> None:
    """Write Pegasus catalogs and place WORKFLOW's jobs on the nodes holding their inputs.

    Writes a site catalog (one site per node), a replica catalog of the
    workflow's inputs at their holders, the workflow with a selector
    profile execution.site per job that reads located inputs, and
    pegasus.properties; plan with
    `pegasus-plan --conf OUT/pegasus.properties --sites <nodes> OUT/workflow.yml`.
    """
    try:
        from .catalogs import prepare
    except ImportError as exc:
        raise GmountError(f"the Pegasus Python API is not installed ({exc}): pip install 'gmountpy[pegasus]'") \
            from None
    prepared = prepare(workflow, Cluster.open(cluster), out_dir, root=root, base=base, callout=callout)
    click.echo(str(prepared))
    sites = ",".join(Cluster.open(cluster).nodes.names)
    click.echo(f"plan with: pegasus-plan --conf {prepared.properties} --sites {sites} {prepared.workflow}")
