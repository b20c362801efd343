"""The Pegasus plugin on a real 4-node, 2-site local cluster (n1 n2 | n3 n4, 14 ms apart).

A Montage-shaped workflow (mProject per tile, mDiffFit per overlapping pair,
mConcatFit, mBgModel, mBackground per tile, mAdd) whose raw tiles are spread
over the nodes' exports. The catalogs are read back with Pegasus's own YAML
loader and properties reader; the site selector is run exactly as the
planner runs it: command split at whitespace, an environment of only the
JVM's variables plus `pegasus.selector.site.env.*`, no PATH.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from Pegasus import yaml as pegasus_yaml
from Pegasus.api import File, Job, Properties, Workflow

import gmountpy.pegasus
import gmountpy_pegasus
import gmountpy_pegasus.catalogs
from gmountpy import Cluster
from gmountpy.cli import main as gmount_main
from gmountpy.jobs import bypass
from gmountpy_pegasus import parse_request, prepare, selector
from gmountpy_pegasus.catalogs import CHOSEN_KEY, workflow_inputs

from ..conftest import LocalCluster, fuse_problem, local_cluster, require, wait_for

#: tile -> (holder node, size): two big tiles on n1, one on n2, two on n3, one on n4
TILES = {0: ("n1", 96_000), 1: ("n1", 80_000), 2: ("n2", 64_000), 3: ("n3", 90_000), 4: ("n3", 70_000),
         5: ("n4", 60_000)}
HEADER = ("n1", 300)         # region.hdr: every mProject, mDiffFit and mAdd reads it
IMAGES_TABLE = ("n4", 2_000)  # images.tbl: read by mBgModel and mAdd


@pytest.fixture(scope="module")
def data(cluster4: LocalCluster) -> Iterator[str]:
    """The workflow's raw inputs, written into the exports of the nodes that hold them."""
    root = f"/pegasus-{uuid.uuid4().hex[:8]}"
    for tile, (node, size) in TILES.items():
        put(cluster4, node, f"{root}/raw/tile{tile}.fits", size)
    put(cluster4, HEADER[0], f"{root}/region.hdr", HEADER[1])
    put(cluster4, IMAGES_TABLE[0], f"{root}/images.tbl", IMAGES_TABLE[1])
    yield root


@pytest.fixture(scope="module")
def api(cluster4: LocalCluster) -> Cluster:
    return Cluster.open(cluster4.spec.name)


def put(cluster: LocalCluster, node: str, path: str, size: int) -> None:
    target = cluster.export(node) / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(os.urandom(size))
    cluster.rescan(node)


def montage(name: str = "montage") -> Workflow:
    """Montage's shape: every job's files, no executables (the planner is not run here)."""
    wf = Workflow(name)
    hdr, images = File("region.hdr"), File("images.tbl")
    projected = {t: File(f"proj/p{t}.fits") for t in TILES}
    for t in TILES:
        wf.add_jobs(Job("mProject", _id=f"mProject_{t}")
                    .add_args("-X", File(f"raw/tile{t}.fits"), projected[t], hdr)
                    .add_inputs(File(f"raw/tile{t}.fits"), hdr)
                    .add_outputs(projected[t], File(f"proj/p{t}_area.fits"), stage_out=False))
    fits = []
    for t in list(TILES)[:-1]:  # neighbouring tiles overlap
        fit = File(f"diff/fit{t}_{t + 1}.txt")
        fits.append(fit)
        wf.add_jobs(Job("mDiffFit", _id=f"mDiffFit_{t}_{t + 1}")
                    .add_inputs(projected[t], projected[t + 1], hdr).add_outputs(fit, stage_out=False))
    fits_table, corrections = File("fits.tbl"), File("corrections.tbl")
    wf.add_jobs(Job("mConcatFit", _id="mConcatFit").add_inputs(*fits).add_outputs(fits_table, stage_out=False))
    wf.add_jobs(Job("mBgModel", _id="mBgModel").add_inputs(images, fits_table)
                .add_outputs(corrections, stage_out=False))
    corrected = []
    for t in TILES:
        out = File(f"corr/c{t}.fits")
        corrected.append(out)
        wf.add_jobs(Job("mBackground", _id=f"mBackground_{t}").add_inputs(projected[t], corrections)
                    .add_outputs(out, stage_out=False))
    wf.add_jobs(Job("mAdd", _id="mAdd").add_inputs(*corrected, hdr, images).add_outputs(File("mosaic.fits")))
    return wf


