"""DAG-aware staging (gmountpy/jobs/prestage.py): the plan, the make database, and a real make run.

The pure parts on synthetic holdings: a consumer of two inputs made on different nodes is
planned where the input still to come will be made, and the finished one is staged there
(Montage's mDiffFit pair); small files are not staged; plans with staging stay put. Then make's
database, read without running a recipe. Then a real cluster and a real make: the consumer of
a pair runs on the node it was planned on and reads nothing remotely.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

from gmountpy import Cluster
from gmountpy.jobs.prestage import Dag, Planner, Prestager, follow, make_dag, parse_make_database

from .conftest import fuse_problem, local_cluster, require

MIB = 1 << 20
BIN = os.path.dirname(sys.executable)


def pair_dag() -> Dag:
    return Dag({"a.out": ("a.in",), "b.out": ("b.in",), "c.out": ("a.out", "b.out")}, {},
               ("a.out", "b.out", "c.out"))


def test_a_pair_consumer_is_planned_where_its_pending_input_will_be_made_and_the_finished_one_goes_there() -> None:
    planner = Planner(pair_dag(), ["n1", "n2"])
    holdings = {"a.in": {"n1": MIB}, "b.in": {"n2": MIB}}
    assert planner.update(holdings, done=[]) == []  # nothing produced yet: nothing to move
    assert planner.plan == {"a.out": "n1", "b.out": "n2", "c.out": "n1"}  # a tie: cluster order for now
    holdings["a.out"] = {"n1": 4 * MIB}
    assert planner.update(holdings, done=["a.out"]) == [("a.out", "n2")]
    assert planner.plan["c.out"] == "n2"
    holdings["a.out"]["n2"] = 4 * MIB  # the replica
    holdings["b.out"] = {"n2": 4 * MIB}
    assert planner.update(holdings, done=["a.out", "b.out"]) == []
    assert planner.plan["c.out"] == "n2"


def test_consumers_of_finished_inputs_on_both_nodes_are_spread_and_small_files_stay() -> None:
    dag = Dag({"c1": ("x1", "y1", "table"), "c2": ("x2", "y2", "table")}, {}, ("c1", "c2"))
    planner = Planner(dag, ["n1", "n2"], min_bytes=MIB)
    holdings = {"x1": {"n1": 8 * MIB}, "y1": {"n2": 8 * MIB}, "x2": {"n1": 8 * MIB}, "y2": {"n2": 8 * MIB},
                "table": {"n1": 1000}}
    requests = planner.update(holdings, done=[])
    assert sorted(planner.plan.values()) == ["n1", "n2"], planner.plan  # one pair on each node
    assert len(requests) == 2 and all(path != "table" for path, _ in requests)
    for path, node in requests:
        assert node == planner.plan["c1" if path.endswith("1") else "c2"]


def test_a_plan_with_staging_stays_when_holdings_change() -> None:
    planner = Planner(pair_dag(), ["n1", "n2"])
    holdings = {"a.in": {"n1": MIB}, "b.in": {"n2": MIB}, "a.out": {"n1": 4 * MIB}}
    planner.update(holdings, done=["a.out"])
    holdings["b.out"] = {"n1": 64 * MIB}  # b.out came out elsewhere, and bigger
    planner.update(holdings, done=["a.out", "b.out"])
    assert planner.plan["c.out"] == "n2"


def test_side_outputs_count_as_made_by_their_job() -> None:
    dag = Dag({"p.fits": ("raw",), "d": ("p.fits", "p_area.fits", "q.fits")}, {"p_area.fits": "p.fits"},
              ("p.fits", "d"))
    assert dag.producer("p_area.fits") == "p.fits" and dag.producer("raw") is None
    planner = Planner(dag, ["n1", "n2"])
    planner.update({"raw": {"n2": MIB}, "q.fits": {"n1": MIB}}, done=[])
    assert planner.plan["p.fits"] == "n2"


MAKEFILE = """\
all: out/c.txt
include parts.mk
parts.mk:
\techo 'x: ; touch ran-parts' > $@
out/%.txt: in/%.txt
\tmkdir -p out && cp $< $@ && touch ran-$*
out/%_side.txt: out/%.txt ;
out/c.txt: out/a.txt out/b.txt out/a_side.txt
\tcat $^ > $@
clean:
\trm -rf out
"""


def test_make_database_is_read_without_running_a_recipe(tmp_path: Path) -> None:
    (tmp_path / "Makefile").write_text(MAKEFILE)
    (tmp_path / "in").mkdir()
    for name in ("a", "b"):
        (tmp_path / "in" / f"{name}.txt").write_text(name)
    dag, complete = make_dag(str(tmp_path))
    assert not complete  # parts.mk is missing: make would have made it (with a recipe) to know the rest
    assert sorted(tmp_path.iterdir()) == [tmp_path / "Makefile", tmp_path / "in"], "make ran a recipe"
    (tmp_path / "parts.mk").write_text("")
    dag, complete = make_dag(str(tmp_path))
    assert complete
    assert dag.deps["out/a.txt"] == ("in/a.txt",)
    assert dag.deps["out/c.txt"] == ("out/a.txt", "out/b.txt", "out/a_side.txt")
    assert dag.side == {"out/a_side.txt": "out/a.txt"}
    assert dag.order.index("out/a.txt") < dag.order.index("out/c.txt")
    assert "clean" not in dag.deps  # not needed by the default goal
    assert not list(tmp_path.glob("ran-*")) and not (tmp_path / "out").exists()


def test_parse_ignores_patterns_and_non_targets() -> None:
    text = "\n# Files\n\n# Not a target:\nfoo.c:\n\n%.o: %.c\n\tcc\n\nx: y z\n#  recipe to execute:\n\tdo\n\n"
    dag = parse_make_database(text + "# files hash-table stats:\n")
    assert dict(dag.deps) == {"x": ("y", "z")}


PAIR_MAKEFILE = """\
include $(shell gmount make-include)
all: c.out
a.out: a.in
\t{python} -c "import shutil; shutil.copyfile('a.in', 'a.out')"
b.out: b.in
\tsleep 3; {python} -c "import shutil; shutil.copyfile('b.in', 'b.out')"
c.out: a.out b.out
\tcat a.out b.out > c.out
"""


def test_make_consumer_of_a_pair_runs_where_it_was_planned_and_reads_nothing_remotely(tmp_path: Path) -> None:
    """a.out is made on n1 at once, b.out on n2 after 3 s: the prestager stages a.out to n2 meanwhile, so
    c.out (a tie without it, which cluster order gives to n1, reading b.out across) runs on n2, all local."""
    require("FUSE", fuse_problem())
    sites = {"east": ["n1"], "west": ["n2"]}
    with local_cluster(tmp_path, f"pre-{os.getpid()}", sites, [("east", "west", 2.0)]) as running:
        (running.export("n1") / "w").mkdir()
        (running.export("n2") / "w").mkdir()
        (running.export("n1") / "w" / "a.in").write_bytes(os.urandom(2 * MIB))
        (running.export("n2") / "w" / "b.in").write_bytes(os.urandom(2 * MIB))
        work = Path(running.spec.node("n1").mountpoint) / "w"
        (work / "Makefile").write_text(PAIR_MAKEFILE.format(python=sys.executable))
        cluster = Cluster.open(running.spec.name)
        log = str(work / ".gmount" / "make.jsonl")
        env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "GMOUNT_PLACEMENT_LOG": log}
        time.sleep(1.0)  # the exports' files are seen by the index
        before = cluster.counters()
        with follow(cluster, str(work), "/w", log) as prestager:
            done = subprocess.run(["make", "-s"], cwd=work, env=env, capture_output=True, text=True, timeout=120)
        after = cluster.counters()
        assert done.returncode == 0, done.stderr
        assert prestager.stats.errors == []
        assert prestager.stats.staged_files >= 1, prestager.stats
        assert (running.export("n2") / "w" / "c.out").exists(), "the consumer did not run on its planned node"
        remote = sum(after[n].get("read_remote", 0) - before[n].get("read_remote", 0) for n in after)
        assert remote < 64 * 1024, f"jobs read {remote} bytes remotely"
        assert (work / "c.out").read_bytes() == (running.export("n1") / "w" / "a.in").read_bytes() + \
            (running.export("n2") / "w" / "b.in").read_bytes()


PLANNED_MAKEFILE = """\
include $(shell gmount make-include)
all: near.out far.out
near.out: big.in mid.in
\tcat big.in mid.in > near.out
far.out: big.in small.in
\tcat big.in small.in > far.out
"""


def test_make_fast_path_runs_a_recipe_on_its_planned_node_only_when_the_rule_counts_it_a_candidate(
        tmp_path: Path) -> None:
    """gmount-job sends the node the prestager's plan names (`<log>.plan`) to the daemon: near.out (n1 holds
    3 MiB, n2 2 MiB: both candidates, the rule alone picks n1) runs on n2, as planned; far.out (n2 holds
    1 MiB of 4: not a candidate) stays on n1 although planned on n2."""
    require("FUSE", fuse_problem())
    sites = {"east": ["n1"], "west": ["n2"]}
    with local_cluster(tmp_path, f"prj-{os.getpid()}", sites, [("east", "west", 2.0)]) as running:
        (running.export("n1") / "p").mkdir()
        (running.export("n2") / "p").mkdir()
        (running.export("n1") / "p" / "big.in").write_bytes(os.urandom(3 * MIB))
        (running.export("n2") / "p" / "mid.in").write_bytes(os.urandom(2 * MIB))
        (running.export("n2") / "p" / "small.in").write_bytes(os.urandom(1 * MIB))
        work = Path(running.spec.node("n1").mountpoint) / "p"
        (work / "Makefile").write_text(PLANNED_MAKEFILE)
        log = work / ".gmount" / "make.jsonl"
        log.parent.mkdir()
        Path(f"{log}.plan").write_text("near.out\tn2\nfar.out\tn2\n")
        env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "GMOUNT_PLACEMENT_LOG": str(log)}
        time.sleep(1.0)  # the exports' files are seen by the index
        done = subprocess.run(["make", "-s"], cwd=work, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        records = {r["target"]: r for r in map(json.loads, log.read_text().splitlines())}
        assert {t: (r["node"], r["via"]) for t, r in records.items()} == {"near.out": ("n2", "daemon"),
                                                                          "far.out": ("n1", "daemon")}
        assert (running.export("n2") / "p" / "near.out").exists()
        assert (running.export("n1") / "p" / "far.out").exists()


def test_nothing_is_staged_for_the_ready_jobs_the_engine_starts_now() -> None:
    """With make -j1 the first ready job starts at once: a copy for it would come after it read its inputs."""
    dag = Dag({"c1": ("x1", "y1"), "c2": ("x2", "y2")}, {}, ("c1", "c2"))
    holdings = {"x1": {"n1": 8 * MIB}, "y1": {"n2": 8 * MIB}, "x2": {"n1": 8 * MIB}, "y2": {"n2": 8 * MIB}}
    planner = Planner(dag, ["n1", "n2"])
    requests = planner.update(holdings, done=[], running=1)
    assert [node for _, node in requests] == [planner.plan["c2"]] and len(requests) == 1


PAIR_SNAKEFILE = """\
rule all:
    input: "c.out"
