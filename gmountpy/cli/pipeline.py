"""`gmount pipeline montage|event`: a reference pipeline end to end, with a locality report."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile

import click

from .. import launch
from ..api import Cluster
from ..cluster.config import load_spec
from ..errors import GmountError
from ._common import console


def _plugin_problem(engine: str) -> str | None:
    """Why locality placement cannot run with this engine here, or None."""
    if engine == "snakemake":
        if importlib.util.find_spec("snakemake_executor_plugin_gmount") is None:
            return "the Snakemake executor plugin (snakemake_executor_plugin_gmount) is not installed"
        return None
    gmount = shutil.which("gmount") or os.path.join(os.path.dirname(sys.executable), "gmount")
    found = subprocess.run([gmount, "make-include"], capture_output=True, text=True, check=False)
    if found.returncode != 0 or not found.stdout.strip():
        return "the make plugin (`gmount make-include`) is not available"
    return None


def _embedded_cluster(base: str) -> str:
    """The demo's 4-node, 2-site local cluster, under its own name and directory."""
    from .demo import DEMO_TOML

    os.makedirs(base, exist_ok=True)
    path = os.path.join(base, "cluster.toml")
    with open(path, "w") as f:
        # a scratch cluster of our own: its exports are made for it
        f.write(DEMO_TOML.format(base=base).replace(
            'name = "demo"', f'name = "pipeline-{os.getpid()}"\ncreate_export = true', 1))
    return path


@click.command("pipeline")
@click.argument("name", type=click.Choice(["montage", "event"]))
@click.option("--tiles", type=click.IntRange(min=1), help="Montage: number of sky tiles (default 16).")
@click.option("--docs", type=click.IntRange(min=1), help="Event recognition: number of abstracts (default 158).")
@click.option("--tile-pixels", type=click.IntRange(min=16),
              help="Montage: side of a sky tile in pixels (default 128). Larger tiles make every job longer "
                   "(e.g. 512 or 1024: jobs of realistic length) with the same DAG.")
@click.option("--engine", type=click.Choice(["make", "snakemake"]), default="make", show_default=True)
@click.option("--placement", type=click.Choice(["locality", "random", "single"]), default="locality",
              show_default=True, help="locality: the gmount plugins place each job; random / single: baselines.")
@click.option("--compare", is_flag=True, help="Run all three placements on the same inputs and compare them.")
@click.option("--cluster", "cluster_file", type=click.Path(exists=True, dir_okay=False),
              help="A cluster file (started if not running). Default: a 4-node, 2-site local cluster, "
                   "brought up and torn down.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Where report.json, report.png and the single-directory run go "
                   "[default: ./gmount-pipeline-NAME].")
@click.option("--seed", type=int, default=1, show_default=True, help="Seed of the random placement.")
def command(name: str, tiles: int | None, docs: int | None, tile_pixels: int | None, engine: str, placement: str,
            compare: bool, cluster_file: str | None, out_dir: str | None, seed: int) -> None:
    """Run the Montage or event-recognition pipeline on a cluster and report where its jobs ran and what
    they read: makespan, stage times, jobs per node, bytes read local vs remote (JSON + PNG)."""
    from ..pipelines import pipeline
    from ..pipelines.report import print_report, write_chart, write_json
    from ..pipelines.runner import check_against, run_on_cluster, run_single_directory

    pipe = pipeline(name)
    wrong = docs if name == "montage" else tiles
    if wrong is not None:
        raise click.UsageError(f"--{'docs' if name == 'montage' else 'tiles'} does not apply to the {name} pipeline; "
                               f"use --{pipe.size_name}")
    if tile_pixels is not None and name != "montage":
        raise click.UsageError(f"--tile-pixels applies to the montage pipeline only, not to {name}")
    options = {"tile_pixels": tile_pixels} if tile_pixels is not None else {}
    size = (tiles if name == "montage" else docs) or pipe.default_size
    placements = ["locality", "random", "single"] if compare else [placement]
    if "locality" in placements:
        problem = _plugin_problem(engine)
        if problem is not None:
            raise GmountError(f"{problem}: locality placement needs it (install gmountpy with its plugins), "
                              "or choose --placement random|single")
    out = os.path.abspath(out_dir or f"gmount-pipeline-{name}")
    os.makedirs(out, exist_ok=True)

    shape = f" of {tile_pixels}x{tile_pixels} pixels" if tile_pixels is not None else ""
    console.print(f"{name}: {size} {pipe.size_name}{shape}, {engine}; first on one local directory (the reference)")
    reference = run_single_directory(pipe, size, engine, os.path.join(out, "single-directory"), options=options)
    console.print(f"  single directory: {reference['makespan_s']:.1f} s")

    started_here = None
    base = None
    if cluster_file is None:
        base = tempfile.mkdtemp(prefix="gm-pipeline-")
        cluster_file = _embedded_cluster(base)
    spec = load_spec(cluster_file)
    try:
        cluster = Cluster.open(spec.name) if _running(spec.name) else None
        if cluster is None:
            console.print(f"bringing up cluster {spec.name} ({len(spec.nodes)} nodes)")
            cluster = Cluster.up(cluster_file)
            started_here = spec.name
        runs = []
        for chosen in placements:
            console.print(f"running on cluster {spec.name} with {chosen} placement ...")
            report = run_on_cluster(cluster, pipe, size, engine, chosen, scratch=os.path.join(out, "logs"), seed=seed,
                                    options=options)
            difference = check_against(report, pipe, reference["directory"])
            report["check"] = "same as single directory" if difference is None else f"DIFFERS: {difference}"
            console.print(f"  {chosen}: {report['makespan_s']:.1f} s, {report['check']}")
            if pipe.picture is not None and chosen == placements[0]:
                shutil.copyfile(os.path.join(report["directory"], pipe.picture), os.path.join(out, pipe.picture))
            runs.append(report)
    finally:
        if started_here is not None:
            console.print(f"tearing down cluster {started_here}")
            launch.down(started_here)
            if base is not None:
                shutil.rmtree(base, ignore_errors=True)
    from rich.console import Console

    print_report(Console(width=max(console.width, 132)), runs, reference)  # wide tables, also in logs
    write_json(os.path.join(out, "report.json"), runs, reference)
    write_chart(os.path.join(out, "report.png"), runs, reference)
    console.print(f"report: {os.path.join(out, 'report.json')}, chart: {os.path.join(out, 'report.png')}")
    if any(r["check"] != "same as single directory" for r in runs):
        raise SystemExit(4)


def _running(name: str) -> bool:
    from ..cluster import state as state_store
    return state_store.load(name) is not None
