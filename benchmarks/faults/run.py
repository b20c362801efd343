"""One soak: bring the cluster up, run the workload under a seeded schedule of faults, check, report.

The schedule (which fault, on which node, for how long, and the pauses between
them) comes from the seed alone; what the workload meets in between depends on
timing, as in any soak. Each kind of fault the configuration names is injected
at least once, in a shuffled order, before any repeats.
"""

from __future__ import annotations

import errno
import json
import os
import platform
import random
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .check import (
    Sampler,
    exports_size,
    outside_exports,
    scan_logs,
    snapshot,
    stray_in_exports,
    twins_and_leftovers,
    verify_everywhere,
)
from .cluster import NODES, SITES, SoakCluster
from .inject import Injector, homes_of
from .judge import Fault, judge
from .work import (
    ApiWriter,
    Appender,
    Context,
    Ledger,
    Mover,
    Reader,
    ShellWriter,
    Sources,
    Worker,
    WorkflowRunner,
    shared_directories,
)

ROOT = Path(__file__).resolve().parents[2]
KINDS = ("kill_home", "kill_backup", "kill_home_and_backup", "kill_any", "disk_full", "drop", "delay", "conn_kill")


@dataclass
class SoakConfig:
    seconds: float = 150.0            # the faulty phase; warm-up and the quiet tail come on top
    seed: int = 28
    warmup: float = 10.0              # load without faults first (any error there is a failure)
    quiet_tail: float = 25.0          # load without faults last, after the grace of the last fault
    grace: float = 10.0               # after a fault is healed, its errors are still documented this long
    faults: tuple[str, ...] = KINDS
    hold: tuple[float, float] = (3.0, 8.0)
    gap: tuple[float, float] = (4.0, 10.0)
    disk_mib: int = 256
    rtt_ms: float = 10.0
    sources: int = 24
    writer_pause: tuple[float, float] = (0.1, 0.6)
    reader_pause: tuple[float, float] = (0.2, 0.8)
    api_pause: tuple[float, float] = (0.2, 0.8)
    appenders: tuple[str, ...] = ("n1", "n3")   # O_APPEND writers into files held by n4 (the small disk)
    appender_pause: tuple[float, float] = (0.3, 1.5)
    mover_pause: tuple[float, float] = (2.0, 6.0)
    workflows: tuple[str, ...] = ("make", "snakemake")
    workflow_pause: tuple[float, float] = (10.0, 30.0)
    fd_growth_bound: int = 32         # descriptors a daemon may hold more after the soak than before it
    rss_growth_bound_mib: int = 96    # and resident MiB
    tuning: str = ""                  # [tuning] lines for the cluster (default: none, as a user gets it)


@dataclass
class Planned:
    kind: str
    params: dict[str, Any]
    hold: float
    gap: float


def plan(config: SoakConfig, rng: random.Random, targets: dict[str, tuple[str, str | None]]) -> list[Planned]:
    """The fault schedule for `config.seconds` (targets: shared directory -> (home, backup))."""
    out: list[Planned] = []
    budget = config.seconds
    kinds: list[str] = []
    while budget > 0:
        if not kinds:
            kinds = list(config.faults)
            rng.shuffle(kinds)
        kind = kinds.pop()
        hold, gap = rng.uniform(*config.hold), rng.uniform(*config.gap)
        directory = rng.choice(sorted(targets))
        home, backup = targets[directory]
        params: dict[str, Any] = {}
        if kind == "kill_home":
            params = {"node": home, "why": f"home of {directory}"}
        elif kind == "kill_backup":
            params = {"node": backup or home, "why": f"backup of {directory}"}
        elif kind == "kill_home_and_backup":
            params = {"node": home, "also": [backup] if backup else [], "why": f"home and backup of {directory}"}
        elif kind == "kill_any":
            params = {"node": rng.choice(NODES), "why": "any node"}
        elif kind == "drop":
            params = {"site": rng.choice(sorted(SITES)), "probability": rng.choice([0.05, 0.3, 1.0])}
        elif kind == "delay":
            params = {"site": rng.choice(sorted(SITES)), "ms": rng.choice([100.0, 800.0, 6000.0])}
        elif kind == "conn_kill":
            params = {"node": rng.choice(NODES), "site": rng.choice(sorted(SITES)), "bursts": rng.randint(2, 5)}
        out.append(Planned(kind, params, hold, gap))
        budget -= hold + gap + (8.0 if kind.startswith("kill") else 0.0)  # a restart takes about that
    return out