def load(path: Path) -> dict[str, Any]:
    """A catalog or workflow through Pegasus's own YAML loader."""
    with open(path) as f:
        document: dict[str, Any] = pegasus_yaml.load(f)
    assert document["pegasus"].startswith("5."), path
    return document


def job_inputs(wf: Workflow, job_id: str, root: str) -> list[str]:
    inputs = set(workflow_inputs(load_text(wf)))
    return [f"{root}/{u.file.lfn}" for u in wf.jobs[job_id].uses if u._type == "input" and u.file.lfn in inputs]


def load_text(wf: Workflow) -> dict[str, Any]:
    text = io.StringIO()
    wf.write(text)
    document: dict[str, Any] = pegasus_yaml.loads(text.getvalue())
    return document


def selector_profiles(document: dict[str, Any]) -> dict[str, str | None]:
    return {job["id"]: job.get("profiles", {}).get("selector", {}).get("execution.site")
            for job in document["jobs"]}


# --------------------------------------------------------------------------- catalogs and placement


def test_documented_name_is_the_plugin() -> None:
    assert gmountpy.pegasus.prepare is prepare
    for name in ("prepare", "Prepared", "parse_request", "choose_site"):
        assert getattr(gmountpy.pegasus, name) is getattr(gmountpy_pegasus, name)


def test_montage_catalogs_load_back_with_sites_replicas_and_profiles(cluster4: LocalCluster, api: Cluster,
                                                                     data: str, tmp_path: Path) -> None:
    wf = montage()
    prepared = prepare(wf, api, tmp_path / "run", root=data)

    # Site catalog: one site per node, its mount as shared file system, HTCondor pinned to its host.
    sites = {site["name"]: site for site in load(prepared.sites)["sites"]}
    assert list(sites) == ["n1", "n2", "n3", "n4"]
    for name, site in sites.items():
        mount = str(cluster4.mount(name))
        directories = {d["type"]: d for d in site["directories"]}
        assert set(directories) == {"sharedScratch", "sharedStorage"}
        for kind, sub in (("sharedScratch", "scratch"), ("sharedStorage", "storage")):
            d = directories[kind]
            assert d["path"] == f"{mount}/pegasus/{name}/{sub}" and d["sharedFileSystem"] is True
            assert d["fileServers"] == [{"url": f"file://{d['path']}", "operation": "all"}]
        assert site["profiles"]["condor"]["requirements"].startswith('(Machine == "')
        # nodes on this machine: their jobs preload the local bypass (docs/bypass.md)
        assert site["profiles"]["env"] == {"GMOUNT_NODE": name, "GMOUNT_CLUSTER": api.name,
                                           "LD_PRELOAD": bypass.library()}

    # Replica catalog: every workflow input, at each holder, in its mount and on its disk.
    replicas = {r["lfn"]: r["pfns"] for r in load(prepared.replicas)["replicas"]}
    expected = {f"raw/tile{t}.fits": node for t, (node, _) in TILES.items()}
    expected.update({"region.hdr": HEADER[0], "images.tbl": IMAGES_TABLE[0]})
    assert set(replicas) == set(expected)
    for lfn, node in expected.items():
        pfns = sorted((p["site"], p["pfn"]) for p in replicas[lfn])
        assert pfns == sorted([(node, f"file://{cluster4.mount(node)}{data}/{lfn}"),
                               (node, f"file://{cluster4.export(node)}{data}/{lfn}")])
        for _, pfn in pfns:  # both name the same bytes
            assert Path(pfn.removeprefix("file://")).read_bytes() == \
                (cluster4.export(node) / data.lstrip("/") / lfn).read_bytes()
    assert prepared.replica_count == 2 * len(expected) and prepared.missing == ()

    # Selector profiles: each mProject on its tile's holder; every placed job exactly
    # where Cluster.place puts its inputs; jobs reading only intermediates left alone.
    written = selector_profiles(load(prepared.workflow))
    for t, (node, _) in TILES.items():
        assert written[f"mProject_{t}"] == node
    for job_id, node in prepared.placements.items():
        assert api.place(job_inputs(wf, job_id, data)).node == node, job_id
    assert {j for j, site in written.items() if site is None} == \
        {"mConcatFit", *(f"mBackground_{t}" for t in TILES)} == set(prepared.unplaced)
    # a tiny header is still a located input: the rule puts mDiffFit and mAdd by it
    assert {written[j] for j in written if j.startswith("mDiffFit")} == {HEADER[0]}
    assert written["mBgModel"] == IMAGES_TABLE[0]
    assert {k: v for k, v in written.items() if v} == dict(prepared.placements)

    # The Workflow object carries the same profiles (a later wf.write()/plan() keeps them).
    assert selector_profiles(load_text(wf)) == written
    assert wf.jobs["mProject_3"].metadata[CHOSEN_KEY] == "n3"

    # Properties, read back by Pegasus's own reader.
    props = Properties.load(prepared.properties)
    assert props["pegasus.catalog.site.file"] == str(prepared.sites)
    assert props["pegasus.catalog.replica"] == "YAML"
    assert props["pegasus.catalog.replica.file"] == str(prepared.replicas)
    assert props["pegasus.data.configuration"] == "sharedfs"
    with pytest.raises(KeyError):
        props["pegasus.selector.site"]  # not asked for: Pegasus's own selector maps the rest


