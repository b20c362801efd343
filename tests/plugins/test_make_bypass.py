"""make's recipes under gmount.mk run with the local bypass on, on the node that holds their inputs."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from ..conftest import LocalCluster, require
from .test_make import BIN, INCLUDE, make_problem

MAKEFILE = INCLUDE + """\
out.txt: in.txt
\tcat $< > $@
\techo "$$GMOUNT_NODE" > $@.node
"""


def test_recipes_read_their_nodes_inputs_from_the_export(cluster4: LocalCluster, tmp_path: Path) -> None:
    require("GNU make and gmount-sh", make_problem())
    wf = "make-bypass"
    (cluster4.export("n3") / wf).mkdir()
    data = "".join(f"line {i}\n" for i in range(20_000))
    (cluster4.export("n3") / wf / "in.txt").write_text(data)
    (cluster4.export("n1") / wf).mkdir()
    (cluster4.export("n1") / wf / "Makefile").write_text(MAKEFILE)
    cluster4.rescan()
    stats = tmp_path / "stats"
    result = subprocess.run(["make"], cwd=cluster4.mount("n1") / wf, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PATH": BIN + os.pathsep + os.environ["PATH"],
                                 "GMOUNT_BYPASS_STATS": str(stats)})
    assert result.returncode == 0, result.stderr
    assert (cluster4.mount("n1") / wf / "out.txt.node").read_text() == "n3\n"  # ran where in.txt is
    assert (cluster4.mount("n1") / wf / "out.txt").read_text() == data
    assert (cluster4.export("n3") / wf / "out.txt").exists()  # written on n3's disk
    direct = sum(int(field.split("=")[1]) for line in stats.read_text().splitlines()
                 for field in line.split() if field.startswith("open_direct="))
    assert direct >= 1, stats.read_text()  # cat read in.txt from n3's export
