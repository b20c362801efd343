"""The launcher, the library API and the CLI start daemons without loading the FUSE layer themselves."""

from __future__ import annotations

import subprocess
import sys


def test_launcher_api_and_cli_do_not_import_the_fuse_layer() -> None:
    probe = ("import sys, gmountpy.launch, gmountpy.api, gmountpy.cli, gmountpy.launch.orchestrate; "
             "print(sorted(m for m in sys.modules if m == 'pyfuse3' or m in ('gmountpy.node.fuse', "
             "'gmountpy.node.daemon')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
