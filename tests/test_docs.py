"""The front door and the docs site's sources: the README stays short and true, every link in it
resolves, and the API reference names every public name. (`nox -s docs` builds the site with
--strict: links between pages, anchors and the nav are checked there.)"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import gmountpy
import gmountpy_pegasus
from gmountpy import api, slurm
from gmountpy.api import filesystem
from gmountpy.cluster.config import parse_spec
from gmountpy.jobs import spawn

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
REFERENCE = (ROOT / "docs" / "reference" / "api.md").read_text()


def test_the_readme_is_short_and_its_first_screen_has_the_two_commands() -> None:
    lines = README.splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines: move the detail into docs/"
    first_screen = "\n".join(lines[:40])
    assert "nox -s demo" in first_screen and "nox -s tests" in first_screen


def test_the_nox_sessions_the_readme_names_exist() -> None:
    sessions = {node.name for node in ast.parse((ROOT / "noxfile.py").read_text()).body
                if isinstance(node, ast.FunctionDef)
                and any("session" in ast.unparse(d) for d in node.decorator_list)}
    named = set(re.findall(r"nox -s (\w+)", README))
    assert named and named <= sessions, named - sessions


def test_every_link_of_the_readme_resolves() -> None:
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    local = [t for t in targets if "://" not in t]
    assert len(local) > 10
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, missing


def documented() -> set[str]:
    """Names the reference renders: `::: module.Name` lines and the `members:` lists under them."""
    names = {line.split()[-1].rsplit(".", 1)[-1] for line in REFERENCE.splitlines() if line.startswith("::: ")}
    for members in re.findall(r"members: \[([^\]]*)\]", REFERENCE):
        names.update(re.findall(r'"([^"]+)"', members))
    return names


def test_the_api_reference_names_every_public_name() -> None:
    public = {*gmountpy.__all__, *api.__all__, *slurm.__all__, *gmountpy_pegasus.__all__, *filesystem.__all__,
              "Spawned"} - {"__version__"}
    assert "Spawned" in spawn.__all__
    missing = public - documented()
    assert not missing, f"public names missing from docs/reference/api.md: {sorted(missing)}"


def test_the_readme_cluster_file_is_valid_and_makes_its_exports() -> None:
    """The ten-line cluster file works as pasted: `gmount up` on it needs no mkdir first."""
    block = re.search(r"```toml\n(.*?)```", README, re.S)
    assert block, "README.md has no ```toml cluster file"
    spec = parse_spec(tomllib.loads(block.group(1)), base_dir="/")
    assert sorted(spec.nodes) == ["n1", "n2", "n3", "n4"] and len(spec.sites) == 2
    assert all(node.create_export for node in spec.nodes.values())