def test_missing_input_is_reported_not_catalogued(api: Cluster, data: str, tmp_path: Path) -> None:
    wf = montage("with-missing")
    wf.add_jobs(Job("mExtra", _id="mExtra").add_inputs(File("raw/not-there.fits"), File("raw/tile5.fits"))
                .add_outputs(File("extra.fits")))
    prepared = prepare(wf, api, tmp_path, root=data)
    assert prepared.missing == ("raw/not-there.fits",)
    assert "raw/not-there.fits" not in {r["lfn"] for r in load(prepared.replicas)["replicas"]}
    assert prepared.placements["mExtra"] == TILES[5][0]
    assert "no node holds 1 workflow inputs: raw/not-there.fits" in str(prepared)


def test_yaml_workflow_through_the_cli_and_user_sites_kept(api: Cluster, data: str, tmp_path: Path) -> None:
    wf = montage("from-yaml")
    wf.jobs["mProject_0"].add_selector_profile(execution_site="n4")  # the user's own choice wins
    source = tmp_path / "workflow.yml"
    wf.write(str(source))
    result = CliRunner().invoke(gmount_main, ["pegasus", str(source), "--cluster", api.name, "--out",
                                              str(tmp_path / "out"), "--root", data, "--callout"])
    assert result.exit_code == 0, result.output
    assert "pegasus-plan --conf" in result.output and "--sites n1,n2,n3,n4" in result.output
    written = selector_profiles(load(tmp_path / "out" / "workflow.yml"))
    from_object = prepare(montage(), api, tmp_path / "object", root=data).placements
    assert written["mProject_0"] == "n4"
    assert {k: v for k, v in written.items() if v and k != "mProject_0"} == \
        {k: v for k, v in from_object.items() if k != "mProject_0"}
    props = Properties.load(tmp_path / "out" / "pegasus.properties")
    assert props["pegasus.selector.site"] == "NonJavaCallout"
    assert os.path.isabs(props["pegasus.selector.site.path"])
    assert props["pegasus.selector.site.env.GMOUNT_CLUSTER"] == api.name
    assert props["pegasus.selector.site.env.GMOUNT_PEGASUS_ROOT"] == data

    bad = CliRunner().invoke(gmount_main, ["pegasus", str(source), "--cluster", "no-such-cluster"])
    assert bad.exit_code == 1 and "neither a running cluster's name" in bad.output


