"""Which errors the documentation promises, under which fault: every other error is a failure.

An operation of the soak that fails gives an errno (from an OSError, or read out of
a tool's message: `cp: ...: Input/output error`). The error is *documented* when a
fault that was active around the operation (from its injection to its healing plus
`grace`, the time the cluster needs to notice a node is back) is one under which
README.md or docs/failures.md say that errno happens, for an operation of that
kind. Everything else -- an error with no fault around it, an errno no document
names for that fault, a message without any errno, wrong bytes -- is a failure.

What is documented, and where:

- a node down (killed, restarting): EIO for what it holds or homes, ENOENT for what
  only it held when this node never saw it there, EIO for unlink/rename while it is
  unreachable (README "When nodes fail", "Consistency" 4, "A home that is down");
  its own mount: ENOTCONN until `gmount up` clears it, then an empty directory that
  takes no files (EACCES/EPERM, or ENOENT for what is not there)
  (docs/failures.md "A node's daemon dies");
- a node unreachable or slow (packets dropped or delayed, a timeout in a daemon's
  log): ETIMEDOUT/EIO after `rpc_timeout`, then EHOSTDOWN/EIO while it is marked
  down, ENOENT for lookups that skip it (README "When nodes fail", docs/failures.md
  "When a node counts as down");
- a connection broken under a request: that request fails (EIO), the node is
  marked down for 2 s (docs/failures.md "When a node counts as down");
- a full disk: ENOSPC for writes stored there (docs/failures.md "A disk fills up").
  coreutils' bare "write error" (no errno: sha256sum lost it, on any full disk) in a
  make or Snakemake job is that ENOSPC only when every job that failed ran on a node
  whose disk was being filled during the run (the same page).
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

#: errno of every strerror() text, longest first, to find them inside tools' messages
_MESSAGES = sorted(((os.strerror(code), code) for code in errno.errorcode), key=lambda m: -len(m[0]))
_MESSAGES = [(text, code) for text, code in _MESSAGES if not text.startswith("Unknown error")]

#: A node down or unreachable: what any operation may meet (the node is somewhere on its path).
UNREACHABLE = frozenset({errno.EIO, errno.ENOENT, errno.ETIMEDOUT, errno.EHOSTDOWN, errno.EHOSTUNREACH,
                         errno.ECONNREFUSED, errno.ECONNRESET, errno.ECONNABORTED, errno.EPIPE})
#: What a node's own mount gives while its daemon is dead or being started again.
OWN_MOUNT_DOWN = frozenset({errno.ENOTCONN, errno.EACCES, errno.EPERM, errno.ENOENT, errno.EIO})

#: Fault kinds: what they document for any operation, and for operations on the fault's node.
DOCUMENTED: dict[str, tuple[frozenset[int], frozenset[int]]] = {
    "kill": (UNREACHABLE, OWN_MOUNT_DOWN),
    "drop": (UNREACHABLE, frozenset()),
    "delay": (UNREACHABLE, frozenset()),
    "conn_kill": (UNREACHABLE, frozenset()),
    "slow": (UNREACHABLE, frozenset()),           # a daemon logged a timeout or a peer marked down
    "disk_full": (frozenset(), frozenset({errno.ENOSPC})),
}
#: Operations that run jobs on other nodes' mounts (make with gmount.mk, Snakemake's gmount executor).
WORKFLOWS = frozenset({"make", "snakemake"})
#: Where each documented error is written down (for the report).
WHERE = {
    "kill": "README 'When nodes fail'; docs/failures.md 'A node's daemon dies'",
    "drop": "README 'When nodes fail'; docs/failures.md 'When a node counts as down'",
    "delay": "README 'When nodes fail'; docs/failures.md 'When a node counts as down'",
    "conn_kill": "docs/failures.md 'When a node counts as down' (its connection broke)",
    "slow": "README 'When nodes fail' (rpc_timeout); docs/failures.md 'When a node counts as down'",
    "disk_full": "docs/failures.md 'A disk fills up'",
}


@dataclass
class Fault:
    """One fault: injected at `start`, healed at `end` (None: not yet)."""

    kind: str
    nodes: tuple[str, ...]        # the nodes it is about (killed, full, cut off, ...)
    start: float
    end: float | None = None
    detail: dict[str, object] = field(default_factory=dict)

    def window(self, grace: float, now: float) -> tuple[float, float]:
        return self.start, (self.end if self.end is not None else now) + grace

    def to_dict(self, t0: float) -> dict[str, object]:
        return {"kind": self.kind, "nodes": list(self.nodes), "at_s": round(self.start - t0, 2),
                "healed_after_s": None if self.end is None else round(self.end - self.start, 2), **self.detail}


@dataclass
class Op:
    """One operation of the workload, as the judge sees it."""

    kind: str                     # cp, dd, cat>, tar, write_bytes, put, make, snakemake, cat, ls, stat, ...
    node: str                     # the mount used, or the node the API asked
    start: float
    end: float
    writes_on: tuple[str, ...] = ()   # nodes whose disk the operation stores bytes on
    error: str = ""               # the message (empty: it succeeded)
    errnos: tuple[int, ...] = ()
    wrong: str = ""               # a result that is wrong whatever the faults (bytes read)
    unless_fault: str = ""        # wrong unless a fault was around (a listing without a new name, a stale size)
    raced: str = ""               # the harness itself moved or removed the file meanwhile: not the cluster's doing
    path: str = ""                # the file it writes, when one
    errno_lost_on: tuple[str, ...] = ()  # a workflow whose failed jobs (on these nodes) said only "write error"

    @property
    def ok(self) -> bool:
        return not self.error and not self.wrong and not self.unless_fault


_ERRNO_NAME = re.compile(r"\[Errno (\d+)\]")
#: How make and Snakemake say that a file they need is not there: ENOENT in their words.
_ABSENT = ("No rule to make target", "Missing input files for rule", "MissingOutputException",
           "Missing files after")


def errnos_in(text: str) -> tuple[int, ...]:
    """The errnos whose strerror() texts appear in `text` (a tool's stderr), each once; make's and
    Snakemake's own words for a missing file count as ENOENT."""
    found: list[int] = []
    rest = text
    for number in _ERRNO_NAME.findall(text):  # Python's "[Errno 5] ..." in a traceback or message
        if int(number) not in found:
            found.append(int(number))
    for message, code in [*_MESSAGES, *((phrase, errno.ENOENT) for phrase in _ABSENT)]:
        if message in rest:
            rest = rest.replace(message, "\0")
            if code not in found:
                found.append(code)
    return tuple(found)


#: coreutils when it cannot name the error: close_stdout() finds stdout's error flag set by an earlier
#: flush and fclose() succeeding, so errno is 0 ("sha256sum: write error", or "prog: FILE: write error").
#: coreutils 9.1's sha256sum prints exactly this on a full local disk too.
_BARE_WRITE_ERROR = re.compile(r"^[\w.+-]+: (?:[^\n]*: )?write error$", re.MULTILINE)
#: gmount's words for a workflow's job that failed, with its node: the Snakemake executor's
#: "gmount: job sums (5) failed on node n4: ..." and make's gmount-sh "gmount: target T failed on node n4: ...".
_FAILED_ON = re.compile(r"gmount: (?:job|target) [^\n]*? failed on node ([\w.-]+):")


def errno_lost_on(text: str) -> tuple[str, ...]:
    """For a make or Snakemake run's whole output: the nodes of the jobs that failed (each once) when
    a tool there said a bare "write error" and nothing in the output names an errno; () otherwise."""
    if errnos_in(text) or not _BARE_WRITE_ERROR.search(text):
        return ()
    return tuple(dict.fromkeys(_FAILED_ON.findall(text)))


def errnos_of_exception(exc: BaseException) -> tuple[int, ...]:
    code = getattr(exc, "errno", None)
    if isinstance(code, int):
        return (code,)
    return tuple(int(m) for m in _ERRNO_NAME.findall(str(exc))) or errnos_in(str(exc))


@dataclass(frozen=True)
class Verdict:
    documented: bool
    why: str                      # the fault and document that cover it, or what is wrong
    kinds: tuple[str, ...] = ()   # the kinds of the faults that cover it


def judge(op: Op, faults: Sequence[Fault], grace: float, now: float) -> Verdict:
    """Is what went wrong with this operation something the documents promise under the faults around it?"""
    if op.wrong:
        return Verdict(False, op.wrong)
    if op.raced:
        return Verdict(True, op.raced, ("harness",))
    if op.unless_fault and not op.error:
        around = [f for f in faults if f.kind != "disk_full" and _overlaps(op, f, grace, now)]
        if not around:
            return Verdict(False, op.unless_fault + " (no fault around it)")
        return Verdict(True, f"{op.unless_fault}: under {around[0].kind} of {','.join(around[0].nodes)} "
                             "(README 'Consistency': rules hold for reachable nodes)", (around[0].kind,))
    if not op.errnos:
        full = _filling_every(op, faults)
        if full is not None:
            return Verdict(True, f"ENOSPC (a bare 'write error': the tool lost the errno) in jobs on "
                                 f"{','.join(op.errno_lost_on)}: disk_full of {','.join(full.nodes)} "
                                 f"({WHERE['disk_full']})", ("disk_full",))
        return Verdict(False, f"an error without an errno: {op.error[:300]}")
    reasons = []
    kinds = []
    for code in op.errnos:
        cover = _covering(op, code, faults, grace, now)
        if cover is None:
            return Verdict(False, f"{errno.errorcode.get(code, code)} with no fault that documents it "
                                  f"around it: {op.error[:300]}")
        reasons.append(f"{errno.errorcode.get(code, code)}: {cover.kind} of {','.join(cover.nodes)} "
                       f"({WHERE[cover.kind]})")
        kinds.append(cover.kind)
    return Verdict(True, "; ".join(reasons), tuple(kinds))


def _overlaps(op: Op, fault: Fault, grace: float, now: float) -> bool:
    start, end = fault.window(grace, now)
    return not (op.end < start or op.start > end)


def _filling_every(op: Op, faults: Iterable[Fault]) -> Fault | None:
    """The disk_full fault under which a workflow's bare "write error" is ENOSPC: every job that failed
    ran on a node being filled while the run went on (no grace: the filler's removal frees the disk)."""
    if op.kind not in WORKFLOWS or not op.errno_lost_on:
        return None
    covering = None
    for node in op.errno_lost_on:
        covering = next((f for f in faults if f.kind == "disk_full" and node in f.nodes
                         and _overlaps(op, f, 0.0, op.end)), None)
        if covering is None:
            return None
    return covering


def _covering(op: Op, code: int, faults: Iterable[Fault], grace: float, now: float) -> Fault | None:
    for fault in faults:
        if not _overlaps(op, fault, grace, now):
            continue
        anywhere, on_node = DOCUMENTED[fault.kind]
        if code in anywhere:
            return fault
        if code in on_node:
            if op.kind in WORKFLOWS:
                return fault  # a workflow's jobs run in (and write to) whichever node holds their inputs
            involved = {op.node} if fault.kind == "kill" else set(op.writes_on)
            if involved & set(fault.nodes):
                return fault
    return None
