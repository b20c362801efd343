"""Choosing the node for a job: Pwrake's locality rule, as a pure function.

No I/O here: the caller gathers who holds which input (`where`), the slots
and the jobs running, and the RTT estimates; this module only decides. That
keeps the rule testable on synthetic holdings (tests/test_placement.py).

The rule (docs/design.md, "Placement"), made precise:

1. A node's *score* is the number of input bytes it holds (a replica counts
   for the node it is on: that node reads it locally).
2. *Candidates* are the nodes whose score is at least half the best score.
3. Among candidates, nodes with a free slot are preferred (if none has one,
   all candidates stay in: the job waits for, or oversubscribes, a slot).
4. Then the lowest *remote cost*: for every located input the node does not
   hold, its size times the RTT to its nearest holder -- what reading the rest
   of the inputs through the mount costs, since every remote read is an RPC
   paying that RTT and the number of reads grows with the bytes.
5. Remaining ties: higher score, more inputs held (so zero-byte inputs still
   pull a job towards their holder), lower load (running / slots), then the
   order of the nodes in the cluster file -- deterministic, never random.

A job with no located input goes to the least loaded node (lowest
running/slots, then most free slots, then cluster-file order).

Workflow jobs (make recipes, Snakemake jobs) go through `place_job`: a
pinned node wins, a job without located inputs stays on the node asked (the
one make or Snakemake runs on), a node DAG-aware staging planned the job on wins
when it is a candidate, anything else is `choose_node`'s. The node
daemon answers make and the Snakemake executor with it, and `gmount plan`
predicts a run with it.

When the caller knows the jobs running (the daemon does) and the node chosen so
(the *holder*) is full while another node has a free slot, the job is delay
scheduled (Zaharia et al., "Delay scheduling", EuroSys 2010) with a cost model,
all in seconds:

    move  = sum over inputs the free node f lacks of  size / bandwidth(f, holder) + RTT(f, holder)
    wait  = max(0, typical - age)   typical: median duration of the jobs that ended on the holder,
                                    age: how long its oldest running job has run (unknown: no job ended yet)
    budget = max(WAIT_FLOOR, move)  if wait <= move or wait is unknown
             WAIT_FLOOR             otherwise

The job waits up to `budget` for a slot on the holder and takes it the moment
one frees; after that it goes to the free node f with the lowest `move`. So a
job never leaves its data for a slot that frees within WAIT_FLOOR, waits out a
short expected wait when its inputs are large, and moves at once (after the
floor) when the holder's jobs are long and its inputs small. Waiting up to the
cost of moving and then moving costs at most twice the better of the two
(ski rental) even when `typical` is wrong. Bandwidth is what the caller knows;
the daemon uses DEFAULT_WAN_MBIT between sites and DEFAULT_SITE_MBIT within
one (the cluster file has RTTs, no bandwidth). Every node full: the holder at
once (the engine keeps its own job limit; there is nowhere better to go).
"""

from __future__ import annotations

# Standard library only, and no dataclasses or typing at run time: make's gmount-sh imports this
# once per recipe, and `dataclasses` alone (re, inspect, ...) costs more than the rule.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any

    #: holdings[input][node] = bytes of `input` that `node` holds
    Holdings = Mapping[str, Mapping[str, int]]

__all__ = ["DEFAULT_SITE_MBIT", "DEFAULT_WAN_MBIT", "MAX_WAIT", "WAIT_FLOOR", "Decision", "JobPlacement",
           "choose_node", "expected_wait", "input_bytes", "move_seconds", "place_job"]

#: Link bandwidth assumed between two sites, and within a site, when nothing better is known (Mbit/s).
DEFAULT_WAN_MBIT = 100.0
DEFAULT_SITE_MBIT = 1000.0
#: A job whose holder is full waits at least this long for it (s): a slot that frees "in a moment"
#: (a job ending as the next is asked for, make noticing it) never sends a job away from its data.
WAIT_FLOOR = 1.0
#: Nor longer than this (s), whatever moving would cost: the asking client (make's gmount-job, the
#: Snakemake executor) waits for the reply, and its timeout is 60 s.
MAX_WAIT = 20.0


class Decision:
    """The chosen node and the numbers that led to it (immutable; compares by value)."""

    __slots__ = ("candidates", "node", "reason", "remote_cost", "scores", "unlocated")
    _FIELDS = ("node", "reason", "scores", "candidates", "remote_cost", "unlocated")

    node: str
    reason: str
    scores: Mapping[str, int]          # input bytes held, per node
    candidates: tuple[str, ...]        # nodes within half of the best score
    remote_cost: Mapping[str, float]   # bytes x ms still to read remotely, per node
    unlocated: tuple[str, ...]         # inputs no node holds (ignored by the rule)

    def __init__(self, node: str, reason: str, scores: Mapping[str, int], candidates: tuple[str, ...],
                 remote_cost: Mapping[str, float], unlocated: tuple[str, ...]) -> None:
        for name, value in zip(self._FIELDS, (node, reason, scores, candidates, remote_cost, unlocated),
                               strict=True):
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"Decision is immutable: cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"Decision is immutable: cannot delete field {name!r}")

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in self._FIELDS)

    __hash__ = None  # type: ignore[assignment]  # holds dicts, as the dataclass it replaces did

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._FIELDS)
        return f"Decision({fields})"


