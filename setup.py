"""Builds the C parts of gmountpy; everything else is in pyproject.toml.

`C_TARGETS` lists them: shared libraries (loaded with LD_PRELOAD or ctypes, never
imported) and programs. Each is compiled with the C compiler Python was built with
(the one pyfuse3's own build needs) into the package, so `pip install .`, a wheel
and an editable install (`--inplace`) all carry them. Add a program the same way:

    CTarget("gmountpy/some/dir/program", ["csrc/program.c"], kind="program")
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from setuptools import Distribution, setup
from setuptools.command.build_ext import build_ext


@dataclass(frozen=True)
class CTarget:
    output: str                       # path inside the package tree, e.g. gmountpy/jobs/libx.so
    sources: list[str]
    kind: str = "shared"              # "shared" (a .so) or "program"
    libraries: list[str] = field(default_factory=list)
    cflags: list[str] = field(default_factory=lambda: ["-O2", "-Wall", "-Wextra", "-fvisibility=hidden"])


C_TARGETS = [
    # LD_PRELOAD'ed into jobs: local files straight from the export (gmountpy/jobs/bypass.py)
    CTarget("gmountpy/jobs/libgmount_preload.so", ["csrc/gmount_preload.c"], libraries=["dl", "pthread"]),
    # loaded into the node daemon before pyfuse3: kernel FUSE passthrough (gmountpy/node/passthrough.py)
    CTarget("gmountpy/node/libgmount_passthrough.so", ["csrc/gmount_passthrough.c"], libraries=["dl", "pthread"]),
]


class BuildC(build_ext):
    """build_ext that also builds C_TARGETS (there are no Python extension modules)."""

    def run(self) -> None:
        super().run()
        from distutils.ccompiler import new_compiler
        from distutils.sysconfig import customize_compiler

        compiler = new_compiler()
        customize_compiler(compiler)
        base = "." if self.inplace else self.build_lib
        for target in C_TARGETS:
            output = os.path.join(base, target.output)
            os.makedirs(os.path.dirname(output), exist_ok=True)
            temp = os.path.join(self.build_temp, os.path.dirname(target.output))
            objects = compiler.compile(target.sources, output_dir=temp, extra_preargs=["-fPIC"],
                                       extra_postargs=target.cflags)
            if target.kind == "shared":
                compiler.link_shared_object(objects, output, libraries=target.libraries)
            elif target.kind == "program":
                compiler.link_executable(objects, os.path.basename(output), output_dir=os.path.dirname(output),
                                         libraries=target.libraries)
            else:
                raise ValueError(f"C target {target.output}: unknown kind {target.kind!r}")

    def get_outputs(self) -> list[str]:
        base = "." if self.inplace else self.build_lib
        return [*super().get_outputs(), *(os.path.join(base, t.output) for t in C_TARGETS)]


class BinaryDistribution(Distribution):
    """The wheel carries compiled code: tag it for the platform, and run build_ext."""

    def has_ext_modules(self) -> bool:
        return True


setup(distclass=BinaryDistribution, cmdclass={"build_ext": BuildC})
