"""Pegasus catalogs and job sites from where the workflow's inputs are.

`prepare(workflow, cluster, out_dir)` writes, for the Pegasus planner:

- ``sites.yml``: one site per gmount node, named like the node. Its shared
  file system is that node's mount: shared scratch and shared storage are
  ``file://`` directories ``<mount>/<base>/<node>/{scratch,storage}`` (one
  directory per node, because on an SSH cluster every node mounts the same
  namespace at the same path and two sites must not write the same names);
  a ``condor`` ``requirements`` profile names the node's host; an ``env``
  profile tells jobs their GMOUNT_NODE and GMOUNT_CLUSTER (and, for a node on
  this machine, preloads the local bypass: docs/bypass.md).
- ``replicas.yml``: every workflow input (a file some job reads and no job
  writes) that the namespace holds, once per holder node: site = the holder,
  pfn = the file in that node's mount, and the holder's export path (the
  file on its own disk, which a job on that node reads without FUSE).
- ``workflow.yml``: the workflow with a ``selector`` profile
  ``execution.site`` on every job that reads a located input, chosen by
  gmount's placement rule over those inputs (exactly what ``Cluster.place``
  answers for them). Jobs with no located input get no profile: Pegasus's
  own site selector maps them (``pegasus.selector.site``; the gmount
  callout, see `selector`, if you ask for it).
- ``pegasus.properties``: the catalog locations, ``sharedfs`` data
  configuration, symlinks for replicas at the job's site, and (with
  ``callout=True``) the NonJavaCallout site selector and the environment it
  needs.

Only workflow inputs count for placement: a file the workflow writes is
written again by the run, wherever its job runs, so an old copy of it in the
namespace says nothing about where the new one will be.
"""

from __future__ import annotations

import io
import os
import posixpath
import shutil
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

from Pegasus import yaml as pegasus_yaml
from Pegasus.api import (
    Directory,
    FileServer,
    Operation,
    Properties,
    ReplicaCatalog,
    Site,
    SiteCatalog,
    Workflow,
)

from gmountpy.api import Cluster, FileLocations
from gmountpy.errors import GmountError
from gmountpy.jobs import bypass
from gmountpy.jobs.placement import choose_node

__all__ = ["SELECTOR_SCRIPT", "Prepared", "catalog_properties", "prepare", "replica_catalog", "selector_properties",
           "site_catalog", "workflow_inputs"]

#: The console script of the NonJavaCallout site selector (see gmountpy_pegasus.selector).
SELECTOR_SCRIPT = "gmount-pegasus-site-selector"

#: Job metadata key recording the site gmount chose, so that a later `prepare`
#: can tell its own `execution.site` from one the user set (which it keeps).
CHOSEN_KEY = "gmount.execution.site"

#: Use types (wf-5.0 schema, `linkType`) a job reads, and those that make a file (an `inout`
#: file must exist before its job: a workflow input unless another job outputs it).
_READS = ("input", "inout")
_WRITES = ("output", "checkpoint")

#: Site names the planner gives a meaning of its own.
_RESERVED_SITES = ("local", "NONE")

WorkflowSource = Union[Workflow, str, "os.PathLike[str]"]


@dataclass(frozen=True)
class Prepared:
    """What `prepare` wrote and decided."""

    workflow: Path                 # the workflow with selector profiles (YAML)
    sites: Path                    # site catalog (YAML)
    replicas: Path                 # replica catalog (YAML)
    properties: Path               # pegasus.properties to pass to pegasus-plan --conf
    placements: Mapping[str, str]  # job id -> gmount node (= Pegasus site) for jobs with located inputs
    unplaced: tuple[str, ...]      # job ids left to Pegasus's site selector (no located input)
    kept: Mapping[str, str] = field(default_factory=dict)  # job id -> site the user set; left alone
    missing: tuple[str, ...] = ()  # workflow inputs no node holds (Pegasus will fail to find them)
    replica_count: int = 0         # PFN entries written to the replica catalog

    def __str__(self) -> str:
        lines = [f"workflow    {self.workflow}", f"sites       {self.sites}", f"replicas    {self.replicas}",
                 f"properties  {self.properties}",
                 (f"{len(self.placements)} jobs placed by their inputs, {len(self.unplaced)} left to Pegasus's "
                  f"site selector, {len(self.kept)} with a site you set; {self.replica_count} replica entries")]
        if self.missing:
            shown = ", ".join(self.missing[:5]) + (" ..." if len(self.missing) > 5 else "")
            lines.append(f"no node holds {len(self.missing)} workflow inputs: {shown}")
        return "\n".join(lines)


