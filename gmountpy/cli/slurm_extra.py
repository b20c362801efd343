from __future__ import annotations

import click

from ..slurm import slurm_extra
from ._cluster import cluster_option_help, open_cluster


@click.command("slurm-extra")
@click.argument("inputs", nargs=-1)
@click.option("--cluster", help=cluster_option_help())
def command(inputs: tuple[str, ...], cluster: str | None) -> None:
    """Print `--nodelist=<host>` of the node holding most of INPUTS (for sbatch or slurm_extra).

    In a Snakemake profile the same comes from
    `slurm_extra: "__import__('gmountpy.slurm').slurm.slurm_extra(input)"` under default-resources.
    """
    click.echo(slurm_extra(list(inputs), cluster=open_cluster(cluster, inputs)))
