"""`gmount ls / stage / place / run`, run as a user would (subprocess), against a real cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ..conftest import LocalCluster, wait_for
from .test_cli import gmount


def put(cluster: LocalCluster, node: str, path: str, data: bytes | str) -> None:
    target = cluster.export(node) / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data.encode() if isinstance(data, str) else data)
    cluster.rescan(node)


def test_ls_shows_each_entry_holder(cluster4: LocalCluster) -> None:
    put(cluster4, "n2", "/cli-ls/near.txt", "near")
    put(cluster4, "n3", "/cli-ls/far.txt", "far")
    put(cluster4, "n4", "/cli-ls/far.txt", "far too")
    put(cluster4, "n4", "/cli-ls/dir/x", "x")
    out = gmount("ls", str(cluster4.mount("n1") / "cli-ls")).stdout
    cells = [line.replace("│", " ").split() for line in out.splitlines()]
    rows = {c[0]: c for c in cells if c and c[0] in ("near.txt", "far.txt", "dir/")}
    assert rows["near.txt"][-1] == "n2"
    assert rows["far.txt"][-2:] == ["n3", "n4"]
    assert rows["dir/"][-1] == "n4"
    data = json.loads(gmount("ls", "--json", "--cluster", cluster4.spec.name, "--node", "n4", "/cli-ls").stdout)
    entries = {e["name"]: e for e in data["entries"]}
    assert data["asked_from"] == "n4" and entries["far.txt"]["node"] == "n4"
    assert entries["far.txt"]["holders"] == ["n4", "n3"] and entries["dir"]["type"] == "directory"
    result = gmount("ls", str(cluster4.mount("n1") / "cli-ls" / "missing"), check=False)
    assert result.returncode == 1 and "no node holds /cli-ls/missing" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_name_with_a_newline_cannot_forge_a_row_of_ls_or_where(cluster4: LocalCluster) -> None:
    """Names are shown as `ls` shows them: a newline or markup in a name stays inside its own cell."""
    forged = "x\nforged.txt  9.9 GB  n4"  # on its own line it would read as a row held by n4
    put(cluster4, "n2", f"/cli-names/{forged}", "a")
    put(cluster4, "n2", "/cli-names/[bold]markup", "b")
    put(cluster4, "n3", "/cli-names/it's", "c")
    out = gmount("ls", str(cluster4.mount("n1") / "cli-names")).stdout
    lines = [line.replace("│", " ").strip() for line in out.splitlines()]
    assert not [line for line in lines if line.startswith("forged.txt")], out
    assert "'x'$'\\n''forged.txt  9.9 GB  n4'" in out, out
    assert "'[bold]markup'" in out and "'it'\\''s'" in out, out
    data = json.loads(gmount("ls", "--json", str(cluster4.mount("n1") / "cli-names")).stdout)
    assert sorted(e["name"] for e in data["entries"]) == sorted([forged, "[bold]markup", "it's"])

    path = cluster4.mount("n1") / "cli-names" / forged
    out = gmount("where", str(path)).stdout
    lines = [line.replace("│", " ").strip() for line in out.splitlines()]
    assert not [line for line in lines if line.startswith("forged.txt")], out
    assert out.count("$'\\n'") == 2, out  # the path asked about, and the holder's path on disk
    assert json.loads(gmount("where", "--json", str(path)).stdout)[str(path)][0]["node"] == "n2"


def test_stage_copies_once_and_changes_the_holder(cluster4: LocalCluster) -> None:
    payload = os.urandom(1024 * 1024 + 7)
    put(cluster4, "n4", "/cli-stage/in.bin", payload)
    cluster_file = str(cluster4.base / "cluster.toml")
    out = gmount("stage", "--cluster", cluster_file, "/cli-stage/in.bin", "--to", "n2").stdout
    assert "/cli-stage/in.bin: copied from n4" in out
    assert (cluster4.export("n2") / "cli-stage" / "in.bin").read_bytes() == payload
    again = json.loads(gmount("stage", "--json", str(cluster4.mount("n1") / "cli-stage" / "in.bin"),
                              "--to", "n2").stdout)
    assert [f["status"] for f in again["files"]] == ["up-to-date"] and again["target"] == "n2"
    on_n2 = cluster4.mount("n2") / "cli-stage" / "in.bin"
    assert wait_for(lambda: os.getxattr(on_n2, "user.gmount.node") == b"n2")

    missing = gmount("stage", str(cluster4.mount("n1") / "cli-stage" / "nope.bin"), "--to", "n2", check=False)
    assert missing.returncode == 1
    assert "cannot stage /cli-stage/nope.bin to n2: no node holds it" in missing.stderr
    bad_node = gmount("stage", str(cluster4.mount("n1") / "cli-stage" / "in.bin"), "--to", "n7", check=False)
    assert bad_node.returncode == 1 and "unknown node 'n7'" in bad_node.stderr and "n1, n2, n3, n4" in bad_node.stderr
    assert "Traceback" not in missing.stderr + bad_node.stderr


def test_place_prints_the_node(cluster4: LocalCluster) -> None:
    put(cluster4, "n3", "/cli-place/big", b"b" * 5000)
    put(cluster4, "n1", "/cli-place/small", b"s" * 1000)
    mount = cluster4.mount("n2") / "cli-place"
    assert gmount("place", str(mount / "big"), str(mount / "small")).stdout.splitlines()[0] == "n3"
    explained = gmount("place", "--explain", str(mount / "big"), str(mount / "small")).stdout
    assert "holds 83% of the input bytes" in explained
    data = json.loads(gmount("place", "--json", "--cluster", cluster4.spec.name, "/cli-place/big").stdout)
    assert data["node"] == "n3" and {r["node"]: r["input_bytes"] for r in data["nodes"]}["n3"] == 5000


def test_run_near_runs_on_the_holder_and_propagates_status(cluster4: LocalCluster) -> None:
    put(cluster4, "n4", "/cli-run/data.txt", "a\nb\n")
    mount = cluster4.mount("n1") / "cli-run"
    # run from outside any mount: the command starts in / of the namespace unless --cwd says otherwise
    result = gmount("run", "--near", str(mount / "data.txt"), "--cwd", "/cli-run", "--",
                    'echo "ran on $GMOUNT_NODE in $(pwd)"; wc -l < data.txt')
    assert result.stdout.splitlines() == [f"ran on n4 in {cluster4.mount('n4') / 'cli-run'}", "2"]
    # several words are one argv; from inside a mount the command runs in the same namespace directory
    inside = subprocess.run([sys.executable, "-m", "gmountpy", "run", "--on", "n3", "--", "sh", "-c",
                             'echo "$GMOUNT_NODE $(pwd)"; exit 7'], cwd=mount, capture_output=True, text=True,
                            timeout=60)
    assert inside.returncode == 7
    assert inside.stdout.strip() == f"n3 {cluster4.mount('n3') / 'cli-run'}"
    timed_out = gmount("run", "--cluster", cluster4.spec.name, "--on", "n2", "--timeout", "0.3", "--", "sleep 5",
                       check=False)
    assert timed_out.returncode == 124 and "did not finish within 0.3s" in timed_out.stderr
    both = gmount("run", "--cluster", cluster4.spec.name, "--on", "n2", "--near", "/x", "--", "true", check=False)
    assert both.returncode == 2 and "not both" in both.stderr
    unknown = gmount("run", "--cluster", cluster4.spec.name, "--on", "n9", "--", "true", check=False)
    assert unknown.returncode == 1 and "unknown node 'n9'" in unknown.stderr and "Traceback" not in unknown.stderr


def test_commands_outside_any_cluster_say_what_to_do(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "empty-state")}
    result = subprocess.run([sys.executable, "-m", "gmountpy", "ls", "/data"], capture_output=True, text=True,
                            env=env, timeout=60)
    assert result.returncode == 1
    assert "no cluster is running: start one with `gmount up CLUSTER.toml`" in result.stderr
    assert "Traceback" not in result.stderr
