"""`gmount up` / `gmount down` time for 4, 16 and 32 nodes on 4 emulated WAN sites.

    python -m benchmarks.wan.bench_deploy [--quick] [--nodes 4,16,32] [--repeats 3] [--out PATH]

Nodes are spread evenly over the 4 sites of bench_meta (RTTs 5-25 ms); every
daemon runs in its site's namespace; the launcher is the local one (no SSH),
so this is the time to start the daemons, exchange the peer table and mount,
and to stop and unmount. All daemons share this machine's CPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from . import sites as wan
from .bench_meta import LINKS, _interrupt, describe_run, log

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def cluster_toml(work: Path, name: str, nodes: int) -> str:
    per_site = max(1, nodes // 4)
    lines = [f'name = "{name}"', "create_export = true", "[defaults]", f'export = "{work}/{{node}}/export"',
             f'mountpoint = "{work}/{{node}}/mnt"', "[tuning]", "ready_timeout = 120"]
    for i in range(1, 5):
        lines += [f"[sites.s{i}]", "nodes = [" + ", ".join(f'"s{i}n{k}"' for k in range(per_site)) + "]"]
    for a, b, rtt in LINKS:
        lines += ["[[links]]", f'sites = ["{a}", "{b}"]', f"rtt_ms = {rtt}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="4,16,32")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="4 and 8 nodes, one repeat")
    parser.add_argument("--out", type=Path, default=RESULTS / "wan_deploy.json")
    args = parser.parse_args(argv)
    sizes = [4, 8] if args.quick else [int(n) for n in args.nodes.split(",")]
    repeats = 1 if args.quick else args.repeats
    if (why := wan.problem()) is not None:
        log(f"cannot run: {why}")
        return 1
    signal.signal(signal.SIGTERM, _interrupt)
    from gmountpy import launch
    from gmountpy.cluster.config import load_spec

    run = describe_run()
    rows: list[dict[str, Any]] = []
    old_state = os.environ.get("XDG_STATE_HOME")
    for nodes in sizes:
        with tempfile.TemporaryDirectory(prefix="gmw-deploy-") as tmp, ExitStack() as stack:
            work = Path(tmp)
            os.environ["XDG_STATE_HOME"] = str(work / "state")
            stack.callback(lambda: os.environ.__setitem__("XDG_STATE_HOME", old_state) if old_state
                           else os.environ.pop("XDG_STATE_HOME", None))
            (work / "cluster.toml").write_text(cluster_toml(work, f"wandeploy-{os.getpid()}", nodes))
            started = time.monotonic()
            emu = stack.enter_context(wan.emulate(work / "cluster.toml", workdir=work))
            emulation_s = time.monotonic() - started
            spec = load_spec(emu.cluster_file)
            ups, downs = [], []
            for _ in range(repeats):
                emu.gmount_up = True
                emu.save()
                t0 = time.monotonic()
                launch.up(spec)
                ups.append(time.monotonic() - t0)
                t0 = time.monotonic()
                problems = launch.down(spec.name)
                downs.append(time.monotonic() - t0)
                if problems:
                    raise wan.WanError(f"gmount down with {nodes} nodes: {problems}")
            row = {"nodes": len(spec.nodes), "sites": len(spec.sites), "up_s": statistics.median(ups),
                   "down_s": statistics.median(downs), "up_samples": ups, "down_samples": downs,
                   "emulation_up_s": emulation_s}
            rows.append(row)
            log(f"{row['nodes']:>3} nodes: up {row['up_s']:.2f}s down {row['down_s']:.2f}s "
                f"(emulation {emulation_s:.2f}s)")
    run["loadavg_end"] = os.getloadavg()
    result = {"benchmark": "wan_deploy", **run, "repeats": repeats, "links": LINKS, "results": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    log(f"wrote {args.out}")
    print("| nodes | up s | down s |\n|---:|---:|---:|")
    for row in rows:
        print(f"| {row['nodes']} | {row['up_s']:.2f} | {row['down_s']:.2f} |")
    plot(result, args.out.with_suffix(".png"))
    return 0


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["results"]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([r["nodes"] for r in rows], [r["up_s"] for r in rows], marker="o", label="gmount up")
    ax.plot([r["nodes"] for r in rows], [r["down_s"] for r in rows], marker="o", label="gmount down")
    ax.set_xlabel("nodes (4 emulated sites)")
    ax.set_ylabel("seconds (median)")
    ax.legend()
    ax.set_title(f"deploy time, {os.cpu_count()} CPUs shared by all daemons — commit {result['commit'][:10]}",
                 fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
