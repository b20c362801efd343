"""The soak's judge: which errors the documents promise under which fault; everything else is a failure.

Pure tests (no cluster): the soak is only as good as the line it draws.
"""

from __future__ import annotations

import errno
import random

from benchmarks.faults.judge import Fault, Op, errnos_in, judge
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
