"""The event-recognition pipeline (see the Makefile for the DAG)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence

from ..base import Job, Options, Pipeline, WorkdirFor

STAGES = ("split", "tokenize", "tag", "entities", "events", "aggregate")
_CHAIN = [("split", "docs/{}.xml", "sent/{}.json"), ("tokenize", "sent/{}.json", "tok/{}.json"),
          ("tag", "tok/{}.json", "pos/{}.json"), ("entities", "pos/{}.json", "ent/{}.json"),
          ("events", "ent/{}.json", "ev/{}.tsv")]


def spread(names: Sequence[str], sites: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """Document -> node: each site holds a contiguous share of the corpus, round-robin over its nodes."""
    site_names = list(sites)
    per_site = -(-len(names) // len(site_names))
    result = {}
    for i, name in enumerate(names):
        nodes = sites[site_names[min(i // per_site, len(site_names) - 1)]]
        result[name] = nodes[(i % per_site) % len(nodes)]
    return result


def generate(n: int, sites: Mapping[str, Sequence[str]], workdir_for: WorkdirFor, options: Options) -> None:
    """n documents spread by site; option abstracts: abstracts per document (default 1; a few thousand make
    a batch of a few MiB, as an archive ships them)."""
    from .corpus import pmids, write_corpus

    unknown = sorted(set(options) - {"abstracts"})
    if unknown:
        raise ValueError(f"the event pipeline has no option {', '.join(unknown)} (it has abstracts)")
    names = [f"{p}.xml" for p in pmids(n)]
    node_of = spread(names, sites)
    write_corpus(n, lambda i, name: os.path.join(workdir_for(node_of[name]), "docs", name),
                 abstracts=options.get("abstracts", 1))


def jobs(files: Sequence[str]) -> list[Job]:
    present = set(files)
    docs = sorted(f[len("docs/"):-len(".xml")] for f in files if f.startswith("docs/") and f.endswith(".xml"))
    result = [Job(stage, out.format(d), (src.format(d),)) for d in docs for stage, src, out in _CHAIN
              if out.format(d) in present]
    if "events.tsv" in present:
        result.append(Job("aggregate", "events.tsv", tuple(f"ev/{d}.tsv" for d in docs)))
    return result


def compare(ours: Callable[[str], bytes], reference: Callable[[str], bytes]) -> str | None:
    a, b = ours("events.tsv"), reference("events.tsv")
    if a == b:
        return None
    rows_a, rows_b = a.decode().splitlines(), b.decode().splitlines()
    return (f"events.tsv differs from the single-directory run's: {len(rows_a) - 1} vs {len(rows_b) - 1} events, "
            f"{len(set(rows_a) ^ set(rows_b))} rows in only one of them")


PIPELINE = Pipeline("event", "docs", 158, STAGES, generate, jobs, compare, "events.tsv", None)
