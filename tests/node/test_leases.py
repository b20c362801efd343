"""TtlCache and Leases: the caches of both locators and the lease tables of a home."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gmountpy.node.leases import WHOLE, Leases, TtlCache


def test_an_entry_is_valid_until_its_expiry_and_kept_while_not_dropped() -> None:
    cache: TtlCache[str, int] = TtlCache(10)
    cache.put("/a", 1, until=5.0, now=0.0)
    assert cache.get("/a", 4.9) == 1
    assert cache.get("/a", 5.0) is None  # expired at its expiry
    assert cache.peek("/a") == 1 and cache.until("/a") == 5.0 and cache.entry("/a") == (1, 5.0)
    assert cache.get("/b", 0.0) is None and cache.peek("/b") is None and cache.until("/b") is None


def test_expired_entries_go_from_the_oldest_end_as_new_ones_come() -> None:
    cache: TtlCache[str, int] = TtlCache(100)
    for i in range(10):
        cache.put(f"/f{i}", i, until=i + 1.0, now=float(i))
    assert len(cache) == 1 and list(cache) == ["/f9"]  # each put dropped the ones expired by then


def test_keep_for_keeps_an_expired_entry_that_long() -> None:
    cache: TtlCache[str, str] = TtlCache(100, keep_for=60.0)
    cache.put("/d", "n1", until=1.0, now=0.0)
    cache.put("/e", "n2", until=31.0, now=30.0)
    assert cache.get("/d", 30.0) is None and cache.peek("/d") == "n1"  # expired, still known
    cache.put("/f", "n3", until=62.0, now=61.0)
    assert "/d" not in cache and cache.peek("/e") == "n2"


def test_the_least_recently_set_entry_goes_beyond_max_entries() -> None:
    cache: TtlCache[str, int] = TtlCache(2)
    cache.put("/a", 1, math.inf, 0.0)
    cache.put("/b", 2, math.inf, 0.0)
    cache.put("/a", 3, math.inf, 0.0)  # set again: the most recent
    cache.put("/c", 4, math.inf, 0.0)
    assert sorted(cache) == ["/a", "/c"] and cache.peek("/a") == 3


def test_pop_discard_where_and_clear() -> None:
    cache: TtlCache[str, int] = TtlCache(10)
    for path in ("/d", "/d/x", "/d/y/z", "/dx", "/e"):
        cache.put(path, 1, 10.0, 0.0)
    assert cache.pop("/e") == 1 and cache.pop("/e") is None
    cache.discard_where(lambda key: key.startswith("/d/"))
    assert sorted(cache) == ["/d", "/dx"]
    cache.clear()
    assert len(cache) == 0


def test_a_cache_refuses_a_negative_bound() -> None:
    with pytest.raises(ValueError, match="max_entries"):
        TtlCache(-1)


@given(st.lists(st.tuples(st.sampled_from("abcdef"), st.floats(0.0, 5.0), st.floats(0.0, 1.0)), max_size=60),
       st.integers(1, 4))
def test_a_cache_answers_as_a_plain_map_of_the_last_put_would(
        puts: list[tuple[str, float, float]], bound: int) -> None:
    """Whatever was dropped, a key that is still in the cache answers its last value and
    expiry, and every live answer is one of the most recently set `bound` keys'."""
    cache: TtlCache[str, int] = TtlCache(bound)
    last: dict[str, tuple[int, float]] = {}
    now = 0.0
    for i, (key, lease, step) in enumerate(puts):
        now += step
        cache.put(key, i, now + lease, now)
        last[key] = (i, now + lease)
        assert len(cache) <= bound
        for kept in cache:
            assert cache.entry(kept) == last[kept]
    recent = list(dict.fromkeys(key for key, _, _ in reversed(puts)))[:bound]
    for key in last:
        if cache.get(key, now) is not None:
            assert key in recent


def test_a_lease_is_revoked_with_every_holder_and_forgotten() -> None:
    leases = Leases()
    leases.grant("/d", "x", "n1", 5.0)
    leases.grant("/d", "x", "n2", 7.0)
    leases.grant("/d", "y", "n1", 5.0)
    assert leases.holders("/d", "x") == {"n1": 5.0, "n2": 7.0} and sorted(leases.names("/d")) == ["x", "y"]
    assert len(leases) == 3
    assert leases.revoke("/d", "x") == {"n1": 5.0, "n2": 7.0}
    assert leases.revoke("/d", "x") == {} and leases.holders("/d", "x") == {}
    assert leases.revoke("/e", "x") == {}
    assert leases.names("/d") == ["y"] and len(leases) == 1


def test_leases_that_ended_are_forgotten() -> None:
    leases = Leases()
    for i in range(1000):
        leases.grant("/d", f"m{i}", "n1", 10.0 + i / 1000)
    leases.grant("/e", WHOLE, "n2", 20.0)
    leases.expire(10.5)
    assert len(leases) == 500
    leases.expire(11.0)
    assert leases.names("/d") == [] and len(leases) == 1 and leases.holders("/e", WHOLE) == {"n2": 20.0}
    leases.expire(20.0)
    assert len(leases) == 0 and not leases._held and not leases._ends


def test_a_lease_granted_again_outlives_its_first_expiry() -> None:
    leases = Leases()
    leases.grant("/d", "x", "n1", 5.0)
    leases.grant("/d", "x", "n1", 9.0)  # asked again: the later expiry holds
    leases.expire(6.0)
    assert leases.holders("/d", "x") == {"n1": 9.0}
    leases.revoke("/d", "x")
    leases.grant("/d", "x", "n1", 8.0)  # revoked, then granted anew
    leases.expire(8.5)
    assert leases.holders("/d", "x") == {}
    leases.expire(9.5)  # the stale heap entry of the first grant finds nothing to drop
    assert len(leases) == 0 and not leases._ends
