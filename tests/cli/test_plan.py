"""`gmount plan`'s pure parts: placing a run from synthetic holdings, its text, make's record and flags.

The runs themselves (real make, real Snakemake on a local cluster, compared with where the run then
went) are in tests/plugins/test_make.py and tests/plugins/test_snakemake.py.
"""

from __future__ import annotations

import pytest

from gmountpy.cli.plan import Job, Plan, PlannedJob, human, predict, render
from gmountpy.jobs.placement import WAIT_FLOOR, JobPlacement, input_bytes, place_job
from gmountpy_make.plan import Recipe, is_dry_run, parse_record

NODES = ["n1", "n2", "n3", "n4"]
SLOTS = {n: 1 for n in NODES}


def rtt(a: str, b: str) -> float:
    return 0.0 if a == b else 1.0 if {a, b} <= {"n1", "n2"} or {a, b} <= {"n3", "n4"} else 14.0


def decide(holdings, asked, pin):  # type: ignore[no-untyped-def]
    return place_job(holdings, NODES, asked=asked, slots=SLOTS, rtt=rtt, pin=pin)


def job(label: str, inputs: list[str], outputs: list[str], **kw: object) -> Job:
    return Job(label, "/wf", kw.pop("asked", "n1"), tuple((i, f"/wf/{i}") for i in inputs),  # type: ignore[arg-type]
               tuple(f"/wf/{o}" for o in outputs), **kw)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- the shared rule


def test_place_job_pins_then_rule_then_the_node_asked() -> None:
    holdings = {"/a": {"n3": 900}, "/b": {"n1": 100}}
    assert place_job(holdings, NODES, asked="n2", slots=SLOTS, rtt=rtt) == \
        JobPlacement("n3", "holds 90% of the input bytes (900 of 1000); has a free slot", 900, 100)
    assert place_job(holdings, NODES, asked="n2", slots=SLOTS, rtt=rtt, pin="n1") == \
        JobPlacement("n1", "pinned by the job", 100, 900)
    assert place_job({"/missing": {}}, NODES, asked="n2", slots=SLOTS, rtt=rtt) == \
        JobPlacement("n2", "no located inputs: the node asked (n2)", 0, 0)
    with pytest.raises(ValueError, match="not a node"):
        place_job(holdings, NODES, asked="n2", slots=SLOTS, rtt=rtt, pin="n9")
    # a replica: both holders read it locally; the others read its one copy remotely
    assert input_bytes({"/r": {"n1": 50, "n2": 50}, "/s": {"n3": 7}}, "n2") == (50, 7)


def test_place_job_sends_a_job_whose_holder_stays_full_to_a_free_node() -> None:
    # make -j2 starts two chains of one site's documents together: the second waits for n1's slot at
    # least WAIT_FLOOR (tests/test_placement.py: the cost model), then goes where a slot is free
    holdings = {"/doc0": {"n1": 3000}, "/cfg": {"n4": 10}}
    two = {"n1": 1, "n2": 1}
    assert place_job(holdings, ["n1", "n2", "n3", "n4"], asked="n1", slots=SLOTS, rtt=rtt,
                     running={}).node == "n1"
    waiting = place_job(holdings, ["n1", "n2", "n3", "n4"], asked="n1", slots=SLOTS, rtt=rtt, running=two)
    assert (waiting.node, waiting.wait) == ("n1", WAIT_FLOOR)
    spilled = place_job(holdings, ["n1", "n2", "n3", "n4"], asked="n1", slots=SLOTS, rtt=rtt, running=two,
                        waited=WAIT_FLOOR)
    # the free nodes n3 and n4 read the big input at the same RTT; n4 holds the small one
    assert spilled.node == "n4" and spilled.reason.startswith("n1 holds the most input bytes but runs 1 jobs on 1")
    assert (spilled.bytes_local, spilled.bytes_remote, spilled.wait) == (10, 3000, 0.0)
    # a node on the holder's site reads the rest at its lower RTT
    assert place_job({"/doc0": {"n1": 3000}}, NODES, asked="n1", slots=SLOTS, rtt=rtt,
                     running={"n1": 1}, waited=WAIT_FLOOR).node == "n2"
    # every node full: the rule's node (the job waits for its slot there); unknown load: the rule alone
    full = {n: 1 for n in NODES}
    assert place_job(holdings, NODES, asked="n1", slots=SLOTS, rtt=rtt, running=full).node == "n1"
    assert place_job(holdings, NODES, asked="n1", slots=SLOTS, rtt=rtt).node == "n1"
    # a planned node is kept while it has a free slot, waited for and then left when it stays full
    replicated = {"/doc0": {"n1": 3000, "n3": 3000}}
    assert place_job(replicated, NODES, asked="n1", slots=SLOTS, rtt=rtt, planned="n3", running={"n1": 1}).node == "n3"
    assert place_job(replicated, NODES, asked="n1", slots=SLOTS, rtt=rtt, planned="n3",
                     running={"n3": 1}).node == "n1"


