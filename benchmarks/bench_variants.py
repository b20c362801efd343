#!/usr/bin/env python3
"""A bwa/samtools/bcftools variant-calling workflow (the Snakemake tutorial's shape) on gmount and plain.

The genome is random DNA this script writes; each sample's reads are made
from it with `wgsim` (Debian's samtools); one sample's reads per node (n2,
n3, n4), the genome on n1. The Snakefile: `bwa index` -> per sample `bwa
mem | samtools view` -> `samtools sort` -> `samtools index` -> one
`bcftools mpileup | bcftools call` over all samples.

Run the same way, in the same benchmark run:
- `gmount`: plain `snakemake -j4` inside n1's mount of a local 4-node,
  2-site cluster, with the workflow profile `gmount snakemake-profile`
  writes (the gmount executor): every per-sample job runs on its sample's
  node;
- `plain`: plain `snakemake -j4` in a plain directory, no gmount.
Outputs are compared byte for byte (BAMs, indexes, the VCF: tools run with
--no-PG / --no-version, so no date or path is written into them).

    python benchmarks/bench_variants.py [--genome-kb 1000] [--reads 200000] [--repeats 2]
        [--out benchmarks/results/variants.json]

Needs the Debian packages bwa, samtools (with wgsim) and bcftools.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _jobs import local_cluster, log, write_document  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "variants.json"
TOOLS = ("bwa", "samtools", "bcftools", "wgsim")
#: sample -> the node whose export holds its reads
SAMPLES = {"A": "n2", "B": "n3", "C": "n4"}
SNAKEFILE = """\
SAMPLES = ["A", "B", "C"]
INDEX = multiext("data/genome.fa", ".amb", ".ann", ".bwt", ".pac", ".sa")

rule all:
    input: "calls/all.vcf", expand("sorted_reads/{sample}.bam.bai", sample=SAMPLES)

rule bwa_index:
    input: "data/genome.fa"
    output: INDEX
    log: "logs/bwa_index.log"
    shell: "bwa index {input} 2> {log}"

rule bwa_map:
    input: fa="data/genome.fa", index=INDEX, reads="data/samples/{sample}.fastq"
    output: temp("mapped_reads/{sample}.bam")
    log: "logs/bwa_map/{sample}.log"
    shell: "bwa mem {input.fa} {input.reads} 2> {log} | samtools view --no-PG -b - > {output}"

rule samtools_sort:
    input: "mapped_reads/{sample}.bam"
    output: protected("sorted_reads/{sample}.bam")
    shell: "samtools sort --no-PG -T sorted_reads/{wildcards.sample} -O bam {input} > {output}"

rule samtools_index:
    input: "sorted_reads/{sample}.bam"
    output: "sorted_reads/{sample}.bam.bai"
    shell: "samtools index {input}"

rule bcftools_call:
    input:
        fa="data/genome.fa",
        bam=expand("sorted_reads/{sample}.bam", sample=SAMPLES),
        bai=expand("sorted_reads/{sample}.bam.bai", sample=SAMPLES)
    output: "calls/all.vcf"
    shell: "bcftools mpileup --no-version -f {input.fa} {input.bam} | bcftools call --no-version -mv - > {output}"
"""
#: what both runs must produce identically
OUTPUTS = ["calls/all.vcf", *(f"sorted_reads/{s}.bam" for s in SAMPLES),
           *(f"sorted_reads/{s}.bam.bai" for s in SAMPLES)]


def tools_problem() -> str | None:
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    return f"missing {', '.join(missing)} (Debian packages bwa, samtools, bcftools)" if missing else None


def write_genome(path: Path, length: int, seed: int = 1) -> None:
    """Random DNA in FASTA, two chromosomes, 60 bases a line."""
    rng = random.Random(seed)
    with open(path, "w") as f:
        for chromosome in (1, 2):
            f.write(f">chr{chromosome}\n")
            bases = "".join(rng.choice("ACGT") for _ in range(length // 2))
            for i in range(0, len(bases), 60):
                f.write(bases[i:i + 60] + "\n")


def write_reads(genome: Path, out: Path, reads: int, seed: int) -> None:
    """Single-end reads of 100 bases with wgsim (mutations and errors at its default rates)."""
    subprocess.run(["wgsim", "-S", str(seed), "-N", str(reads), "-1", "100", "-2", "100", str(genome), str(out),
                    "/dev/null"], check=True, capture_output=True)


def prepare(genome_kb: int, reads: int, scratch: Path) -> dict[str, Path]:
    """The genome and each sample's reads, made once in `scratch`; returns name -> file."""
    scratch.mkdir(parents=True, exist_ok=True)
    genome = scratch / "genome.fa"
    write_genome(genome, genome_kb * 1000)
    files = {"data/genome.fa": genome}
    for seed, sample in enumerate(SAMPLES, start=1):
        write_reads(genome, scratch / f"{sample}.fastq", reads, seed)
        files[f"data/samples/{sample}.fastq"] = scratch / f"{sample}.fastq"
    return files


def place_inputs(files: dict[str, Path], destination: dict[str, Path]) -> None:
    """Copy each input to its directory: destination[name] is the workflow directory it goes to."""
    for name, source in files.items():
        target = destination[name] / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)