def prepare(workflow: WorkflowSource, cluster: Cluster, out_dir: str | os.PathLike[str], *, root: str = "/",
            base: str = "pegasus", callout: bool = False) -> Prepared:
    """Write site and replica catalogs, placed workflow and properties for `workflow` on `cluster`.

    `workflow` is a `Pegasus.api.Workflow` (its jobs get the selector
    profiles too, so a later `workflow.write()`/`plan()` carries them) or
    the path of a workflow already written to YAML. LFNs are namespace
    paths below `root`. `base` is the directory, in every mount, that holds
    each site's scratch and storage. `callout=True` also configures the
    gmount site selector for the jobs left to Pegasus. Run it again after
    inputs move (`Cluster.stage`): placements follow the data.
    """
    if not posixpath.isabs(root):
        raise ValueError(f"`root` must be an absolute namespace path, got {root!r}")
    if not base or base.startswith("/") or ".." in base.split("/"):
        raise ValueError(f"`base` must be a relative directory inside the mount, got {base!r}")
    for node in cluster.nodes:
        if node.name in _RESERVED_SITES:
            raise GmountError(f"node {node.name!r} of cluster {cluster.name!r} has a name Pegasus reserves for a "
                              "site of its own: rename it in the cluster file")
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)

    document = _workflow_document(workflow)
    jobs = _jobs(document)
    inputs = workflow_inputs(document)
    found = cluster.where([_namespace_path(root, lfn) for lfn in inputs]) if inputs else None
    located: dict[str, FileLocations] = {}
    missing: list[str] = []
    for lfn, item in zip(inputs, found or (), strict=True):
        files = tuple(h for h in item.holders if not h.is_dir)
        if files:
            located[lfn] = item if len(files) == len(item.holders) else \
                FileLocations(item.path, item.asked_from, files, item.given)
        else:
            missing.append(lfn)

    placements, unplaced, kept = _place_jobs(jobs, located, cluster)
    _apply(jobs, placements)
    if isinstance(workflow, Workflow):
        _apply_to_object(workflow, placements, [job["id"] for job in jobs])

    replicas, count = replica_catalog(located, cluster, root)
    prepared = Prepared(out / "workflow.yml", out / "sites.yml", out / "replicas.yml", out / "pegasus.properties",
                        placements, tuple(unplaced), kept, tuple(missing), count)
    if isinstance(workflow, Workflow):
        workflow.write(str(prepared.workflow))
    else:
        with open(prepared.workflow, "w") as f:
            pegasus_yaml.dump(document, f, sort_keys=False)
    site_catalog(cluster, base).write(str(prepared.sites))
    replicas.write(str(prepared.replicas))
    properties = Properties()
    settings = catalog_properties(prepared)
    if callout:
        settings.update(selector_properties(cluster, root, out))
    for key, value in settings.items():
        properties[key] = value
    properties.write(str(prepared.properties))
    return prepared


# --------------------------------------------------------------------------- the workflow


def _workflow_document(workflow: WorkflowSource) -> dict[str, Any]:
    """The workflow as Pegasus writes it (wf-5.0 YAML), loaded by Pegasus's own YAML loader."""
    if isinstance(workflow, Workflow):
        text = io.StringIO()
        workflow.write(text)
        document = pegasus_yaml.loads(text.getvalue())
    else:
        try:
            with open(workflow) as f:
                document = pegasus_yaml.load(f)
        except FileNotFoundError:
            raise GmountError(f"no workflow file {os.fspath(workflow)}") from None
    if not isinstance(document, dict) or not isinstance(document.get("jobs"), list):
        raise GmountError(f"{_describe(workflow)} is not a Pegasus 5 workflow: it has no list of jobs")
    return document


def _describe(workflow: WorkflowSource) -> str:
    return f"workflow {workflow.name!r}" if isinstance(workflow, Workflow) else os.fspath(workflow)


