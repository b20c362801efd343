"""gmountpy.cluster.mounts without a cluster: the state files it reads (mounts: tests/plugins/test_make.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gmountpy.cluster import mounts


def test_mounts_load_state_keeps_a_private_marshal_copy(tmp_path: Path) -> None:
    clusters = tmp_path / "gmountpy" / "clusters"
    clusters.mkdir(parents=True)
    state = clusters / "c1.json"
    state.write_text(json.dumps({"spec": {"name": "c1"}, "nodes": {"n1": {"pid": 1}}}))
    assert mounts.load_state(str(state)) == {"spec": {"name": "c1"}, "nodes": {"n1": {"pid": 1}}}
    copy = tmp_path / "gmountpy" / "mounts-cache" / "c1.marshal"
    assert copy.exists() and copy.stat().st_mode & 0o077 == 0
    assert mounts.load_state(str(state)) == {"spec": {"name": "c1"}, "nodes": {"n1": {"pid": 1}}}
    # the state file rewritten (another size): parsed again, not the stale copy
    state.write_text(json.dumps({"spec": {"name": "c1"}, "nodes": {"n1": {"pid": 12345}}}))
    assert mounts.load_state(str(state))["nodes"]["n1"]["pid"] == 12345
    copy.write_bytes(b"garbage")  # a damaged copy is ignored and replaced
    assert mounts.load_state(str(state))["nodes"]["n1"]["pid"] == 12345
    assert mounts.load_state(str(state))["nodes"]["n1"]["pid"] == 12345
    state.write_text("{not json")
    with pytest.raises(ValueError):
        mounts.load_state(str(state))
