"""The package map of docs/design.md matches the tree.

Every module under gmountpy/ is listed, alone or under a listed package directory,
and everything listed exists -- so the layering the design document shows is the one in the code.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DESIGN = ROOT / "docs" / "design.md"
#: entry points of a package, not modules with a role of their own
NOT_LISTED = {"__init__.py", "__main__.py"}


def package_map(document: str) -> list[str]:
    """The paths in the first column of the `| module | role |` table, relative to the repository.

    A cell lists one path, then possibly names in that path's directory:
    "`gmountpy/node/inodes.py`, `fuse.py`"; a path ending in "/" is a package directory.
    """
    lines = document.splitlines()
    start = next((i for i, line in enumerate(lines) if re.fullmatch(r"\|\s*module\s*\|\s*role\s*\|", line.strip())),
                 None)
    assert start is not None, "docs/design.md has no package map (a table headed | module | role |)"
    paths: list[str] = []
    for line in lines[start + 2:]:  # past the header and its |---| line
        if not line.startswith("|"):
            break
        cell = line.split("|")[1]
        names = re.findall(r"`([^`]+)`", cell)
        assert names, f"a package-map row names no path: {line!r}"
        directory = names[0].rstrip("/").rsplit("/", 1)[0] if "/" in names[0].rstrip("/") else ""
        for name in names:
            paths.append(name if "/" in name else f"{directory}/{name}")
    return paths


def covered(module: str, listed: list[str]) -> bool:
    return any(module == path or (path.endswith("/") and module.startswith(path)) for path in listed)


def test_every_module_under_gmountpy_is_in_the_package_map() -> None:
    listed = package_map(DESIGN.read_text())
    modules = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "gmountpy").rglob("*.py") if p.name not in NOT_LISTED)
    missing = [module for module in modules if not covered(module, listed)]
    assert not missing, f"modules missing from the package map of docs/design.md: {missing}"


def test_everything_in_the_package_map_exists() -> None:
    listed = package_map(DESIGN.read_text())
    assert len(listed) > 20  # the table was found and read
    gone = [path for path in listed if not (ROOT / path).exists() or (path.endswith("/") != (ROOT / path).is_dir())]
    assert not gone, f"the package map of docs/design.md lists what is not in the tree: {gone}"


def test_the_package_map_parser() -> None:
    document = "\n".join([
        "| module | role |", "|---|---|",
        "| `gmountpy/node/inodes.py`, `fuse.py` | inodes |",
        "| `gmountpy/launch/` | launch |",
        "| `plugins/a/`, `plugins/b/` | plugins |",
        "", "| `gmountpy/after.py` | not in the table |",
    ])
    listed = package_map(document)
    assert listed == ["gmountpy/node/inodes.py", "gmountpy/node/fuse.py", "gmountpy/launch/", "plugins/a/",
                      "plugins/b/"]
    assert covered("gmountpy/launch/ssh.py", listed) and not covered("gmountpy/launcher.py", listed)
