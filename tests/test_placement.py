"""The placement rule on synthetic holdings: properties with hypothesis, and worked examples."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gmountpy.jobs.placement import (
    MAX_WAIT,
    WAIT_FLOOR,
    JobPlacement,
    choose_node,
    expected_wait,
    move_seconds,
    place_job,
)

NODES = ["n1", "n2", "n3", "n4", "n5"]
SITE = {"n1": "a", "n2": "a", "n3": "b", "n4": "b", "n5": "c"}
SITE_RTT = {frozenset("ab"): 14.0, frozenset("ac"): 80.0, frozenset("bc"): 60.0}


def rtt(x: str, y: str) -> float:
    if x == y:
        return 0.0
    if SITE[x] == SITE[y]:
        return 0.15
    return SITE_RTT[frozenset((SITE[x], SITE[y]))]


holding = st.dictionaries(st.sampled_from(NODES), st.integers(0, 10_000), max_size=3)
holdings_st = st.dictionaries(st.text("abcdefgh", min_size=1, max_size=4), holding, max_size=6)
slots_st = st.fixed_dictionaries({n: st.integers(1, 4) for n in NODES})
running_st = st.fixed_dictionaries({n: st.integers(0, 5) for n in NODES})


def scores(holdings: dict[str, dict[str, int]]) -> dict[str, int]:
    return {n: sum(h.get(n, 0) for h in holdings.values()) for n in NODES}


@settings(max_examples=300, deadline=None)
@given(holdings_st, slots_st, running_st)
def test_rule_properties(holdings: dict[str, dict[str, int]], slots: dict[str, int],
                         running: dict[str, int]) -> None:
    decision = choose_node(holdings, NODES, slots=slots, running=running, rtt=rtt)
    chosen = decision.node
    assert chosen in NODES
    assert decision.scores == scores(holdings)
    free = {n for n in NODES if running[n] < slots[n]}
    located = any(holdings.values())
    if not located:
        # anywhere: the least loaded
        assert running[chosen] / slots[chosen] == min(running[n] / slots[n] for n in NODES)
        return
    best = max(decision.scores.values())
    # within half of the best score
    assert 2 * decision.scores[chosen] >= best
    assert set(decision.candidates) == {n for n in NODES if 2 * decision.scores[n] >= best}
    # a candidate with a free slot beats one without
    if free & set(decision.candidates):
        assert chosen in free
    # then the lowest remote cost among the preferred group
    group = [n for n in decision.candidates if (n in free) == (chosen in free)]
    assert decision.remote_cost[chosen] == min(decision.remote_cost[n] for n in group)
    assert decision.unlocated == tuple(p for p, h in holdings.items() if not h)


@settings(max_examples=200, deadline=None)
@given(holdings_st, slots_st, running_st, st.randoms())
def test_rule_ignores_input_order(holdings: dict[str, dict[str, int]], slots: dict[str, int],
                                  running: dict[str, int], rnd) -> None:  # type: ignore[no-untyped-def]
    items = list(holdings.items())
    rnd.shuffle(items)
    a = choose_node(holdings, NODES, slots=slots, running=running, rtt=rtt)
    b = choose_node(dict(items), NODES, slots=slots, running=running, rtt=rtt)
    assert a.node == b.node


# Real holdings: every holder of a path has the same size (replicas are verified copies).
consistent_st = st.dictionaries(st.text("abcdefgh", min_size=1, max_size=4),
                                st.tuples(st.integers(0, 10_000), st.sets(st.sampled_from(NODES), max_size=3)),
                                max_size=6)


@settings(max_examples=200, deadline=None)
@given(consistent_st, st.sampled_from(NODES), running_st)
def test_holder_of_everything_with_a_free_slot_wins(paths: dict[str, tuple[int, set[str]]], node: str,
                                                     running: dict[str, int]) -> None:
    """A node that holds every input and has a free slot reads nothing remotely: nothing beats it."""
    holdings = {path: {n: size for n in holders | {node}} for path, (size, holders) in paths.items()}
    holdings = holdings or {"x": {node: 1}}
    slots = {n: 8 for n in NODES}
    decision = choose_node(holdings, NODES, slots=slots, running=running, rtt=rtt)
    assert decision.remote_cost[decision.node] == 0
    assert all(decision.node in held for held in holdings.values())


def test_most_bytes_wins() -> None:
    holdings = {"big": {"n3": 900}, "small": {"n1": 100}}
    decision = choose_node(holdings, NODES, slots={}, running={}, rtt=rtt)
    assert decision.node == "n3"
    assert decision.candidates == ("n3",)
    assert "90%" in decision.reason


def test_free_slot_beats_more_bytes_within_half() -> None:
    holdings = {"a": {"n3": 600}, "b": {"n1": 400}}
    busy = {"n3": 2}
    decision = choose_node(holdings, NODES, slots={"n3": 2}, running=busy, rtt=rtt)
    assert set(decision.candidates) == {"n1", "n3"}
    assert decision.node == "n1"
    # ...but not a node below half of the best
    holdings = {"a": {"n3": 900}, "b": {"n1": 100}}
    assert choose_node(holdings, NODES, slots={"n3": 2}, running=busy, rtt=rtt).node == "n3"


def test_rtt_to_the_rest_breaks_ties() -> None:
    # n1 and n3 hold as much; the rest of the inputs is on n2, n1's site-mate
    holdings = {"a": {"n1": 500, "n3": 500}, "b": {"n2": 300}}
    decision = choose_node(holdings, NODES, slots={}, running={}, rtt=rtt)
    assert decision.node in ("n1", "n2")
    assert decision.remote_cost["n3"] == 300 * 14.0


def test_no_located_inputs_goes_to_least_loaded() -> None:
    decision = choose_node({"gone": {}}, NODES, slots={n: 2 for n in NODES},
                           running={"n1": 2, "n2": 1, "n3": 1, "n4": 0, "n5": 1}, rtt=rtt)
    assert decision.node == "n4"
    assert decision.unlocated == ("gone",)
    assert "least loaded" in decision.reason


def test_zero_byte_inputs_still_pull_to_their_holder() -> None:
    decision = choose_node({"empty": {"n4": 0}}, NODES, slots={}, running={}, rtt=rtt)
    assert decision.node == "n4"


def test_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="`nodes` must not be empty"):
        choose_node({}, [], slots={}, running={}, rtt=rtt)
    with pytest.raises(ValueError, match="unknown node 'n9'"):
        choose_node({"x": {"n9": 1}}, NODES, slots={}, running={}, rtt=rtt)


def test_decision_is_an_immutable_value() -> None:
    """Decision is a plain class (no dataclasses: make's gmount-sh imports this per recipe): it keeps the
    dataclass it replaced's value equality, repr and immutability."""
    holdings = {"a": {"n1": 5}, "b": {}}
    first = choose_node(holdings, ["n1", "n2"], slots={}, running={}, rtt=lambda a, b: 1.0)
    second = choose_node(holdings, ["n1", "n2"], slots={}, running={}, rtt=lambda a, b: 1.0)
    assert first == second and first is not second
    assert first != choose_node({"a": {"n2": 5}}, ["n1", "n2"], slots={}, running={}, rtt=lambda a, b: 1.0)
    assert repr(first).startswith("Decision(node='n1', reason=") and "unlocated=('b',)" in repr(first)
    with pytest.raises(AttributeError, match="immutable"):
        first.node = "n2"  # type: ignore[misc]
    with pytest.raises(AttributeError, match="immutable"):
        del first.reason  # type: ignore[misc]
    with pytest.raises(TypeError):
        hash(first)


# --------------------------------------------------------------------------- delay scheduling


MIB = 1 << 20
#: 100 Mbit/s between every pair of nodes, as bytes/s
WAN = 100e6 / 8


def delayed(holdings: dict[str, dict[str, int]], **load: object) -> JobPlacement:
    """A workflow job asked from n1 while n1 (one slot) runs a job and n3 (one slot) is free."""
    return place_job(holdings, ["n1", "n3"], asked="n1", slots={"n1": 1, "n3": 1}, rtt=rtt,
                     running={"n1": 1}, bandwidth=lambda a, b: WAN, **load)  # type: ignore[arg-type]


def test_a_job_waits_for_its_holder_that_frees_a_slot_soon() -> None:
    # n1's jobs take 10 s and the one running has run 9.5: a slot frees in 0.5 s, within the floor
    small = {"/doc": {"n1": 1000}}
    placed = delayed(small, ages={"n1": [9.5]}, typical={"n1": 10.0})
    assert (placed.node, placed.wait) == ("n1", WAIT_FLOOR)
    assert "waits up to 1.0 s for a slot (expected wait there 0.5 s" in placed.reason
    # still waiting 0.4 s later: the same node, the rest of the floor
    later = delayed(small, ages={"n1": [9.9]}, typical={"n1": 10.0}, waited=0.4)
    assert later.node == "n1" and later.wait == pytest.approx(WAIT_FLOOR - 0.4)
    # the slot freed: the holder at once, and the reason says the job waited
    freed = place_job(small, ["n1", "n3"], asked="n1", slots={"n1": 1, "n3": 1}, rtt=rtt, running={},
                      waited=0.5)
    assert (freed.node, freed.wait, freed.bytes_remote) == ("n1", 0.0, 0)
    assert freed.reason.endswith("; waited 0.5 s for a free slot")
    # a slot held "for a moment" with nothing known about n1's jobs: the floor too, never an instant move
    assert delayed(small).node == "n1" and delayed(small).wait == WAIT_FLOOR


def test_a_job_with_large_inputs_waits_longer_than_its_holder_needs() -> None:
    # 8 s expected wait; reading 200 MiB at 100 Mbit/s plus one RTT takes ~16.8 s: wait, up to that
    large = {"/tile": {"n1": 200 * MIB}}
    move = 200 * MIB / WAN + 0.014
    assert move_seconds(large, "n3", rtt, lambda a, b: WAN) == pytest.approx(move)
    placed = delayed(large, ages={"n1": [2.0]}, typical={"n1": 10.0})
    assert placed.node == "n1" and placed.wait == pytest.approx(move)
    assert placed.bytes_local == 200 * MIB and placed.bytes_remote == 0
    # still n1 after 10 s of waiting (the job there overran); moved only once the wait cost the move
    assert delayed(large, ages={"n1": [12.0]}, typical={"n1": 10.0}, waited=10.0).node == "n1"
    moved = delayed(large, ages={"n1": [19.0]}, typical={"n1": 10.0}, waited=move)
    assert (moved.node, moved.wait, moved.bytes_remote) == ("n3", 0.0, 200 * MIB)
    assert "waited 16.8 s" in moved.reason and "n3 has a free slot" in moved.reason
    # however large the inputs, no client waits longer than MAX_WAIT for a reply
    huge = {"/cube": {"n1": 10_000 * MIB}}
    assert delayed(huge, ages={"n1": [2.0]}, typical={"n1": 10.0}).wait == MAX_WAIT
    assert delayed(huge, ages={"n1": [2.0]}, typical={"n1": 10.0}, waited=MAX_WAIT).node == "n3"


def test_a_job_with_small_inputs_moves_when_its_holder_is_busy_for_long() -> None:
    # n1's jobs take 60 s, the running one started 1 s ago; reading 64 KiB remotely costs ~0.02 s
    small = {"/doc": {"n1": 64 * 1024}}
    placed = delayed(small, ages={"n1": [1.0]}, typical={"n1": 60.0})
    assert (placed.node, placed.wait) == ("n1", WAIT_FLOOR)  # only the floor
    assert "expected wait there 59.0 s, reading the inputs on n3 0.0 s" in placed.reason
    moved = delayed(small, ages={"n1": [2.0]}, typical={"n1": 60.0}, waited=WAIT_FLOOR)
    assert (moved.node, moved.bytes_local, moved.bytes_remote) == ("n3", 0, 64 * 1024)


def test_delay_scheduling_applies_only_when_a_free_node_exists_and_load_is_known() -> None:
    small = {"/doc": {"n1": 1000}}
    nodes, slots = ["n1", "n3"], {"n1": 1, "n3": 1}
    # every node full: the holder at once (nowhere better to go); load unknown: the rule alone
    full = place_job(small, nodes, asked="n1", slots=slots, rtt=rtt, running={"n1": 1, "n3": 1})
    assert (full.node, full.wait) == ("n1", 0.0)
    assert (place_job(small, nodes, asked="n1", slots=slots, rtt=rtt).node,) == ("n1",)
    # the free node that reads the least: n2 shares n1's site (0.15 ms) where n3 is 14 ms away
    near = place_job({"/doc": {"n1": 1000}}, ["n1", "n2", "n3"], asked="n1",
                     slots={"n1": 1, "n2": 1, "n3": 1}, rtt=rtt, running={"n1": 1}, waited=WAIT_FLOOR)
    assert near.node == "n2"


def test_expected_wait_is_typical_duration_less_the_oldest_running_jobs_age() -> None:
    assert expected_wait([3.0, 7.0], 10.0) == 3.0
    assert expected_wait([12.0], 10.0) == 0.0  # overdue: any moment now
    assert expected_wait([3.0], None) is None  # nothing ended there yet
