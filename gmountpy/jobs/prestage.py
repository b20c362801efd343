"""DAG-aware staging: a finished job's outputs go, before they are needed, to where their consumers will run.

A job placed where most of its input bytes are still reads the rest remotely: Montage's
mDiffFit reads two overlapping tiles that often sit on different nodes, mAdd reads every
corrected tile. Knowing the workflow's DAG, such reads can be moved out of the jobs' way:

- `plan`: for every job not started yet, the node it will run on: the node holding most
  of its input bytes, counting inputs not produced yet on the node their producer is planned
  on (estimated at the bytes their producer reads times the bytes written per byte read by
  the jobs done so far, shared by its outputs; else at the size of the job's produced
  inputs), in units of `min_bytes` (small
  tables do not decide); ties go to the node where inputs are still to be produced (they
  cannot be moved ahead of time, the produced ones can), then to the node with fewer planned
  jobs, then to the node holding more of the inputs, then to cluster order. Then, as an engine
  runs jobs in its own order whatever node holds their data, a job whose node has more jobs of
  its level (depth in the DAG) than another node goes to that node if its inputs, all made
  already, cost at most `move_bytes` to stage there. A job keeps its plan once something was
  staged for it.
- the plan of the jobs something was staged for is written next to the placement log
  (`<log>.plan`, "target<TAB>node" lines; the Snakemake executor asks `planned`): the plugins
  run such a job on its planned node when that node is a candidate under the placement rule
  (holds at least half of the best node's bytes), so that replicas made for one job do not
  pull other jobs after them. Other jobs are placed by the rule alone.
- every produced input of a planned job that is not on its planned node (and at least
  `min_bytes`) is staged there, as a verified replica (`Cluster.stage`), in the order the
  engine will run the jobs -- while other jobs run. When the consumer starts, the placement
  rule sees the replica as held by that node, so the job goes there and reads locally.

`Planner` is the pure part (no I/O; tests drive it with synthetic holdings). `Prestager`
follows a run: it reads the DAG from the engine (make: `make_dag`, the make database printed
with recipes disabled), learns which jobs finished and where from the plugins' placement log
(one JSON line per finished recipe, `GMOUNT_PLACEMENT_LOG`), asks the cluster where files
are, and stages in worker threads. make's DAG is read at the start and again only when a job it
does not show finished (an included makefile was made) or, while incomplete, at most every
`RELOAD_AFTER` seconds. `follow(...)` runs one for the duration of a block.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from .planned import plan_path

#: holdings[path][node] = bytes of `path` that `node` holds (a replica counts for its node)
Holdings = dict[str, dict[str, int]]

#: files smaller than this are read remotely rather than staged (a stage costs round trips too)
MIN_BYTES = 256 * 1024
#: a job is planned away from its data, to even out the nodes, only if this much or less must be staged for it
MOVE_BYTES = 64 * 1024 * 1024
#: while make's DAG is incomplete, read it again after jobs finished at most this often (seconds), unless a
#: job it does not show finished (an included makefile: then at once)
RELOAD_AFTER = 10.0


@dataclass(frozen=True)
class Dag:
    """The jobs of a workflow: each target with a recipe, its prerequisites, and the order an engine runs them."""

    deps: Mapping[str, tuple[str, ...]]      # target -> prerequisites (paths relative to the workflow directory)
    side: Mapping[str, str] = field(default_factory=dict)  # side output -> the target whose recipe writes it
    order: tuple[str, ...] = ()              # targets, the first to run first

    def producer(self, path: str) -> str | None:
        """The job that writes `path` (itself, or the job a side output comes from), or None for a source."""
        if path in self.deps:
            return path
        return self.side.get(path)

    def inputs(self, job: str) -> tuple[str, ...]:
        return self.deps.get(job, ())


class Planner:
    """Where each job of a DAG will run, and what to stage for it; knows nothing of clusters or files."""

    def __init__(self, dag: Dag, nodes: Sequence[str], min_bytes: int = MIN_BYTES,
                 move_bytes: int = MOVE_BYTES) -> None:
        if not nodes:
            raise ValueError("`nodes` must not be empty")
        self.dag = dag
        self.nodes = list(nodes)
        self.min_bytes = min_bytes
        self.move_bytes = move_bytes
        self.plan: dict[str, str] = {}       # job -> planned node
        self.sticky: set[str] = set()        # jobs something was staged for: their plan stays
        self.staged: set[tuple[str, str]] = set()  # (path, node) asked for
        self.level = self._levels()          # job -> depth in the DAG: jobs of one level tend to run together
        self._sides: dict[str, list[str]] = {}  # job -> its side outputs
        for side, job in dag.side.items():
            self._sides.setdefault(job, []).append(side)
        self._grown = 1.0                    # `_growth` at the last update

    def _levels(self) -> dict[str, int]:
        level: dict[str, int] = {}
        for job in self.dag.order:  # producers come before their consumers
            below = [level[q] for q in (self.dag.producer(p) for p in self.dag.inputs(job)) if q in level]
            level[job] = 1 + max(below, default=-1)
        return level

    def update(self, holdings: Mapping[str, Mapping[str, int]], done: Iterable[str],
               started: Iterable[str] = (), running: int = 0) -> list[tuple[str, str]]:
        """Plan every job not started yet; the (path, node) copies to make now, most urgent first.

        `holdings` has every produced file the planner may ask about (a missing path: not produced yet);
        `done` the jobs finished, `started` those running (neither is planned again). The first `running`
        ready jobs (every input produced) in the engine's order are taken to be starting now: a copy
        would come too late for them, so nothing is staged for them."""
        finished = set(done) | set(started)
        self._grown = self._growth(holdings, set(done))
        load = {node: 0 for node in self.nodes}
        level_load: dict[int, dict[str, int]] = {}
        for job in self.dag.order:
            if job in finished and job in self.plan:
                load[self.plan[job]] += 1
                level_load.setdefault(self.level[job], dict.fromkeys(self.nodes, 0))[self.plan[job]] += 1
        # each level's jobs per node where their data pulls them (the finished ones where they ran): the
        # balancing below moves a job only out of a level that is uneven in total, not merely so far
        totals = {level: dict(counts) for level, counts in level_load.items()}
        natural_load = dict(load)
        for job in self.dag.order:
            if job in finished:
                continue
            if job not in self.sticky:
                self.plan[job] = self._choose(job, holdings, natural_load)
            natural_load[self.plan[job]] += 1
            totals.setdefault(self.level[job], dict.fromkeys(self.nodes, 0))[self.plan[job]] += 1
        requests: list[tuple[str, str]] = []
        starting = running
        for job in self.dag.order:
            if job in finished:
                continue
            wave = level_load.setdefault(self.level[job], dict.fromkeys(self.nodes, 0))
            if job not in self.sticky:
                self.plan[job] = self._balance(job, self._choose(job, holdings, load), holdings, wave,
                                               totals[self.level[job]])
            node = self.plan[job]
            load[node] += 1
            wave[node] += 1
            if starting > 0 and all(holdings.get(p) or self.dag.producer(p) is None for p in self.dag.inputs(job)):
                starting -= 1
                continue
            for path in self.dag.inputs(job):
                held = holdings.get(path)
                if not held or node in held or (path, node) in self.staged:
                    continue
                if max(held.values()) < self.min_bytes:
                    continue
                requests.append((path, node))
                self.staged.add((path, node))
                self.sticky.add(job)
        return requests

    def _balance(self, job: str, node: str, holdings: Mapping[str, Mapping[str, int]],
                 wave: Mapping[str, int], totals: dict[str, int]) -> str:
        """`node`, or the node with the fewest jobs of this job's level if `node` has more (so far in the
        engine's order, and by at least two in the level's `totals`, updated here) and moving the job
        costs at most `move_bytes` of copies of inputs made already (an input still to be made cannot be
        moved ahead of time: a job waiting for a large one stays; a small one, a header, is read remotely).
        The engine runs jobs in its order, whatever node holds their data: without this, a node holding the
        first inputs of a level runs two jobs while another idles. A level already even in total (the
        event pipeline's documents, half at each site) is left alone: a move there only swaps jobs, each
        swap a copy."""
        order = {n: i for i, n in enumerate(self.nodes)}
        lightest = min(self.nodes, key=lambda n: (wave[n], order[n]))
        if wave[node] <= wave[lightest] or totals.get(node, 0) - totals.get(lightest, 0) < 2:
            return node
        cost = 0
        for path in self.dag.inputs(job):
            held = holdings.get(path)
            if not held:
                if self.dag.producer(path) is None:
                    continue
                # made later, maybe elsewhere, and read remotely then: only a small one may be left behind
                estimate = self._estimate(path, holdings)
                if estimate is None or estimate >= self.min_bytes:
                    return node
                continue
            if lightest not in held and (path, lightest) not in self.staged:
                cost += max(held.values())
        if cost > self.move_bytes:
            return node
        totals[node] -= 1
        totals[lightest] = totals.get(lightest, 0) + 1
        return lightest

    def _read_bytes(self, job: str, holdings: Mapping[str, Mapping[str, int]]) -> int | None:
        sizes = [max(held.values()) for held in (holdings.get(p) for p in self.dag.inputs(job)) if held]
        return sum(sizes) if sizes else None

    def _growth(self, holdings: Mapping[str, Mapping[str, int]], done: set[str]) -> float:
        """Bytes written per byte read by the jobs finished so far (1 before any): outputs still to be made
        are guessed with it (Montage's projections are several times their raw tiles)."""
        read = written = 0
        for job in done:
            made = holdings.get(job)
            inputs = self._read_bytes(job, holdings) if made else None
            if made and inputs:
                read += inputs
                sides = [holdings.get(side) for side in self._sides.get(job, ())]
                written += max(made.values()) + sum(max(held.values()) for held in sides if held)
        return written / read if read else 1.0

    def _estimate(self, path: str, holdings: Mapping[str, Mapping[str, int]]) -> int | None:
        """The size of a file not made yet: the bytes its job reads, times the growth seen so far, shared by
        the job's outputs (None: not known yet). bwa index's five outputs are not five times its genome."""
        producer = self.dag.producer(path)
        read = self._read_bytes(producer, holdings) if producer is not None else None
        if producer is None or read is None:
            return None
        return int(read * self._grown / (1 + len(self._sides.get(producer, ()))))

    def _choose(self, job: str, holdings: Mapping[str, Mapping[str, int]], load: Mapping[str, int]) -> str:
        inputs = self.dag.inputs(job)
        produced = [holdings[p] for p in inputs if holdings.get(p)]
        estimate = (sum(max(h.values()) for h in produced) // len(produced)) if produced else 1
        score = {node: 0 for node in self.nodes}
        held_count = {node: 0 for node in self.nodes}
        pending = {node: 0 for node in self.nodes}
        for path in inputs:
            held = holdings.get(path)
            if held:
                for node, size in held.items():
                    if node in score:
                        score[node] += size
                        held_count[node] += 1
                for node in self.nodes:  # replicas asked for count where they will be
                    if node not in held and (path, node) in self.staged:
                        score[node] += max(held.values())
                        held_count[node] += 1
                continue
            producer = self.dag.producer(path)
            planned = self.plan.get(producer) if producer is not None else None
            if planned is not None:
                guess = self._estimate(path, holdings)
                score[planned] += estimate if guess is None else guess
                pending[planned] += 1
        order = {node: i for i, node in enumerate(self.nodes)}
        unit = max(self.min_bytes, 1)  # bytes below staging size do not decide: small tables sit on one node
        return max(self.nodes, key=lambda n: (score[n] // unit, pending[n], -load[n], held_count[n], -order[n]))


# --- the make database ------------------------------------------------------------------------------


def parse_make_database(text: str, goals: Sequence[str] = ()) -> Dag:
    """The DAG in `make -p` output: the targets with a recipe that `goals` (default: make's default goal)
    need, their prerequisites, in the order make reaches them; targets whose recipe is empty and that
    depend on one such target (`proj/%_area.fits: proj/%.fits ;`) are that target's side outputs."""
    section = text.rsplit("\n# Files\n", 1)[-1].split("\n# files hash-table stats:", 1)[0]
    graph: dict[str, tuple[str, ...]] = {}
    deps: dict[str, tuple[str, ...]] = {}
    empty: dict[str, tuple[str, ...]] = {}
    for entry in section.split("\n\n"):
        lines = entry.strip("\n").split("\n")
        if not lines or lines[0].startswith("# Not a target:"):
            continue
        head = next((line for line in lines if line and not line.startswith(("#", "\t"))), None)
        if head is None or ":" not in head or head.startswith("."):
            continue
        target, _, rest = head.partition(":")
        target = target.strip()
        if rest.startswith(":") or "%" in target or " " in target or not target:
            continue  # double-colon rules, patterns, several targets
        prerequisites = tuple(p for p in rest.split("|", 1)[0].split() if p)
        graph[target] = prerequisites
        recipe = [line for line in lines if line.startswith("\t") and line.strip()]
        if recipe:
            deps[target] = prerequisites
        elif any(line.startswith("#  recipe to execute") for line in lines):
            empty[target] = prerequisites
    if not goals:
        found = re.search(r"^\.DEFAULT_GOAL :?= (.*)$", text, re.MULTILINE)
        goals = found.group(1).split() if found else [t for t in graph if not t.startswith(".")][:1]
    order = _post_order(graph, goals, deps)
    wanted = set(order)
    side = {target: pre[0] for target, pre in empty.items() if len(pre) == 1 and pre[0] in wanted}
    return Dag({t: deps[t] for t in order}, side, tuple(order))


def _post_order(graph: Mapping[str, tuple[str, ...]], goals: Sequence[str],
                jobs: Mapping[str, tuple[str, ...]]) -> list[str]:
    """The jobs `goals` need, in the order make reaches them (depth first, prerequisites first)."""
    seen: set[str] = set()
    order: list[str] = []
    for goal in goals:
        if goal in seen or goal not in graph:
            continue
        seen.add(goal)
        stack: list[tuple[str, Iterator[str]]] = [(goal, iter(graph[goal]))]
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                if node in jobs:
                    order.append(node)
            elif child not in seen and child in graph:
                seen.add(child)
                stack.append((child, iter(graph[child])))
    return order


def make_dag(directory: str, make_args: Sequence[str] = ()) -> tuple[Dag, bool]:
    """The DAG make would build in `directory`, and whether it is complete.

    `make -p -n` prints make's database after walking the whole DAG without running recipes --
    except those that remake included makefiles (and `+` lines), which run even then: with
    SHELL=/bin/false they fail at once instead, and the DAG is then only what the makefiles that
    exist say (incomplete: ask again once they exist).
    """
    result = subprocess.run(["make", "-p", "-n", "SHELL=/bin/false", *make_args], cwd=directory,
                            capture_output=True, text=True, stdin=subprocess.DEVNULL)
    complete = result.returncode == 0  # 2: an error, e.g. an included makefile could not be made
    return parse_make_database(result.stdout), complete


# --- following a run --------------------------------------------------------------------------------


class StagingCluster(Protocol):
    """What the prestager needs of `gmountpy.api.Cluster`."""

    @property
    def nodes(self) -> Any: ...
    def where(self, paths: Any, from_node: Any = None) -> Any: ...
    def stage(self, paths: Any, to: Any, *, concurrency: int = 4, progress: bool | None = None) -> Any: ...


@dataclass
class PrestageStats:
    """What a prestager did in one run (for reports)."""

    staged_files: int = 0
    staged_bytes: int = 0
    failed: int = 0
    dag_jobs: int = 0
    dag_reads: int = 0
    seconds_busy: float = 0.0
    errors: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"staged_files": self.staged_files, "staged_bytes": self.staged_bytes, "failed": self.failed,
                "dag_jobs": self.dag_jobs, "dag_reads": self.dag_reads, "seconds_busy": round(self.seconds_busy, 2),
                "errors": self.errors[:5]}


class Prestager:
    """Stages ahead of one workflow run (see the module doc), in a thread of its own.

    It learns which jobs finished, and where, from the make plugin's placement log (`log_path`) or
    from `notify` (the Snakemake executor), and reads the DAG from `dag_source` when it starts and,
    while that DAG is incomplete, after jobs finished."""

    def __init__(self, cluster: StagingCluster, directory: str, namespace_dir: str, log_path: str | None,
                 dag_source: Callable[[], tuple[Dag, bool]], *, min_bytes: int = MIN_BYTES,
                 concurrency: int = 2, poll: float = 0.2, running: int = 1,
                 reload_after: float = RELOAD_AFTER) -> None:
        self.cluster = cluster
        self.directory = directory          # the workflow directory on this machine (in a mount)
        self.namespace_dir = namespace_dir  # the same directory as a namespace path
        self.log_path = log_path
        self.dag_source = dag_source
        self.min_bytes = min_bytes
        self.poll = poll
        self.running = running  # jobs the engine runs at once (make -j): the first ready ones start now
        self.reload_after = reload_after
        self._dag_read_at = 0.0
        self.stats = PrestageStats()
        self._nodes = [n.name for n in cluster.nodes]
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="prestage")
        self._pending: list[Future[None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="prestage", daemon=True)
        self._lock = threading.Lock()
        self._holdings: Holdings = {}
        self._done: set[str] = set()
        self._planner: Planner | None = None
        self._complete = False
        self._plan_text = ""
        self._notified: list[tuple[str, str]] = []
        self._reload = False
        self._wake = threading.Event()

    def start(self) -> None:
        self._thread.start()

    def notify(self, finished: Iterable[tuple[str, str]], dag_changed: bool = False) -> None:
        """Jobs (target, node) that finished; `dag_changed`: read the DAG again before planning."""
        with self._lock:
            self._notified += list(finished)
            self._reload |= dag_changed
        self._wake.set()

    def planned(self, target: str) -> str | None:
        """The node planned for a job not run yet that something was staged for, or None: elsewhere the
        placement rule, which sees the same holdings, decides (a plan made on load alone, from files
        too small to stage, must not pull a job away from its data)."""
        with self._lock:
            planner = self._planner
            if planner is None or target in self._done or target not in planner.sticky:
                return None
            return planner.plan.get(target)

    def stop(self) -> PrestageStats:
        self._stop.set()
        self._wake.set()
        self._thread.join()
        for future in self._pending:
            future.cancel()
        self._pool.shutdown(wait=True, cancel_futures=True)
        return self.stats

    # --- the loop ---------------------------------------------------------------------------------

    def _run(self) -> None:
        offset = 0
        first = True
        while not self._stop.is_set():
            try:
                finished, offset = self._read_log(offset)
                with self._lock:
                    finished += self._notified
                    reload, self._notified, self._reload = self._reload, [], False
                # the DAG again only when told, or when a job finished that it does not show (an included
                # makefile made: the DAG grows), or, while it is incomplete, at most every `reload_after`
                # seconds after jobs finished (a makefile made as a side output): make reads the whole
                # DAG through the mount, on the head node's CPU, and the copies wait for it
                known = self._planner.dag.deps if self._planner is not None else {}
                unknown = any(target not in known for target, _ in finished)
                stale = not self._complete and time.monotonic() - self._dag_read_at >= self.reload_after
                if first or reload or (finished and (unknown or stale)):
                    first = False
                    self._load_dag()
                if finished:
                    self._step(finished)
            except Exception as exc:  # a failed step must not end the run: the jobs still read remotely
                self.stats.errors.append(f"{type(exc).__name__}: {exc}")
            self._wake.wait(self.poll)
            self._wake.clear()

    def _load_dag(self) -> None:
        dag, complete = self.dag_source()
        self.stats.dag_reads += 1
        self._dag_read_at = time.monotonic()
        if self._planner is not None and len(dag.deps) <= len(self._planner.dag.deps) and not complete:
            return
        old = self._planner
        self._planner = Planner(dag, self._nodes, self.min_bytes)
        if old is not None:  # keep what was decided and asked for
            self._planner.plan.update(old.plan)
            self._planner.sticky |= old.sticky
            self._planner.staged |= old.staged
        self._complete = complete
        self.stats.dag_jobs = len(dag.deps)
        self._refresh([p for job in dag.order for p in dag.inputs(job) if p not in self._holdings])
        self._step([])

    def _read_log(self, offset: int) -> tuple[list[tuple[str, str]], int]:
        """(target, node) of the recipes finished since `offset`, and the new offset."""
        if self.log_path is None:
            return [], offset
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                data = f.read()
        except FileNotFoundError:
            return [], offset
        end = data.rfind(b"\n") + 1
        finished = []
        for line in data[:end].splitlines():
            record = json.loads(line)
            if record.get("status", 0) == 0 and "target" in record:
                finished.append((str(record["target"]), str(record["node"])))
        return finished, offset + end

    def _step(self, finished: list[tuple[str, str]]) -> None:
        planner = self._planner
        if planner is None:
            return
        new_paths = []
        for target, _ in finished:
            self._done.add(target)
            new_paths.append(target)
            new_paths += [side for side, job in planner.dag.side.items() if job == target]
        if new_paths:
            self._refresh(new_paths)
        with self._lock:
            requests = planner.update(self._holdings, self._done, running=self.running)
        if not self._complete:
            # jobs the partial DAG does not show (pattern rules make has not looked at) would be placed
            # by replicas made for the jobs it shows: plan, but copy nothing until the DAG is whole
            planner.staged -= set(requests)
            planner.sticky.clear()
            requests = []
        self._write_plan(planner)
        for path, node in requests:
            self._pending.append(self._pool.submit(self._stage, path, node))

    def _write_plan(self, planner: Planner) -> None:
        """The plan of the jobs not run yet that something was staged for (as `planned`), for the make
        plugin (`planned.planned_node`), replaced atomically."""
        if self.log_path is None:
            return
        text = "".join(f"{job}\t{node}\n" for job, node in planner.plan.items()
                       if job not in self._done and job in planner.sticky)
        if text == self._plan_text:
            return
        path = plan_path(self.log_path)
        tmp = f"{path}.tmp{os.getpid()}"
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(tmp, "w", encoding="utf-8", errors="surrogateescape") as f:
            f.write(text)
        os.replace(tmp, path)
        self._plan_text = text

    def _refresh(self, paths: list[str]) -> None:
        """Ask the cluster who holds `paths` (relative to the workflow directory)."""
        if not paths:
            return
        found = self.cluster.where([self._ns(p) for p in paths])
        with self._lock:
            for path, location in zip(paths, found, strict=True):
                holders = {h.node: int(h.size) for h in location.holders}
                if holders:
                    self._holdings[path] = holders

    def _stage(self, path: str, node: str) -> None:
        if self._stop.is_set():
            return
        started = time.monotonic()
        try:
            report = self.cluster.stage(self._ns(path), to=node, concurrency=1, progress=False)
            copied = [f for f in report.files if f.status == "copied"]
        except Exception as exc:
            self.stats.failed += 1
            self.stats.errors.append(f"staging {path} to {node}: {exc}")
            return
        finally:
            self.stats.seconds_busy += time.monotonic() - started
        self.stats.staged_files += len(copied)
        self.stats.staged_bytes += sum(int(f.size) for f in copied)
        with self._lock:
            held = self._holdings.setdefault(path, {})
            held[node] = max(held.values(), default=0)

    def _ns(self, path: str) -> str:
        return self.namespace_dir.rstrip("/") + "/" + path


@contextmanager
def follow(cluster: StagingCluster, directory: str, namespace_dir: str, log_path: str,
           make_args: Sequence[str] = (), **options: Any) -> Iterator[Prestager]:
    """Stage ahead of a make run in `directory` for the block's duration; `.stats` says what it did."""
    prestager = Prestager(cluster, directory, namespace_dir, log_path, lambda: make_dag(directory, make_args),
                          **options)
    prestager.start()
    try:
        yield prestager
    finally:
        prestager.stop()


class SnakemakeStaging:
    """DAG-aware staging for the Snakemake executor: what it tells a Prestager, in Snakemake's terms.

    A job is known by its first output (relative to the working directory); its other outputs are
    side outputs. The DAG is read from Snakemake's own (`workflow.dag`) in the executor's thread,
    each time a job finished (checkpoints add jobs), and handed to the prestager's thread."""

    def __init__(self, cluster: StagingCluster, directory: str, namespace_dir: str, workflow: Any,
                 running: int = 1) -> None:
        self._workflow = workflow
        self._directory = directory
        self._dag: tuple[Dag, bool] = (Dag({}), True)
        self.prestager = Prestager(cluster, directory, namespace_dir, None, lambda: self._dag, running=running)
        self._dag = (self._read_dag(), True)
        self.prestager.start()

    def _key(self, path: Any) -> str | None:
        text = str(path)
        if "://" in text or not text:
            return None
        if os.path.isabs(text):
            text = os.path.relpath(text, self._directory)
        return text

    def _read_dag(self) -> Dag:
        dag = self._workflow.dag
        deps: dict[str, tuple[str, ...]] = {}
        side: dict[str, str] = {}
        order: list[str] = []
        for level in dag.toposorted(list(dag.needrun_jobs())):
            for job in sorted(level, key=lambda j: j.jobid):
                outputs = [k for k in (self._key(f) for f in job.output) if k]
                if not outputs:
                    continue
                deps[outputs[0]] = tuple(k for k in (self._key(f) for f in job.input) if k)
                side.update({other: outputs[0] for other in outputs[1:]})
                order.append(outputs[0])
        return Dag(deps, side, tuple(order))

    def target(self, job: Any) -> str | None:
        outputs = [k for k in (self._key(f) for f in job.output) if k]
        return outputs[0] if outputs else None

    def planned(self, job: Any) -> str | None:
        target = self.target(job)
        return self.prestager.planned(target) if target is not None else None

    def finished(self, job: Any, node: str) -> None:
        """A job ended well on `node` (call from the executor's thread)."""
        target = self.target(job)
        self._dag = (self._read_dag(), True)
        self.prestager.notify([(target, node)] if target is not None else [], dag_changed=True)

    def stop(self) -> PrestageStats:
        return self.prestager.stop()


def enabled() -> bool:
    """Prestaging is on unless GMOUNT_PRESTAGE=0."""
    return os.environ.get("GMOUNT_PRESTAGE", "1") != "0"
