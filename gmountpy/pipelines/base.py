"""What a reference pipeline provides to the runner: its files, inputs, jobs and output check."""

from __future__ import annotations

import dataclasses
import importlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

#: node -> directory its inputs go to (the same directory for a single-directory run)
WorkdirFor = Callable[[str], str]
#: a pipeline's input options beyond its size (Montage: tile_pixels); each pipeline names its own
Options = Mapping[str, int]


@dataclass(frozen=True)
class Job:
    """One job of a finished run, recovered from its output (where it ran: the placement log, else the
    node holding the output)."""

    stage: str
    output: str             # path relative to the workflow directory
    inputs: tuple[str, ...]  # the job's declared inputs (make prerequisites, Snakemake input)


@dataclass(frozen=True)
class Pipeline:
    name: str
    size_name: str    # "tiles", "docs"
    default_size: int
    stages: tuple[str, ...]  # in DAG order
    #: write the inputs of size n, spread over `sites` (site -> nodes); files go under workdir_for(node);
    #: options as in `options` (raises ValueError on one it does not know)
    generate: Callable[[int, Mapping[str, Sequence[str]], WorkdirFor, Options], None]
    #: the jobs of a finished run, from the relative paths of the files it left
    jobs: Callable[[Sequence[str]], list[Job]]
    #: compare a run's result directory with the single-directory run's: None if equal, else what differs
    compare: Callable[[Callable[[str], bytes], Callable[[str], bytes]], str | None]
    result: str       # the main output (relative path)
    picture: str | None  # a PNG the pipeline writes, if any
    rules: Mapping[str, str] = dataclasses.field(default_factory=dict)  # Snakemake rule -> stage, where they differ

    @property
    def directory(self) -> str:
        """Where the Makefile and Snakefile are."""
        module = importlib.import_module(f"gmountpy.pipelines.{self.name}")
        return os.path.dirname(module.__file__ or "")


def pipeline(name: str) -> Pipeline:
    if name not in ("montage", "event"):
        raise ValueError(f"unknown pipeline {name!r}: choose montage or event")
    module = importlib.import_module(f"gmountpy.pipelines.{name}")
    result: Pipeline = module.PIPELINE
    return result
