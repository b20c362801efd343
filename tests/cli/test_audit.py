"""`gmount audit`: what protects a cluster, and warnings on weak settings (--strict fails on them)."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from pathlib import Path

from click.testing import CliRunner

from gmountpy.cli import main as cli_main
from gmountpy.cluster import state as state_store
from gmountpy.cluster.config import load_spec, parse_spec
from gmountpy.launch import audit as auditing

from ..conftest import fuse_problem, local_cluster, require, write_cluster_file


def by_topic(findings: list[auditing.Finding], topic: str) -> list[auditing.Finding]:
    return [f for f in findings if f.topic == topic]


def test_a_stopped_local_cluster(tmp_path: Path) -> None:
    path = write_cluster_file(tmp_path, "aud-local", {"s": ["n1", "n2"]}, [])
    os.chmod(tmp_path / "n1" / "export", 0o700)
    os.chmod(tmp_path / "n2" / "export", 0o777)
    runner = CliRunner()
    result = runner.invoke(cli_main, ["audit", "--json", str(path)])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["warnings"] == 1
    findings = {(f["topic"], f["subject"]): f for f in report["findings"]}
    links = findings[("links", "within s")]
    assert links["level"] == "ok" and "NOT encrypted" in links["message"] and "loopback only" in links["message"]
    assert findings[("exports", f"node n1: {tmp_path}/n1/export")]["level"] == "ok"
    weak = findings[("exports", f"node n2: {tmp_path}/n2/export")]
    assert weak["level"] == "warn" and "0777" in weak["message"] and "chmod o-w" in weak["message"]
    assert findings[("mount", "allow_other")]["level"] == "ok"
    assert "not running" in findings[("secrets", state_store.state_dir())]["message"]

    assert runner.invoke(cli_main, ["audit", "--strict", str(path)]).exit_code == 1
    os.chmod(tmp_path / "n2" / "export", 0o750)
    result = runner.invoke(cli_main, ["audit", "--strict", str(path)])
    assert result.exit_code == 0 and "no warnings" in result.output


def test_weak_settings_between_hosts_are_warned_about() -> None:
    base = {"name": "aud-ssh", "launcher": "ssh",
            "defaults": {"export": "/data/{node}", "mountpoint": "/gm/{node}"},
            "sites": {"a": {"nodes": ["n1", "n2"]}, "b": {"nodes": ["n3"]}},
            "links": [{"sites": ["a", "b"], "rtt_ms": 10}],
            "nodes": {"n1": {"host": "h1", "listen": "10.0.0.1"}, "n2": {"host": "h2", "listen": "0.0.0.0"},
                      "n3": {"host": "h3", "listen": "10.0.0.3"}}}
    safe = auditing.audit(parse_spec(base))  # TLS is the default between hosts
    assert all(f.level == "ok" for f in by_topic(safe, "links") if f.subject != "node n2")
    assert [f.subject for f in safe if f.level == "warn"] == []
    assert [f.level for f in safe if f.subject == "node n2"] == ["info"]  # 0.0.0.0, but under TLS
    assert all("not checked" in f.message for f in by_topic(safe, "exports"))

    weak = auditing.audit(parse_spec({**base, "tls": False, "ssh": {"known_hosts": False}}))
    warned = {f.subject: f.message for f in weak if f.level == "warn"}
    assert "in clear between hosts; set tls = true" in warned["a <-> b"]
    assert "in clear" in warned["within a"]
    assert "known_hosts = false" in warned["known_hosts"]
    assert "node n2" in warned


def test_allow_other_is_read_whether_or_not_the_spec_has_it(tmp_path: Path) -> None:
    spec = load_spec(write_cluster_file(tmp_path, "aud-other", {"s": ["n1", "n2"]}, []))
    assert by_topic(auditing.audit(spec), "mount")[0].level == "ok"
    object.__setattr__(spec.nodes["n2"], "allow_other", True)  # as the cluster-file option will set it
    finding = by_topic(auditing.audit(spec), "mount")[0]
    assert finding.level == "warn" and "on for n2" in finding.message
    object.__setattr__(spec, "allow_other", True)
    assert "on for n1, n2" in by_topic(auditing.audit(spec), "mount")[0].message


def test_a_running_tls_cluster(tmp_path: Path) -> None:
    require("FUSE", fuse_problem())
    with local_cluster(tmp_path, "aud-tls", {"s": ["n1", "n2"]}, [], top="tls = true") as cluster:
        findings = auditing.audit(cluster.spec)
        assert [f.level for f in by_topic(findings, "certificates")] == ["ok", "ok", "ok"]
        assert "TLS 1.3" in by_topic(findings, "links")[0].message
        secrets = {f.subject: f for f in by_topic(findings, "secrets")}
        secret_file = os.path.join(state_store.state_dir(), "aud-tls.secret")
        assert secrets[secret_file].level == "ok"
        os.chmod(secret_file, 0o644)
        secrets = {f.subject: f for f in by_topic(auditing.audit(cluster.spec), "secrets")}
        assert secrets[secret_file].level == "warn" and f"chmod 600 {secret_file}" in secrets[secret_file].message
        os.chmod(secret_file, 0o600)

        # a node on another host: its export's mode comes from its daemon
        os.chmod(cluster.export("n2"), 0o777)
        remote = dataclasses.replace(cluster.spec, nodes={**cluster.spec.nodes,
                                                          "n2": dataclasses.replace(cluster.spec.nodes["n2"],
                                                                                    host="elsewhere")})
        exports = {f.subject: f for f in by_topic(auditing.audit(remote), "exports")}
        answer = exports[f"node n2: {cluster.export('n2')}"]
        assert answer.level == "warn" and "0777" in answer.message
        assert stat.S_IMODE(os.stat(cluster.export("n2")).st_mode) == 0o777
