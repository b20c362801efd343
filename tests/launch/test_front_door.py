"""Bad input at the front door: a missing export or a busy mountpoint is refused before anything starts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from gmountpy import launch
from gmountpy.cli import main as cli_main
from gmountpy.cluster import state as state_store
from gmountpy.cluster.config import SpecError, load_spec, parse_spec
from gmountpy.launch.orchestrate import LaunchError

from ..conftest import force_cleanup, fuse_problem, require


def cluster_file(base: Path, name: str, top: str = "", n2: str = "") -> Path:
    """Two local nodes; n1's and n2's directories under base (not created here)."""
    base.mkdir(parents=True, exist_ok=True)
    path = base / "cluster.toml"
    path.write_text(f"""name = "{name}"
launcher = "local"
{top}
[defaults]
export = "{base}/{{node}}/export"
mountpoint = "{base}/{{node}}/mnt"
[sites.s]
nodes = ["n1", "n2"]
[nodes.n2]
{n2}
""")
    return path


def mounted(path: Path) -> bool:
    with open("/proc/self/mounts") as f:
        return any(line.split(" ")[1] == str(path) for line in f)


def up_and_down(path: Path) -> None:
    spec = load_spec(path)
    state = None
    try:
        state = launch.up(spec)
        assert all(mounted(Path(n.mountpoint)) for n in spec.nodes.values())
    finally:
        launch.down(spec.name)
        force_cleanup(spec, state)


def test_a_missing_export_is_refused_naming_the_node_and_the_path(tmp_path: Path) -> None:
    (tmp_path / "n1" / "export").mkdir(parents=True)  # n2's export is a typo away
    spec = load_spec(cluster_file(tmp_path, "typo"))
    with pytest.raises(LaunchError) as info:
        launch.up(spec)
    assert list(info.value.failures) == ["n2"]
    assert info.value.failures["n2"] == (f"export {tmp_path}/n2/export does not exist: create it, fix `export` in "
                                         "the cluster file, or set create_export = true to have it made")
    assert "n2: export" in str(info.value)
    assert not (tmp_path / "n2" / "export").exists()  # nothing made, nothing started
    assert not mounted(tmp_path / "n1" / "mnt")
    assert state_store.load("typo") is None


def test_the_cli_says_it_in_one_line_per_node(tmp_path: Path) -> None:
    path = cluster_file(tmp_path, "typo-cli")
    result = CliRunner().invoke(cli_main, ["up", str(path)])
    assert result.exit_code == 1
    for node in ("n1", "n2"):
        assert f"{node}: export {tmp_path}/{node}/export does not exist" in result.output.replace("\n", " ")
    assert "Traceback" not in result.output


def test_create_export_for_the_cluster_or_for_one_node(tmp_path: Path) -> None:
    require("FUSE", fuse_problem())
    up_and_down(cluster_file(tmp_path / "all", "create-all", top="create_export = true"))
    assert (tmp_path / "all" / "n1" / "export").is_dir() and (tmp_path / "all" / "n2" / "export").is_dir()

    (tmp_path / "one" / "n1" / "export").mkdir(parents=True)
    up_and_down(cluster_file(tmp_path / "one", "create-one", n2="create_export = true"))
    assert (tmp_path / "one" / "n2" / "export").is_dir()


def test_a_node_can_refuse_what_the_cluster_allows(tmp_path: Path) -> None:
    spec = load_spec(cluster_file(tmp_path, "mixed", top="create_export = true", n2="create_export = false"))
    assert spec.node("n1").create_export and not spec.node("n2").create_export
    with pytest.raises(LaunchError) as info:
        launch.up(spec)
    assert list(info.value.failures) == ["n2"]


@pytest.mark.parametrize("kind", ["not empty", "a file"])
def test_a_mountpoint_that_is_not_an_empty_directory_is_refused(tmp_path: Path, kind: str) -> None:
    for node in ("n1", "n2"):
        (tmp_path / node / "export").mkdir(parents=True)
    mountpoint = tmp_path / "n1" / "mnt"
    if kind == "a file":
        mountpoint.write_text("in the way")
        expected = f"mountpoint {mountpoint} exists and is not a directory: choose an empty directory"
    else:
        mountpoint.mkdir()
        (mountpoint / "stray.txt").write_text("x")
        expected = f"mountpoint {mountpoint} is not empty: choose an empty directory"
    with pytest.raises(LaunchError) as info:
        launch.up(load_spec(cluster_file(tmp_path, f"busy-{kind[0]}")))
    assert info.value.failures == {"n1": expected}
    assert not mounted(tmp_path / "n2" / "mnt")


def test_an_export_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "n1").mkdir()
    (tmp_path / "n1" / "export").write_text("not a directory")
    (tmp_path / "n2" / "export").mkdir(parents=True)
    with pytest.raises(LaunchError) as info:
        launch.up(load_spec(cluster_file(tmp_path, "file-export", top="create_export = true")))
    assert info.value.failures == {"n1": f"export {tmp_path}/n1/export is not a directory"}


def test_create_export_and_tls_defaults_in_the_spec() -> None:
    base = {"name": "c", "defaults": {"export": "/e/{node}", "mountpoint": "/m/{node}", "host": "h"},
            "sites": {"s": {"nodes": ["n1"]}}}
    assert not parse_spec(base).node("n1").create_export
    assert parse_spec({**base, "create_export": True}).node("n1").create_export
    with pytest.raises(SpecError, match="create_export: must be true or false"):
        parse_spec({**base, "create_export": "yes"})
    with pytest.raises(SpecError, match=r"nodes.n1.create_export: must be true or false"):
        parse_spec({**base, "nodes": {"n1": {"create_export": 1}}})
    # between hosts TLS is on unless switched off; on one machine it is off unless switched on
    assert parse_spec({**base, "launcher": "ssh"}).tls
    assert not parse_spec({**base, "launcher": "ssh", "tls": False}).tls
    assert not parse_spec(base).tls
    assert parse_spec({**base, "tls": True}).tls


def test_the_demo_makes_its_exports_first(tmp_path: Path) -> None:
    from gmountpy.cli.demo import write_demo

    spec = load_spec(write_demo(str(tmp_path / "demo")))
    assert all(os.path.isdir(node.export) for node in spec.nodes.values())
    assert not any(node.create_export for node in spec.nodes.values())