# --------------------------------------------------------------------------- predict


def test_predict_places_downstream_jobs_where_their_inputs_will_be() -> None:
    existing = {f"/wf/in{i}": {f"n{i}": 1000 * i} for i in range(1, 5)} | {"/wf/cfg": {"n2": 10}}
    jobs = [job(f"up{i}", [f"in{i}", "cfg"], [f"up{i}"]) for i in range(1, 5)]
    jobs.append(job("merge", [f"up{i}" for i in range(1, 5)], ["merged"]))
    jobs.append(job("report", ["merged", "up1"], ["report"]))
    planned = {p.job.label: p for p in predict(jobs, existing, decide)}
    assert [planned[f"up{i}"].node for i in range(1, 5)] == NODES
    up1 = planned["up1"]
    assert (up1.bytes_local, up1.bytes_remote, up1.estimated, up1.planned_inputs) == (1000, 10, False, ())
    merge = planned["merge"]  # up_i sized as its inputs: in_i (+ cfg): n4's 4010 is the largest
    assert merge.node == "n4" and merge.planned_inputs == ("up1", "up2", "up3", "up4")
    assert (merge.bytes_local, merge.bytes_remote) == (4010, 1010 + 2010 + 3010)
    assert merge.local_estimated and merge.remote_estimated
    report = planned["report"]  # merged.txt (estimated as all of merge's inputs) is on n4
    assert report.node == "n4" and (report.bytes_local, report.bytes_remote) == (10040, 1010)


def test_predict_old_versions_rewritten_in_place_or_replaced_and_missing_inputs() -> None:
    existing = {"/wf/in": {"n3": 5000}, "/wf/out": {"n1": 70}, "/wf/nowhere": {}}
    jobs = [job("make-like", ["in"], ["out"], rewrites_in_place=True), job("after", ["out"], ["final"])]
    planned = predict(jobs, existing, decide)
    # make opens the existing file: its target stays on n1 (with its current size), so `after` goes there
    assert [p.node for p in planned] == ["n3", "n1"]
    assert (planned[1].bytes_local, planned[1].local_estimated) == (70, True)
    # Snakemake removes old outputs first: the new one is on its job's node, sized as the old version
    planned = predict([job("snake-like", ["in"], ["out"]), job("after", ["out"], ["final"])], existing, decide)
    assert [p.node for p in planned] == ["n3", "n3"] and planned[1].bytes_local == 70
    # an input nobody holds and no job writes: said, and the job stays where it is asked from
    lost = predict([job("lost", ["nowhere", "gone"], ["x"], asked="n2")], existing, decide)[0]
    assert (lost.node, lost.missing) == ("n2", ("nowhere", "gone"))


