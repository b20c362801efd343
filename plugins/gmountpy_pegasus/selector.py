"""`gmount-pegasus-site-selector`: a site selector for Pegasus's NonJavaCallout.

The protocol, as the planner implements it (pegasus-isi/pegasus,
src/edu/isi/pegasus/planner/selector/site/NonJavaCallout.java, and
doc/sphinx/reference-guide/configuration.rst, "pegasus.selector.site"):

- with ``pegasus.selector.site=NonJavaCallout`` the planner runs
  ``<pegasus.selector.site.path> <request file>`` once per job that has no
  ``selector`` profile ``execution.site``, with ``Runtime.exec(String,
  env)``: the command is split at whitespace and the environment is only
  CLASSPATH, JAVA_HOME, USER, LOGNAME, HOME, TMP, TZ (from the JVM) plus
  every ``pegasus.selector.site.env.NAME=value`` property -- no PATH;
- the request file has one ``key=value`` per line: ``version=2.0``,
  ``transformation=ns::name:version``, ``derivation=...``, ``job.level=``,
  ``job.id=``, one ``resource.id=<site> <file server URL prefix>`` per file
  server of each candidate site's shared scratch directory (so a site may
  repeat; ``resource.id=NONE NONE`` when there is no candidate), one
  ``input.lfn=<lfn>`` per input (the documentation allows a size after
  whitespace), then ``wf.name=``, ``wf.index=``, ``wf.manager=dagman``,
  ``vo.name=NONE``, ``vo.group=NONE``;
- the answer is one stdout line ``SOLUTION:<site>`` (optionally
  ``:<jobmanager>``); ``SOLUTION:NONE`` means no site fits, and the planner
  then stops with "could not map job"; it keeps the request file when the
  selector exits non-zero (``pegasus.selector.site.keep.tmp=onerror``).

The answer here: the gmount placement rule (gmountpy.jobs.placement) over the
candidate sites that are gmount nodes, with the inputs' holders looked up
live. A job none of whose inputs a candidate holds goes "anywhere": the
callout sees one job at a time and no load, so it spreads such jobs over the
candidates by a stable hash of the job id, weighted by slots.

Configuration comes from the environment (set it with
``pegasus.selector.site.env.*``): GMOUNT_CLUSTER (cluster name or cluster
file, required), GMOUNT_PEGASUS_ROOT (namespace directory the LFNs are
relative to, default ``/``), XDG_STATE_HOME (if the cluster's state is not
in ``~/.local/state``).
"""

from __future__ import annotations

import os
import posixpath
import sys
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported when used: the planner runs this once per job
    from gmountpy.api import Cluster

__all__ = ["Request", "choose_site", "main", "parse_request"]

NONE = "NONE"


@dataclass(frozen=True)
class Request:
    """One NonJavaCallout request: the job, its candidate sites, its input LFNs."""

    job_id: str
    transformation: str
    candidates: tuple[str, ...]   # site handles, in the planner's order, each once
    lfns: tuple[str, ...]         # input LFNs, each once
    version: str = ""
    fields: Mapping[str, str] | None = None  # every single-valued key as given


def parse_request(text: str) -> Request:
    """Parse a request file's text (see the module doc for its keys)."""
    single: dict[str, str] = {}
    candidates: dict[str, None] = {}
    lfns: dict[str, None] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"line {number} of the request is not key=value: {line!r}")
        key = key.strip()
        if key == "resource.id":
            site = value.split(None, 1)[0] if value.strip() else ""
            if site and site != NONE:
                candidates.setdefault(site)
        elif key == "input.lfn":
            parts = value.strip().rsplit(None, 1)
            lfn = parts[0] if len(parts) == 2 and parts[1].isdigit() else value.strip()
            if lfn:
                lfns.setdefault(lfn)
        else:
            single[key] = value.strip()
    if "job.id" not in single:
        raise ValueError("the request has no job.id line: is it a Pegasus NonJavaCallout request file?")
    return Request(single["job.id"], single.get("transformation", ""), tuple(candidates), tuple(lfns),
                   single.get("version", ""), single)


def spread(job_id: str, nodes: Sequence[str], slots: Mapping[str, int]) -> str:
    """A node for a job with nothing to go by: stable per job id, proportional to slots."""
    weighted = [node for node in nodes for _ in range(max(slots.get(node, 1), 1))]
    return weighted[zlib.crc32(job_id.encode()) % len(weighted)]