def choose_node(holdings: Holdings, nodes: Sequence[str], *, slots: Mapping[str, int],
                running: Mapping[str, int], rtt: Callable[[str, str], float]) -> Decision:
    """Pick the node for a job whose inputs are held as `holdings` says.

    `nodes` is every node in cluster-file order; `slots` and `running` give
    each node's job slots and the jobs running there now (missing = 1 slot,
    0 running); `rtt(a, b)` is the estimated round trip in ms.
    """
    if not nodes:
        raise ValueError("`nodes` must not be empty")
    known = set(nodes)
    for path, held in holdings.items():
        for node, size in held.items():
            if node not in known:
                raise ValueError(f"input {path!r} is held by unknown node {node!r}")
            if size < 0:
                raise ValueError(f"input {path!r} has a negative size on node {node!r}: {size}")
    order = {node: i for i, node in enumerate(nodes)}

    def free(node: str) -> int:
        return slots.get(node, 1) - running.get(node, 0)

    def load(node: str) -> float:
        return running.get(node, 0) / max(slots.get(node, 1), 1)

    located = {path: held for path, held in holdings.items() if held}
    unlocated = tuple(path for path, held in holdings.items() if not held)
    scores = {node: sum(held.get(node, 0) for held in located.values()) for node in nodes}
    inputs_held = {node: sum(1 for held in located.values() if node in held) for node in nodes}
    remote_cost = {node: _remote_cost(node, located, rtt) for node in nodes}

    if not located:
        chosen = min(nodes, key=lambda n: (load(n), -free(n), order[n]))
        return Decision(chosen, "no located inputs: least loaded node", scores, tuple(nodes),
                        remote_cost, unlocated)

    best = max(scores.values())
    candidates = tuple(n for n in nodes if 2 * scores[n] >= best)
    with_free = tuple(n for n in candidates if free(n) > 0)
    pool = with_free or candidates
    chosen = min(pool, key=lambda n: (remote_cost[n], -scores[n], -inputs_held[n], load(n), order[n]))

    total = sum(max(held.values()) for held in located.values())
    share = f"{scores[chosen] / total:.0%}" if total else "all"
    reason = f"holds {share} of the input bytes ({scores[chosen]} of {total})"
    if len(candidates) > 1:
        reason += f"; {len(candidates)} candidates within half of the best"
    reason += "; has a free slot" if with_free else "; no candidate has a free slot"
    return Decision(chosen, reason, scores, candidates, remote_cost, unlocated)


def _remote_cost(node: str, located: Holdings, rtt: Callable[[str, str], float]) -> float:
    cost = 0.0
    for held in located.values():
        if node not in held:
            size = max(held.values())
            cost += size * min(rtt(node, holder) for holder in held)
    return cost


class JobPlacement:
    """Where a workflow job goes (`place_job`), the input bytes it then reads locally and remotely, and
    `wait`: seconds the job should still wait for a slot on `node` and then ask again (0: start now)."""

    __slots__ = ("bytes_local", "bytes_remote", "node", "reason", "wait")

    node: str
    reason: str
    bytes_local: int    # input bytes the node holds
    bytes_remote: int   # input bytes it reads from other nodes
    wait: float         # seconds to wait for a slot on `node` before asking again; 0: start now

    def __init__(self, node: str, reason: str, bytes_local: int, bytes_remote: int, wait: float = 0.0) -> None:
        for name, value in (("node", node), ("reason", reason), ("bytes_local", bytes_local),
                            ("bytes_remote", bytes_remote), ("wait", wait)):
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"JobPlacement is immutable: cannot assign to field {name!r}")

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in self.__slots__)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        wait = f", wait={self.wait}" if self.wait else ""
        return (f"JobPlacement(node={self.node!r}, reason={self.reason!r}, bytes_local={self.bytes_local}, "
                f"bytes_remote={self.bytes_remote}{wait})")


