"""The soak's judge: which errors the documents promise under which fault; everything else is a failure.

Pure tests (no cluster): the soak is only as good as the line it draws.
"""

from __future__ import annotations

import errno
import random

from benchmarks.faults.judge import Fault, Op, errno_lost_on, errnos_in, judge
from benchmarks.faults.run import KINDS, SoakConfig, plan

GRACE = 10.0


def failed(kind: str, node: str, at: float, message: str, writes_on: tuple[str, ...] = ()) -> Op:
    return Op(kind, node, at, at + 0.1, writes_on=writes_on, error=message, errnos=errnos_in(message))


def test_errnos_are_read_out_of_tools_messages() -> None:
    assert errnos_in("cp: cannot create regular file '/m/x': Transport endpoint is not connected") == \
        (errno.ENOTCONN,)
    assert set(errnos_in("cat: /m/x: Input/output error\ncat: /m/y: No such file or directory")) == \
        {errno.EIO, errno.ENOENT}
    assert errnos_in("make: *** No rule to make target 'sum1.txt', needed by 'merged.txt'.  Stop.") == \
        (errno.ENOENT,)
    assert errnos_in("NodeUnavailable: [Errno 112] node 'n2' unavailable: cannot connect") == (errno.EHOSTDOWN,)
    assert errnos_in("snakemake exited 1: WorkflowError: something else entirely") == ()


def test_errors_under_a_fault_that_documents_them_are_documented() -> None:
    kill = Fault("kill", ("n3",), 100.0, 110.0)
    assert judge(failed("cat", "n1", 105.0, "cat: x: Input/output error"), [kill], GRACE, 200).documented
    assert judge(failed("cat", "n1", 118.0, "cat: x: No such file or directory"), [kill], GRACE, 200).documented
    # the dead node's own mount: ENOTCONN, then a sealed directory (EPERM)
    assert judge(failed("cp", "n3", 101.0, "cp: x: Transport endpoint is not connected"), [kill], GRACE,
                 200).documented
    assert judge(failed("cp", "n3", 109.0, "mkdir: x: Operation not permitted"), [kill], GRACE, 200).documented


def test_errors_without_a_fault_or_of_the_wrong_kind_are_failures() -> None:
    kill = Fault("kill", ("n3",), 100.0, 110.0)
    full = Fault("disk_full", ("n4",), 100.0, 110.0)
    # no fault around it (before it, and after its grace)
    assert not judge(failed("cat", "n1", 50.0, "cat: x: Input/output error"), [kill], GRACE, 200).documented
    assert not judge(failed("cat", "n1", 121.0, "cat: x: Input/output error"), [kill], GRACE, 200).documented
    # ENOTCONN on a mount whose daemon was not the one killed
    assert not judge(failed("cp", "n1", 105.0, "cp: x: Transport endpoint is not connected"), [kill], GRACE,
                     200).documented
    # ENOSPC: only for bytes stored on the full node
    assert judge(failed("cp", "n4", 105.0, "cp: x: No space left on device", ("n4",)), [full], GRACE,
                 200).documented
    assert not judge(failed("cp", "n1", 105.0, "cp: x: No space left on device", ("n1",)), [full], GRACE,
                     200).documented
    # a full disk documents no EIO, and no error is documented without an errno
    assert not judge(failed("cp", "n4", 105.0, "cp: x: Input/output error", ("n4",)), [full], GRACE,
                     200).documented
    assert not judge(failed("snakemake", "n1", 105.0, "WorkflowError: ?"), [kill], GRACE, 200).documented
    # EBADF is no fault's promise: an open file whose connection broke must say EIO
    conn = Fault("conn_kill", ("n4",), 100.0, 101.0)
    assert not judge(failed("append", "n3", 100.5, "OSError: [Errno 9] Bad file descriptor"), [conn], GRACE,
                     200).documented


#: What the 15-minute soak's Snakemake run printed when its job on n4 wrote while n4's disk was filled.
SNAKEMAKE_BARE = """Error in rule sums:
    message: gmount: job sums (5) failed on node {node}: its command exited with status 1. Its stderr there:
sha256sum: write error
(whole log: /m/soak/snakemake/r010/.gmount/snakemake-logs/x/sums-5-attempt1.err)
For further information see the job's log file.
Shutting down, this might take some time.
Exiting because a job execution failed. Look above for error message
"""
#: make with gmount.mk: the recipe's stderr, gmount-sh's line, make's.
MAKE_BARE = """sha256sum: write error
gmount: target sum4.txt failed on node {node}: its recipe exited with status 1
make: *** [Makefile:4: sum4.txt] Error 1
"""