@dataclass
class Report:
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def failures(self) -> int:
        return int(self.data["failures"]["total"])


def git(*args: str) -> str:
    result = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    return result.stdout.strip()


def run_soak(config: SoakConfig, base: Path, log: Any = None) -> Report:
    """Run one soak in `base` (a fresh directory); the report's `failures.total` is the verdict."""
    say = log or (lambda message: print(f"[soak {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr,
                                        flush=True))
    rng = random.Random(config.seed)
    t_begin = time.time()
    load_start = os.getloadavg()
    sources = Sources(base / "scratch", random.Random(f"{config.seed}-sources"), config.sources)
    name = f"soak{os.getpid()}"
    faults: list[Fault] = []
    lock = threading.Lock()
    harness_failures: list[tuple[str, str]] = []

    def note_failure(what: str, detail: str) -> None:
        say(f"FAILURE {what}: {detail[:300]}")
        with lock:
            harness_failures.append((what, detail))

    ledger = Ledger()
    with SoakCluster(base / "cluster", name, disk_mib=config.disk_mib, rtt_ms=config.rtt_ms,
                     tuning=config.tuning) as cluster:
        spec = cluster.spec
        assert spec is not None
        tuning = spec.tuning
        say(f"cluster {name} up: {', '.join(NODES)} in sites {dict(SITES)}, {config.rtt_ms} ms apart")
        targets = {}
        for directory, creator in shared_directories().items():
            (cluster.mount(creator) / directory).mkdir(parents=True)
            targets[directory] = homes_of(cluster, "/" + directory, creator)
        schedule = plan(config, rng, targets)
        injector = Injector(cluster, faults, lock, note_failure)
        time.sleep(max(1.0, tuning.attr_ttl))
        before = snapshot(cluster)
        stop = threading.Event()
        sampler = Sampler(cluster, faults, lock, stop)
        context = Context(cluster, ledger, stop, config.seed)
        workers: list[Worker] = []
        for node in NODES:
            workers.append(ShellWriter(context, config.writer_pause, node, sources))
            workers.append(Reader(context, config.reader_pause, node, tuning.attr_ttl))
        workers.append(ApiWriter(context, config.api_pause, sources))
        workers += [Appender(context, config.appender_pause, node) for node in config.appenders]
        workers.append(Mover(context, config.mover_pause, sources))
        if config.workflows:
            workers.append(WorkflowRunner(context, config.workflow_pause, list(config.workflows), sources))
        t_load = time.time()
        sampler.start()
        for worker in workers:
            worker.start()
        try:
            say(f"load on every node; faults after {config.warmup:.0f} s: "
                + ", ".join(f"{p.kind}{p.params}" for p in schedule))
            stop.wait(config.warmup)
            deadline = t_load + config.warmup + config.seconds
            for index, planned in enumerate(schedule):
                if time.time() > deadline and index >= len(config.faults):  # each kind once, whatever the time
                    break
                say(f"fault: {planned.kind} {planned.params} for {planned.hold:.1f} s")
                try:
                    inject(injector, planned, stop)
                except RuntimeError as exc:
                    note_failure("harness", f"{planned.kind}: {exc}")
                    break
                stop.wait(planned.gap)
            last_healed = max((f.end or time.time() for f in faults), default=time.time())
            stop.wait(max(0.0, last_healed + config.grace + config.quiet_tail - time.time()))
        finally:
            say("stopping the load")
            stop.set()
            for worker in workers:
                worker.join(timeout=330)
            sampler.join(timeout=10)
            try:
                injector.heal_everything()
            except RuntimeError as exc:
                note_failure("harness", f"could not undo the faults: {exc}")
        t_end_load = time.time()
        for worker in workers:
            if worker.is_alive():
                note_failure("harness", f"{worker.name} did not stop within 330 s")
            if worker.crash:
                note_failure("harness", worker.crash)
        time.sleep(config.grace)  # every node up again: let marks and leases run out
        after = snapshot(cluster)
        files = sorted(ledger.files.values(), key=lambda e: e.path)
        say(f"checking {len(files)} files from every node")
        checked = verify_everywhere(cluster, files, dict(ledger.links), set(ledger.gone))
        twins, leftovers = twins_and_leftovers(cluster)
        stray = stray_in_exports(cluster)
        logs = scan_logs(cluster, t_begin, tuning.rpc_timeout)
        stored = exports_size(cluster)
        restarts = {n: len({u.pid for _, node, u in sampler.samples if node == n}) - 1 for n in NODES}
        peaks = sampler.peaks()
    outside = outside_exports(cluster) + injector.quarantined + stray
    t_done = time.time()
    all_faults = faults + logs.slow
    report = _report(config, ledger, faults, all_faults, checked, twins, leftovers, outside, before, after, peaks,
                     restarts, logs, harness_failures, stored,
                     timing={"start": t_begin, "load": t_load, "load_end": t_end_load, "done": t_done},
                     load=(load_start, os.getloadavg()))
    say(f"{report.data['operations']['total']} operations, {report.data['faults']['total']} faults, "
        f"{checked.files} files checked from {len(NODES)} nodes: {report.failures} failures")
    return report