def test_predict_directories_pins_and_local_rules() -> None:
    existing = {"/wf/dir/a": {"n2": 300}, "/wf/dir/b": {"n2": 400}, "/wf/dir/c": {"n4": 500}, "/wf/x": {"n4": 1}}
    jobs = [job("reads-a-directory", ["dir"], ["made"]),
            job("writes-a-directory", ["x"], ["outdir"]),
            job("reads-inside-it", ["outdir/part1"], ["y"]),
            job("pinned", ["dir"], ["z"], pin="n1"),
            job("local", ["dir"], ["w"], on_head="local rule: runs where Snakemake runs (n1)")]
    planned = {p.job.label: p for p in predict(jobs, existing, decide)}
    assert (planned["reads-a-directory"].node, planned["reads-a-directory"].bytes_local) == ("n2", 700)
    assert planned["reads-inside-it"].node == "n4" and planned["reads-inside-it"].planned_inputs == ("outdir/part1",)
    assert (planned["pinned"].node, planned["pinned"].reason, planned["pinned"].bytes_remote) == (
        "n1", "pinned by the job", 1200)
    assert (planned["local"].node, planned["local"].reason) == ("n1", "local rule: runs where Snakemake runs (n1)")


def test_render_shows_every_job_whole_and_the_totals() -> None:
    long_label = "align sample=" + "x" * 150
    jobs = (PlannedJob(job(long_label, ["a"], ["b"]), "n3", "holds 100% of the input bytes", 3 << 20, 0, False,
                       False, (), ()),
            PlannedJob(job("merge", ["b"], ["c"]), "n3", "holds 100% ...", 3 << 20, 1500, True, True, ("b",), ()))
    plan = Plan("snakemake", "/m/wf/Snakefile", "c1", "n1", "/wf", jobs)
    text = render(plan)
    assert long_label in text  # never cut, whatever the terminal
    lines = text.splitlines()
    assert lines[0] == "plan of Snakefile /m/wf/Snakefile in /wf: cluster c1, run from node n1, 2 jobs"
    assert lines[1].split() == ["job", "node", "inputs", "local", "remote", "why"]
    assert lines[3].split()[:7] == ["merge", "n3", "1", "~3.0", "MiB", "~1.5", "KiB"]
    assert "total: 2 jobs (n3 2); input bytes read locally ~6.0 MiB, from other nodes ~1.5 KiB" in text
    assert plan.as_json()["total"] == {"jobs": 2, "per_node": {"n3": 2}, "bytes_local": 6 << 20,
                                       "bytes_remote": 1500, "bytes_local_estimated": True,
                                       "bytes_remote_estimated": True}
    assert human(1023) == "1023 B" and human(1536, True) == "~1.5 KiB"


# --------------------------------------------------------------------------- make's side


def test_parse_record_keeps_one_recipe_per_target_in_makes_order() -> None:
    text = "/m/wf\tup1.txt\tin1.txt shared.cfg\n/m/wf\tup1.txt\tin1.txt shared.cfg\n/m/wf/sub\tx\t\n" \
           "/m/wf\tall\tup1.txt x\n"
    assert parse_record(text) == (Recipe("/m/wf", "up1.txt", ("in1.txt", "shared.cfg")), Recipe("/m/wf/sub", "x", ()),
                                  Recipe("/m/wf", "all", ("up1.txt", "x")))


@pytest.mark.parametrize(("args", "dry"), [
    (["-n"], True), (["-kn"], True), (["-j4", "--dry-run"], True), (["--just-print"], True), (["--recon"], True),
    (["-C", "n"], False), (["-Cn"], False), (["-f", "-n"], False), (["-j", "-n"], True), (["-nj4"], True),
    (["all", "X=-n"], False), (["-k", "all"], False), (["-O", "-n"], True), (["--", "-n"], False),
])
def test_is_dry_run_reads_makes_flags(args: list[str], dry: bool) -> None:
    assert is_dry_run(args) is dry
