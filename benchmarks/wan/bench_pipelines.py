"""The reference pipelines across emulated WAN sites: gmountpy's placements beside Gfarm and a central server.

    python -m benchmarks.wan.bench_pipelines montage [--size 16] [--tile-pixels 1024]
        [--rtt-ms 20] [--bandwidth-mbit 100 --bandwidth-mbit 1000]
        [--systems gmountpy-locality,gmountpy-random,gmountpy-single,gfarm,central] [--engine make]
        [--quick] [--out PATH]
    python -m benchmarks.wan.bench_pipelines event [--size 8] [--abstracts 3000] ...

Two sites of one node each (`n1` at tsukuba, `n2` at hongo), the link's RTT and bandwidth
cap as given, every node with a CPU of its own (a cgroup per node: its daemons and the jobs
placed on it run there; benchmarks/wan/cgroups.py) and as many job slots as CPUs: every
system runs as many jobs at once (make -j) as the nodes have slots, `single` one node's.
One emulation per bandwidth; in it, one after another, on the same inputs (made the same
way: each site holds its half, as after acquisition):

- single-directory:  the pipeline on one plain local directory, in n1's cgroup -- the
                     reference every result is checked against, and one node without gmount;
- gmountpy-locality: gmount's make include / Snakemake executor place each job where its
                     inputs are (with DAG-aware staging, `--no-prestage` to switch it off);
- gmountpy-random:   jobs on a node picked by a hash of the job, through gmount's mounts;
- gmountpy-single:   every job on n1, through gmount's mounts;
- gmountpy-nostage:  locality placement without DAG-aware staging (not in the default set);
- gfarm:             Gfarm (gfmd at n1's site, a gfsd and a gfarm2fs mount per node), jobs
                     spread at random over the nodes' gfarm2fs mounts -- a Gfarm user without a
                     locality scheduler; inputs written through the holding node's mount (so on
                     its gfsd);
- central:           an sshd at n1's site serving one directory, sshfs on every node, jobs
                     spread at random; every input on the server.

The engine (make or Snakemake) runs in n1's site and cgroup. Each run records its makespan,
the bytes that crossed the WAN (the hub's counters), gmountpy's own byte counters (reads
local vs remote), the CPU time each node used, and whether its result equals the reference.
The JSON states the command, commit, RTT, bandwidth, the link as measured, and the CPU layout;
a PNG shows makespan and WAN bytes per system.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from . import cgroups, gfarm, sshfs
from . import sites as wan
from .bench_meta import _interrupt, describe_run, log

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
SITES = {"tsukuba": ["n1"], "hongo": ["n2"]}
GMOUNT_SYSTEMS = {"gmountpy-locality": "locality", "gmountpy-random": "random", "gmountpy-single": "single",
                  "gmountpy-nostage": "locality"}  # locality placement without DAG-aware staging
ALL_SYSTEMS = (*GMOUNT_SYSTEMS, "gfarm", "central")
DEFAULT_SYSTEMS = ("gmountpy-locality", "gmountpy-random", "gmountpy-single", "gfarm", "central")
DEFAULTS = {"montage": {"size": 16, "tile_pixels": 1024}, "event": {"size": 8, "abstracts": 3000}}
QUICK = {"montage": {"size": 4, "tile_pixels": 256}, "event": {"size": 4, "abstracts": 200}}
#: gfarm2fs tells gfmd a file's new size when the kernel releases it, just after close() returned:
#: each job waits this long after it ended before make starts the next (else mViewer, started on
#: the other node right after mAdd, found a mosaic.fits of 0 bytes)
GFARM_SETTLE = 0.5


def slots() -> int:
    """Jobs a node runs at once: the CPUs it owns (this machine's CPUs shared out among the nodes)."""
    nodes = sum(len(ns) for ns in SITES.values())
    return max(1, len(os.sched_getaffinity(0)) // nodes)


def cluster_toml(work: Path, name: str, rtt_ms: float, mbit: float | None) -> str:
    lines = [f'name = "{name}"', "create_export = true", "[defaults]", f'export = "{work}/gmount/{{node}}/export"',
             f'mountpoint = "{work}/gmount/{{node}}/mnt"', f"slots = {slots()}"]
    for site, nodes in SITES.items():
        lines += [f"[sites.{site}]", "nodes = [" + ", ".join(f'"{n}"' for n in nodes) + "]"]
    lines += ["[[links]]", f"sites = {json.dumps(list(SITES))}", f"rtt_ms = {rtt_ms}"]
    if mbit:
        lines.append(f"bandwidth_mbit = {mbit}")
    return "\n".join(lines) + "\n"


def measure_link(emu: wan.Emulation, seconds: float = 2.0) -> dict[str, float]:
    """The link as the sites see it: TCP ping-pong RTT (median of 20) and one bulk TCP stream, n1 -> n2."""
    a, b = (nodes[0] for nodes in SITES.values())

    def probe(where: str, *args: str) -> subprocess.Popen[str]:
        return emu.spawn(where, [sys.executable, "-m", "benchmarks.wan.probe", *args], cwd=ROOT,
                         stdout=subprocess.PIPE, text=True)

    result: dict[str, float] = {}
    for port, kind, arg in ((5401, "rtt", "20"), (5402, "bulk", str(seconds))):
        server = probe(b, "serve", emu.address[b], str(port))
        assert server.stdout is not None
        server.stdout.readline()
        out, _ = probe(a, kind, emu.address[b], str(port), arg).communicate(timeout=120)
        data = json.loads(out)
        if kind == "rtt":
            result["rtt_ms"] = round(statistics.median(data["rtt_ms"]), 2)
        else:
            result["bulk_mbit"] = round(data["bytes"] * 8 / data["seconds"] / 1e6, 1)
        server.wait(timeout=10)
        server.stdout.close()
    return result


# --- one run, inside n1's site and cgroup --------------------------------------------------


def worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Runs in the head node's site: the engine must reach the daemons, and runs on the head node's CPUs."""
    from gmountpy.pipelines import pipeline
    from gmountpy.pipelines.runner import check_against, run_on_cluster, run_on_mounts, run_single_directory

    pipe = pipeline(spec["pipeline"])
    options = spec["options"]
    if spec["kind"] == "single-directory":
        return run_single_directory(pipe, spec["size"], spec["engine"], spec["directory"], jobs=1, options=options)
    if spec["kind"] == "gmountpy":
        from gmountpy.api import Cluster

        report = run_on_cluster(Cluster.open(spec["cluster"]), pipe, spec["size"], spec["engine"], spec["placement"],
                                scratch=spec["scratch"], seed=spec["seed"], options=options)
    else:
        report = run_on_mounts(pipe, spec["size"], spec["engine"], spec["mounts"], spec["sites"],
                               system=spec["system"], scratch=spec["scratch"], seed=spec["seed"],
                               inputs_at=spec.get("inputs_at"), options=options, settle=spec.get("settle", 0.0),
                               slots=spec.get("slots", 1), cluster=spec.get("jobs_cluster"))
    difference = check_against(report, pipe, spec["reference"])
    report["check"] = "same as single directory" if difference is None else f"DIFFERS: {difference}"
    return report


def run_worker(emu: wan.Emulation, spec: dict[str, Any], work: Path) -> dict[str, Any]:
    """Start `worker(spec)` in n1's site and cgroup; its report, or WanError with the end of its output."""
    head = SITES[next(iter(SITES))][0]
    spec_file = work / f"spec-{time.monotonic_ns()}.json"
    out_file = spec_file.with_suffix(".out.json")
    spec_file.write_text(json.dumps({**spec, "out": str(out_file)}))
    log_file = spec_file.with_suffix(".log")
    with open(log_file, "w") as log_stream:
        process = emu.spawn(head, [sys.executable, "-m", "benchmarks.wan.bench_pipelines", "worker", str(spec_file)],
                            node=head, cwd=ROOT, stdout=log_stream, stderr=subprocess.STDOUT)
        try:
            process.wait()
        except BaseException:
            process.terminate()
            process.wait(timeout=60)
            raise
    if process.returncode != 0 or not out_file.exists():
        tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-30:])
        raise wan.WanError(f"{spec.get('system', spec['kind'])} run failed (exit {process.returncode}):\n{tail}")
    result: dict[str, Any] = json.loads(out_file.read_text())
    return result