def workflow(kind: str, at: float, text: str) -> Op:
    """A make or Snakemake run that failed, as the soak's WorkflowRunner records it (on n2, 3 s long)."""
    return Op(kind, "n2", at, at + 3.0, writes_on=("n1", "n2", "n3", "n4"), error=f"{kind} exited 1: ...{text}",
              errnos=errnos_in(text), errno_lost_on=errno_lost_on(text))


def test_a_bare_write_error_is_enospc_only_in_jobs_on_the_node_being_filled_then() -> None:
    """coreutils' sha256sum says "write error" without errno when its flush met ENOSPC (on any full disk):
    documented only when every failed job ran on the node whose disk was filled during the run."""
    full = Fault("disk_full", ("n4",), 100.0, 110.0)
    kill = Fault("kill", ("n4",), 100.0, 110.0)
    for kind, text in (("snakemake", SNAKEMAKE_BARE), ("make", MAKE_BARE)):
        on_n4 = workflow(kind, 104.0, text.format(node="n4"))
        assert on_n4.errnos == () and on_n4.errno_lost_on == ("n4",)
        verdict = judge(on_n4, [full], GRACE, 200)
        assert verdict.documented and verdict.kinds == ("disk_full",), verdict
        assert judge(workflow(kind, 98.0, text.format(node="n4")), [full], GRACE, 200).documented  # ran into it
        # the same words from a job elsewhere, or on n4 at another time (grace included), or under another fault
        assert not judge(workflow(kind, 104.0, text.format(node="n3")), [full], GRACE, 200).documented
        assert not judge(workflow(kind, 111.0, text.format(node="n4")), [full], GRACE, 200).documented
        assert not judge(workflow(kind, 50.0, text.format(node="n4")), [full], GRACE, 200).documented
        assert not judge(workflow(kind, 104.0, text.format(node="n4")), [kill], GRACE, 200).documented
        # two jobs failed, one of them not on the full node: that one's error is unexplained
        both = text.format(node="n4") + text.format(node="n1")
        assert workflow(kind, 104.0, both).errno_lost_on == ("n4", "n1")
        assert not judge(workflow(kind, 104.0, both), [full], GRACE, 200).documented
    # not a workflow: no job and node to tell it by
    bare = Op("cat>", "n4", 104.0, 104.1, writes_on=("n4",), error="sh: cat: write error",
              errno_lost_on=("n4",))
    assert not judge(bare, [full], GRACE, 200).documented
    # a write error with its errno is judged by that errno; other words without one stay failures
    assert errno_lost_on("sha256sum: write error: No space left on device\n"
                         "gmount: target s failed on node n4: its recipe exited with status 1") == ()
    assert errno_lost_on("WorkflowError: ?\ngmount: job s (1) failed on node n4: its command exited") == ()
    assert errno_lost_on("sha256sum: write error\n") == ()  # no job named: nothing to tell where


def test_wrong_bytes_are_failures_under_any_fault_and_stale_listings_only_without_one() -> None:
    kill = Fault("kill", ("n3",), 100.0, 110.0)
    wrong = Op("cat", "n1", 105.0, 105.1, wrong="cat x on n1: 5 B, not the 3 written")
    assert not judge(wrong, [kill], GRACE, 200).documented
    stale = Op("ls", "n1", 105.0, 105.1, unless_fault="ls -l d lacks 1 name")
    assert judge(stale, [kill], GRACE, 200).documented
    assert not judge(stale, [Fault("disk_full", ("n4",), 100.0, 110.0)], GRACE, 200).documented
    assert not judge(Op("ls", "n1", 150.0, 150.1, unless_fault="ls -l d lacks 1 name"), [kill], GRACE,
                     200).documented


def test_the_schedule_comes_from_the_seed_and_has_every_kind() -> None:
    targets = {"soak/shared/e0": ("n1", "n2"), "soak/shared/w0": ("n4", "n3")}
    config = SoakConfig(seconds=80.0, hold=(2.0, 4.0), gap=(3.0, 6.0))
    first = plan(config, random.Random(28), targets)
    assert first == plan(config, random.Random(28), targets)
    assert {p.kind for p in first[:len(KINDS)]} == set(KINDS)
    homes = [p for p in first if p.kind == "kill_home_and_backup"]
    assert all(p.params["also"] and p.params["also"][0] != p.params["node"] for p in homes)
