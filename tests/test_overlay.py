"""The locality overlay: nearest nodes are asked first, by shortest-path RTT."""

from __future__ import annotations

from typing import Any

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gmountpy.cluster.config import ClusterSpec, parse_spec
from gmountpy.cluster.overlay import Overlay


def make_spec(sites: dict[str, list[str]], links: list[tuple[str, str, float]], **extra: Any) -> ClusterSpec:
    data: dict[str, Any] = {
        "name": "t",
        "defaults": {"export": "/tmp/gm-t/{node}/export", "mountpoint": "/tmp/gm-t/{node}/mnt"},
        "sites": {site: {"nodes": nodes} for site, nodes in sites.items()},
        "links": [{"sites": [a, b], "rtt_ms": rtt} for a, b, rtt in links],
        **extra,
    }
    return parse_spec(data)


@pytest.fixture
def demo() -> Overlay:
    return Overlay(make_spec({"tsukuba": ["n1", "n2"], "hongo": ["n3", "n4"]}, [("tsukuba", "hongo", 14.0)]))


def test_demo_lookup_order(demo: Overlay) -> None:
    assert demo.lookup_order("n1") == ["n1", "n2", "n3", "n4"]
    assert demo.lookup_order("n2") == ["n2", "n1", "n3", "n4"]
    assert demo.lookup_order("n3") == ["n3", "n4", "n1", "n2"]
    assert demo.lookup_tiers("n3") == [("n3",), ("n4",), ("n1", "n2")]


def test_demo_graph(demo: Overlay) -> None:
    assert set(demo.graph.nodes) == {"tsukuba", "hongo"}
    assert demo.graph.nodes["hongo"]["nodes"] == ("n3", "n4")
    assert demo.graph.edges["tsukuba", "hongo"]["rtt_ms"] == 14.0


def test_demo_rtt(demo: Overlay) -> None:
    assert demo.site_of("n3") == "hongo"
    assert demo.rtt("n1", "n1") == 0.0
    assert demo.rtt("n1", "n2") == 0.15
    assert demo.rtt("n1", "n4") == 14.0
    assert demo.site_rtt("hongo", "hongo") == 0.15
    assert demo.site_rtt("hongo", "tsukuba") == 14.0


def test_nearest(demo: Overlay) -> None:
    assert demo.nearest("n3", ["n2", "n4", "n1", "n3"]) == ["n3", "n4", "n1", "n2"]
    assert demo.nearest("n1", iter(["n4", "n2"])) == ["n2", "n4"]
    assert demo.nearest("n1", []) == []
    with pytest.raises(KeyError, match="n9"):
        demo.nearest("n1", ["n2", "n9"])
    with pytest.raises(KeyError, match="n9"):
        demo.nearest("n9", ["n2"])


def test_unknown_names(demo: Overlay) -> None:
    for call in (lambda: demo.site_of("x"), lambda: demo.lookup_order("x"), lambda: demo.rtt("n1", "x")):
        with pytest.raises(KeyError, match="'x'"):
            call()
    with pytest.raises(KeyError, match="'mars'"):
        demo.site_rtt("hongo", "mars")


def test_returned_lists_are_copies(demo: Overlay) -> None:
    demo.lookup_order("n1").clear()
    demo.lookup_tiers("n1").clear()
    assert demo.lookup_order("n1") == ["n1", "n2", "n3", "n4"]
    assert len(demo.lookup_tiers("n1")) == 3


def test_shortest_path_beats_direct_link() -> None:
    # a-c directly is 100 ms, but a-b-c is 10 + 20 = 30 ms; b (10) is still nearer than c (30).
    spec = make_spec(
        {"a": ["a1"], "b": ["b1"], "c": ["c1", "c2"]},
        [("a", "b", 10.0), ("b", "c", 20.0), ("a", "c", 100.0)],
    )
    overlay = Overlay(spec)
    assert overlay.site_rtt("a", "c") == 30.0
    assert overlay.rtt("c2", "a1") == 30.0
    assert overlay.lookup_order("a1") == ["a1", "b1", "c1", "c2"]
    assert overlay.lookup_order("c2") == ["c2", "c1", "b1", "a1"]


def test_shortest_path_reorders_sites() -> None:
    # Direct links say c (50) is nearer to a than d (60), but a-b-d is 5 + 5 = 10.
    spec = make_spec(
        {"a": ["a1"], "b": ["b1"], "c": ["c1"], "d": ["d1"]},
        [("a", "b", 5.0), ("b", "d", 5.0), ("a", "c", 50.0), ("a", "d", 60.0)],
    )
    overlay = Overlay(spec)
    assert overlay.site_rtt("a", "d") == 10.0
    assert overlay.lookup_order("a1") == ["a1", "b1", "d1", "c1"]