# --- the comparison ----------------------------------------------------------------------------


def measured(emu: wan.Emulation, run: Any) -> dict[str, Any]:
    """Run `run()` and add what the harness saw meanwhile: WAN bytes into each site, CPU seconds per node."""
    groups = emu.node_cgroups()
    load_start = os.getloadavg()[0]
    wan_before = emu.wan_bytes()
    cpu_before = groups.usage_all() if groups is not None else {}
    report: dict[str, Any] = run()
    wan_after = emu.wan_bytes()
    report["wan_bytes"] = {site: wan_after[site] - wan_before.get(site, 0) for site in wan_after}
    report["wan_bytes_total"] = sum(report["wan_bytes"].values())
    report["loadavg_1min"] = [round(load_start, 2), round(os.getloadavg()[0], 2)]  # at start and end: others' work
    if groups is not None:
        after = groups.usage_all()
        report["cpu_seconds_by_node"] = {
            node: round(float(after[node]["cpu_seconds"]) - float(cpu_before[node]["cpu_seconds"]), 2)  # type: ignore[arg-type]
            for node in after}
        report["cpu_by_node_per_cpu"] = {node: after[node]["per_cpu"] for node in after}
    return report


def compare(name: str, size: int, options: dict[str, int], rtt_ms: float, mbit: float | None, systems: list[str],
            engine: str, seed: int, prestage: bool, work: Path, rounds: int = 1) -> dict[str, Any]:
    """One emulation at one bandwidth: the reference, then every system, `rounds` times (every other
    round in reverse order, so that a machine growing busier or quieter favours no system)."""
    cluster = f"wanpipe-{os.getpid()}-{int(mbit or 0)}"
    toml = work / "cluster.toml"
    toml.write_text(cluster_toml(work, cluster, rtt_ms, mbit))
    runs: list[dict[str, Any]] = []
    base = {"pipeline": name, "size": size, "engine": engine, "options": options, "seed": seed}
    with wan.emulate(toml, workdir=work, node_cpus=True) as emu:
        link = measure_link(emu)
        log(f"link: rtt {rtt_ms:g} ms, cap {mbit or 'none'} Mbit/s; measured {link}")
        reference_dir = str(work / "single-directory")
        reference = measured(emu, lambda: run_worker(emu, {**base, "kind": "single-directory",
                                                           "directory": reference_dir}, work))
        reference["system"] = "single-directory"
        log(f"single directory (one node, no gmount): {reference['makespan_s']:.1f} s")
        for round_ in range(rounds):
            for system in (systems if round_ % 2 == 0 else systems[::-1]):
                spec = {**base, "scratch": str(work / "logs"), "reference": reference_dir, "system": system}
                report = run_system(emu, system, spec, work, cluster, prestage)
                report["round"] = round_
                runs.append(report)
        described = emu.link()
    return {"rtt_ms": rtt_ms, "bandwidth_mbit": mbit, "measured_link": link, "cpus": described["cpus"],
            "single_directory": reference, "runs": runs, "rounds": rounds, "ratios": ratios(runs)}


