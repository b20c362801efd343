"""MkDocs hook: pages kept elsewhere in the repository, included in the site at build time.

`benchmarks/README.md` becomes the Benchmarks page (`benchmarks/index.md`) with the plots of
`benchmarks/published/` beside it, so its `published/NAME.png` images resolve unchanged and the
numbers have one source.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]


def on_files(files: Files, config: Any) -> Files:
    benchmarks = ROOT / "benchmarks"
    files.append(File.generated(config, "benchmarks/index.md", abs_src_path=str(benchmarks / "README.md")))
    for plot in sorted((benchmarks / "published").glob("*.png")):
        files.append(File.generated(config, f"benchmarks/published/{plot.name}", abs_src_path=str(plot)))
    return files
