"""The placement rule on synthetic holdings: properties with hypothesis, and worked examples."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gmountpy.jobs.placement import choose_node

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
