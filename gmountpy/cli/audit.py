from __future__ import annotations

import json

import click
from rich.markup import escape
from rich.table import Table

from ..launch.audit import WARN, audit, summary
from ._common import console, spec_from

_STYLE = {"ok": "green", "info": "cyan", "warn": "yellow"}


@click.command("audit")
@click.argument("cluster_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--strict", is_flag=True, help="Exit with status 1 if there is any warning.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
def command(cluster_file: str, strict: bool, as_json: bool) -> None:
    """Show what protects the cluster (TLS per link, secret files, exports, allow_other) and warn on weak settings."""
    spec = spec_from(cluster_file)
    findings = audit(spec)
    warnings = sum(f.level == WARN for f in findings)
    if as_json:
        click.echo(json.dumps(summary(findings), indent=2))
    else:
        table = Table(title=f"cluster {spec.name}: security audit", show_edge=False, title_justify="left")
        for column in ("", "topic", "subject", "finding"):
            table.add_column(column)
        for f in findings:
            table.add_row(f"[{_STYLE[f.level]}]{f.level}[/]", f.topic, escape(f.subject), escape(f.message))
        console.print(table)
        console.print(f"{warnings} warning(s)" if warnings else "no warnings", markup=False)
    if strict and warnings:
        raise SystemExit(1)
