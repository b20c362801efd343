"""The reference pipelines: a Montage mosaic and event recognition over medline-like abstracts.

Each pipeline is a directory with a Makefile and a Snakefile (the same DAG,
run by make with gmount's one-line include or by Snakemake with the gmount
executor, and plainly on one local directory), a generator of its inputs,
and a description of its jobs used to report where they ran. They ship in
the wheel so that `gmount pipeline` works from a normal install.
"""

from __future__ import annotations

from .base import Job, Pipeline, pipeline

__all__ = ["Job", "Pipeline", "pipeline"]
