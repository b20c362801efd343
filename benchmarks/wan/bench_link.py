"""Calibrate the emulated link: TCP ping-pong RTT at 2, 10, 20 ms targets and bulk TCP at 10 ms.

    python -m benchmarks.wan.bench_link [--rtts 2,10,20] [--bulk-rtt 10] [--seconds 5] [--out PATH]

Targets (issue 12): median RTT within 10% of the target; bulk TCP at 10 ms RTT
>= 1 GB/s. The bulk sender is a Python loop (benchmarks.wan.probe), so on a
busy machine it may be the limit rather than the link.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from . import sites as wan
from .bench_meta import describe_run, log

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def measure(rtt_ms: float, bulk_seconds: float, work: Path) -> dict[str, Any]:
    toml = work / f"link{rtt_ms:g}.toml"
    toml.write_text("\n".join([f'name = "wanlink-{rtt_ms:g}"', "create_export = true", "[defaults]",
                               f'export = "{work}/{{node}}/e"', f'mountpoint = "{work}/{{node}}/m"',
                               '[sites.a]', 'nodes = ["a1"]', '[sites.b]',
                               'nodes = ["b1"]', "[[links]]", 'sites = ["a", "b"]', f"rtt_ms = {rtt_ms}", ""]))
    row: dict[str, Any] = {"target_rtt_ms": rtt_ms}
    with wan.emulate(toml, workdir=work) as emu:
        def probe(where: str, *args: str) -> subprocess.Popen[str]:
            return emu.spawn(where, [sys.executable, "-m", "benchmarks.wan.probe", *args], cwd=ROOT,
                             stdout=subprocess.PIPE, text=True)

        server = probe("b", "serve", emu.address["b1"], "5301")
        assert server.stdout is not None
        server.stdout.readline()
        out, _ = probe("a", "rtt", emu.address["b1"], "5301", "200").communicate(timeout=120)
        samples = json.loads(out)["rtt_ms"]
        row.update(median_rtt_ms=statistics.median(samples), p10_rtt_ms=statistics.quantiles(samples, n=10)[0],
                   p90_rtt_ms=statistics.quantiles(samples, n=10)[-1])
        row["rtt_error"] = row["median_rtt_ms"] / rtt_ms - 1
        server.wait(timeout=10)
        server.stdout.close()
        if bulk_seconds > 0:
            server = probe("b", "serve", emu.address["b1"], "5302")
            assert server.stdout is not None
            server.stdout.readline()
            out, _ = probe("a", "bulk", emu.address["b1"], "5302", str(bulk_seconds)).communicate(timeout=120)
            bulk = json.loads(out)
            row["bulk_GB_per_s"] = bulk["bytes"] / bulk["seconds"] / 1e9
            server.wait(timeout=10)
            server.stdout.close()
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rtts", default="2,10,20")
    parser.add_argument("--bulk-rtt", type=float, default=10.0)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--quick", action="store_true", help="2 s of bulk transfer")
    parser.add_argument("--out", type=Path, default=RESULTS / "wan_link.json")
    args = parser.parse_args(argv)
    if (why := wan.problem()) is not None:
        log(f"cannot run: {why}")
        return 1
    run = describe_run()
    rows = []
    with tempfile.TemporaryDirectory(prefix="gmw-link-") as tmp:
        for rtt in [float(r) for r in args.rtts.split(",")]:
            row = measure(rtt, (2.0 if args.quick else args.seconds) if rtt == args.bulk_rtt else 0, Path(tmp))
            rows.append(row)
            log(f"target {rtt:g} ms: median {row['median_rtt_ms']:.2f} ms ({row['rtt_error']:+.1%})"
                + (f", bulk {row['bulk_GB_per_s']:.2f} GB/s" if "bulk_GB_per_s" in row else ""))
    result = {"benchmark": "wan_link", **run, "results": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
