"""Reports of runs: the reference pipelines' (tables, JSON, a PNG chart) and any workflow's placement
log as an HTML page (`gmount report`), drawn with the same plots.

The plots (matplotlib, imported when drawing): `draw_bytes` (bytes local vs
remote, stacked: per pipeline run, or per job) and `draw_timeline` (the jobs
on each node over time).
"""

from __future__ import annotations

import html
import io
import json
import os
import posixpath
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from ..api.results import human_size
from ..errors import GmountError
from ..jobs.runlog import JobRecord, describe, summarise

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from ..api import Cluster, FileLocations

#: the colours of bytes read locally and from other nodes, in every plot
LOCAL_COLOUR, REMOTE_COLOUR = "tab:green", "tab:red"
#: jobs drawn one by one in the bytes-per-job plot (those with the most bytes)
MOST_JOBS_DRAWN = 60


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
    draw_bytes(ax, labels, [r["bytes_read"]["local"] for r in runs], [r["bytes_read"]["remote"] for r in runs],
               what="read through the mounts")
    ax.set_title("bytes read: local vs remote")

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


# --------------------------------------------------------------------------- shared plots


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise GmountError("drawing the report needs matplotlib: pip install 'gmountpy[report]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _unit(largest: float) -> tuple[float, str]:
    for scale, name in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if largest >= scale:
            return scale, name
    return 1, "bytes"


def draw_bytes(ax: Axes, labels: Sequence[str], local: Sequence[int], remote: Sequence[int], *, what: str,
               horizontal: bool = False) -> None:
    """Stacked bars of bytes local (green) and remote (red), one per label, in the unit that fits."""
    scale, unit = _unit(max([a + b for a, b in zip(local, remote, strict=True)], default=0))
    ours = [v / scale for v in local]
    theirs = [v / scale for v in remote]
    if horizontal:
        positions = range(len(labels))
        ax.barh(positions, ours, color=LOCAL_COLOUR, label="local")
        ax.barh(positions, theirs, left=ours, color=REMOTE_COLOUR, label="remote")
        ax.set_yticks(positions, labels, fontsize="small")
        ax.invert_yaxis()
        ax.set_xlabel(f"{unit} {what}")
    else:
        ax.bar(labels, ours, color=LOCAL_COLOUR, label="local")
        ax.bar(labels, theirs, bottom=ours, color=REMOTE_COLOUR, label="remote")
        ax.set_ylabel(f"{unit} {what}")
    ax.legend(fontsize="small")


def draw_timeline(ax: Axes, jobs: Sequence[JobRecord], nodes: Sequence[str]) -> None:
    """Each node's jobs as bars from start to end (seconds from the run's first start), one lane per node;
    jobs at once on a node get rows of their own in its lane. Colour: the rule (make: the target's
    suffix); a failed job is hatched."""
    timed = [job for job in jobs if job.start is not None]
    origin = min((job.start or 0.0) for job in timed) if timed else 0.0
    groups = sorted({_group(job) for job in timed})
    palette = _pyplot().get_cmap("tab10" if len(groups) <= 10 else "tab20")
    colour = {group: palette(i % palette.N) for i, group in enumerate(groups)}
    labelled: set[str] = set()
    for lane, node in enumerate(nodes):
        rows: list[float] = []  # the end of the last job in each row
        placed: list[tuple[JobRecord, int]] = []
        for job in sorted((j for j in timed if j.node == node), key=lambda j: j.start or 0.0):
            start = (job.start or 0.0) - origin
            row = next((i for i, end in enumerate(rows) if end <= start + 1e-9), len(rows))
            if row == len(rows):
                rows.append(0.0)
            rows[row] = start + job.seconds
            placed.append((job, row))
        height = 0.8 / max(len(rows), 1)
        for job, row in placed:
            group = _group(job)
            ax.barh(lane - 0.4 + height * (row + 0.5), max(job.seconds, 1e-3), height * 0.9,
                    left=(job.start or 0.0) - origin, color=colour[group], edgecolor="black", linewidth=0.3,
                    hatch="xx" if job.failed else None, label=None if group in labelled else group)
            labelled.add(group)
    ax.set_yticks(range(len(nodes)), nodes)
    ax.set_ylim(len(nodes) - 0.5, -0.5)
    ax.set_xlabel("seconds from the first job's start")
    ax.grid(axis="x", linewidth=0.3)
    if 0 < len(groups) <= 20:
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))


