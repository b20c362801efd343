"""Measuring round-trip times between sites, so users need not type `[[links]]` by hand.

Over SSH (before launch): from a node of site A, timed TCP connects to the
SSH port of a node of site B (see ssh.measure_site_rtts). For a local
cluster every node runs on this machine, so there is no network to measure:
probe then times `ping` RPCs to the running daemons and says plainly that
these are loopback numbers, and refuses to write them over the topology the
user described.
"""

from __future__ import annotations

import math
import os
import re
import textwrap
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass

import trio

from ..cluster import state as state_store
from ..cluster.config import ClusterSpec, load_spec
from ..cluster.state import ClusterState
from ..errors import GmountError
from ..protocol.client import ClusterClient, open_client
from . import _run
from .ssh import SiteRtt, measure_site_rtts

__all__ = ["ProbeReport", "SiteRtt", "links_toml", "probe", "write_links"]


@dataclass(frozen=True)
class ProbeReport:
    """What was measured (one sentence), the measurements, and whether they may replace [[links]]."""

    method: str
    rtts: list[SiteRtt]
    writable: bool
    refusal: str = ""

    @property
    def links(self) -> list[SiteRtt]:
        return [r for r in self.rtts if r.sites[0] != r.sites[1]]

    @property
    def intra_site(self) -> list[SiteRtt]:
        return [r for r in self.rtts if r.sites[0] == r.sites[1]]


def probe(spec: ClusterSpec, count: int = 7, progress: Callable[[str], None] | None = None) -> ProbeReport:
    if count < 1:
        raise ValueError(f"`count` must be >= 1, got {count!r}")
    if spec.launcher == "ssh":
        rtts = _run(measure_site_rtts(spec, count, progress))
        return ProbeReport(
            method=(f"median of {count} TCP connects from the first node of each site to the SSH port of "
                    f"the first node of the other site (one round trip each), run on the nodes over SSH"),
            rtts=rtts, writable=True)
    state = state_store.load(spec.name)
    if state is None:
        raise GmountError(f"cluster {spec.name!r} is local and not running: every node of a local cluster runs on "
                          f"this machine, so there is no network between sites to measure; `gmount up` it to time "
                          f"RPCs to its daemons, or keep the [[links]] you wrote")
    rtts = trio.run(_local_rtts, state, count)
    return ProbeReport(
        method=(f"local cluster: median of {count} `ping` RPC round trips over loopback from this machine "
                f"(where every node runs) to a daemon of the second site; NOT network RTTs between sites"),
        rtts=rtts, writable=False,
        refusal=("not writing: a local cluster's nodes all run on this machine, so these loopback times would "
                 "replace the topology you described in [[links]]"))


async def _local_rtts(state: ClusterState, count: int) -> list[SiteRtt]:
    firsts = {site: next((n for n in names if n in state.nodes), None) for site, names in state.spec.sites.items()}

    async def ping_times(client: ClusterClient, node: str) -> tuple[float, ...]:
        await client.call(node, "ping", timeout=5.0)  # warm up: connection and caches
        samples = []
        for _ in range(count):
            start = time.perf_counter()
            await client.call(node, "ping", timeout=5.0)
            samples.append((time.perf_counter() - start) * 1000.0)
        return tuple(samples)

    sites = list(state.spec.sites)
    result = []
    for i, a in enumerate(sites):
        for b in sites[i + 1:]:
            src, dst = firsts[a], firsts[b]
            if src is None or dst is None:
                result.append(SiteRtt((a, b), (src or "?", dst or "?"), problem="no running node in one of the sites"))
                continue
            try:
                async with open_client(state, name="gmount-probe") as client:
                    result.append(SiteRtt((a, b), (src, dst), await ping_times(client, dst)))
            except OSError as exc:
                result.append(SiteRtt((a, b), (src, dst), problem=f"{dst}: {exc}"))
    return result


def _ms(value: float) -> str:
    """rtt_ms as written to the file: > 0 (the spec requires it), three decimals."""
    return f"{max(round(value, 3), 0.001):g}"


def links_toml(report: ProbeReport) -> str:
    """The [[links]] tables for the measured site pairs, with a comment saying how they were measured."""
    lines = textwrap.wrap(f"[[links]] measured by `gmount probe`: {report.method}", 86,
                          initial_indent="# ", subsequent_indent="#   ")
    intra = [r for r in report.intra_site if not r.problem]
    if intra:
        lines += textwrap.wrap("within a site (intra_site_rtt_ms is one value for all sites): "
                               + ", ".join(f"{r.sites[0]} {_ms(r.median_ms)} ms" for r in intra), 86,
                               initial_indent="# ", subsequent_indent="#   ")
    for r in report.links:
        if r.problem:
            lines.append(f"# {r.sites[0]} <-> {r.sites[1]}: not measured: {r.problem}")
            continue
        lines += ["[[links]]", f'sites = ["{r.sites[0]}", "{r.sites[1]}"]', f"rtt_ms = {_ms(r.median_ms)}"]
    return "\n".join(lines) + "\n"


_HEADER_RE = re.compile(r"^\s*\[\[?\s*[\w.\"' -]+\s*\]\]?\s*(#.*)?$")  # [table] or [[array]] only
_LINKS_HEADER_RE = re.compile(r"^\s*\[\[\s*links\s*\]\]", re.MULTILINE)
_OUR_COMMENTS = ("# [[links]] measured by", "# within a site")


def _without_links(text: str) -> str:
    """The cluster file minus its [[links]] tables and the comment an earlier --write put above them."""
    kept: list[str] = []
    pending: list[str] = []  # blank/comment lines after a links table: they may belong to what follows
    in_links = ours = False
    for line in text.splitlines(keepends=True):
        stripped = line.strip()
        if stripped.startswith(_OUR_COMMENTS) or (ours and stripped.startswith("#   ")):
            ours = True
            continue
        ours = False
        if _HEADER_RE.match(line):
            in_links = bool(_LINKS_HEADER_RE.match(line))
            if not in_links:
                kept.extend(pending)
                kept.append(line)
            else:
                while kept and kept[-1].lstrip().startswith("#"):
                    kept.pop()  # a comment right above a links table belongs to it
            pending = []
        elif in_links:
            if not stripped or stripped.startswith("#"):
                pending.append(line)
            else:
                pending = []  # a key of the links table: the comments above it went with it
        else:
            kept.append(line)
    kept.extend(pending)
    return "".join(kept)


def write_links(path: str, report: ProbeReport) -> None:
    """Replace the [[links]] tables of a cluster file by the measured ones; the rest is kept as written."""
    if not report.writable:
        raise GmountError(report.refusal)
    failed = [r for r in report.links if r.problem or math.isnan(r.median_ms)]
    if failed:
        r = failed[0]
        raise GmountError(f"not writing {path}: {r.sites[0]} <-> {r.sites[1]} could not be measured ({r.problem})")
    with open(path) as f:
        text = f.read()
    if "links" in tomllib.loads(text) and not _LINKS_HEADER_RE.search(text):
        raise GmountError(f"not writing {path}: its links are not written as [[links]] tables; "
                          f"replace them by hand with the printed ones")
    kept = [_without_links(text)]
    body = "".join(kept).rstrip("\n") + "\n\n" + links_toml(report)
    tmp = os.path.join(os.path.dirname(os.path.abspath(path)), f".{os.path.basename(path)}.probe{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(body)
    try:
        load_spec(tmp)  # never leave a broken cluster file behind
        os.chmod(tmp, os.stat(path).st_mode & 0o7777)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