def node_of(name: str) -> str:
    """Where an input sits on the cluster: the genome on n1 (the head), each sample's reads on its node."""
    for sample, node in SAMPLES.items():
        if name == f"data/samples/{sample}.fastq":
            return node
    return "n1"


def run_snakemake(cwd: Path, jobs: int, timeout: float = 3600) -> float:
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "snakemake", "-j", str(jobs)], cwd=cwd, capture_output=True,
                            text=True, timeout=timeout)
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        raise RuntimeError(f"snakemake failed in {cwd} ({result.returncode}):\n{result.stdout[-3000:]}\n"
                           f"{result.stderr[-6000:]}")
    return seconds


def write_profile(workdir: Path) -> None:
    """The one-line change: the workflow profile `gmount snakemake-profile` writes, picked up by plain snakemake."""
    subprocess.run([sys.executable, "-m", "gmountpy", "snakemake-profile", str(workdir / "profiles" / "default"),
                    "--latency-wait", "10"], check=True, capture_output=True, timeout=120)


def differences(a: Path, b: Path) -> list[str]:
    return [name for name in OUTPUTS if (a / name).read_bytes() != (b / name).read_bytes()]


def run(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    files = prepare(args.genome_kb, args.reads, base / "inputs")
    seconds: dict[str, list[float]] = {"gmount": [], "plain": []}
    records: list[dict[str, Any]] = []
    with local_cluster(base, f"bench-var-{os.getpid()}"):
        for repeat in range(args.repeats):
            wf = f"variants-{repeat}"
            place_inputs(files, {name: base / node_of(name) / "export" / wf for name in files})
            head = base / "n1" / "export" / wf
            (head / "Snakefile").write_text(SNAKEFILE)
            write_profile(head)
            plain = base / f"plain-{repeat}"
            place_inputs(files, {name: plain for name in files})
            (plain / "Snakefile").write_text(SNAKEFILE)
            time.sleep(2)  # inputs written straight into the exports: their homes hear within a scan
            here = base / "n1" / "mnt" / wf
            # alternate which goes first: the machine is shared, its load drifts
            order = [("gmount", here), ("plain", plain)] if repeat % 2 == 0 else [("plain", plain), ("gmount", here)]
            for how, cwd in order:
                seconds[how].append(run_snakemake(cwd, args.jobs))
                log("bench-variants", f"repeat {repeat}: {how} {seconds[how][-1]:.1f} s")
            wrong = differences(here, plain)
            if wrong:
                raise SystemExit(f"bench_variants: outputs differ between gmount and plain: {wrong}")
            placement = [json.loads(line) for p in sorted((here / ".gmount").glob("snakemake-*.jsonl"))
                         for line in p.read_text().splitlines()]
            records += placement
    per_sample = [r for r in records if r["rule"] in ("bwa_map", "samtools_sort", "samtools_index")]
    misplaced = [r for r in per_sample if r["node"] != SAMPLES[Path(r["inputs"][-1]).name.split(".")[0]]]
    ratios = [g / p for g, p in zip(seconds["gmount"], seconds["plain"], strict=True)]
    return {"seconds": seconds, "ratios": [round(r, 3) for r in ratios],
            "ratio_median": round(statistics.median(ratios), 3),
            "gmount_median_s": round(statistics.median(seconds["gmount"]), 2),
            "plain_median_s": round(statistics.median(seconds["plain"]), 2),
            "outputs_identical": True, "jobs_per_run": len(records) // args.repeats,
            "per_sample_jobs_not_on_their_sample_node": len(misplaced),
            "jobs_via": sorted({(r["rule"], r["via"]) for r in records}),
            "placement_log_seconds": {rule: round(statistics.median(r["seconds"] for r in records
                                                                    if r["rule"] == rule), 3)
                                      for rule in sorted({r["rule"] for r in records})}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--genome-kb", type=int, default=1000, help="genome length in kilobases (default 1000)")
    parser.add_argument("--reads", type=int, default=200_000, help="reads per sample (default 200000)")
    parser.add_argument("--jobs", type=int, default=4, help="snakemake -j (default 4)")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each (default 2)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON output (default {DEFAULT_OUT})")
    args = parser.parse_args()
    problem = tools_problem()
    if problem:
        print(f"bench_variants: {problem}", file=sys.stderr)
        return 2
    base = Path(tempfile.mkdtemp(prefix="gmount-bench-var-"))
    os.environ["XDG_STATE_HOME"] = str(base / "state")
    load_start = os.getloadavg()
    try:
        results = run(args, base)
    except KeyboardInterrupt:
        return 130
    finally:
        shutil.rmtree(base, ignore_errors=True)
    write_document(args.out, load_start, {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                   results=results)
    print(f"gmount {results['gmount_median_s']:.1f} s, plain {results['plain_median_s']:.1f} s: "
          f"{results['ratio_median']:.2f}x (runs: {results['ratios']}); outputs identical; "
          f"per-sample jobs not on their node: {results['per_sample_jobs_not_on_their_sample_node']}")
    print(f"results written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