def choose_site(request: Request, cluster: Cluster, root: str = "/") -> tuple[str | None, str]:
    """(site, why) for a request: None when no candidate is a node of `cluster` that answers.

    Nodes that do not answer now are left out (the job goes to one that does, and `why`
    names the others); the inputs' holders are asked from a node that answers.
    """
    from gmountpy.jobs.placement import choose_node

    nodes = [node for node in cluster.nodes if node.name in request.candidates]
    if not nodes:
        return None, (f"none of the candidate sites ({', '.join(request.candidates) or 'none'}) is a node of "
                      f"cluster {cluster.name!r}")
    answering = set(cluster.answering([node.name for node in nodes]))
    down = [node.name for node in nodes if node.name not in answering]
    nodes = [node for node in nodes if node.name in answering]
    if not nodes:
        return None, (f"none of the candidate nodes ({', '.join(down)}) of cluster {cluster.name!r} answers: "
                      "is the cluster up? (`gmount status`)")
    names = [node.name for node in nodes]
    slots = {node.name: node.slots for node in nodes}
    note = f" (not answering, left out: {', '.join(down)})" if down else ""
    holdings: dict[str, dict[str, int]] = {}
    if request.lfns:
        paths = [posixpath.normpath(posixpath.join(root, lfn.lstrip("/"))) for lfn in request.lfns]
        asking = cluster.home if cluster.home in answering else names[0]
        for item in cluster.where(paths, from_node=asking):
            held = {h.node: h.size for h in item.holders if h.node in slots and not h.is_dir}
            if held:
                holdings[item.path] = held
    if not holdings:
        return spread(request.job_id, names, slots), "no input held by a candidate: spread by job id" + note
    decision = choose_node(holdings, names, slots=slots, running={}, rtt=cluster.overlay.rtt)
    return decision.node, decision.reason + note


def main(argv: Sequence[str] | None = None) -> int:
    """Answer one request file, always with one SOLUTION line (the planner waits for it).

    Exit 0 with a site; 1 with SOLUTION:NONE when the request or the configuration is
    wrong. An unexpected failure after the request was read answers a fallback site (the
    job spread by its id over the candidates) rather than stopping the whole plan; stderr
    always says why.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        return _fail("usage: gmount-pegasus-site-selector REQUEST_FILE (the planner's NonJavaCallout request)")
    try:
        with open(args[0]) as f:
            request = parse_request(f.read())
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        return _fail(f"cannot read the request {args[0]}: {exc}")
    cluster_name = os.environ.get("GMOUNT_CLUSTER")
    if not cluster_name:
        return _fail("GMOUNT_CLUSTER is not set: add pegasus.selector.site.env.GMOUNT_CLUSTER=<cluster name or "
                     "cluster file> to the Pegasus properties")
    root = os.environ.get("GMOUNT_PEGASUS_ROOT") or "/"
    try:
        from gmountpy.api import Cluster
        from gmountpy.errors import GmountError

        try:
            cluster = Cluster.open(cluster_name)
        except (GmountError, OSError) as exc:  # not running, unknown: nothing to place on
            return _fail(f"job {request.job_id}: {exc}")
    except Exception as exc:  # noqa: BLE001 -- never leave the planner without an answer
        return _fall_back(request, None, f"{type(exc).__name__}: {exc}")
    try:
        site, why = choose_site(request, cluster, root)
    except Exception as exc:  # noqa: BLE001 -- e.g. a node that died meanwhile: still answer
        return _fall_back(request, cluster, f"{type(exc).__name__}: {exc}")
    if site is None:
        print(f"gmount-pegasus-site-selector: job {request.job_id}: {why}", file=sys.stderr, flush=True)
        print(f"SOLUTION:{NONE}", flush=True)
        return 0
    print(f"SOLUTION:{site}", flush=True)
    if os.environ.get("GMOUNT_PEGASUS_DEBUG") or "not answering" in why:
        print(f"gmount-pegasus-site-selector: job {request.job_id} -> {site}: {why}", file=sys.stderr, flush=True)
    return 0


def _fall_back(request: Request, cluster: Cluster | None, problem: str) -> int:
    """The placement failed unexpectedly: a site anyway (spread by job id over the candidates that are
    nodes of the cluster, or over all candidates), so one failure does not stop the whole plan."""
    try:
        known = {node.name: node.slots for node in cluster.nodes} if cluster is not None else {}
    except Exception:  # noqa: BLE001
        known = {}
    pool = [site for site in request.candidates if site in known] or list(request.candidates)
    if not pool:
        return _fail(f"job {request.job_id}: {problem}; and the request names no candidate site to fall back on")
    site = spread(request.job_id, pool, known)
    print(f"gmount-pegasus-site-selector: job {request.job_id}: placement failed ({problem}); "
          f"fell back to {site}, spread by job id over {', '.join(pool)}", file=sys.stderr, flush=True)
    print(f"SOLUTION:{site}", flush=True)
    return 0


def _fail(message: str) -> int:
    # The planner reads stdout before stderr and stops at the solution, so the
    # reason also goes to stdout (logged at debug level) before SOLUTION:NONE;
    # the non-zero exit makes it keep the request file for a rerun by hand.
    line = f"gmount-pegasus-site-selector: {message}"
    print(line, file=sys.stderr, flush=True)
    print(line, flush=True)
    print(f"SOLUTION:{NONE}", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