def draw_overlay(ax: Axes, cluster: Cluster, locations: Sequence[FileLocations]) -> None:
    """The cluster's sites joined by their RTTs, each site's nodes around it, and each located file beside
    its nearest holder (dotted lines to every holder)."""
    import math

    import networkx as nx

    graph: nx.Graph[str] = nx.Graph()
    pos: dict[str, tuple[float, float]] = {}
    site_pos = nx.circular_layout(cluster.graph, scale=3.0)
    for a, b, link in cluster.graph.edges(data=True):
        graph.add_edge(f"site {a}", f"site {b}", kind="link", label=f"{link['rtt_ms']:g} ms")
    for site, names in cluster.sites.items():
        sx, sy = (float(v) for v in site_pos[site])
        pos[f"site {site}"] = (sx, sy)
        graph.add_node(f"site {site}")
        heading = math.atan2(sy, sx) if (sx, sy) != (0, 0) else 0.0
        for i, name in enumerate(names):
            angle = heading + (i - (len(names) - 1) / 2) * 1.0
            pos[name] = (sx + 1.6 * math.cos(angle), sy + 1.6 * math.sin(angle))
            graph.add_edge(f"site {site}", name, kind="member")
    stacked: dict[str, int] = {}
    for found in locations:
        if found.nearest is None:
            continue
        for holder in found.holders:
            graph.add_edge(holder.node, found.path, kind="holds")
        first = found.nearest.node
        stacked[first] = stacked.get(first, 0) + 1
        (x, y), (sx, sy) = pos[first], pos[f"site {cluster.nodes[first].site}"]
        norm = math.hypot(x - sx, y - sy) or 1.0
        pos[found.path] = (x + 1.4 * (x - sx) / norm, y + 1.4 * (y - sy) / norm - 0.5 * (stacked[first] - 1))

    def kind(v: str) -> str:
        return "site" if v.startswith("site ") else ("file" if v.startswith("/") else "node")

    colours = {"site": "#f4a261", "node": "#2a9d8f", "file": "#dee2e6"}
    sizes = {"site": 2200, "node": 900, "file": 250}
    edges = list(graph.edges(data=True))
    nx.draw_networkx_edges(graph, pos, ax=ax, edgelist=[(a, b) for a, b, _ in edges],
                           style=[":" if d["kind"] == "holds" else "-" for *_, d in edges],
                           width=[3 if d["kind"] == "link" else 1 for *_, d in edges])
    nx.draw_networkx_nodes(graph, pos, ax=ax, node_color=[colours[kind(v)] for v in graph],
                           node_size=[sizes[kind(v)] for v in graph])
    nx.draw_networkx_labels(graph, pos, ax=ax, font_size=8,
                            labels={v: posixpath.basename(v) if kind(v) == "file" else v for v in graph})
    nx.draw_networkx_edge_labels(graph, pos, ax=ax, edge_labels={(a, b): d["label"] for a, b, d in edges
                                                                if d["kind"] == "link"})
    ax.margins(0.15)
    ax.axis("off")


def _group(job: JobRecord) -> str:
    if job.engine == "snakemake":
        return job.name
    suffix = os.path.splitext(job.name)[1]
    return f"*{suffix}" if suffix else job.name


def _svg(fig: Figure) -> str:
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", bbox_inches="tight")
    _pyplot().close(fig)
    text = buffer.getvalue()
    return text[text.index("<svg"):]


# --------------------------------------------------------------------------- the run report page


