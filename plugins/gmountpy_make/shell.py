"""gmount-sh: run one recipe on the node that holds its prerequisites -- the Python path.

make's SHELL under gmount.mk is the C program gmount-job, which asks the node
daemon where a recipe goes and runs it there; it hands over to this wrapper
for nodes on other machines (SSH clusters; GMOUNT_PLACED_NODE names the node
it chose) and when the daemon has no job socket (then this wrapper places the
recipe itself, asking the mount). Used directly as SHELL, it does it all.

make calls `gmount-sh -c RECIPE` (or with its .SHELLFLAGS) for every recipe
line (one call per recipe with .ONESHELL), with GMOUNT_TARGET=$@ and
GMOUNT_DEPS=$^ in the environment. This runs once per recipe, so it imports
only the standard library and the stdlib-only `gmountpy.cluster.mounts` (and
`gmountpy.jobs.placement` when more than one node holds inputs) -- not even
`json` (it loads `re`) nor `signal`'s enums: the log line is written by
`json_line`, signals are handled through `_signal`; the full
API is loaded only to reach SSH nodes. The recipe starts with posix_spawn
(vfork), not fork: copying this process's memory map costs more.

- No target (a `$(shell ...)`): exec the recipe shell right here.
- Otherwise: find the cluster and node from the current directory (it is
  inside a node's mount), ask the mount who holds each prerequisite, choose
  the node with Pwrake's rule (`gmountpy.jobs.placement.choose_node`; the make
  process's node when no prerequisite is in the namespace), and run the
  recipe with the recipe shell in the same directory of that node's mount,
  with GMOUNT_NODE, GMOUNT_SITE and GMOUNT_CLUSTER set -- `Cluster.run`'s
  semantics. On a local cluster that is a child process in its own process
  group; INT, TERM, HUP and QUIT are forwarded to the whole group, and
  what is left of the group after that is terminated, so Ctrl-C (and
  make's SIGTERM) stop everything the recipe started. On an SSH
  cluster it is `Cluster.spawn(..., on=node)`, stopped (its whole process
  group on that node) when make is interrupted; make's own node runs its
  recipes itself.
- stdout, stderr and stdin are the recipe's own; the exit status is the
  recipe's (a recipe killed by a signal kills gmount-sh with that signal).
  A failed recipe adds one line naming its node, before make's own error.
- Not inside a running cluster's mount: the recipe runs here, with a notice
  (gmount.mk's check, `gmount-sh --gmount-check`, normally sees that first
  and leaves make's SHELL alone).
- One JSON line per recipe goes to $GMOUNT_PLACEMENT_LOG.
"""

from __future__ import annotations

import os
import sys
import time

from gmountpy.cluster import mounts, registry
from gmountpy.jobs import bypass
from gmountpy.jobs.planned import planned_node

TYPE_CHECKING = False  # typing is not imported at run time: it costs more than a small recipe
if TYPE_CHECKING:
    import signal
    from types import FrameType
    from typing import NoReturn
else:
    # The C module `signal` wraps: the same functions and constants, without the enums the
    # wrapper builds when imported (milliseconds, once per recipe).
    import _signal as signal

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
#: Variables that describe the recipe to gmount-sh only: a sub-make started by
#: the recipe must not see its parent's target (its own $(shell ...) would be
#: taken for a recipe).
PRIVATE_VARIABLES = ("GMOUNT_TARGET", "GMOUNT_DEPS", "GMOUNT_PLACED_NODE")


def main() -> None:
    args = sys.argv[1:]
    shell = os.environ.get("GMOUNT_RECIPE_SHELL") or "/bin/sh"
    target = os.environ.get("GMOUNT_TARGET", "")
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # Python ignores it; recipes must not inherit that
    if args == ["--gmount-check"]:
        check()
        return
    if not target or not args:
        os.execv(shell, [shell, *args])
    args[-1] = strip_oneshell_prefixes(args[-1])
    cwd = os.getcwd()
    found = mounts.find(cwd)
    if found is None:  # gmount.mk's check makes this rare: SHELL set by hand
        print(f"gmount: {cwd} is not inside a running gmount cluster's mount on this machine: the recipe of "
              f"{target} runs here", file=sys.stderr)
        os.execv(shell, [shell, *args])
    cluster, here, ns_dir = found
    holdings = cluster.holdings(os.environ.get("GMOUNT_DEPS", "").split(), cwd)
    placed = os.environ.get("GMOUNT_PLACED_NODE", "")  # chosen by the node daemon (gmount-job)
    node = placed if placed in cluster.nodes else choose(cluster, here, holdings)
    command = [shell, *args]
    started = time.monotonic()
    if cluster.nodes[node].remote and node != here:  # make's own node runs its recipes itself
        status, quiet = run_over_ssh(cluster, node, ns_dir, command)
    else:
        status, quiet = run_local(cluster, node, ns_dir, command, target)
    log(cluster, target, node, here, ns_dir, holdings, time.monotonic() - started, status)
    if status and not quiet:
        say_failure(target, node, status)
    if status < 0:  # killed by a signal: die the same way, so make reports it as it would for /bin/sh
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
        status = 128 - status
    sys.exit(status)