def run_system(emu: wan.Emulation, system: str, spec: dict[str, Any], work: Path, cluster: str,
               prestage: bool) -> dict[str, Any]:
    """One run of one system: its file system brought up on the emulation, the pipeline, then torn down."""
    nodes = [n for ns in SITES.values() for n in ns]
    if system in GMOUNT_SYSTEMS:
        spec = {**spec, "kind": "gmountpy", "cluster": cluster, "placement": GMOUNT_SYSTEMS[system]}
        if system == "gmountpy-nostage" or (system == "gmountpy-locality" and not prestage):
            spec["no_prestage"] = True
        with wan.gmount_cluster(emu):
            return _one(emu, system, spec, work)
    if system == "gfarm":
        peer = gfarm.Gfarm(emu, work, nodes, metadata_node=nodes[0], stat_cache=0)
        with peer.running():
            peer.check()
            spec = {**spec, "kind": "mounts", "mounts": {n: str(peer.mount(n)) for n in nodes}, "sites": SITES,
                    "jobs_cluster": jobs_cluster(cluster, system),
                    "settle": GFARM_SETTLE, "slots": slots()}
            return _one(emu, system, spec, work)
    server = sshfs.CentralServer(emu, work, nodes[0], nodes, name="central", options=sshfs.SSHFS_HANDOFF_OPTIONS)
    with server.running():
        server.check()
        spec = {**spec, "kind": "mounts", "mounts": {n: str(server.mount(n)) for n in nodes}, "sites": SITES,
                "jobs_cluster": jobs_cluster(cluster, system),
                "inputs_at": {n: str(server.data) for n in nodes}, "slots": slots()}
        return _one(emu, system, spec, work)