def write_run_page(path: str, runs: Sequence[tuple[str, Sequence[JobRecord]]]) -> None:
    """An HTML page (self-contained: the plots inline as SVG) for runs given as (name, jobs): per run,
    its summary line, jobs and bytes per node, the timeline per node, input bytes local/remote per
    job, and the slowest and failed jobs."""
    plt = _pyplot()
    sections = []
    for name, jobs in runs:
        s = summarise(jobs, slowest=10)
        nodes = sorted({job.node for job in jobs})
        parts = [f"<h2>{html.escape(name)}</h2>", f"<p class='summary'>{html.escape(_line(jobs))}</p>"]
        rows = []
        for node in nodes:
            mine = [job for job in jobs if job.node == node]
            rows.append([node, str(len(mine)), f"{sum(j.seconds for j in mine):.1f}",
                         human_size(sum(j.bytes_local for j in mine)), human_size(sum(j.bytes_remote for j in mine))])
        parts.append(_table(("node", "jobs", "job seconds", "input bytes local", "input bytes remote"), rows))
        if any(job.end is not None for job in jobs):
            lanes = sum(max(1, _rows_needed([j for j in jobs if j.node == node])) for node in nodes)
            fig, ax = plt.subplots(figsize=(11, 1.0 + 0.28 * lanes + 0.3 * len(nodes)))
            draw_timeline(ax, jobs, nodes)
            ax.set_title("jobs per node over time")
            parts.append(f"<figure class='timeline'>{_svg(fig)}</figure>")
        else:
            parts.append("<p>This log records no end times (written by an older gmountpy): no timeline.</p>")
        drawn = sorted(jobs, key=lambda j: -(j.bytes_local + j.bytes_remote))[:MOST_JOBS_DRAWN]
        drawn.sort(key=lambda j: (j.start if j.start is not None else 0.0, j.label))
        fig, ax = plt.subplots(figsize=(11, 1.2 + 0.22 * len(drawn)))
        draw_bytes(ax, [f"{j.label} ({j.node})" for j in drawn], [j.bytes_local for j in drawn],
                   [j.bytes_remote for j in drawn], what="of input", horizontal=True)
        shown = f"the {len(drawn)} of {len(jobs)} jobs with the most input" if len(drawn) < len(jobs) else "per job"
        ax.set_title(f"input bytes local vs remote, {shown}")
        parts.append(f"<figure class='bytes'>{_svg(fig)}</figure>")
        parts.append("<h3>slowest jobs</h3>")
        parts.append(_table(("job", "node", "seconds", "input local", "input remote", "status"),
                            [[j.label, j.node, f"{j.seconds:.2f}", human_size(j.bytes_local),
                              human_size(j.bytes_remote), _status(j)] for j in s.slowest]))
        failed = [j for j in jobs if j.failed]
        if failed:
            parts.append("<h3>failed jobs</h3>")
            parts.append(_table(("job", "node", "seconds", "status"),
                                [[j.label, j.node, f"{j.seconds:.2f}", _status(j)] for j in failed]))
        sections.append("<section>" + "\n".join(parts) + "</section>")
    title = "gmount run report" if len(runs) != 1 else f"gmount run report: {runs[0][0]}"
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; color: #222; }}
table {{ border-collapse: collapse; margin: 0.5em 0 1em; }}
th, td {{ text-align: left; padding: 0.15em 0.8em; border-bottom: 1px solid #ddd; }}
.summary {{ font-family: monospace; background: #f4f4f4; padding: 0.5em; }}
figure {{ margin: 0.5em 0; }} svg {{ max-width: 100%; height: auto; }}
</style></head>
<body><h1>{html.escape(title)}</h1>
{"".join(sections)}
</body></html>
"""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)


def _line(jobs: Sequence[JobRecord]) -> str:
    return describe(jobs) or "no jobs"


def _rows_needed(jobs: Sequence[JobRecord]) -> int:
    """How many rows a node's lane needs: the most jobs that ran there at once."""
    events = sorted([(j.start, 1) for j in jobs if j.start is not None] +
                    [(j.end, -1) for j in jobs if j.end is not None])
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def _status(job: JobRecord) -> str:
    if job.cancelled:
        return "cancelled"
    return "ok" if job.status == 0 else f"exit {job.status}"


def _table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
