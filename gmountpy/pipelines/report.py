"""The pipeline report: printed as tables, written as JSON and as a PNG chart."""

from __future__ import annotations

import json
import os
from typing import Any

from rich.console import Console
from rich.table import Table

from ..api.results import human_size


def print_report(console: Console, runs: list[dict[str, Any]], reference: dict[str, Any] | None) -> None:
    summary = Table(title="runs", show_edge=False, title_justify="left")
    for column in ("pipeline", "engine", "placement", "jobs", "makespan s", "read local", "read remote",
                   "remote %", "jobs off their data", "result"):
        summary.add_column(column)
    for r in runs:
        b = r["bytes_read"]
        summary.add_row(r["pipeline"], r["engine"], r["placement"], str(r["jobs"]), f"{r['makespan_s']:.1f}",
                        human_size(b["local"]), human_size(b["remote"]), f"{100 * b['remote_fraction']:.1f}",
                        str(len(r["jobs_not_on_their_data"])), r.get("check", "not checked"))
    if reference is not None:
        summary.caption = (f"single local directory, no gmount ({reference['engine']}): "
                           f"{reference['makespan_s']:.1f} s")
    console.print(summary)
    for r in runs:
        stages = Table(title=f"{r['placement']}: stages (seconds from start until the first / last output)",
                       show_edge=False, title_justify="left")
        for column in ("stage", "jobs", "first done", "last done", "job seconds (sum / max)"):
            stages.add_column(column)
        for stage, s in r["stages"].items():
            timed = r.get("job_seconds", {}).get(stage)
            seconds = f"{timed['seconds']:.1f} / {timed['max_seconds']:.1f}" if timed else "-"
            stages.add_row(stage, str(s["jobs"]), f"{s['first_done_s']:.1f}", f"{s['last_done_s']:.1f}", seconds)
        console.print(stages)
        nodes = Table(title=f"{r['placement']}: jobs and bytes per node", show_edge=False, title_justify="left")
        for column in ("node", "site", "jobs", "read local", "read remote", "served to peers"):
            nodes.add_column(column)
        for node, site in r["nodes"].items():
            c = r["counters"].get(node, {})
            nodes.add_row(node, site, str(sum(r["jobs_per_node"].get(node, {}).values())),
                          human_size(c.get("read_local", 0)), human_size(c.get("read_remote", 0)),
                          human_size(c.get("served_read", 0)))
        console.print(nodes)


def write_json(path: str, runs: list[dict[str, Any]], reference: dict[str, Any] | None) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump({"runs": runs, "single_directory": reference}, f, indent=1, sort_keys=True)
        f.write("\n")


def write_chart(path: str, runs: list[dict[str, Any]], reference: dict[str, Any] | None) -> None:
    """Makespan, remote-read fraction and jobs per node, one colour per placement."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['placement']}\n({r['engine']})" for r in runs]
    fig, axes = plt.subplots(1, 4, figsize=(17, 4.2))
    ax = axes[0]
    spans = [r["makespan_s"] for r in runs]
    ax.bar(labels, spans, color="tab:blue")
    if reference is not None:
        ax.axhline(reference["makespan_s"], color="grey", linestyle="--", label="one local directory")
        ax.legend(fontsize="small")
    ax.set_ylabel("makespan (s)")
    ax.set_title("makespan")

    ax = axes[1]
    local = [r["bytes_read"]["local"] / 2**20 for r in runs]
    remote = [r["bytes_read"]["remote"] / 2**20 for r in runs]
    ax.bar(labels, local, label="local", color="tab:green")
    ax.bar(labels, remote, bottom=local, label="remote", color="tab:red")
    ax.set_ylabel("MiB read through the mounts")
    ax.set_title("bytes read: local vs remote")
    ax.legend(fontsize="small")

    ax = axes[2]
    nodes = list(runs[0]["nodes"])
    width = 0.8 / max(len(runs), 1)
    for i, r in enumerate(runs):
        counts = [sum(r["jobs_per_node"].get(n, {}).values()) for n in nodes]
        ax.bar([x + i * width for x in range(len(nodes))], counts, width, label=r["placement"])
    ax.set_xticks([x + width * (len(runs) - 1) / 2 for x in range(len(nodes))], nodes)
    ax.set_ylabel("jobs")
    ax.set_title("jobs per node")
    ax.legend(fontsize="small")

    ax = axes[3]
    run = runs[0]
    names = list(run["stages"])
    for i, r in enumerate(runs):
        firsts = [r["stages"].get(s, {}).get("first_done_s", 0) for s in names]
        lasts = [r["stages"].get(s, {}).get("last_done_s", 0) for s in names]
        ys = [y + i * width for y in range(len(names))]
        longest = max(lasts, default=1) or 1
        spans = [max(b - a, longest / 200) for a, b in zip(firsts, lasts, strict=True)]  # one job: a thin bar
        ax.barh(ys, spans, width, left=firsts, label=r["placement"])
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlabel("seconds from start (first..last output)")
    ax.set_title("stages")
    ax.legend(fontsize="small")

    title = f"{runs[0]['pipeline']} pipeline"
    size_key = "tiles" if "tiles" in runs[0] else "docs"
    fig.suptitle(f"{title}, {runs[0][size_key]} {size_key}, cluster {runs[0]['cluster']}")
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
