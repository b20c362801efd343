"""The local bypass for jobs gmount starts: what turns it on in a job's environment.

A job whose environment preloads `libgmount_preload.so` (built from csrc/gmount_preload.c
at install) reads and writes the files its node holds straight from the node's export,
at disk speed, with any dynamically linked program; everything else goes through the
mount (docs/bypass.md; the daemon's side is gmountpy/node/bypass.py). Jobs gmount starts
have it on -- `gmount run`, `Cluster.run`/`spawn` (and so the Snakemake executor), make's
`gmount-sh`, the Pegasus site catalog of local clusters -- unless GMOUNT_BYPASS=0 is set
where they are started; `gmount shell` and `gmount env` turn it on for a user's own
processes.

Standard library only: make's per-recipe wrapper imports it.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # no `typing`, `collections.abc` or `shlex` (re) at run time: gmount-sh imports this
if TYPE_CHECKING:
    from collections.abc import Mapping

#: The interposition library, next to this module once the package is built.
LIBRARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libgmount_preload.so")
#: GMOUNT_BYPASS=0 (or off, no, false) where a job is started keeps it on the mount; the library
#: reads it too, so a program can switch it off for itself and what it starts.
SWITCH = "GMOUNT_BYPASS"
_OFF = ("0", "off", "no", "false")


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether jobs started from this environment get the bypass (GMOUNT_BYPASS is not 0/off/no/false)."""
    env = os.environ if environ is None else environ
    return env.get(SWITCH, "1").strip().lower() not in _OFF


def library() -> str | None:
    """The built library: next to this module, else (a source checkout run beside an installed copy,
    as the tests are) the installed copy's; None when gmountpy was never built."""
    if os.path.exists(LIBRARY):
        return LIBRARY
    import sys

    for entry in sys.path:
        candidate = os.path.join(entry or ".", "gmountpy", "jobs", "libgmount_preload.so")
        if os.path.exists(candidate):
            return os.path.abspath(candidate)
    return None


def preload_value(current: str, lib: str) -> str:
    """LD_PRELOAD with `lib` first, the entries already there kept (separated by spaces or colons)."""
    entries = [entry for entry in current.replace(":", " ").split() if entry]
    return " ".join([lib, *(entry for entry in entries if entry != lib)])


def job_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables to add to a job started on this machine: LD_PRELOAD, or nothing when the
    bypass is switched off or the library was not built."""
    env = os.environ if environ is None else environ
    lib = library()
    if not enabled(env) or lib is None:
        return {}
    return {"LD_PRELOAD": preload_value(env.get("LD_PRELOAD", ""), lib)}


def remote_prelude(python: str, environ: Mapping[str, str] | None = None) -> str:
    """Shell text for a job on an SSH node: find that node's own copy of the library (through the
    node's `python`, without importing gmountpy) and preload it; ends with `; ` or is empty."""
    import shlex

    if not enabled(environ):
        return f"{SWITCH}=0; export {SWITCH}; "
    locate = ("import importlib.util as u, os; s = u.find_spec('gmountpy'); "
              "print(os.path.join(os.path.dirname(s.origin), 'jobs', 'libgmount_preload.so'))")
    # -P: not the job's directory first on sys.path (a checkout of gmountpy in the namespace is not the install)
    return (f"gm_lib=$({shlex.quote(python)} -P -c {shlex.quote(locate)} 2>/dev/null) && [ -r \"$gm_lib\" ] && "
            "LD_PRELOAD=\"$gm_lib${LD_PRELOAD:+ $LD_PRELOAD}\" && export LD_PRELOAD; ")


def shell_lines(environ: Mapping[str, str] | None = None) -> str:
    """`export` lines for `eval "$(gmount env)"`: the bypass on in this shell and what it starts."""
    import shlex

    lib = library()
    if lib is None:
        raise FileNotFoundError(f"{LIBRARY} is missing: gmountpy was not built (pip install gmountpy builds it)")
    env = os.environ if environ is None else environ
    value = preload_value(env.get("LD_PRELOAD", ""), lib)
    return f"export LD_PRELOAD={shlex.quote(value)}\nexport {SWITCH}=1\n"


__all__ = ["LIBRARY", "SWITCH", "enabled", "job_environment", "library", "preload_value", "remote_prelude",
           "shell_lines"]
