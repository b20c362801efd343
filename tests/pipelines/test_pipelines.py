"""The reference pipelines (Montage, event recognition) on a real local cluster, under make and Snakemake.

Every cluster run is checked against the same pipeline run on one plain
local directory; locality runs must place every job on a node holding at
least half of the best node's share of its input bytes (the placement rule);
the daemons' byte counters must add up to the bytes the jobs read.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from gmountpy import Cluster
from gmountpy.cli.pipeline import _plugin_problem
from gmountpy.pipelines import pipeline
from gmountpy.pipelines.base import Job
from gmountpy.pipelines.event import stages as event_stages
from gmountpy.pipelines.montage.concatfit import concat
from gmountpy.pipelines.montage.tiles import write_tiles
from gmountpy.pipelines.runner import (
    check_against,
    job_table,
    placement_log_gaps,
    placement_log_jobs,
    placement_log_nodes,
    run_on_cluster,
    run_single_directory,
)

from ..conftest import (
    FOUR_NODE_LINKS,
    FOUR_NODES,
    LocalCluster,
    fuse_problem,
    local_cluster,
    require,
)

MONTAGE_TILES = 4
EVENT_DOCS = 4  # 21 jobs (5 stages x 4 + aggregate), one document on each node


def montage_problem() -> str | None:
    missing = [t for t in ("mImgtbl", "mProjectPP", "mDiff", "mFitplane", "mBgModel", "mBackground", "mAdd",
                           "mViewer", "mFitExec") if shutil.which(t) is None]
    return f"Montage executables missing: {', '.join(missing)} (Debian package montage)" if missing else None


def engine_problem(engine: str) -> str | None:
    if engine == "make":
        return None if shutil.which("make") else "GNU make is not installed"
    return None if importlib.util.find_spec("snakemake") else "snakemake is not installed"


@pytest.fixture(scope="module")
def cluster4(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """4 nodes, 2 sites, default TTLs: make stats a target just before a job on another node creates it,
    and a later job on make's node must see it (hand-off rule 1 of docs/design.md) -- mMakeHdr then mProjectPP."""
    require("FUSE", fuse_problem())
    base = tmp_path_factory.mktemp("pipelines")
    with local_cluster(base, f"pl-{os.getpid()}", FOUR_NODES, FOUR_NODE_LINKS) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Single-directory runs (make, no gmount), made once per pipeline when first needed."""
    base = tmp_path_factory.mktemp("reference")
    made: dict[str, str] = {}

    class Lazy(dict):  # type: ignore[type-arg]
        def __missing__(self, name: str) -> str:
            size = MONTAGE_TILES if name == "montage" else EVENT_DOCS
            made[name] = run_single_directory(pipeline(name), size, "make", str(base / name))["directory"]
            return made[name]

    yield Lazy()


def _run(cluster4: LocalCluster, name: str, engine: str, placement: str, scratch: Path) -> dict[str, Any]:
    if name == "montage":
        require("Montage", montage_problem())
    require(engine, engine_problem(engine))
    if placement == "locality":
        require(f"the gmount {engine} plugin", _plugin_problem(engine))
    size = MONTAGE_TILES if name == "montage" else EVENT_DOCS
    return run_on_cluster(Cluster.open(cluster4.spec.name), pipeline(name), size, engine, placement,
                          scratch=str(scratch))


def _assert_inputs_spread(report: dict[str, Any]) -> None:
    """The inputs sat on every node, as after acquisition at two sites (else locality proves nothing)."""
    stage = "mProjectPP" if report["pipeline"] == "montage" else "split"
    nodes = {r["node"] for r in report["job_rows"] if r["stage"] == stage}
    assert nodes == set(report["nodes"]), nodes


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["make", "snakemake"])
@pytest.mark.parametrize("name", ["montage", "event"])
def test_locality_run_matches_single_directory(cluster4: LocalCluster, references: dict[str, str], tmp_path: Path,
                                               name: str, engine: str) -> None:
    report = _run(cluster4, name, engine, "locality", tmp_path)
    pipe = pipeline(name)
    assert check_against(report, pipe, references[name]) is None
    assert report["jobs_not_on_their_data"] == []
    _assert_inputs_spread(report)
    # one job per output of every stage
    assert {r["stage"] for r in report["job_rows"]} == set(pipe.stages)
    assert report["bytes_read"]["local"] > 0
    # the plugin's placement log timed every job, under the pipeline's stage names
    assert set(report["job_seconds"]) >= set(pipe.stages)
    assert sum(s["jobs"] for stage, s in report["job_seconds"].items() if stage in pipe.stages) == report["jobs"]


def test_random_placement_spreads_jobs_and_counters_add_up(cluster4: LocalCluster, references: dict[str, str],
                                                           tmp_path: Path) -> None:
    """Event recognition with jobs placed at random: each intermediate file is read by one job, once, on a
    node that never had it in its page cache, so the remote bytes the daemons counted must equal the
    declared inputs the jobs read from other nodes, to the byte."""
    report = _run(cluster4, "event", "make", "random", tmp_path)
    assert check_against(report, pipeline("event"), references["event"]) is None
    assert len([n for n, stages in report["jobs_per_node"].items() if stages]) >= 3
    assert report["declared_input_bytes"]["remote"] > 0
    assert report["bytes_read"]["remote"] == report["declared_input_bytes"]["remote"]
    # local reads: the declared local inputs, plus make reading the Makefile on the home node
    makefile = os.path.getsize(os.path.join(report["directory"], "Makefile"))
    assert report["bytes_read"]["local"] == report["declared_input_bytes"]["local"] + makefile
    served = sum(c["served_read"] for c in report["counters"].values())
    assert served == report["bytes_read"]["remote"]


def test_single_placement_runs_everything_on_one_node(cluster4: LocalCluster, references: dict[str, str],
                                                      tmp_path: Path) -> None:
    report = _run(cluster4, "montage", "snakemake", "single", tmp_path)
    assert check_against(report, pipeline("montage"), references["montage"]) is None
    busy = {n for n, stages in report["jobs_per_node"].items() if stages}
    assert busy == {cluster4.nodes[0]}
    others = [n for n in cluster4.nodes if n != cluster4.nodes[0]]
    # every other node only served data (the tiles it held), and its mount read nothing
    for node in others:
        assert report["counters"][node]["read_local"] == report["counters"][node]["read_remote"] == 0
        assert report["counters"][node]["served_read"] > 0
    # the tiles held elsewhere were read remotely, whole (mImgtbl's header reads, then mProjectPP's)
    remote_tiles = sum(r["input_bytes_remote"] for r in report["job_rows"] if r["stage"] == "mProjectPP")
    assert remote_tiles > 0
    assert report["bytes_read"]["remote"] >= remote_tiles
    assert sum(c["served_read"] for c in report["counters"].values()) >= report["bytes_read"]["remote"]


def test_pipeline_command_writes_report_and_chart(cluster4: LocalCluster, tmp_path: Path) -> None:
    require("Montage", montage_problem())
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, "-m", "gmountpy", "pipeline", "montage", "--tiles", "4",
                             "--placement", "random", "--cluster", str(cluster4.base / "cluster.toml"),
                             "--out", str(out)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((out / "report.json").read_text())
    (run,) = report["runs"]
    assert run["check"] == "same as single directory"
    assert run["placement"] == "random" and run["tiles"] == 4
    assert report["single_directory"]["makespan_s"] > 0
    assert (out / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "mosaic.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "bytes" not in result.stderr


def test_pipeline_command_tile_pixels_makes_tiles_of_that_size(cluster4: LocalCluster, tmp_path: Path) -> None:
    """--tile-pixels reaches the tiles on the cluster and in the reference run, and the report records it."""
    require("Montage", montage_problem())
    from astropy.io import fits

    out = tmp_path / "out"
    result = subprocess.run([sys.executable, "-m", "gmountpy", "pipeline", "montage", "--tiles", "4",
                             "--tile-pixels", "48", "--placement", "random",
                             "--cluster", str(cluster4.base / "cluster.toml"), "--out", str(out)],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((out / "report.json").read_text())
    (run,) = report["runs"]
    assert run["check"] == "same as single directory"
    assert run["tile_pixels"] == 48 and report["single_directory"]["tile_pixels"] == 48
    for directory in (Path(run["directory"]), out / "single-directory"):
        tiles = sorted((directory / "raw").glob("tile_*.fits"))
        assert len(tiles) == 4
        for tile in tiles:
            assert fits.getdata(tile).shape == (48, 48)
            assert fits.getheader(tile)["CRPIX1"] == 24.5


def test_montage_generate_tile_pixels(tmp_path: Path) -> None:
    """The option changes the tiles' size (and the field they cover); without it tiles stay 128 pixels."""
    from astropy.io import fits

    pipe = pipeline("montage")
    pipe.generate(2, {"local": ["local"]}, lambda node: str(tmp_path / "default"), {})
    pipe.generate(2, {"local": ["local"]}, lambda node: str(tmp_path / "big"), {"tile_pixels": 200})
    default = fits.getdata(tmp_path / "default" / "raw" / "tile_001.fits")
    big = fits.getdata(tmp_path / "big" / "raw" / "tile_001.fits")
    assert default.shape == (128, 128) and big.shape == (200, 200)
    assert big.max() > big.min() + 50  # point sources rendered over the whole tile, not just a corner
    assert np.median(big[:100, :100]) > 40 and np.median(big[100:, 100:]) > 40
    with pytest.raises(ValueError, match="no option pixels"):
        pipe.generate(2, {"local": ["local"]}, lambda node: str(tmp_path / "bad"), {"pixels": 64})
    with pytest.raises(ValueError, match="no option tile_pixels"):
        pipeline("event").generate(2, {"local": ["local"]}, lambda node: str(tmp_path / "ev"), {"tile_pixels": 64})


