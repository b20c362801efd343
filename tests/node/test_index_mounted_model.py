"""The index's model check through real FUSE mounts (issue 13: "and the same against real mounts").

Random creates, rewrites, truncates, chmods, unlinks, renames, mkdirs and rmdirs from random
nodes of a local 4-node, 2-site cluster with `lookup = "index"`, each through that node's
mount; after every step every node's mount must show exactly the model of the union
namespace: each name there or not, its type, a file's size, mode and contents, and every
directory's listing. `attr_ttl = 0`, so no kernel keeps attributes or names, and what a
mount shows is what its daemon answers now (its listings and the homes' leases included);
`negative_ttl` stays long, so the kernels' "not found" must be revoked by creates (hand-off
rule 1). No faults here: the in-memory state machine in test_index.py loses messages and
crashes nodes; this one runs the kernel, the FUSE layer and the RPC of the real daemons.
"""

from __future__ import annotations

import os
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from ..conftest import FOUR_NODE_LINKS, FOUR_NODES, LocalCluster, fuse_problem, local_cluster, require

NODES = ("n1", "n2", "n3", "n4")
NAMES = ("a", "b", "d", "d/a", "d/b", "e", "e/a")
TUNING = 'attr_ttl = 0.0\nnegative_ttl = 10.0\nrpc_timeout = 3.0\nlookup = "index"'


@pytest.fixture(scope="module")
def model_mounts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    require("FUSE", fuse_problem())
    base = tmp_path_factory.mktemp("index-model-mounts")
    with local_cluster(base, f"ixm-{os.getpid()}", FOUR_NODES, FOUR_NODE_LINKS, TUNING) as running:
        yield running


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


class MountedIndex(RuleBasedStateMachine):
    """One example: a fresh top directory, made through n1's mount; the model is what is in it."""

    def __init__(self, cluster: LocalCluster) -> None:
        super().__init__()
        self.cluster = cluster
        self.top = f"model-{uuid.uuid4().hex[:8]}"
        (cluster.mount("n1") / self.top).mkdir()
        self.files: dict[str, bytes] = {}
        self.modes: dict[str, int] = {}
        self.dirs: set[str] = set()

    def _path(self, node: str, name: str) -> Path:
        return self.cluster.mount(node) / self.top / name

    def _parent_ok(self, name: str) -> bool:
        parent = name.rpartition("/")[0]
        return not parent or parent in self.dirs

    def _free(self, name: str) -> bool:
        return name not in self.files and name not in self.dirs

    def _children(self, name: str) -> list[str]:
        prefix = f"{name}/" if name else ""
        return sorted(n[len(prefix):] for n in (*self.files, *self.dirs)
                      if n.startswith(prefix) and "/" not in n[len(prefix):])

    @rule(node=st.sampled_from(NODES), name=st.sampled_from(NAMES), data=st.binary(max_size=64))
    def create(self, node: str, name: str, data: bytes) -> None:
        if not self._parent_ok(name) or not self._free(name):
            return
        fd = os.open(self._path(node, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        self.files[name] = data
        self.modes[name] = 0o644 & ~_umask()

    @rule(node=st.sampled_from(NODES), name=st.sampled_from(NAMES), data=st.binary(max_size=64))
    def rewrite(self, node: str, name: str, data: bytes) -> None:
        if name not in self.files:
            return
        with open(self._path(node, name), "wb") as f:  # O_CREAT | O_TRUNC of a name held elsewhere: that file
            f.write(data)
        self.files[name] = data

    @rule(node=st.sampled_from(NODES), name=st.sampled_from(NAMES), size=st.integers(0, 80))
    def truncate(self, node: str, name: str, size: int) -> None:
        if name not in self.files:
            return
        os.truncate(self._path(node, name), size)
        data = self.files[name]
        self.files[name] = data[:size] + b"\0" * (size - len(data))

    @rule(node=st.sampled_from(NODES), name=st.sampled_from(NAMES), mode=st.sampled_from([0o600, 0o640, 0o755]))
    def chmod(self, node: str, name: str, mode: int) -> None:
        if name not in self.files:
            return
        os.chmod(self._path(node, name), mode)
        self.modes[name] = mode

    @rule(node=st.sampled_from(NODES), name=st.sampled_from(NAMES))
    def unlink(self, node: str, name: str) -> None:
        if name not in self.files:
            return
        os.unlink(self._path(node, name))
        del self.files[name], self.modes[name]

    @rule(node=st.sampled_from(NODES), name=st.sampled_from(NAMES))
    def mkdir(self, node: str, name: str) -> None:
        if not self._parent_ok(name) or not self._free(name):
            return
        os.mkdir(self._path(node, name))
        self.dirs.add(name)

    @rule(node=st.sampled_from(NODES), name=st.sampled_from(NAMES))
    def rmdir(self, node: str, name: str) -> None:
        if name not in self.dirs or self._children(name):
            return
        os.rmdir(self._path(node, name))
        self.dirs.discard(name)

    @rule(node=st.sampled_from(NODES), src=st.sampled_from(NAMES), dst=st.sampled_from(NAMES))
    def rename(self, node: str, src: str, dst: str) -> None:
        if src not in self.files or dst == src or dst in self.dirs or not self._parent_ok(dst):
            return
        os.rename(self._path(node, src), self._path(node, dst))
        self.files[dst], self.modes[dst] = self.files.pop(src), self.modes.pop(src)

    @invariant()
    def every_mount_shows_the_model(self) -> None:
        for node in NODES:
            assert sorted(os.listdir(self._path(node, ""))) == self._children(""), node
            for name in NAMES:
                path = self._path(node, name)
                try:
                    found = os.lstat(path)
                except FileNotFoundError:
                    assert self._free(name), f"{node} does not see {name}"
                    continue
                except NotADirectoryError:
                    assert name.rpartition("/")[0] in self.files, f"{node}: {name}'s parent is not a file"
                    continue
                if name in self.files:
                    assert stat.S_ISREG(found.st_mode), (node, name, found)
                    assert (found.st_size, stat.S_IMODE(found.st_mode)) == (len(self.files[name]), self.modes[name]), \
                        (node, name, found)
                    assert path.read_bytes() == self.files[name], (node, name)
                else:
                    assert name in self.dirs and stat.S_ISDIR(found.st_mode), f"{node} sees {name}: {found}"
                    assert sorted(os.listdir(path)) == self._children(name), (node, name)


def test_every_mount_shows_the_union_namespace_model(model_mounts: LocalCluster) -> None:
    run_state_machine_as_test(
        lambda: MountedIndex(model_mounts),
        settings=settings(max_examples=int(os.environ.get("GMOUNT_MOUNT_SM_EXAMPLES", "10")),
                          stateful_step_count=15, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]))
