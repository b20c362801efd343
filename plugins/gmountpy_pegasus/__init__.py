"""gmountpy for Pegasus: catalogs and job sites from where the data is (extra `gmountpy[pegasus]`).

    import gmountpy, gmountpy.pegasus        # gmountpy.pegasus is this module
    cluster = gmountpy.Cluster.open("cluster.toml")
    gmountpy.pegasus.prepare(workflow, cluster, "run")   # a Pegasus.api.Workflow
    # pegasus-plan --conf run/pegasus.properties --sites n1,n2,... run/workflow.yml

`prepare` writes the site catalog, replica catalog, placed workflow and
properties (see gmountpy_pegasus.catalogs); `gmount-pegasus-site-selector` is
the NonJavaCallout site selector for the jobs it leaves to Pegasus (see
gmountpy_pegasus.selector). Only the Pegasus Python API (`pegasus-wms.api`)
is needed here; the planner and HTCondor are yours to install.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .catalogs import (
        Prepared,
        prepare,
        replica_catalog,
        selector_properties,
        site_catalog,
        workflow_inputs,
    )
    from .selector import Request, choose_site, parse_request

# Names load on first use: the site selector (run once per job by the planner)
# and `gmount` itself must not pay for importing Pegasus.
_WHERE = {"Prepared": "catalogs", "prepare": "catalogs", "replica_catalog": "catalogs",
          "selector_properties": "catalogs", "site_catalog": "catalogs", "workflow_inputs": "catalogs",
          "Request": "selector", "choose_site": "selector", "parse_request": "selector"}

__all__ = ["Prepared", "Request", "choose_site", "parse_request", "prepare", "replica_catalog",
           "selector_properties", "site_catalog", "workflow_inputs"]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{module}"), name)
