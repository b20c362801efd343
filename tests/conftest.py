"""Shared fixtures: isolated state directory, capability checks, real local clusters."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from gmountpy import launch
from gmountpy.cluster.config import ClusterSpec, load_spec
from gmountpy.cluster.state import ClusterState
from gmountpy.launch.orchestrate import pid_is_daemon
from gmountpy.node.directories import unseal_mountpoint


@pytest.fixture(scope="session", autouse=True)
def _private_state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Keep launcher state and daemon logs of the test run away from the user's own."""
    old = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("state"))
    yield
    if old is None:
        del os.environ["XDG_STATE_HOME"]
    else:
        os.environ["XDG_STATE_HOME"] = old


def require(capability: str, problem: str | None) -> None:
    """Skip a test whose capability is missing -- but under CI that is a failure, never a skip."""
    if problem is None:
        return
    message = f"{capability} not usable: {problem}"
    if os.environ.get("CI"):
        pytest.fail(message + " (CI is set: this must work here)", pytrace=False)
    pytest.skip(message)


def fuse_problem() -> str | None:
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse does not exist"
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return "/dev/fuse is not readable and writable by this user"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is not installed (Debian package fuse3)"
    return None


@pytest.fixture
def fuse() -> None:
    require("FUSE", fuse_problem())


class LocalCluster:
    """A running local cluster made for a test, with paths to each node's export and mount."""

    def __init__(self, spec: ClusterSpec, state: ClusterState, base: Path) -> None:
        self.spec = spec
        self.state = state
        self.base = base

    def rescan(self, *nodes: str) -> None:
        """Files were written straight into these nodes' exports (default: every node's): under
        `lookup = "index"` tell the homes now, as a user would with `gmount rescan`, instead of
        waiting for the nodes' next export scan. Under flooding there is nothing to tell."""
        if self.spec.tuning.lookup == "flood":
            return  # one request per node that answers 0: not worth a failure point in every test
        from gmountpy import Cluster

        Cluster.open(self.spec.name).rescan(list(nodes) or None)

    @property
    def nodes(self) -> list[str]:
        return list(self.spec.nodes)

    def mount(self, node: str) -> Path:
        return Path(self.spec.node(node).mountpoint)

    def export(self, node: str) -> Path:
        return Path(self.spec.node(node).export)


def write_cluster_file(base: Path, name: str, sites: dict[str, list[str]],
                       links: list[tuple[str, str, float]], tuning: str = "", top: str = "") -> Path:
    lines = [f'name = "{name}"', 'launcher = "local"', *([top] if top else []), "[defaults]",
             f'export = "{base}/{{node}}/export"', f'mountpoint = "{base}/{{node}}/mnt"']
    for site, nodes in sites.items():
        lines += [f"[sites.{site}]", "nodes = [" + ", ".join(f'"{n}"' for n in nodes) + "]"]
    for a, b, rtt in links:
        lines += ["[[links]]", f'sites = ["{a}", "{b}"]', f"rtt_ms = {rtt}"]
    if tuning:
        lines += ["[tuning]", textwrap.dedent(tuning).strip()]
    for node in (n for members in sites.values() for n in members):
        (base / node / "export").mkdir(parents=True, exist_ok=True)  # `gmount up` refuses a missing export
    path = base / "cluster.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def force_cleanup(spec: ClusterSpec, state: ClusterState | None) -> None:
    """Last resort after a failed test: kill our daemons by pid, lazily unmount our mountpoints
    and make them ordinary directories again (a dead daemon leaves them sealed, unremovable)."""
    if state is not None:
        for record in state.nodes.values():
            if pid_is_daemon(record.pid):
                os.kill(record.pid, signal.SIGKILL)
    for node in spec.nodes.values():
        with open("/proc/self/mounts") as f:
            mounted = any(line.split(" ")[1] == node.mountpoint for line in f)
        if mounted:
            subprocess.run(["fusermount3", "-u", "-z", node.mountpoint], capture_output=True)
        unseal_mountpoint(node.mountpoint)


