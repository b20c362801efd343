"""MkDocs hook: pages kept elsewhere in the repository, included in the site at build time.

`benchmarks/README.md` becomes the Benchmarks page (`benchmarks/index.md`) with the plots and
results of `benchmarks/published/` beside it, so its `published/NAME` links resolve unchanged and
the numbers have one source.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]


def on_files(files: Files, config: Any) -> Files:
    benchmarks = ROOT / "benchmarks"
    # its links into docs/ (`../docs/x.md`, right on GitHub) become links between the site's pages
    page = (benchmarks / "README.md").read_text(encoding="utf-8").replace("](../docs/", "](../")
    files.append(File.generated(config, "benchmarks/index.md", content=page))
    for published in sorted((benchmarks / "published").iterdir()):
        if published.suffix in (".png", ".json"):  # the plots, and the results they were drawn from
            files.append(File.generated(config, f"benchmarks/published/{published.name}", abs_src_path=str(published)))
    return files
