"""Rewriting [[links]] in a cluster file from probe measurements (no network needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gmountpy.cluster.config import load_spec
from gmountpy.errors import GmountError
from gmountpy.launch.probe import ProbeReport, SiteRtt, links_toml, write_links

CLUSTER = """\
# my cluster
name = "c"
launcher = "ssh"

[defaults]
host = "me@example.org"
export = "/data/{node}"
mountpoint = "/mnt/{node}"

[sites.a]
nodes = ["n1", "n2"]

[sites.b]
nodes = ["n3"]

[sites.c]
nodes = ["n4"]

# hand-typed guesses
[[links]]
sites = ["a", "b"]
rtt_ms = 14.0

[[links]]
sites = ["b", "c"]   # a chain
rtt_ms = 3.0

# tuning for the whole cluster
[tuning]
attr_ttl = 2.0
"""


def report(*pairs: tuple[str, str, float], writable: bool = True) -> ProbeReport:
    rtts = [SiteRtt((a, b), ("x", "y"), (ms, ms, ms)) for a, b, ms in pairs]
    return ProbeReport(method="a test", rtts=rtts, writable=writable, refusal="not writing: loopback")


def test_links_are_replaced_and_everything_else_kept(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(CLUSTER)
    path.chmod(0o640)
    write_links(str(path), report(("a", "b", 12.3456), ("a", "c", 30.0), ("b", "c", 0.0001), ("a", "a", 0.2)))
    text = path.read_text()
    spec = load_spec(path)
    assert {link.sites: link.rtt_ms for link in spec.links} == {("a", "b"): 12.346, ("a", "c"): 30.0,
                                                                ("b", "c"): 0.001}
    assert spec.tuning.attr_ttl == 2.0
    assert "# my cluster" in text and "# tuning for the whole cluster\n[tuning]" in text
    assert "hand-typed guesses" not in text and "a chain" not in text
    assert "# within a site (intra_site_rtt_ms is one value for all sites): a 0.2 ms" in text
    assert (path.stat().st_mode & 0o777) == 0o640
    # a second --write replaces our own comment too instead of piling them up
    write_links(str(path), report(("a", "b", 1.0), ("a", "c", 2.0), ("b", "c", 3.0)))
    assert path.read_text().count("measured by `gmount probe`") == 1
    assert path.read_text().count("\n[[links]]\n") == 3


def test_nothing_is_written_when_a_pair_failed_or_numbers_are_loopback(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(CLUSTER)
    failed = ProbeReport("t", [SiteRtt(("a", "b"), ("n1", "n3"), problem="n3: cannot reach")], writable=True)
    with pytest.raises(GmountError, match=r"not writing .*a <-> b could not be measured \(n3: cannot reach\)"):
        write_links(str(path), failed)
    with pytest.raises(GmountError, match=r"^not writing: loopback$"):
        write_links(str(path), report(("a", "b", 1.0), writable=False))
    assert path.read_text() == CLUSTER


def test_links_toml_is_valid_toml_with_the_method_as_comment() -> None:
    text = links_toml(report(("a", "b", 5.0)))
    assert text.startswith("# [[links]] measured by `gmount probe`: a test\n")
    assert '[[links]]\nsites = ["a", "b"]\nrtt_ms = 5\n' in text


def test_local_cluster_probe_says_what_it_measured_and_never_writes(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from gmountpy.cli import main as cli_main

    from ..conftest import FOUR_NODE_LINKS, FOUR_NODES, fuse_problem, local_cluster, require, write_cluster_file

    (tmp_path / "idle").mkdir()
    path = write_cluster_file(tmp_path / "idle", "probe-idle", FOUR_NODES, FOUR_NODE_LINKS)
    result = CliRunner().invoke(cli_main, ["probe", str(path)])
    assert result.exit_code == 1
    assert "is local and not running: every node of a local cluster runs on this machine" in result.output

    require("FUSE", fuse_problem())
    with local_cluster(tmp_path / "up", "probe-local", FOUR_NODES, FOUR_NODE_LINKS):
        cluster_file = tmp_path / "up" / "cluster.toml"
        before = cluster_file.read_text()
        result = CliRunner().invoke(cli_main, ["probe", "--count", "3", str(cluster_file)])
        assert result.exit_code == 0, result.output
        assert "loopback" in result.output and "NOT network RTTs" in result.output
        assert '[[links]]\nsites = ["tsukuba", "hongo"]' in result.output
        result = CliRunner().invoke(cli_main, ["probe", "--count", "3", "--write", str(cluster_file)])
        assert result.exit_code == 1
        assert "gmount: not writing: a local cluster's nodes all run on this machine" in result.output
        assert cluster_file.read_text() == before