def test_staged_inputs_get_new_placements(api: Cluster, data: str, tmp_path: Path) -> None:
    wf = montage("staged")
    before = prepare(wf, api, tmp_path / "before", root=data)
    assert before.placements["mProject_2"] == "n2"
    # n4 gets a replica of tile 2 and of the header: it now holds more of mProject_2's bytes than n2.
    api.stage([f"{data}/raw/tile2.fits", f"{data}/region.hdr"], to="n4")
    try:
        after = prepare(wf, api, tmp_path / "after", root=data)
        assert after.placements["mProject_2"] == "n4"
        assert selector_profiles(load(after.workflow))["mProject_2"] == "n4"
        assert selector_profiles(load_text(wf))["mProject_2"] == "n4"
        for job_id, node in after.placements.items():
            assert api.place(job_inputs(wf, job_id, data)).node == node, job_id
        tile2 = {p["site"] for r in load(after.replicas)["replicas"] if r["lfn"] == "raw/tile2.fits"
                 for p in r["pfns"]}
        assert tile2 == {"n2", "n4"}
        assert {k: v for k, v in after.placements.items() if not k.startswith("mProject_2")} == \
            {k: v for k, v in before.placements.items() if not k.startswith("mProject_2")}
    finally:  # other tests of this module expect the original layout
        for path in ("raw/tile2.fits", "region.hdr"):
            (Path(api.nodes["n4"].export) / data.lstrip("/") / path).unlink(missing_ok=True)
        assert wait_for(lambda: api.where(f"{data}/region.hdr")[0].nodes == (HEADER[0],))


# --------------------------------------------------------------------------- the site selector callout


def request(job_id: str, lfns: list[str], sites: list[str], *, sizes: bool = False) -> str:
    """A request file as NonJavaCallout.prepareInputFile writes it (API version 2.0)."""
    lines = ["version=2.0", f"transformation=montage::{job_id.split('_')[0]}:", "derivation=::" + job_id + ":",
             "job.level=1", f"job.id={job_id}"]
    if sites:
        for site in sites:  # one line per file server of the site's shared scratch (and per operation)
            lines += [f"resource.id={site} file://"]
    else:
        lines.append("resource.id=NONE NONE")
    lines += [f"input.lfn={lfn}" + (f" {1000 + i}" if sizes else "") for i, lfn in enumerate(lfns)]
    lines += ["wf.name=montage", "wf.index=0", "wf.manager=dagman", "vo.name=NONE", "vo.group=NONE"]
    return "\n".join(lines) + "\n"