def check() -> None:
    """`gmount-sh --gmount-check` (gmount.mk, once per run of make): "place <time>-<make's pid>" if recipes
    run from here are placed (the stamp names the run's placement log), else "local <why>" -- then make
    runs them as plain make does, and says why once."""
    cwd = os.getcwd()
    if mounts.find(cwd) is None:
        print(f"local {cwd} is not inside a running gmount cluster's mount on this machine")
    else:
        print(f"place {time.strftime('%Y%m%dT%H%M%S')}-{os.getppid()}")


def say_failure(target: str, node: str, status: int) -> None:
    """The line before make's own error: which node the recipe failed on, and how."""
    if status > 0:
        print(f"gmount: target {target} failed on node {node}: its recipe exited with status {status}",
              file=sys.stderr)
    else:
        print(f"gmount: target {target} failed on node {node}: its recipe was killed by signal {-status} "
              f"({signal.strsignal(-status)})", file=sys.stderr)


def choose(cluster: mounts.MountedCluster, here: str, holdings: dict[str, dict[str, int]]) -> str:
    """The node for a recipe: `place($^)`; the make process's node when no prerequisite is located;
    the node a prestager planned for the target if it is a candidate under the rule (gmountpy.jobs.prestage)."""
    located = {path: held for path, held in holdings.items() if held}
    if not located:
        return here
    scores: dict[str, int] = {}
    for held in located.values():
        for name, size in held.items():
            scores[name] = scores.get(name, 0) + size
    planned = planned_node(os.environ.get("GMOUNT_TARGET", ""), os.environ.get("GMOUNT_PLACEMENT_LOG"))
    if planned is not None and 2 * scores.get(planned, 0) >= max(scores.values()):
        return planned
    holding = [name for name, score in scores.items() if score > 0]
    if len(holding) == 1:  # the only candidate under the rule (every other node scores 0 < best/2)
        return holding[0]
    from gmountpy.jobs.placement import choose_node
    decision = choose_node(holdings, list(cluster.nodes),
                           slots={name: n.slots for name, n in cluster.nodes.items()},
                           running={}, rtt=cluster.rtt)
    return decision.node


def run_local(cluster: mounts.MountedCluster, node: str, ns_dir: str, command: list[str],
              target: str) -> tuple[int, bool]:
    """Run `command` in `node`'s mount as a child in its own process group: (its wait status as an exit
    code, whether a failure is already told: not started, or stopped by make's interrupt)."""
    workdir = cluster.path_on(node, ns_dir)
    env = {k: v for k, v in os.environ.items() if k not in PRIVATE_VARIABLES}
    env.update(GMOUNT_NODE=node, GMOUNT_SITE=cluster.nodes[node].site, GMOUNT_CLUSTER=cluster.name, PWD=workdir)
    env.update(bypass.job_environment(env))  # the node's own files straight from its export
    child = 0
    received: list[int] = []
    original = {sig: signal.getsignal(sig) for sig in FORWARDED}

    def forward(sig: int, frame: FrameType | None) -> None:
        received.append(sig)
        if child:
            try:
                os.killpg(child, sig)
            except ProcessLookupError:
                pass

    for sig in FORWARDED:
        if original[sig] != signal.SIG_IGN:
            signal.signal(sig, forward)
    # The child gets its own process group before it runs, the caught signals back to their default
    # action at exec (ignored ones stay ignored, as make left them), and this directory on `node`'s
    # mount: posix_spawn has no working directory of its own, so this process goes there and back.
    here = os.getcwd()
    try:
        os.chdir(workdir)
        try:
            child = os.posix_spawn(command[0], command, env, setpgroup=0)
        finally:
            os.chdir(here)
    except OSError as exc:
        for sig in FORWARDED:
            signal.signal(sig, original[sig])
        print(f"gmount-sh: cannot run the recipe of {target} on node {node} in {workdir}: {exc.strerror or exc}",
              file=sys.stderr)
        return 127, True
    registry.register(cluster.name, node, target, child, kind="make", directory=ns_dir)  # for `gmount top`
    if received:  # came while starting it
        forward(received[-1], None)
    _, status = os.waitpid(child, 0)
    if received:
        stop_group(child)
    return os.waitstatus_to_exitcode(status), bool(received)


def stop_group(group: int, grace: float = 2.0) -> None:
    """After an interrupt, end what the recipe left in its process group.

    A non-interactive shell starts `cmd &` with SIGINT ignored, so Ctrl-C
    alone would leave such jobs running: they get SIGTERM, then SIGKILL.
    """
    deadline = time.monotonic() + grace
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            return
        while time.monotonic() < deadline:
            try:
                os.killpg(group, 0)
            except ProcessLookupError:
                return
            time.sleep(0.02)


#: make's own variables a sub-make on the other node needs (jobserver fds do not cross SSH: dropped).
SSH_FORWARDED = ("MAKELEVEL", "GMOUNT_PLACEMENT_LOG", "GMOUNT_RECIPE_SHELL")