#: The locators the hand-off tests run under: the default (the index) and GMount's flooding
#: search, which a user may still choose; only the one GMOUNT_TEST_LOOKUP names when it is set.
LOOKUPS = [os.environ["GMOUNT_TEST_LOOKUP"]] if os.environ.get("GMOUNT_TEST_LOOKUP") else ["index", "flood"]


@contextmanager
def local_cluster(base: Path, name: str, sites: dict[str, list[str]],
                  links: list[tuple[str, str, float]], tuning: str = "attr_ttl = 0.5\nnegative_ttl = 0.5",
                  top: str = "") -> Iterator[LocalCluster]:
    """Bring a cluster up for the duration of a block; always tear it down, also on failure."""
    base.mkdir(parents=True, exist_ok=True)
    lookup = os.environ.get("GMOUNT_TEST_LOOKUP")  # run a suite against another locator ("index", "central")
    if lookup and "lookup" not in tuning:
        tuning = f'{tuning}\nlookup = "{lookup}"'
    if os.environ.get("GMOUNT_TEST_TUNING"):  # more [tuning] lines for such a run, e.g. index_rescan = 0.01
        tuning = f'{tuning}\n{os.environ["GMOUNT_TEST_TUNING"]}'
    spec = load_spec(write_cluster_file(base, name, sites, links, tuning, top))
    state: ClusterState | None = None
    try:
        state = launch.up(spec)
        yield LocalCluster(spec, state, base)
    finally:
        try:
            launch.down(spec.name)
        finally:
            force_cleanup(spec, state)


FOUR_NODES = {"tsukuba": ["n1", "n2"], "hongo": ["n3", "n4"]}
FOUR_NODE_LINKS = [("tsukuba", "hongo", 14.0)]


@pytest.fixture(scope="session")
def cluster4(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A 4-node, 2-site local cluster shared by the tests of a session (use unique file names)."""
    require("FUSE", fuse_problem())
    base = tmp_path_factory.mktemp("cluster4")
    with local_cluster(base, f"t4-{os.getpid()}", FOUR_NODES, FOUR_NODE_LINKS) as cluster:
        yield cluster


def as_terminal_job() -> None:
    """preexec_fn for a process a test will Ctrl-C: SIGINT and SIGQUIT back to their defaults.

    A test runner started in the background (as CI jobs often are) inherits SIGINT and
    SIGQUIT ignored, and make, shells and Python keep an ignored SIGINT ignored -- as they
    must. A terminal's foreground job, which Ctrl-C is about, has them at their defaults.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def close_pipes(process: subprocess.Popen[Any]) -> None:
    """After killing a process: close its pipes now (not at garbage collection, in another test)."""
    for stream in (process.stdin, process.stdout, process.stderr):
        if stream is not None:
            stream.close()


def process_report(pid: int, cluster: LocalCluster | None = None) -> str:
    """State, kernel wait channel and command line of `pid`, everything below it and the cluster's daemons.

    For the message of a test that timed out waiting for a process: says who waits where.
    """
    lines = []
    daemons = [record.pid for record in cluster.state.nodes.values()] if cluster is not None else []
    for p in [*sorted({pid} | descendants(pid)), *daemons]:
        try:
            with open(f"/proc/{p}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            with open(f"/proc/{p}/wchan") as f:
                wchan = f.read()
            with open(f"/proc/{p}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        lines.append(f"{p} {state} {wchan or '-'} {command}")
        try:  # where in the kernel it waits (readable by root only)
            with open(f"/proc/{p}/stack") as f:
                lines += ["    " + line for line in f.read().splitlines()[:8]]
        except OSError:
            pass
    return "\n".join(lines)


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` (by /proc/<pid>/task/*/children)."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except FileNotFoundError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{parent}/task/{task}/children") as f:
                    children = [int(c) for c in f.read().split()]
            except FileNotFoundError:
                continue
            for child in children:
                if child not in found:
                    found.add(child)
                    todo.append(child)
    return found


def wait_for(predicate, timeout: float = 5.0, interval: float = 0.05):  # type: ignore[no-untyped-def]
    """Poll until predicate() is truthy (for effects that become visible after a cache TTL)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)