def jobs_cluster(cluster: str, system: str) -> str:
    """The GMOUNT_CLUSTER of the jobs another file system's run places on a node: a variant of the
    emulation's cluster, so that the cgroup watcher moves each job (GMOUNT_NODE) onto its node's CPUs --
    without it, every job ran in the engine's cgroup, on n1's CPU, whatever node it was placed on."""
    return f"{cluster}-{system}"


def _one(emu: wan.Emulation, system: str, spec: dict[str, Any], work: Path) -> dict[str, Any]:
    log(f"{system}: running ...")
    try:
        report = measured(emu, lambda: run_worker(emu, spec, work))
    except wan.WanError as exc:  # recorded; the other systems still run
        log(f"{system}: FAILED: {exc}")
        return {"system": system, "makespan_s": None, "error": str(exc)[-2000:], "check": "failed"}
    report["system"] = system
    report["seed"] = spec["seed"]  # of the random placements (every system placing at random uses the same)
    report.pop("job_rows", None)  # per-job rows: in the worker's scratch, too long for the published JSON
    remote = report.get("bytes_read", {}).get("remote_fraction")
    log(f"{system}: {report['makespan_s']:.1f} s, WAN {report['wan_bytes_total'] / 2**20:.0f} MiB"
        + (f", jobs read {100 * remote:.1f} % remotely" if remote is not None else "") + f"; {report['check']}")
    return report


def medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Each system's median makespan over its rounds (failed runs left out)."""
    spans: dict[str, list[float]] = {}
    for run in runs:
        if run.get("makespan_s"):
            spans.setdefault(run["system"], []).append(float(run["makespan_s"]))
    return {system: statistics.median(values) for system, values in spans.items()}


