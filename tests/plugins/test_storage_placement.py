"""The storage plugin from outside any mount: examples/snakemake/storage.smk run for real, its cluster given with
--config, each output landing on the node holding most of its job's inputs (not on the first node)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gmountpy import Cluster

from ..conftest import LocalCluster, require
from .test_snakemake import holder, snakemake, snakemake_problem

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "snakemake" / "storage.smk"


@pytest.fixture(autouse=True)
def _snakemake() -> None:
    require("snakemake and the gmount plugins", snakemake_problem())


def test_storage_outputs_land_where_their_jobs_inputs_are(cluster4: LocalCluster, tmp_path: Path) -> None:
    name = cluster4.spec.name
    # the demo's survey, bigger: one tile on n3, three on n4
    tiles = {"tile-001": ("n3", "one two three\n"), "tile-002": ("n4", "alpha beta\n" * 40),
             "tile-003": ("n4", "gamma\n" * 300), "tile-004": ("n4", "delta epsilon zeta\n" * 7)}
    for tile, (node, text) in tiles.items():
        target = cluster4.export(node) / "inputs" / "survey" / f"{tile}.txt"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    cluster4.rescan()
    laptop = tmp_path / "laptop"
    laptop.mkdir()
    shutil.copy(EXAMPLE, laptop / "Snakefile")
    assert Cluster.open(name).where(str(laptop))[0].holders == ()  # really outside every mount
    snakemake(laptop, "-j2", "--config", f"cluster={name}")
    for tile, (node, text) in tiles.items():
        words = f"results/laptop/{tile}.words"
        assert holder(cluster4, "", words) == [node], words  # beside its tile, not on n1
        assert (cluster4.export(node) / words).read_text().strip() == str(len(text.split()))
    summary = "results/laptop-summary.txt"
    assert holder(cluster4, "", summary) == ["n4"]  # three of its four inputs are there
    assert (cluster4.export("n4") / summary).read_text().split() == [
        str(len(tiles[t][1].split())) for t in sorted(tiles)]
    again = snakemake(laptop, "-j2", "--config", f"cluster={name}")
    assert "Nothing to be done" in again.stdout + again.stderr
