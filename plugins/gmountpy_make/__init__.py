"""GNU make on gmount: `include $(shell gmount make-include)` runs every recipe where its inputs are.

`gmount.mk` (shipped beside this file) makes `gmount-job` make's SHELL: a
small C program, built at install beside this file (from `gmount_job.c`),
that asks the node daemon where each recipe goes and runs it there;
`gmount-sh` (`gmountpy_make.shell`) is the Python path it hands SSH nodes to,
and what runs when the daemon has no job socket;
`gmount make-include` and `gmount make` are the CLI (`gmountpy_make.cli`).
"""

from __future__ import annotations

import os

__all__ = ["JOB_PROGRAM", "MAKEFILE"]

#: The makefile to include: `include $(shell gmount make-include)` prints this path.
MAKEFILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gmount.mk")
#: make's SHELL under gmount.mk (C, built at install; setup.py).
JOB_PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gmount-job")