def planner_call(properties: Path, request_text: str, tmp_path: Path) -> tuple[int, str, str, float]:
    """Run the selector as NonJavaCallout.mapJob does; (exit status, stdout, stderr, ms)."""
    props = Properties.load(properties)
    conf = props._conf["DEFAULT"]
    env = {"HOME": os.environ.get("HOME", "/root"), "USER": "pegasus", "LOGNAME": "pegasus", "TMP": str(tmp_path),
           "TZ": "UTC", "CLASSPATH": "/usr/share/pegasus/java/pegasus.jar", "JAVA_HOME": "/usr/lib/jvm/default"}
    prefix = "pegasus.selector.site.env."
    env.update({key[len(prefix):]: value for key, value in conf.items() if key.startswith(prefix)})
    assert "PATH" not in env
    request_file = tmp_path / f"pegasus{time.monotonic_ns()}"
    request_file.write_text(request_text)
    command = (props["pegasus.selector.site.path"] + " " + str(request_file)).split()  # Runtime.exec(String)
    started = time.perf_counter()
    done = subprocess.run(command, check=False, env=env, capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout, done.stderr, (time.perf_counter() - started) * 1000


def solution(stdout: str) -> str:
    answers = [line for line in stdout.splitlines() if line.startswith("SOLUTION:")]
    assert len(answers) == 1, stdout
    return answers[0].removeprefix("SOLUTION:")


def test_parse_request_follows_the_protocol() -> None:
    parsed = parse_request(request("mDiffFit_0_1", ["proj/p0.fits", "proj/p1.fits", "proj/p0.fits"],
                                   ["n1", "n1", "n3", "local"], sizes=True))
    assert parsed.job_id == "mDiffFit_0_1" and parsed.version == "2.0"
    assert parsed.transformation == "montage::mDiffFit:"
    assert parsed.candidates == ("n1", "n3", "local")
    assert parsed.lfns == ("proj/p0.fits", "proj/p1.fits")
    assert parsed.fields is not None and parsed.fields["wf.manager"] == "dagman"
    assert parse_request(request("j", ["a b.fits"], [])).candidates == ()
    with pytest.raises(ValueError, match="no job.id"):
        parse_request("version=2.0\nresource.id=n1 file://\n")
    with pytest.raises(ValueError, match="line 2 .* not key=value"):
        parse_request("job.id=x\ngarbage\n")


def test_callout_answers_request_files_like_the_planner_asks(api: Cluster, data: str, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    prepared = prepare(montage(), api, tmp_path / "run", root=data, callout=True)
    every = ["n1", "n2", "n3", "n4"]
    cases: list[tuple[str, str, str]] = []  # (what, request, expected site)
    for t, (node, _) in TILES.items():
        cases.append((f"mProject_{t}", request(f"mProject_{t}", [f"raw/tile{t}.fits", "region.hdr"], every), node))
    # the planner's candidates restrict the answer: n3's tiles, but only n1 and n4 may run it
    cases.append(("restricted", request("mExtra_1", ["raw/tile3.fits", "raw/tile5.fits"], ["n1", "n4"]), "n4"))
    cases.append(("sizes after lfns", request("mExtra_2", ["raw/tile3.fits", "raw/tile4.fits"], every,
                                              sizes=True), "n3"))
    cases.append(("no gmount site", request("mExtra_3", ["raw/tile0.fits"], ["local", "condorpool"]), "NONE"))
    cases.append(("no candidate at all", request("mExtra_4", ["raw/tile0.fits"], []), "NONE"))
    for what, text, expected in cases:
        if what.startswith("mProject"):
            lfns = parse_request(text).lfns
            assert api.place([f"{data}/{lfn}" for lfn in lfns]).node == expected
        status, out, err, _ = planner_call(prepared.properties, text, tmp_path)
        assert (status, solution(out)) == (0, expected), (what, out, err)

    # Nothing located (intermediates): some candidate, the same one every time, spread over jobs.
    answers = {}
    for pair in range(5):
        text = request(f"mDiffFit_{pair}_{pair + 1}", [f"proj/p{pair}.fits", f"proj/p{pair + 1}.fits"], every)
        first = solution(planner_call(prepared.properties, text, tmp_path)[1])
        assert first in every and solution(planner_call(prepared.properties, text, tmp_path)[1]) == first
        answers[pair] = first
    assert len(set(answers.values())) > 1, answers

    # How long the planner waits per job (reported, not asserted: the machine is shared).
    timings = sorted(planner_call(prepared.properties, cases[0][1], tmp_path)[3] for _ in range(5))
    with capsys.disabled():
        print(f"\nsite selector: median {timings[2]:.0f} ms per request (min {timings[0]:.0f}, "
              f"max {timings[-1]:.0f}), planner environment, 4-node cluster")


def test_callout_failures_say_why_and_answer_none(api: Cluster, data: str, tmp_path: Path) -> None:
    prepared = prepare(montage(), api, tmp_path / "run", root=data, callout=True)
    text = request("mProject_0", ["raw/tile0.fits"], ["n1", "n2"])
    lines = prepared.properties.read_text().splitlines()
    no_cluster = tmp_path / "no-cluster.properties"
    no_cluster.write_text("\n".join(line for line in lines if "GMOUNT_CLUSTER" not in line) + "\n")
    status, out, err, _ = planner_call(no_cluster, text, tmp_path)
    assert status == 1 and solution(out) == "NONE" and "GMOUNT_CLUSTER is not set" in err

    stopped = tmp_path / "stopped.properties"
    stopped.write_text("\n".join(line.replace(f"GMOUNT_CLUSTER = {api.name}", "GMOUNT_CLUSTER = not-running")
                                 for line in lines) + "\n")
    status, out, err, _ = planner_call(stopped, text, tmp_path)
    assert status == 1 and solution(out) == "NONE" and "job mProject_0" in err and "not-running" in err

    status, out, err, _ = planner_call(prepared.properties, "version=2.0\n", tmp_path)
    assert status == 1 and solution(out) == "NONE" and "no job.id" in err


def test_callout_answers_even_when_placement_fails_unexpectedly(api: Cluster, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """A bug in placement must not leave the planner waiting (300 s per job) for an answer that
    never comes: the job gets a site anyway, and stderr says what failed."""
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug in placement")

    monkeypatch.setattr(selector, "choose_site", broken)
    monkeypatch.setenv("GMOUNT_CLUSTER", api.name)
    request_file = tmp_path / "request"
    answers = set()
    for job in range(6):
        request_file.write_text(request(f"mAdd_{job}", ["raw/tile0.fits"], ["n1", "n3", "condorpool"]))
        status = selector.main([str(request_file)])
        out, err = capsys.readouterr()
        assert status == 0 and "RuntimeError: a bug in placement" in err and "fell back" in err, (out, err)
        answers.add(solution(out))
    assert answers <= {"n1", "n3"} and len(answers) == 2  # the gmount candidates, spread by job id


def test_callout_places_over_the_nodes_that_answer_when_one_is_down(tmp_path: Path) -> None:
    """A node that is down -- here n1, the node the cluster is asked from by default -- is left out:
    jobs go to the nodes that answer instead of the whole plan stopping at SOLUTION:NONE."""
    require("FUSE", fuse_problem())
    with local_cluster(tmp_path / "c", f"pegdown-{os.getpid()}", {"a": ["n1", "n2"], "b": ["n3"]},
                       [("a", "b", 5.0)]) as cluster:
        put(cluster, "n2", "/in/big.fits", 90_000)
        put(cluster, "n3", "/in/small.fits", 10_000)
        os.kill(cluster.state.nodes["n1"].pid, signal.SIGKILL)
        env = {"HOME": os.environ.get("HOME", "/root"), "USER": "pegasus", "LOGNAME": "pegasus", "TZ": "UTC",
               "TMP": str(tmp_path), "GMOUNT_CLUSTER": cluster.spec.name, "GMOUNT_PEGASUS_ROOT": "/in",
               "XDG_STATE_HOME": os.environ["XDG_STATE_HOME"]}

        def ask(text: str) -> tuple[int, str, str]:
            request_file = tmp_path / f"request{time.monotonic_ns()}"
            request_file.write_text(text)
            done = subprocess.run([gmountpy_pegasus.catalogs.selector_path(), str(request_file)], env=env,
                                  capture_output=True, text=True, timeout=60, check=False)
            return done.returncode, solution(done.stdout), done.stderr

        every = ["n1", "n2", "n3"]
        status, site, err = ask(request("mProject_0", ["big.fits", "small.fits"], every))
        assert (status, site) == (0, "n2"), err
        assert "n1" in err and "not answering" in err
        spread = {ask(request(f"mDiffFit_{job}", ["nowhere.fits"], every))[1] for job in range(4)}
        assert spread <= {"n2", "n3"} and spread, spread
        status, site, err = ask(request("mAdd", ["big.fits"], ["n1"]))
        assert (status, site) == (0, "NONE") and "answers" in err, err
