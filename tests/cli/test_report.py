"""A run's report: real Snakemake (its summary line at the end, its jobs seen while they run) and real make on a
local 4-node cluster, then `gmount report` on their placement logs, the page looked at in headless Chromium."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from gmountpy import Cluster
from gmountpy.jobs.runlog import read_log

from ..conftest import LocalCluster, require, wait_for

BIN = Path(sys.executable).parent
RUN_TIMEOUT = 900

SNAKEFILE = """\
rule all:
    input: "merged.txt"

rule step:
    input: "data/{s}.txt"
    output: "out/{s}.txt"
    shell: "sleep 2; tr a-z A-Z < {input} > {output}"

rule merge:
    input: expand("out/{s}.txt", s=["s1", "s2", "s3", "s4"])
    output: "merged.txt"
    shell: "cat {input} > {output}"
"""

MAKEFILE = """\
include $(shell gmount make-include)

all: big.sum small.sum

%.sum: %.dat
\tsleep 1; sha256sum $< > $@
"""


def tools_problem() -> str | None:
    try:
        import snakemake  # noqa: F401

        import snakemake_executor_plugin_gmount  # noqa: F401
    except ImportError as exc:
        return f"{exc}: install gmountpy[snakemake]"
    if shutil.which("make") is None:
        return "GNU make is not installed (Debian package make)"
    return None


def chromium_problem() -> str | None:
    return None if shutil.which("chromium") else "chromium is not installed (Debian package chromium)"


def spread(cluster: LocalCluster, workdir: str, files: dict[str, tuple[str, bytes]]) -> None:
    for rel, (node, data) in files.items():
        target = cluster.export(node) / workdir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    cluster.rescan()


def screenshot(page: Path, png: Path, profile: Path) -> None:
    """The page as headless Chromium renders it (the flags that work on this machine's closed network)."""
    run = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                          "--no-first-run", "--disable-background-networking", "--disable-component-update",
                          "--disable-sync", f"--user-data-dir={profile}", "--hide-scrollbars",
                          "--window-size=1280,2400", f"--screenshot={png}", page.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and png.exists(), run.stderr[-3000:]


def colours(png: Path) -> tuple[float, Counter[str]]:
    """The share of pixels that are not white, and pixel counts of the plots' colours."""
    import numpy as np
    from PIL import Image

    targets = {"local": (44, 160, 44), "remote": (214, 39, 40), "first rule": (31, 119, 180)}
    pixels = np.asarray(Image.open(png).convert("RGB"), dtype=np.int32).reshape(-1, 3)
    counts: Counter[str] = Counter()
    for name, colour in targets.items():
        counts[name] = int((np.abs(pixels - np.array(colour)).sum(axis=1) < 24).sum())
    inked = float((pixels.sum(axis=1) < 720).mean())
    return inked, counts


def test_a_snakemake_and_a_make_run_end_in_a_summary_and_a_report_page(cluster4: LocalCluster,
                                                                     tmp_path: Path) -> None:
    require("snakemake and make", tools_problem())
    require("Chromium", chromium_problem())
    name = cluster4.spec.name
    workdir = f"report-{os.getpid()}"
    spread(cluster4, workdir, {f"data/s{i}.txt": (f"n{i}", f"sample {i}\n".encode() * (500 * i))
                               for i in range(1, 5)})
    spread(cluster4, workdir, {"big.dat": ("n4", os.urandom(300_000)), "small.dat": ("n2", b"small\n")})
    (cluster4.export("n1") / workdir / "Snakefile").write_text(SNAKEFILE)
    (cluster4.export("n1") / workdir / "Makefile").write_text(MAKEFILE)
    cwd = cluster4.mount("n1") / workdir
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}

    # Snakemake through the executor: its jobs are seen on their nodes while they run
    snakemake = subprocess.Popen([sys.executable, "-m", "snakemake", "--executor", "gmount", "-j4",
                                  "--latency-wait", "5"], cwd=cwd, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
    try:
        seen: set[tuple[str, str]] = set()

        def registered() -> bool:
            seen.update((job.node, job.job) for job in Cluster.open(name).jobs() if job.kind == "snakemake")
            return len(seen) >= 2 or snakemake.poll() is not None

        wait_for(registered, timeout=RUN_TIMEOUT, interval=0.3)
        output, _ = snakemake.communicate(timeout=RUN_TIMEOUT)
    finally:
        if snakemake.poll() is None:
            snakemake.kill()
            snakemake.communicate()
    assert snakemake.returncode == 0, output[-5000:]
    assert any(job.startswith("step #") for _, job in seen), seen
    [log] = (cwd / ".gmount").glob("snakemake-*.jsonl")
    jobs = read_log(log)
    assert sorted(j.name for j in jobs) == ["merge"] + ["step"] * 4
    for node, job in seen:
        assert any(j.label == job and j.node == node for j in jobs), (node, job)
    # the run's last words: one line, with the numbers of its log
    [line] = [text for text in output.splitlines() if "gmount: 5 jobs (" in text]
    per_node = Counter(j.node for j in jobs)
    assert "(" + ", ".join(f"{n} {per_node[n]}" for n in sorted(per_node)) + ")" in line
    slowest = max(jobs, key=lambda j: j.seconds)
    assert f"slowest: {slowest.label} {slowest.seconds:.1f} s on {slowest.node}" in line
    assert "input bytes" in line and "remote" in line and f"gmount report {log.relative_to(cwd)}" in line
    lines = output.rstrip().splitlines()
    assert lines.index(line) >= len(lines) - 3, lines[-6:]  # at the end of the run

    # make through gmount.mk: `gmount report` prints its summary line
    made = subprocess.run(["make", "-j2"], cwd=cwd, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert made.returncode == 0, made.stderr
    [make_log] = (cwd / ".gmount").glob("make-*.jsonl")
    summarised = subprocess.run([str(BIN / "gmount"), "report", "--no-html"], cwd=cwd, env=env, capture_output=True,
                                text=True, timeout=120)
    assert summarised.returncode == 0, summarised.stderr
    assert summarised.stdout.startswith(f".gmount/{make_log.name}: gmount: 2 jobs (n2 1, n4 1)")
    assert "slowest: " in summarised.stdout

    # both runs on one page, looked at in a real browser
    page = tmp_path / "report.html"
    drawn = subprocess.run([str(BIN / "gmount"), "report", str(log), str(make_log), "-o", str(page)], cwd=cwd,
                           env=env, capture_output=True, text=True, timeout=300)
    assert drawn.returncode == 0, drawn.stderr
    assert f"wrote {page}" in drawn.stdout
    text = page.read_text()
    assert text.count("<svg") == 4 and "jobs per node over time" in text and "step #" in text
    assert "big.sum" in text and "n4" in text
    png = tmp_path / "report.png"
    started = time.monotonic()
    screenshot(page, png, tmp_path / "chromium-profile")
    inked, counts = colours(png)
    assert inked > 0.02, f"the page looks blank ({inked:.1%} of its pixels are not white)"
    assert counts["local"] > 500 and counts["remote"] > 50 and counts["first rule"] > 500, counts
    print(json.dumps({"screenshot_seconds": round(time.monotonic() - started, 1), "inked": round(inked, 3),
                      **counts}))
