"""The recipes a run of make would run, in make's order, read from make itself (`gmount plan`).

`make -n` with gmount.mk included and GMOUNT_PLAN_FILE set records, for
every recipe line make would run, its directory, target and prerequisites
($^) -- through SHELL's expansion, which make does per recipe line even when
it only prints the line. So the recipes are exactly make's: its own rule
search, pattern rules, timestamps (a target that is up to date is not
there), -B, -C, sub-makes (`$(MAKE)` lines run under -n, and --eval reaches
them through MAKEFLAGS), and the order make would start them in with -j1.
Nothing is placed or run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

from gmountpy.errors import GmountError

from . import MAKEFILE

__all__ = ["MakeRun", "Recipe", "dry_run", "is_dry_run"]


@dataclass(frozen=True)
class Recipe:
    """One recipe make would run: in `directory` (absolute), for `target`, reading `prerequisites` ($^)."""

    directory: str
    target: str
    prerequisites: tuple[str, ...]


@dataclass(frozen=True)
class MakeRun:
    """What `make -n` printed, and the recipes it recorded (in make's order, one per target)."""

    recipes: tuple[Recipe, ...]
    stdout: str
    stderr: str


def dry_run(make_args: Sequence[str], cwd: str | None = None) -> MakeRun:
    """Run `make -n MAKE_ARGS` with gmount.mk included, in `cwd`; GmountError if make fails."""
    make = shutil.which("make")
    if make is None:
        raise GmountError("GNU make is not on PATH (Debian package `make`)")
    with tempfile.TemporaryDirectory(prefix="gmount-plan-") as tmp:
        record = os.path.join(tmp, "recipes.tsv")
        env = {**os.environ, "GMOUNT_PLAN_FILE": record}
        env.pop("MAKEFLAGS", None)  # from a make this runs under: its -j and jobserver are not this run's
        env.pop("MAKELEVEL", None)
        done = subprocess.run([make, f"--eval=include {MAKEFILE}", "-n", *make_args], cwd=cwd, env=env,
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise GmountError(f"make -n {' '.join(make_args)} failed (exit status {done.returncode}):\n"
                              f"{done.stderr.rstrip() or done.stdout.rstrip()}")
        try:
            with open(record, encoding="utf-8", errors="surrogateescape") as f:
                text = f.read()
        except FileNotFoundError:
            text = ""
    recipes = parse_record(text)
    if not recipes and _prints_recipes(done.stdout):
        raise GmountError("make -n printed recipes but none reached gmount.mk: the Makefile sets SHELL after "
                          "including gmount.mk (set GMOUNT_RECIPE_SHELL instead; gmount.mk makes SHELL its own)")
    return MakeRun(recipes, done.stdout, done.stderr)


def parse_record(text: str) -> tuple[Recipe, ...]:
    """The recipes of a GMOUNT_PLAN_FILE: a line per recipe line, so each (directory, target) is kept once."""
    seen: set[tuple[str, str]] = set()
    recipes = []
    for line in text.splitlines():
        directory, _, rest = line.partition("\t")
        target, _, prerequisites = rest.partition("\t")
        if not target or (directory, target) in seen:
            continue
        seen.add((directory, target))
        recipes.append(Recipe(directory, target, tuple(prerequisites.split())))
    return tuple(recipes)


def _prints_recipes(stdout: str) -> bool:
    """Whether make -n printed any command (not only its own messages)."""
    return any(line and not line.startswith(("make: ", "make[")) for line in stdout.splitlines())


#: make's short options that take an argument (the rest of the word, or the next word)
_WITH_ARGUMENT = set("CfIjloOW")
_DRY_RUN = ("--dry-run", "--just-print", "--recon")


def is_dry_run(make_args: Sequence[str]) -> bool:
    """Whether make's arguments ask for a dry run (-n, --dry-run, --just-print, --recon, or -n in a group)."""
    skip = False
    for arg in make_args:
        if skip:
            skip = False
            continue
        if arg == "--":
            return False
        if arg.startswith("--"):
            if arg in _DRY_RUN:
                return True
            continue
        if not arg.startswith("-") or arg == "-":
            continue
        for i, letter in enumerate(arg[1:], start=1):
            if letter == "n":
                return True
            if letter in _WITH_ARGUMENT:
                # -j, -l and -O take an optional argument: only the rest of the word
                skip = i == len(arg) - 1 and letter not in "jlO"
                break
    return False
