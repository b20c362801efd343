"""The layers of docs/design.md: imports flow down, and the launcher, the API and the CLI never load FUSE."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path


def test_launcher_api_and_cli_do_not_import_the_fuse_layer() -> None:
    probe = ("import sys, gmountpy.launch, gmountpy.api, gmountpy.cli, gmountpy.launch.orchestrate; "
             "print(sorted(m for m in sys.modules if m == 'pyfuse3' or m in ('gmountpy.node.fuse', "
             "'gmountpy.node.daemon')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


#: The layers of docs/design.md, bottom up: a module imports only from its own folder and lower layers.
LAYERS = {
    "base": 0,  # errors, _trio, _sync, _version
    "cluster": 1,
    "protocol": 2,
    "node": 3,
    "jobs": 2,  # the placement rule and spawning: below the node daemon, which places jobs too
    "launch": 4,
    "api": 5,
    "slurm": 6,
    "pipelines": 6,
    "cli": 7,
    "__main__": 8,
    "pegasus": 8,
    "__init__": 8,  # the package's face loads the public names lazily
}
BASE = {"errors", "_trio", "_sync", "_version"}


def _layer_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "__init__"
    return "base" if parts[1] in BASE else parts[1]


def _imports(path: Path, module: str, is_package: bool) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "gmountpy":
                found += [f"gmountpy.{alias.name}" for alias in node.names]
            elif target.startswith("gmountpy."):
                found.append(target)
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.startswith("gmountpy.")]
    return found


def test_imports_flow_down_the_layers() -> None:
    root = Path(__file__).resolve().parents[2]
    wrong = []
    for path in sorted((root / "gmountpy").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        module = ".".join(parts[:-1] if is_package else parts)
        here = _layer_of(module)
        assert here in LAYERS, f"{module}: its folder is in no layer of docs/design.md (add it to LAYERS)"
        for target in _imports(path, module, is_package):
            there = _layer_of(target)
            if there != here and LAYERS[there] >= LAYERS[here]:
                wrong.append(f"{module} ({here}) imports {target} ({there})")
    assert not wrong, "imports that run up or across the layers:\n" + "\n".join(wrong)