def place_job(holdings: Holdings, nodes: Sequence[str], *, asked: str, slots: Mapping[str, int],
              rtt: Callable[[str, str], float], pin: str = "", planned: str = "",
              running: Mapping[str, int] | None = None, ages: Mapping[str, Sequence[float]] | None = None,
              typical: Mapping[str, float] | None = None, waited: float = 0.0,
              bandwidth: Callable[[str, str], float] | None = None) -> JobPlacement:
    """The node for a workflow job with inputs held as `holdings` says, asked from node `asked`.

    `pin` (a node the job names) wins; a job with no located input stays on `asked`; then
    `planned` (the node DAG-aware staging planned the job on, `gmountpy.jobs.prestage`) if it is a
    candidate under the rule (at least half the best node's bytes: its staged replicas count for
    it); otherwise `choose_node` decides. `running` (jobs running per node, None: not known) turns
    on delay scheduling when the node chosen so is full and another has a free slot (the module's
    docstring): `ages` (seconds each running job has run, per node), `typical` (a node's typical job
    seconds), `waited` (seconds this job has waited so far) and `bandwidth(a, b)` (bytes/s; default
    DEFAULT_WAN_MBIT between nodes) feed the cost model. A reply with `wait` > 0 says: wait that long
    at most for a slot on its `node`, then ask again with `waited` grown.
    """
    if pin:
        if pin not in nodes:
            raise ValueError(f"the job is pinned to {pin!r}, which is not a node (nodes: {', '.join(nodes)})")
        node, reason = pin, "pinned by the job"
    elif not any(holdings.values()):
        if asked not in nodes:
            raise ValueError(f"`asked` is {asked!r}, which is not a node")
        node, reason = asked, f"no located inputs: the node asked ({asked})"
    else:
        busy = running or {}
        decision = choose_node(holdings, nodes, slots=slots, running=busy, rtt=rtt)
        node, reason = decision.node, decision.reason
        if planned and planned != node and planned in decision.candidates and \
                (running is None or _free(planned, slots, busy) > 0 or _free(node, slots, busy) <= 0):
            node = planned
            reason = (f"planned by DAG-aware staging: holds {decision.scores[planned]} of the input bytes, "
                      f"a candidate (the rule alone: {decision.node})")
        idle = [n for n in nodes if _free(n, slots, busy) > 0] if running is not None else []
        if idle and _free(node, slots, busy) <= 0:
            link = bandwidth or (lambda a, b: DEFAULT_WAN_MBIT * 1e6 / 8)
            order = {n: i for i, n in enumerate(nodes)}
            move = {n: move_seconds(holdings, n, rtt, link) for n in idle}
            spill = min(idle, key=lambda n: (move[n], -decision.scores[n], busy.get(n, 0) / max(slots.get(n, 1), 1),
                                             order[n]))
            wait = expected_wait((ages or {}).get(node, ()), (typical or {}).get(node))
            budget = min(MAX_WAIT, max(WAIT_FLOOR, move[spill]) if wait is None or wait <= move[spill] else WAIT_FLOOR)
            full = f"{node} holds the most input bytes but runs {busy.get(node, 0)} jobs on {slots.get(node, 1)} slots"
            guess = "unknown (no job ended there yet)" if wait is None else f"{wait:.1f} s"
            why = f"expected wait there {guess}, reading the inputs on {spill} {move[spill]:.1f} s"
            if waited < budget:
                local, remote = input_bytes(holdings, node)
                return JobPlacement(node, f"{full}: waits up to {budget:.1f} s for a slot ({why})", local, remote,
                                    wait=budget - waited)
            reason = f"{full}: waited {waited:.1f} s ({why}); {spill} has a free slot and reads the rest remotely"
            node = spill
        elif waited > 0:
            reason += f"; waited {waited:.1f} s for a free slot"
    local, remote = input_bytes(holdings, node)
    return JobPlacement(node, reason, local, remote)


def _free(node: str, slots: Mapping[str, int], running: Mapping[str, int]) -> int:
    return slots.get(node, 1) - running.get(node, 0)


def move_seconds(holdings: Holdings, node: str, rtt: Callable[[str, str], float],
                 bandwidth: Callable[[str, str], float]) -> float:
    """Seconds `node` spends reading the located inputs it lacks: per input, its size over the bandwidth
    (bytes/s) from its nearest holder plus one round trip to it (`rtt` in ms)."""
    seconds = 0.0
    for held in holdings.values():
        if held and node not in held:
            holder = min(held, key=lambda h: (rtt(node, h), h))
            seconds += max(held.values()) / bandwidth(node, holder) + rtt(node, holder) / 1000
    return seconds


def expected_wait(ages: Sequence[float], typical: float | None) -> float | None:
    """Seconds until a full node frees a slot: its typical job duration minus the age of its oldest
    running job (0 when that job is overdue); None when no job ended there yet (typical unknown)."""
    if typical is None:
        return None
    return max(0.0, typical - max(ages, default=0.0))


def input_bytes(holdings: Holdings, node: str) -> tuple[int, int]:
    """(input bytes `node` holds, input bytes it must read from other nodes: each input's largest copy)."""
    located = [held for held in holdings.values() if held]
    local = sum(held[node] for held in located if node in held)
    remote = sum(max(held.values()) for held in located if node not in held)
    return local, remote