rule a:
    input: "a.in"
    output: "a.out"
    shell: "cp {input} {output}"
rule b:
    input: "b.in"
    output: "b.out"
    shell: "sleep 6; cp {input} {output}"
rule c:
    input: "a.out", "b.out"
    output: "c.out"
    shell: "cat {input} > {output}"
"""


def test_snakemake_consumer_of_a_pair_runs_where_it_was_planned_and_reads_nothing_remotely(tmp_path: Path) -> None:
    """The same pair through the Snakemake executor: it tells the prestager each finished job, and runs c on
    the node planned for it, where a.out was staged while b ran."""
    require("FUSE", fuse_problem())
    sites = {"east": ["n1"], "west": ["n2"]}
    with local_cluster(tmp_path, f"pres-{os.getpid()}", sites, [("east", "west", 2.0)]) as running:
        (running.export("n1") / "s").mkdir()
        (running.export("n2") / "s").mkdir()
        (running.export("n1") / "s" / "a.in").write_bytes(os.urandom(2 * MIB))
        (running.export("n2") / "s" / "b.in").write_bytes(os.urandom(2 * MIB))
        work = Path(running.spec.node("n1").mountpoint) / "s"
        (work / "Snakefile").write_text(PAIR_SNAKEFILE)
        cluster = Cluster.open(running.spec.name)
        time.sleep(1.0)
        before = cluster.counters()
        done = subprocess.run([sys.executable, "-m", "snakemake", "-j", "2", "--executor", "gmount", "--nolock",
                               "--latency-wait", "10"], cwd=work, capture_output=True, text=True, timeout=300,
                              env={**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"})
        after = cluster.counters()
        assert done.returncode == 0, done.stderr[-3000:]
        assert "DAG-aware staging copied 1 files" in done.stderr, done.stderr[-3000:]
        assert (running.export("n2") / "s" / "c.out").exists(), "the consumer did not run on its planned node"
        remote = sum(after[n].get("read_remote", 0) - before[n].get("read_remote", 0) for n in after)
        assert remote < 64 * 1024, f"jobs read {remote} bytes remotely"


def test_jobs_of_one_level_are_spread_when_their_small_inputs_can_be_moved() -> None:
    """make runs jobs in its order: four projections whose tiles all sit on n1 would have n1 run two at a
    time while n2 idles; the plan sends every other one to n2 with its tile staged there, but not a job
    whose input is too big to move."""
    dag = Dag({f"p{i}": (f"raw{i}",) for i in range(5)}, {}, tuple(f"p{i}" for i in range(5)))
    holdings = {f"raw{i}": {"n1": 4 * MIB} for i in range(4)}
    holdings["raw4"] = {"n1": 200 * MIB}
    planner = Planner(dag, ["n1", "n2"])
    requests = planner.update(holdings, done=[])
    assert [planner.plan[f"p{i}"] for i in range(4)] == ["n1", "n2", "n1", "n2"]
    assert requests == [("raw1", "n2"), ("raw3", "n2")]
    assert planner.plan["p4"] == "n1"  # 200 MiB to stage: it stays with its data


def test_a_job_waiting_for_a_small_input_is_spread_but_not_one_waiting_for_a_large_one() -> None:
    """Montage's projections wait for region.hdr (a header made from a table): they are spread while it is
    made; a job waiting for a large input made elsewhere is not moved away from it."""
    dag = Dag({"hdr": ("table",), "p0": ("raw0", "hdr"), "p1": ("raw1", "hdr"),
               "big": ("raw2",), "q0": ("raw3", "big"), "q1": ("raw4", "big")},
              {}, ("hdr", "p0", "p1", "big", "q0", "q1"))
    holdings = {"table": {"n1": 1000}, "raw0": {"n1": 4 * MIB}, "raw1": {"n1": 4 * MIB}, "raw2": {"n1": 16 * MIB},
                "raw3": {"n1": 4 * MIB}, "raw4": {"n1": 4 * MIB}}
    planner = Planner(dag, ["n1", "n2"])
    requests = planner.update(holdings, done=[])
    assert (planner.plan["p0"], planner.plan["p1"]) == ("n1", "n2") and ("raw1", "n2") in requests
    assert planner.plan["q0"] == planner.plan["q1"] == planner.plan["big"]  # they wait with it, wherever it runs


def test_outputs_still_to_be_made_are_guessed_at_what_their_job_reads_shared_by_its_outputs() -> None:
    """bwa index makes five files from a small genome on n1; bwa mem reads them and a sample's reads on
    n2: the job is planned on n2 and nothing is staged (the five outputs are not five times the genome)."""
    dag = Dag({"genome.bwt": ("genome.fa",), "a.bam": ("genome.fa", "genome.bwt", "genome.sa", "genome.pac",
                                                       "genome.amb", "genome.ann", "a.fastq")},
              {"genome.sa": "genome.bwt", "genome.pac": "genome.bwt", "genome.amb": "genome.bwt",
               "genome.ann": "genome.bwt"}, ("genome.bwt", "a.bam"))
    holdings = {"genome.fa": {"n1": 100 * 1024}, "a.fastq": {"n2": 2 * MIB}}
    planner = Planner(dag, ["n1", "n2"])
    assert planner.update(holdings, done=[]) == []
    assert planner.plan == {"genome.bwt": "n1", "a.bam": "n2"}


class FakeCluster:
    """What a Prestager asks of a cluster, in memory: who holds what, and the copies it was asked for."""

    def __init__(self, holdings: dict[str, dict[str, int]]) -> None:
        self.holdings = holdings  # namespace path -> node -> bytes
        self.copies: list[tuple[str, str, float]] = []  # (path, node, when)

    @property
    def nodes(self) -> list[SimpleNamespace]:
        return [SimpleNamespace(name="n1"), SimpleNamespace(name="n2")]

    def where(self, paths: list[str], from_node: str | None = None) -> list[SimpleNamespace]:
        return [SimpleNamespace(holders=[SimpleNamespace(node=n, size=s) for n, s in self.holdings.get(p, {}).items()])
                for p in paths]

    def stage(self, path: str, to: str, *, concurrency: int = 4, progress: bool | None = None) -> SimpleNamespace:
        self.copies.append((path, to, time.monotonic()))
        size = max(self.holdings[path].values())
        self.holdings[path][to] = size
        return SimpleNamespace(files=[SimpleNamespace(status="copied", size=size)])


def finish(log: Path, target: str, node: str) -> None:
    with open(log, "a") as f:
        f.write(json.dumps({"target": target, "node": node, "status": 0}) + "\n")


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_make_database_is_read_again_when_an_included_makefile_is_made_not_after_every_job(tmp_path: Path) -> None:
    """Montage's DAG is incomplete until diffs.mk is made (make cannot tell the rest without it): the
    prestager reads it once at the start and once when diffs.mk is made -- not after each of the ten
    projections made before it (each read walks the DAG through the mount on the head node's CPU)."""
    projections = [f"proj/{i}.fits" for i in range(10)]
    partial = Dag({**{p: (f"raw/{i}.fits",) for i, p in enumerate(projections)}, "diffs.tbl": tuple(projections)},
                  {}, (*projections, "diffs.tbl"))
    whole = Dag({**partial.deps, "diffs.mk": ("diffs.tbl",), "fit.txt": ("proj/0.fits", "proj/9.fits")}, {},
                (*partial.order, "diffs.mk", "fit.txt"))
    log = tmp_path / "make.jsonl"
    asked: list[bool] = []

    def dag_source() -> tuple[Dag, bool]:
        complete = any('"diffs.mk"' in line for line in (log.read_text().splitlines() if log.exists() else []))
        asked.append(complete)
        return (whole, True) if complete else (partial, False)

    cluster = FakeCluster({f"/w/raw/{i}.fits": {"n1" if i < 5 else "n2": MIB} for i in range(10)})
    prestager = Prestager(cluster, str(tmp_path), "/w", str(log), dag_source, poll=0.01)
    prestager.start()
    try:
        wait_for(lambda: len(asked) == 1)
        for i, path in enumerate(projections):
            node = "n1" if i < 5 else "n2"
            cluster.holdings[f"/w/{path}"] = {node: 4 * MIB}
            finish(log, path, node)
            time.sleep(0.05)
        cluster.holdings["/w/diffs.tbl"] = {"n2": 1000}
        finish(log, "diffs.tbl", "n2")
        time.sleep(0.05)
        assert len(asked) == 1, f"make's database was read {len(asked)} times before diffs.mk was made"
        cluster.holdings["/w/diffs.mk"] = {"n2": 100}
        finish(log, "diffs.mk", "n2")
        wait_for(lambda: bool(cluster.copies))
    finally:
        stats = prestager.stop()
    assert asked == [False, True] and stats.dag_reads == 2, stats
    assert [(p, n) for p, n, _ in cluster.copies] == [("/w/proj/0.fits", "n2")] or \
        [(p, n) for p, n, _ in cluster.copies] == [("/w/proj/9.fits", "n1")], cluster.copies



def test_a_level_already_even_in_total_is_not_rebalanced_job_by_job() -> None:
    """The event pipeline: four documents, two at each site, a chain of jobs per document, run by make one
    document after another. Balancing the level as far as the engine's order has reached swapped the second
    and fourth chains (two copies for nothing); the level is even in total, so every chain stays with its
    document and nothing is staged."""
    docs = ["d0", "d1", "d2", "d3"]
    chain = [("sent", "docs"), ("tok", "sent"), ("ev", "tok")]
    deps: dict[str, tuple[str, ...]] = {f"{stage}/{d}": (f"{src}/{d}",) for stage, src in chain for d in docs}
    deps["events.tsv"] = tuple(f"ev/{d}" for d in docs)
    order = (*(f"{stage}/{d}" for d in docs for stage, _ in chain), "events.tsv")
    planner = Planner(Dag(deps, {}, order), ["n1", "n2"])
    holdings = {f"docs/{d}": {"n1" if d in ("d0", "d1") else "n2": 3 * MIB} for d in docs}
    assert planner.update(holdings, done=[], running=2) == []
    assert all(planner.plan[f"{stage}/{d}"] == ("n1" if d in ("d0", "d1") else "n2")
               for stage, _ in chain for d in docs)
