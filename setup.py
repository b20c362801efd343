"""The C parts of gmountpy, built at install (everything else is in pyproject.toml).

`C_TARGETS` lists them: each is compiled with the system's C compiler ($CC,
else `cc`; pyfuse3 needs one anyway) into the installed packages, so
`pip install .`, a wheel and an editable install all carry them. A wheel
with them is platform-specific.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from dataclasses import dataclass

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py


@dataclass(frozen=True)
class CTarget:
    """One C program ("program") or shared library ("shared", e.g. for LD_PRELOAD) to build."""

    output: str                  # path inside the installed packages, e.g. "gmountpy_make/gmount-job"
    sources: tuple[str, ...]     # relative to this file
    kind: str = "program"
    cflags: tuple[str, ...] = ()
    libraries: tuple[str, ...] = ()  # -l names
    source_package: str = ""     # the source directory of the output's package (for editable installs)


C_TARGETS = [
    # make's SHELL under gmount.mk: asks the node daemon where a recipe goes and runs it there
    CTarget("gmountpy_make/gmount-job", ("plugins/gmountpy_make/gmount_job.c",),
            source_package="plugins/gmountpy_make"),
    # LD_PRELOAD'ed into jobs: local files straight from the export (gmountpy/jobs/bypass.py)
    CTarget("gmountpy/jobs/libgmount_preload.so", ("csrc/gmount_preload.c",), kind="shared",
            cflags=("-fvisibility=hidden",), libraries=("dl", "pthread"), source_package="gmountpy/jobs"),
    # loaded into the node daemon before pyfuse3: kernel FUSE passthrough (gmountpy/node/passthrough.py)
    CTarget("gmountpy/node/libgmount_passthrough.so", ("csrc/gmount_passthrough.c",), kind="shared",
            cflags=("-fvisibility=hidden",), libraries=("dl", "pthread"), source_package="gmountpy/node"),
]

CFLAGS = ("-O2", "-Wall", "-Wextra", "-std=gnu11")


def compile_target(target: CTarget, output: str) -> None:
    compiler = shlex.split(os.environ.get("CC", "cc"))
    flags = [*CFLAGS, *target.cflags, *(["-shared", "-fPIC"] if target.kind == "shared" else [])]
    command = [*compiler, *flags, "-o", output, *target.sources, *(f"-l{name}" for name in target.libraries)]
    os.makedirs(os.path.dirname(output), exist_ok=True)
    try:
        subprocess.run(command, check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise SystemExit(f"building {target.output} failed ({exc}): gmountpy needs a C compiler "
                         f"(Debian: apt-get install gcc); the command was: {shlex.join(command)}") from None


class BuildWithC(build_py):
    """build_py, then the C targets into the build directory (into the sources for an editable install)."""

    def run(self) -> None:
        super().run()
        for target in C_TARGETS:
            compile_target(target, self._output(target))

    def _output(self, target: CTarget) -> str:
        if getattr(self, "editable_mode", False) and target.source_package:
            return os.path.join(target.source_package, os.path.basename(target.output))
        return os.path.join(self.build_lib, target.output)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), *(self._output(target) for target in C_TARGETS)]


class BinaryDistribution(Distribution):
    """The wheel holds compiled programs: tag it for this platform."""

    def has_ext_modules(self) -> bool:
        return True


setup(cmdclass={"build_py": BuildWithC}, distclass=BinaryDistribution)
