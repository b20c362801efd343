"""GNU make on gmount: `include $(shell gmount make-include)` runs every recipe where its inputs are.

`gmount.mk` (shipped beside this file) makes `gmount-sh` make's SHELL;
`gmount-sh` (`gmountpy_make.shell`) places and runs each recipe;
`gmount make-include` and `gmount make` are the CLI (`gmountpy_make.cli`).
"""

from __future__ import annotations

import os

__all__ = ["MAKEFILE"]

#: The makefile to include: `include $(shell gmount make-include)` prints this path.
MAKEFILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gmount.mk")