def _jobs(document: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Compute jobs (type `job`); sub-workflow jobs run where Pegasus puts them."""
    return [job for job in document["jobs"] if isinstance(job, dict) and job.get("type", "job") == "job"]


def _uses(job: Mapping[str, Any], types: Sequence[str]) -> list[str]:
    return [use["lfn"] for use in job.get("uses", ()) if use.get("type") in types]


def workflow_inputs(document: Mapping[str, Any]) -> list[str]:
    """LFNs some job reads and no job writes, in the order jobs first read them."""
    all_jobs = [job for job in document["jobs"] if isinstance(job, dict)]
    written = {lfn for job in all_jobs for lfn in _uses(job, _WRITES)}
    return list(dict.fromkeys(lfn for job in all_jobs for lfn in _uses(job, _READS) if lfn not in written))


def _namespace_path(root: str, lfn: str) -> str:
    return posixpath.normpath(posixpath.join(root, lfn.lstrip("/")))


def _place_jobs(jobs: list[dict[str, Any]], located: Mapping[str, FileLocations],
                cluster: Cluster) -> tuple[dict[str, str], list[str], dict[str, str]]:
    """Each job with a located input -> the node `Cluster.place` would choose for those inputs."""
    nodes = cluster.nodes
    order = list(nodes.names)
    slots = {node.name: node.slots for node in nodes}
    placements: dict[str, str] = {}
    unplaced: list[str] = []
    kept: dict[str, str] = {}
    for job in jobs:
        chosen_before = job.get("metadata", {}).get(CHOSEN_KEY)
        current = job.get("profiles", {}).get("selector", {}).get("execution.site")
        if current is not None and current != chosen_before:
            kept[job["id"]] = current  # the user's choice wins
            continue
        holdings: dict[str, dict[str, int]] = {}
        for lfn in dict.fromkeys(_uses(job, _READS)):
            item = located.get(lfn)
            if item is None:
                continue
            held = holdings.setdefault(item.path, {})
            for holder in item.holders:
                held[holder.node] = max(held.get(holder.node, 0), holder.size)
        if not holdings:
            unplaced.append(job["id"])
            continue
        # The same rule, inputs and numbers as Cluster.place; one lookup for the whole
        # workflow instead of one round of connections per job. Nothing runs yet.
        decision = choose_node(holdings, order, slots=slots, running={}, rtt=cluster.overlay.rtt)
        placements[job["id"]] = decision.node
    return placements, unplaced, kept


def _apply(jobs: list[dict[str, Any]], placements: Mapping[str, str]) -> None:
    """Set (or clear) gmount's selector profile and its marker on the YAML jobs."""
    for job in jobs:
        node = placements.get(job["id"])
        metadata = job.get("metadata", {})
        selector = job.get("profiles", {}).get("selector", {})
        if node is not None:
            job.setdefault("profiles", {}).setdefault("selector", {})["execution.site"] = node
            job.setdefault("metadata", {})[CHOSEN_KEY] = node
        elif CHOSEN_KEY in metadata and selector.get("execution.site") == metadata[CHOSEN_KEY]:
            del selector["execution.site"]  # inputs gone: back to Pegasus's site selector
            del metadata[CHOSEN_KEY]
            _drop_empty(job)


def _apply_to_object(workflow: Workflow, placements: Mapping[str, str], job_ids: list[str]) -> None:
    for job_id in job_ids:
        job = workflow.jobs[job_id]
        node = placements.get(job_id)
        selector = job.profiles.get("selector", {})
        if node is not None:
            job.add_selector_profile(execution_site=node)
            job.metadata[CHOSEN_KEY] = node
        elif CHOSEN_KEY in job.metadata and selector.get("execution.site") == job.metadata[CHOSEN_KEY]:
            del selector["execution.site"]
            del job.metadata[CHOSEN_KEY]
            if not selector:
                job.profiles.pop("selector", None)


def _drop_empty(job: dict[str, Any]) -> None:
    profiles = job.get("profiles", {})
    if not profiles.get("selector", True):
        del profiles["selector"]
    for key in ("profiles", "metadata"):
        if key in job and not job[key]:
            del job[key]


# --------------------------------------------------------------------------- catalogs


def site_catalog(cluster: Cluster, base: str = "pegasus") -> SiteCatalog:
    """One site per node: its mount is the shared file system; HTCondor runs its jobs on its host."""
    catalog = SiteCatalog()
    local_host = socket.getfqdn()
    for node in cluster.nodes:
        top = posixpath.join(node.mountpoint, base, node.name)
        site = Site(node.name)
        for kind, sub in ((Directory.SHARED_SCRATCH, "scratch"), (Directory.SHARED_STORAGE, "storage")):
            path = posixpath.join(top, sub)
            site.add_directories(Directory(kind, path, shared_file_system=True)
                                 .add_file_servers(FileServer("file://" + path, Operation.ALL)))
        host = cluster.spec.node(node.name).host or local_host
        site.add_condor_profile(requirements=f'(Machine == "{host}")')
        site.add_pegasus_profile(style="condor")
        site.add_env(GMOUNT_NODE=node.name, GMOUNT_CLUSTER=cluster.name)
        if cluster.spec.node(node.name).host is None and bypass.enabled() and bypass.library() is not None:
            site.add_env(LD_PRELOAD=bypass.library())  # a node on this machine: its files straight from its export
        catalog.add_sites(site)
    return catalog


def replica_catalog(located: Mapping[str, FileLocations], cluster: Cluster,
                    root: str = "/") -> tuple[ReplicaCatalog, int]:
    """Each located input at each holder: the file in that node's mount, and on its own disk."""
    catalog = ReplicaCatalog()
    mounts = {node.name: node.mountpoint for node in cluster.nodes}
    count = 0
    for lfn, item in located.items():
        inside = item.path.lstrip("/")
        for holder in item.holders:
            for pfn in dict.fromkeys((posixpath.join(mounts[holder.node], inside), holder.export_path)):
                catalog.add_replica(holder.node, lfn, "file://" + pfn)
                count += 1
    return catalog, count


# --------------------------------------------------------------------------- properties


def catalog_properties(prepared: Prepared) -> dict[str, str]:
    """Where the planner finds the catalogs, and how data moves between gmount sites."""
    return {
        "pegasus.catalog.site.file": str(prepared.sites),
        "pegasus.catalog.replica": "YAML",
        "pegasus.catalog.replica.file": str(prepared.replicas),
        # Each site's scratch is in the mount: jobs read inputs where they are.
        "pegasus.data.configuration": "sharedfs",
        # A file:// replica at the job's own site is symlinked, never copied.
        "pegasus.transfer.links": "true",
    }


def selector_properties(cluster: Cluster, root: str = "/", out_dir: Path | None = None) -> dict[str, str]:
    """Properties that make the planner ask gmount's callout for jobs without a site.

    The planner runs the callout with only the variables it is given
    (HOME, USER, TMP, TZ and `pegasus.selector.site.env.*`; no PATH), so
    the script is named by its absolute path and everything it needs to
    find the cluster is passed explicitly.
    """
    env = {"GMOUNT_CLUSTER": cluster.name, "GMOUNT_PEGASUS_ROOT": root}
    state = os.environ.get("XDG_STATE_HOME")
    if state:
        env["XDG_STATE_HOME"] = state  # where the launcher keeps the cluster's state
    properties = {"pegasus.selector.site": "NonJavaCallout",
                  "pegasus.selector.site.path": selector_path(out_dir),
                  "pegasus.selector.site.keep.tmp": "onerror"}
    properties.update({f"pegasus.selector.site.env.{k}": v for k, v in env.items()})
    return properties


def selector_path(out_dir: Path | None = None) -> str:
    """Absolute path of the callout: the installed script, else a launcher written into `out_dir`."""
    beside = Path(sys.executable).parent / SELECTOR_SCRIPT
    found = str(beside) if beside.is_file() else shutil.which(SELECTOR_SCRIPT)
    if found is None:
        if out_dir is None:
            raise GmountError(f"{SELECTOR_SCRIPT} is not installed: install gmountpy[pegasus]")
        launcher = out_dir / SELECTOR_SCRIPT
        launcher.write_text(f"#!{sys.executable}\nimport sys\nfrom gmountpy_pegasus.selector import main\n"
                            "sys.exit(main())\n")
        launcher.chmod(0o755)
        found = str(launcher)
    path = os.path.abspath(found)
    if any(c.isspace() for c in path):
        # The planner starts it with Runtime.exec(String), which splits the command at whitespace.
        raise GmountError(f"the site selector's path {path!r} contains whitespace, which the Pegasus planner "
                          "cannot run: install gmountpy into a directory without spaces")
    return path