def test_pipeline_command_refuses_tile_pixels_for_event() -> None:
    result = subprocess.run([sys.executable, "-m", "gmountpy", "pipeline", "event", "--tile-pixels", "64"],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 2
    assert "--tile-pixels applies to the montage pipeline only" in result.stderr


def test_pipeline_command_refuses_a_size_of_the_other_pipeline() -> None:
    result = subprocess.run([sys.executable, "-m", "gmountpy", "pipeline", "event", "--tiles", "4"],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 2
    assert "--tiles does not apply to the event pipeline; use --docs" in result.stderr


# --------------------------------------------------------------------------- the pieces


def test_concatfit_writes_the_table_mfitexec_writes(tmp_path: Path) -> None:
    """mConcatFit's stand-in gives, byte for byte, what Montage's own mFitExec gives."""
    require("Montage", montage_problem())

    def sh(*args: str) -> None:
        subprocess.run(args, cwd=tmp_path, check=True, capture_output=True)

    write_tiles(4, lambda t: str(tmp_path / "raw" / t.name))
    sh("mImgtbl", "raw", "images.tbl")
    sh("mMakeHdr", "images.tbl", "region.hdr")
    (tmp_path / "proj").mkdir()
    for tile in sorted(os.listdir(tmp_path / "raw")):
        sh("mProjectPP", f"raw/{tile}", f"proj/{tile}", "region.hdr")
    sh("mImgtbl", "proj", "pimages.tbl")
    sh("mOverlaps", "pimages.tbl", "diffs.tbl")
    (tmp_path / "diffs").mkdir()
    sh("mDiffExec", "-p", "proj", "diffs.tbl", "region.hdr", "diffs")
    sh("mFitExec", "diffs.tbl", "fits.tbl", "diffs")
    (tmp_path / "fits").mkdir()
    for diff in sorted(os.listdir(tmp_path / "diffs")):
        if not diff.endswith("_area.fits"):
            out = subprocess.run(["mFitplane", f"diffs/{diff}"], cwd=tmp_path, capture_output=True, text=True,
                                 check=True).stdout
            (tmp_path / "fits" / ("fit." + diff[len("diff."):-len(".fits")] + ".txt")).write_text(out)
    count = concat(str(tmp_path / "diffs.tbl"), str(tmp_path / "fits"), str(tmp_path / "ours.tbl"))
    assert count == 6  # a 2x2 grid: every pair of tiles overlaps
    assert (tmp_path / "ours.tbl").read_bytes() == (tmp_path / "fits.tbl").read_bytes()


def test_event_stages_extract_trigger_and_arguments(tmp_path: Path) -> None:
    doc = tmp_path / "docs" / "1.xml"
    doc.parent.mkdir()
    doc.write_text('<?xml version="1.0"?><MedlineCitation><PMID>1</PMID><Article><ArticleTitle>A title about '
                   'TP53.</ArticleTitle><Abstract><AbstractText>EGFR directly phosphorylates STAT3 in HeLa cells. '
                   'We show that beta-catenin is degraded by GSK3B in vivo. The binding of NF-kappaB by IkappaB '
                   'alpha was confirmed by mass spectrometry. Mutations in KRAS are frequent in colorectal cancer.'
                   '</AbstractText></Abstract></Article></MedlineCitation>')
    paths = [str(doc)] + [str(tmp_path / d / "1.json") for d in ("sent", "tok", "pos", "ent")]
    for stage, (src, out) in zip(["split", "tokenize", "tag", "entities"], itertools.pairwise(paths), strict=True):
        event_stages.STAGES[stage](src, out)
    event_stages.events(paths[-1], str(tmp_path / "ev.tsv"))
    event_stages.aggregate(str(tmp_path / "events.tsv"), str(tmp_path / "ev.tsv"))
    rows = [line.split("\t") for line in (tmp_path / "events.tsv").read_text().splitlines()]
    assert rows[0] == event_stages.COLUMNS
    found = {(r[2], r[3], r[5], r[6]) for r in rows[1:]}
    assert found == {("Phosphorylation", "phosphorylates", "STAT3", "EGFR"),
                     ("Protein_catabolism", "degraded", "beta-catenin", "GSK3B"),
                     ("Binding", "binding", "NF-kappaB", "IkappaB alpha")}
    sentences = json.loads((tmp_path / "sent" / "1.json").read_text())["sentences"]
    assert len(sentences) == 5
    tagged = json.loads((tmp_path / "pos" / "1.json").read_text())["sentences"][1]["tokens"]
    assert ["phosphorylates", " ", "VERB", "phosphorylate"] in tagged


def test_a_job_is_counted_on_the_node_its_placement_log_names_not_the_first_holder_of_its_output(
        tmp_path: Path) -> None:
    """DAG-aware staging copies a projection to the node of its consumers: its output then has two holders,
    the replica's node possibly first. The report counts the job where make's placement log says it ran."""
    (tmp_path / ".gmount").mkdir()
    lines = [{"target": "proj/t0.fits", "node": "n2", "status": 0}, {"target": "proj/t1.fits", "node": "n1",
                                                                     "status": 0}]
    (tmp_path / ".gmount" / "make-1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    files = {"raw/t0.fits": SimpleNamespace(holders=["n2"], size=100),
             "raw/t1.fits": SimpleNamespace(holders=["n1"], size=100),
             "proj/t0.fits": SimpleNamespace(holders=["n1", "n2"], size=400, mtime_ns=0),  # staged to n1
             "proj/t1.fits": SimpleNamespace(holders=["n1"], size=400, mtime_ns=0)}
    jobs = [Job("mProjectPP", "proj/t0.fits", ("raw/t0.fits",)), Job("mProjectPP", "proj/t1.fits", ("raw/t1.fits",))]
    assert placement_log_nodes(str(tmp_path)) == {"proj/t0.fits": "n2", "proj/t1.fits": "n1"}
    rows = job_table(jobs, files, placement_log_nodes(str(tmp_path)))
    assert [r["node"] for r in rows] == ["n2", "n1"]
    assert all(r["holds_most_inputs"] for r in rows)


def test_recipe_gaps_are_the_waits_between_a_slot_freeing_and_the_next_command(tmp_path: Path) -> None:
    (tmp_path / ".gmount").mkdir()
    # two slots: a and b start together; c starts 0.25 s after a ended, d 0.5 s after b ended
    lines = [{"target": "a", "time": 12.0, "seconds": 2.0}, {"target": "b", "time": 13.0, "seconds": 3.0},
             {"target": "c", "time": 14.25, "seconds": 2.0}, {"target": "d", "time": 15.5, "seconds": 2.0}]
    (tmp_path / ".gmount" / "make-1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert placement_log_gaps(str(tmp_path)) == {"recipes": 2, "median_s": 0.5, "max_s": 0.5, "total_s": 0.75}
    assert placement_log_gaps(str(tmp_path / "none")) == {}
    assert [(job["target"], job["start_s"], job["seconds"]) for job in placement_log_jobs(str(tmp_path), 9.0)] == \
        [("a", 1.0, 2.0), ("b", 1.0, 3.0), ("c", 3.25, 2.0), ("d", 4.5, 2.0)]