def inject(injector: Injector, planned: Planned, stop: threading.Event) -> None:
    p = planned.params
    if planned.kind.startswith("kill"):
        injector.kill(p["node"], planned.hold, p["why"], stop, also=p.get("also", ()))
    elif planned.kind == "disk_full":
        injector.disk_full(planned.hold, stop)
    elif planned.kind == "drop":
        injector.drop(p["site"], p["probability"], planned.hold, stop)
    elif planned.kind == "delay":
        injector.delay(p["site"], p["ms"], planned.hold, stop)
    elif planned.kind == "conn_kill":
        injector.conn_kill(p["node"], p["site"], p["bursts"], stop)
    else:
        raise ValueError(f"unknown fault kind {planned.kind!r}")


def _report(config: SoakConfig, ledger: Ledger, injected: list[Fault], all_faults: list[Fault], checked: Any,
            twins: list[str], leftovers: list[str], outside: list[str], before: dict[str, Any],
            after: dict[str, Any], peaks: dict[str, dict[str, int]], restarts: dict[str, int], logs: Any,
            harness_failures: list[tuple[str, str]], stored: dict[str, int], timing: dict[str, float],
            load: tuple[tuple[float, ...], tuple[float, ...]]) -> Report:
    t0 = timing["load"]
    by_kind: dict[str, Counter[str]] = defaultdict(Counter)
    documented: Counter[str] = Counter()
    covered_by: Counter[str] = Counter()
    failures: list[dict[str, Any]] = []
    now = time.time()
    longest: dict[str, float] = defaultdict(float)
    examples: dict[tuple[str, str, str], str] = {}  # (operation, errnos, faults) -> its first message
    for op in ledger.ops:
        longest[op.kind] = max(longest[op.kind], op.end - op.start)
        if op.ok:
            by_kind[op.kind]["ok"] += 1
            continue
        verdict = judge(op, all_faults, config.grace, now)
        if verdict.documented:
            by_kind[op.kind]["documented_error" if op.error else "tolerated_under_fault"] += 1
            for code in op.errnos:
                documented[errno.errorcode.get(code, str(code))] += 1
            covered_by.update(verdict.kinds)
            example = (op.kind, ",".join(errno.errorcode.get(c, str(c)) for c in op.errnos), ",".join(verdict.kinds))
            examples.setdefault(example, (op.error or op.unless_fault)[-300:])
        else:
            by_kind[op.kind]["failure"] += 1
            failures.append({"category": "operation", "kind": op.kind, "node": op.node,
                             "at_s": round(op.start - t0, 2), "took_s": round(op.end - op.start, 2),
                             "why": verdict.why})
    failures += [{"category": "unreadable or wrong after the soak", "why": f} for f in checked.failures]
    failures += [{"category": "twin", "why": t} for t in twins]
    failures += [{"category": "leftover temporary file", "why": leftover} for leftover in leftovers]
    failures += [{"category": "bytes outside exports", "why": o} for o in outside]
    failures += [{"category": "daemon internal error", "why": e} for e in logs.internal_errors]
    failures += [{"category": what, "why": detail[:2000]} for what, detail in harness_failures
                 if what != "bytes outside exports"]  # (those are in `outside` already)
    daemons = {}
    for node in NODES:
        b, a = before.get(node), after.get(node)
        entry: dict[str, Any] = {"restarts": restarts.get(node, 0)}
        if b is not None and a is not None:
            entry.update({"fds_before": b.fds, "fds_after": a.fds, "rss_mib_before": round(b.rss / 2**20, 1),
                          "rss_mib_after": round(a.rss / 2**20, 1)})
            if a.fds - b.fds > config.fd_growth_bound:
                failures.append({"category": "descriptor growth", "why": f"{node}: {b.fds} -> {a.fds}"})
            if (a.rss - b.rss) / 2**20 > config.rss_growth_bound_mib:
                failures.append({"category": "memory growth",
                                 "why": f"{node}: {b.rss / 2**20:.0f} -> {a.rss / 2**20:.0f} MiB"})
        else:
            failures.append({"category": "daemon not running at the end", "why": node})
        if node in peaks:
            entry.update({"fds_peak": peaks[node]["fds"], "rss_mib_peak": round(peaks[node]["rss"] / 2**20, 1)})
        daemons[node] = entry
    categories = Counter(f["category"] for f in failures)
    fault_kinds = Counter(f.kind for f in injected)
    data = {
        "config": {k: v for k, v in asdict(config).items()},
        "seconds": {"setup": round(timing["load"] - timing["start"], 1),
                    "load": round(timing["load_end"] - timing["load"], 1),
                    "checks_and_teardown": round(timing["done"] - timing["load_end"], 1)},
        "operations": {"total": len(ledger.ops), "by_kind": {k: dict(v) for k, v in sorted(by_kind.items())},
                       "longest_s": {k: round(v, 2) for k, v in sorted(longest.items())}},
        "faults": {"total": len(injected), "by_kind": dict(sorted(fault_kinds.items())),
                   "list": [f.to_dict(t0) for f in injected],
                   "timeouts_logged_by_daemons": len(logs.slow), "peer_marked_down_logged": logs.unavailable},
        "files_checked": checked.files,
        "reads_checked": checked.reads,
        "bytes_in_exports": stored,
        "documented_errors": {"by_errno": dict(documented.most_common()), "by_fault": dict(covered_by.most_common()),
                              "examples": [{"operation": k, "errnos": e, "under": f, "message": m}
                                           for (k, e, f), m in sorted(examples.items())]},
        "daemons": daemons,
        "bounds": {"fd_growth": config.fd_growth_bound, "rss_growth_mib": config.rss_growth_bound_mib},
        "event_loop_stall_reports": logs.stall_reports,
        "failures": {"total": len(failures), "by_category": dict(categories.most_common()),
                     "list": failures[:200]},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "loadavg_before": [round(x, 2) for x in load[0]],
                    "loadavg_after": [round(x, 2) for x in load[1]]},
    }
    return Report(data)


def write_report(report: Report, path: Path, command: str, note: str = "") -> None:
    document = {"command": command, "commit": git("rev-parse", "HEAD"), **({"note": note} if note else {}),
                "uncommitted_changes": bool(git("status", "--porcelain", "--", "gmountpy", "benchmarks")),
                "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **report.data}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=1) + "\n")