def test_ties_broken_by_site_name() -> None:
    # zeta and alpha are both 7 ms from hub; alpha wins by name even though zeta comes first in the file.
    spec = make_spec(
        {"hub": ["h1"], "zeta": ["z1", "z2"], "alpha": ["a2", "a1"], "mid": ["m1"]},
        [("hub", "zeta", 7.0), ("hub", "alpha", 7.0), ("hub", "mid", 3.0)],
    )
    overlay = Overlay(spec)
    assert overlay.lookup_tiers("h1") == [("h1",), ("m1",), ("a2", "a1"), ("z1", "z2")]
    assert overlay.nearest("h1", ["z1", "a1", "m1"]) == ["m1", "a1", "z1"]


def test_single_node_cluster() -> None:
    overlay = Overlay(make_spec({"only": ["solo"]}, []))
    assert overlay.lookup_tiers("solo") == [("solo",)]
    assert overlay.lookup_order("solo") == ["solo"]


def test_custom_intra_site_rtt() -> None:
    spec = make_spec({"a": ["a1", "a2"], "b": ["b1"]}, [("a", "b", 9.0)], intra_site_rtt_ms=1.5)
    overlay = Overlay(spec)
    assert overlay.rtt("a1", "a2") == 1.5
    assert overlay.site_rtt("b", "b") == 1.5


SITE = st.text(alphabet="abcdefgh", min_size=1, max_size=3)
# At least the intra-site RTT, so the own site really is the nearest tier.
RTT = st.sampled_from([1.0, 2.0, 2.5, 5.0, 10.0, 40.0]) | st.floats(1.0, 300.0)


@st.composite
def connected_specs(draw: st.DrawFn) -> ClusterSpec:
    """Random sites with random nodes, linked by a random spanning tree plus extra edges."""
    site_names = draw(st.lists(SITE, min_size=1, max_size=7, unique=True))
    sizes = [draw(st.integers(1, 4)) for _ in site_names]
    sites = {}
    counter = 0
    for site, size in zip(site_names, sizes, strict=True):
        sites[site] = [f"n{counter + k}" for k in range(size)]
        counter += size
    links: list[tuple[str, str, float]] = []
    seen: set[frozenset[str]] = set()
    for i in range(1, len(site_names)):
        j = draw(st.integers(0, i - 1))
        links.append((site_names[i], site_names[j], draw(RTT)))
        seen.add(frozenset((site_names[i], site_names[j])))
    for i, j in draw(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6)), max_size=6)):
        if i < len(site_names) and j < len(site_names) and i != j:
            pair = frozenset((site_names[i], site_names[j]))
            if pair not in seen:
                seen.add(pair)
                links.append((site_names[i], site_names[j], draw(RTT)))
    return make_spec(sites, links)


@settings(max_examples=150, deadline=None)
@given(connected_specs())
def test_lookup_order_properties(spec: ClusterSpec) -> None:
    overlay = Overlay(spec)
    everyone = sorted(spec.nodes)
    for node in spec.nodes:
        order = overlay.lookup_order(node)
        assert sorted(order) == everyone
        assert len(set(order)) == len(order)
        assert order[0] == node
        rtts = [overlay.rtt(node, other) for other in order]
        assert rtts == sorted(rtts)
        tiers = overlay.lookup_tiers(node)
        assert [n for tier in tiers for n in tier] == order
        assert tiers[0] == (node,)
        for tier in tiers:
            assert tier
            assert len({overlay.rtt(node, other) for other in tier}) == 1
        assert overlay.nearest(node, reversed(order)) == order


@settings(max_examples=100, deadline=None)
@given(connected_specs())
def test_site_rtt_matches_networkx_and_is_symmetric(spec: ClusterSpec) -> None:
    overlay = Overlay(spec)
    graph = nx.Graph()
    graph.add_nodes_from(spec.sites)
    for link in spec.links:
        graph.add_edge(*link.sites, weight=link.rtt_ms)
    for a in spec.sites:
        for b in spec.sites:
            expected = spec.intra_site_rtt_ms if a == b else nx.dijkstra_path_length(graph, a, b)
            assert overlay.site_rtt(a, b) == pytest.approx(expected)
            assert overlay.site_rtt(a, b) == pytest.approx(overlay.site_rtt(b, a))