def run_over_ssh(cluster: mounts.MountedCluster, node: str, ns_dir: str, command: list[str]) -> tuple[int, bool]:
    """Run `command` on an SSH node (public `Cluster.spawn`): output streams as it comes, and
    Ctrl-C, SIGTERM or SIGHUP to make stops the command's whole process group on that node.
    (Exit status, whether stopped by make's interrupt), as `run_local`."""
    import shlex

    from gmountpy.api import Cluster
    from gmountpy.errors import GmountError

    env = {name: os.environ[name] for name in SSH_FORWARDED if name in os.environ}
    try:
        job = Cluster.open(cluster.name).spawn(shlex.join(command), on=node, cwd=ns_dir, env=env)
    except GmountError as exc:
        fail(str(exc), 255)
    stopped_by: list[int] = []

    def stop(sig: int, frame: FrameType | None) -> None:
        stopped_by.append(sig)
        raise KeyboardInterrupt

    for sig in FORWARDED:
        if signal.getsignal(sig) != signal.SIG_IGN:  # ignored (make run in the background): stays so
            signal.signal(sig, stop)
    try:
        return job.wait(), False
    except KeyboardInterrupt:
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_IGN)  # a second Ctrl-C must not interrupt the cleanup
        job.stop(grace=2.0)
        return -(stopped_by[0] if stopped_by else signal.SIGINT), True


def log(cluster: mounts.MountedCluster, target: str, node: str, make_node: str, ns_dir: str,
        holdings: dict[str, dict[str, int]], seconds: float, status: int) -> None:
    """Append the recipe's line to $GMOUNT_PLACEMENT_LOG (one write: lines from parallel recipes stay whole)."""
    path = os.environ.get("GMOUNT_PLACEMENT_LOG")
    if not path:
        return
    located = [held for held in holdings.values() if held]
    local = sum(held[node] for held in located if node in held)
    remote = sum(max(held.values()) for held in located if node not in held)
    line = json_line({"target": target, "node": node, "make_node": make_node, "cluster": cluster.name,
                      "cwd": ns_dir, "inputs": len(holdings), "bytes_local": local, "bytes_remote": remote,
                      "seconds": round(seconds, 6), "status": status, "time": time.time(), "via": "python"})
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
    except OSError as exc:
        print(f"gmount-sh: cannot write the placement log {path}: {exc.strerror or exc} "
              "(set GMOUNT_PLACEMENT_LOG to a writable file)", file=sys.stderr)


#: JSON's two-character escapes; other characters outside printable ASCII become \\uXXXX
_SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}


def json_line(record: dict[str, str | int | float]) -> str:
    """`json.dumps(record)` for a flat record of strings and numbers, without importing json (and re).

    Strings are escaped as json.dumps does by default (ensure_ascii): so a target name with
    undecodable bytes (surrogate escapes) still makes a valid line.
    """
    parts = []
    for key, value in record.items():
        if isinstance(value, str):
            text = json_string(value)
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"json_line: {key!r} is {value!r}, not a string or a number")
        elif isinstance(value, int):
            text = str(value)
        elif value != value:
            text = "NaN"
        elif value in (float("inf"), float("-inf")):
            text = "Infinity" if value > 0 else "-Infinity"
        else:
            text = repr(value)
        parts.append(f"{json_string(key)}: {text}")
    return "{" + ", ".join(parts) + "}"


def json_string(text: str) -> str:
    """A JSON string literal for `text`, exactly as json.dumps writes it."""
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return f'"{text}"'
    out = []
    for ch in text:
        code = ord(ch)
        if ch in _SHORT_ESCAPES:
            out.append(_SHORT_ESCAPES[ch])
        elif 0x20 <= code < 0x7F:
            out.append(ch)
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:  # outside the BMP: a surrogate pair
            code -= 0x10000
            out.append(f"\\u{0xD800 | (code >> 10):04x}\\u{0xDC00 | (code & 0x3FF):04x}")
    return '"' + "".join(out) + '"'


def strip_oneshell_prefixes(script: str) -> str:
    """Drop @, - and + (and blanks) at the start of every logical line but the first, as make does.

    make passes a recipe with unescaped newlines only under .ONESHELL, and
    then strips these prefix characters from the inner lines itself -- but
    only when SHELL is a POSIX shell by name (sh, bash, ...), which
    gmount-sh is not. Doing it here keeps .ONESHELL recipes unchanged.
    """
    if "\n" not in script:
        return script
    out: list[str] = []
    i, n = 0, len(script)
    first = True
    while i < n:
        if not first:
            while i < n and script[i] in " \t-@+":
                i += 1
        first = False
        escaped = False
        while i < n:
            ch = script[i]
            out.append(ch)
            i += 1
            if ch == "\\":
                escaped = not escaped
                continue
            if ch == "\n" and not escaped:
                break
            escaped = False
    return "".join(out)


def fail(message: str, status: int) -> NoReturn:
    print(f"gmount-sh: {message}", file=sys.stderr)
    sys.exit(status)


if __name__ == "__main__":
    main()