def ratios(runs: list[dict[str, Any]]) -> dict[str, float]:
    """gmountpy-locality's (median) makespan over each other system's (the targets are stated against these)."""
    span = medians(runs)
    ours = span.get("gmountpy-locality")
    if not ours:
        return {}
    return {f"locality/{s.removeprefix('gmountpy-')}": round(ours / v, 3) for s, v in span.items()
            if s != "gmountpy-locality" and v}


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = result["settings"]
    fig, axes = plt.subplots(len(settings), 2, figsize=(12, 3.6 * len(settings)), squeeze=False)
    for row, setting in zip(axes, settings, strict=True):
        runs = [setting["single_directory"], *setting["runs"]]
        systems = list(dict.fromkeys(r["system"] for r in runs))
        span = medians(runs)
        labels = [s.replace("gmountpy-", "gmountpy\n") for s in systems]
        colors = ["grey" if s == "single-directory" else "tab:green" if s == "gmountpy-locality" else
                  "tab:blue" if s.startswith("gmountpy") else "tab:red" for s in systems]
        cap = f"{setting['bandwidth_mbit']:g} Mbit/s" if setting["bandwidth_mbit"] else "no cap"
        row[0].bar(labels, [span.get(s, 0) for s in systems], color=colors)  # a failed run: no bar
        wan_mib: dict[str, list[float]] = {}
        for run in runs:
            i = systems.index(run["system"])
            if run.get("makespan_s"):
                row[0].plot(i, run["makespan_s"], "k.", markersize=4)  # each round
            wan_mib.setdefault(run["system"], []).append(run.get("wan_bytes_total", 0) / 2**20)
        row[0].set_ylabel("makespan (s; bar: median)")
        row[0].set_title(f"makespan — RTT {setting['rtt_ms']:g} ms, {cap}", fontsize=9)
        bars = row[1].bar(labels, [statistics.median(wan_mib[s]) for s in systems], color=colors)
        for bar, system in zip(bars, systems, strict=True):
            remote = [r["bytes_read"]["remote_fraction"] for r in runs if r["system"] == system and r.get("bytes_read")]
            if remote:  # gmountpy's own counters: the share of the jobs' reads that came from another node
                row[1].annotate(f"jobs {100 * statistics.median(remote):.0f}% remote", (bar.get_x(), bar.get_height()),
                                fontsize=6, va="bottom")
        row[1].set_ylabel("MiB across the WAN")
        row[1].set_title("bytes that crossed the WAN (hub counters)", fontsize=9)
        for ax in row:
            ax.tick_params(axis="x", labelsize=7)
    size = result["size"]
    fig.suptitle(f"{result['pipeline']} ({size} {'tiles' if result['pipeline'] == 'montage' else 'documents'}, "
                 f"{result['options']}), 2 sites x 1 node, each with its own CPU — commit {result['commit'][:10]}",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    raw = sys.argv[1:] if argv is None else argv
    if raw[:1] == ["worker"]:
        spec = json.loads(Path(raw[1]).read_text())
        if spec.get("no_prestage"):
            os.environ["GMOUNT_PRESTAGE"] = "0"
        report = worker(spec)
        Path(spec["out"]).write_text(json.dumps(report))
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pipeline", choices=["montage", "event"])
    parser.add_argument("--size", type=int, help="tiles (montage) or documents (event)")
    parser.add_argument("--tile-pixels", type=int, help="montage: side of a tile (default 1024)")
    parser.add_argument("--abstracts", type=int, help="event: abstracts per document (default 3000, ~3 MiB)")
    parser.add_argument("--rtt-ms", type=float, default=20.0)
    parser.add_argument("--bandwidth-mbit", type=float, action="append",
                        help="a link cap; give it twice for two emulations (default 100 and 1000)")
    parser.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS),
                        help=f"comma-separated, from {', '.join(ALL_SYSTEMS)} (gmountpy-nostage: locality placement "
                        "without DAG-aware staging)")
    parser.add_argument("--engine", choices=["make", "snakemake"], default="make")
    parser.add_argument("--seed", type=int, default=1, help="seed of the random placements")
    parser.add_argument("--no-prestage", action="store_true", help="gmountpy-locality without DAG-aware staging")
    parser.add_argument("--rounds", type=int, default=1, help="run every system this many times, every other "
                        "round in reverse order; ratios of medians (default 1)")
    parser.add_argument("--quick", action="store_true", help="small inputs (a check that everything runs)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(raw)
    sizes = dict((QUICK if args.quick else DEFAULTS)[args.pipeline])
    if args.size:
        sizes["size"] = args.size
    if args.tile_pixels and args.pipeline == "montage":
        sizes["tile_pixels"] = args.tile_pixels
    if args.abstracts and args.pipeline == "event":
        sizes["abstracts"] = args.abstracts
    size = sizes.pop("size")
    systems = [s for s in args.systems.split(",") if s]
    if unknown := set(systems) - set(ALL_SYSTEMS):
        parser.error(f"unknown systems {sorted(unknown)} (known: {', '.join(ALL_SYSTEMS)})")
    for why in (wan.problem(), cgroups.problem()):
        if why is not None:
            log(f"cannot run: {why}")
            return 1
    if "gfarm" in systems and (why := gfarm.ensure_installed(log)) is not None:
        log(f"gfarm skipped: {why}")
        systems.remove("gfarm")
    if "central" in systems and (why := sshfs.problem()) is not None:
        log(f"central skipped: {why}")
        systems.remove("central")
    out = args.out or RESULTS / f"wan_pipeline_{args.pipeline}.json"
    signal.signal(signal.SIGTERM, _interrupt)
    result: dict[str, Any] = {"benchmark": "wan_pipeline", "pipeline": args.pipeline, "size": size, "options": sizes,
                              "engine": args.engine, "systems": systems, "prestage": not args.no_prestage,
                              "seed": args.seed,
                              "command": "python -m benchmarks.wan.bench_pipelines " + shlex.join(raw),
                              **describe_run(), "settings": []}
    for mbit in args.bandwidth_mbit or [100.0, 1000.0]:
        with tempfile.TemporaryDirectory(prefix="gmw-pipe-") as tmp, ExitStack() as stack:
            work = Path(tmp)
            old_state = os.environ.get("XDG_STATE_HOME")
            os.environ["XDG_STATE_HOME"] = str(work / "state")
            stack.callback(lambda old=old_state: os.environ.__setitem__("XDG_STATE_HOME", old) if old
                           else os.environ.pop("XDG_STATE_HOME", None))
            setting = compare(args.pipeline, size, sizes, args.rtt_ms, mbit, systems, args.engine, args.seed,
                              not args.no_prestage, work, args.rounds)
        result["settings"].append(setting)
        log(f"{mbit:g} Mbit/s: " + ", ".join(f"{k} {v:.2f}" for k, v in setting["ratios"].items()))
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1))
    result["loadavg_end"] = os.getloadavg()
    out.write_text(json.dumps(result, indent=1))
    plot(result, out.with_suffix(".png"))
    log(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
