"""Sessions a newcomer runs on a fresh Debian machine: `nox -s demo`, `nox -s tests`, `nox -s bench`, `nox -s lint`,
`nox -s docs`.

Each session installs what it needs: Debian packages via apt-get when they
are missing (FUSE, and sshd for the tests), then gmountpy into the session's
virtualenv as a normal (non-editable) install.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess

import nox

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True

BASE_PACKAGES = ["fuse3", "libfuse3-dev", "pkg-config", "gcc", "python3-dev"]
#: the tests run a real sshd and the WAN harness (namespaces, iptables-legacy, the NFQUEUE delay program)
TEST_PACKAGES = ["openssh-server", "openssh-client", "iproute2", "iptables", "util-linux", "rsync",
                 "libnetfilter-queue-dev", "libmnl-dev",
                 "glusterfs-server", "glusterfs-client",  # the WAN benchmarks' GlusterFS peer, tested too
                 "gfmd", "gfsd", "gfarm2fs", "gfarm-client", "sshfs",  # the pipelines' peers: Gfarm, a central server
                 "bwa", "samtools", "bcftools",  # the variant-calling workflow run through Snakemake (wgsim: samtools)
                 "chromium"]  # `gmount report`'s page, looked at in a real (headless) browser
PIPELINE_PACKAGES = ["make", "montage"]  # the reference pipelines: GNU make and the Montage executables
#: an sshfs mount through a private sshd on 127.0.0.1, beside the mount in bench_core's local I/O rows
SSHFS_PACKAGES = ["sshfs", "openssh-server", "openssh-client"]


def _missing_debs(packages: list[str]) -> list[str]:
    missing = []
    for package in packages:
        result = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True)
        if "install ok installed" not in result.stdout:
            missing.append(package)
    return missing


def ensure_system_packages(session: nox.Session, packages: list[str]) -> None:
    """apt-get install what is missing (as root), or say exactly what to install."""
    if shutil.which("dpkg-query") is None:
        session.warn(f"not a Debian system: make sure these are installed: {' '.join(packages)}")
        return
    missing = _missing_debs(packages)
    if not missing:
        return
    if os.geteuid() != 0:
        session.error(f"missing system packages: {' '.join(missing)}; run: sudo apt-get install -y {' '.join(missing)}")
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    session.run("apt-get", "update", "-qq", external=True, env=env)
    session.run("apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing, external=True, env=env)


def install_project(session: nox.Session, extras: str = "") -> None:
    session.install(f".{extras}")


@nox.session
def tests(session: nox.Session) -> None:
    """The whole test suite: real FUSE mounts, a real sshd, real make and snakemake runs, emulated WAN sites."""
    ensure_system_packages(session, BASE_PACKAGES + TEST_PACKAGES + PIPELINE_PACKAGES)
    install_project(session, "[test,pipelines,snakemake]")
    session.run("pytest", *(session.posargs or ["-q"]))


#: pinned: a new release of either may add checks, and CI must not break without a change here
LINT_TOOLS = ["mypy==2.4.1", "ruff==0.17.6", "types-networkx==3.6.1.20261114"]
LINT_PATHS = ["gmountpy", "plugins"]


@nox.session
def lint(session: nox.Session) -> None:
    """`mypy --strict` over the package and plugins; `ruff check` also over tests and benchmarks (pyproject.toml);
    `shellcheck` over the sh programs the launcher runs on nodes.

    mypy checks calls against the libraries as installed, so the project comes with
    the same extras as the tests (pyfuse3 builds against libfuse3-dev).
    """
    ensure_system_packages(session, BASE_PACKAGES + ["shellcheck"])
    install_project(session, "[test,pipelines,snakemake]")
    session.install(*LINT_TOOLS)
    session.run("ruff", "check", *LINT_PATHS, "tests", "benchmarks")  # mypy: the package and plugins only
    session.run("mypy", *LINT_PATHS)
    session.run("shellcheck", "--shell=sh", *sorted(glob.glob("gmountpy/**/*.sh", recursive=True)), external=True)


#: pinned like the lint tools: a new release may add warnings, and the build runs with --strict
DOCS_TOOLS = ["mkdocs==1.6.1", "mkdocs-material==9.8.1", "mkdocstrings==1.0.8", "mkdocstrings-python==2.0.11",
              "mkdocs-click==0.9.0", "ruff==0.17.6"]  # ruff: mkdocstrings formats signatures with it


@nox.session
def docs(session: nox.Session) -> None:
    """The documentation site (MkDocs Material) into site/: `mkdocs build --strict`, so a warning -- a broken
    link or anchor, a page missing from the nav, a docstring the API reference cannot read -- fails it.

    `nox -s docs -- serve` previews it at http://127.0.0.1:8000 instead. The API reference is read from the
    package's docstrings and the CLI reference from its click commands, so the project is installed too.
    """
    ensure_system_packages(session, BASE_PACKAGES)
    install_project(session, "[fsspec]")
    session.install(*DOCS_TOOLS)
    session.env["NO_MKDOCS_2_WARNING"] = "1"  # Material's banner about its successor, printed at every build
    if session.posargs[:1] == ["serve"]:
        session.run("mkdocs", "serve", *session.posargs[1:])
    else:
        session.run("mkdocs", "build", "--strict", "--site-dir", "site", *session.posargs)


@nox.session
def demo(session: nox.Session) -> None:
    """Start the embedded 4-node, 2-site local cluster and show it working."""
    ensure_system_packages(session, BASE_PACKAGES)
    install_project(session)
    session.run("gmount", "demo", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks against direct disk access; JSON results in benchmarks/results/."""
    ensure_system_packages(session, BASE_PACKAGES + SSHFS_PACKAGES)  # bench_core's sshfs rows
    install_project(session, "[dask]")
    session.run("python", "benchmarks/bench_core.py", *session.posargs)
    session.run("python", "benchmarks/bench_lookup.py")  # messages/op: flood vs index vs central
    session.run("python", "benchmarks/bench_split.py")  # creates into one directory, with and without Giga+ splits
    session.run("python", "benchmarks/bench_big_directory.py")  # 100 000 names in one directory, checked
    session.run("python", "benchmarks/bench_dask.py", "--check")  # Dask tasks placed on their data vs Dask's own
    ensure_system_packages(session, ["make"])
    session.run("python", "benchmarks/bench_make.py")
    if os.geteuid() == 0:  # the WAN benchmarks and the soak need network namespaces (root); reduced size here
        bench_wan(session, ["--quick"])
        run_soak(session, ["--minutes", "5"])
    else:
        session.warn("WAN benchmarks and the soak skipped: they need root (network namespaces); "
                     "see benchmarks/README.md")


WAN_PACKAGES = ["iproute2", "iptables", "util-linux", "gcc", "libnetfilter-queue-dev", "libmnl-dev", "fio", "sshfs",
                "openssh-server", "openssh-client"]
#: GlusterFS, a peer in the WAN metadata and fio benchmarks (glusterd, bricks and the FUSE client)
GLUSTER_PACKAGES = ["glusterfs-server", "glusterfs-client"]
#: Gfarm, the GMount paper's baseline: in the metadata benchmark and the pipeline comparison
GFARM_PACKAGES = ["gfmd", "gfsd", "gfarm2fs", "gfarm-client"]


@nox.session
def wan(session: nox.Session) -> None:
    """The WAN emulation CLI: `nox -s wan -- up CLUSTER.toml [--gmount]`, `down CLUSTER.toml`,
    `run CLUSTER.toml -- CMD`."""
    ensure_system_packages(session, BASE_PACKAGES + WAN_PACKAGES)
    install_project(session)
    session.run("python", "-m", "benchmarks.wan", *(session.posargs or ["--help"]))


def bench_wan(session: nox.Session, args: list[str]) -> None:
    """Metadata (ParaMark-style), fio and deploy benchmarks over emulated WAN sites (root)."""
    ensure_system_packages(session, BASE_PACKAGES + WAN_PACKAGES + GLUSTER_PACKAGES + GFARM_PACKAGES)
    session.run("python", "-m", "benchmarks.wan.bench_link", *args)
    session.run("python", "-m", "benchmarks.wan.bench_meta", *args)
    session.run("python", "-m", "benchmarks.wan.bench_io", *args)
    session.run("python", "-m", "benchmarks.wan.bench_deploy", *args)


@nox.session(name="bench-wan")
def bench_wan_session(session: nox.Session) -> None:
    """Only the WAN benchmarks, full size unless `-- --quick` (MooseFS joins if moosefs-* are installed).

    GlusterFS (a peer in the metadata and fio runs) is installed with apt-get when it is missing.
    """
    install_project(session)
    bench_wan(session, session.posargs)


def run_soak(session: nox.Session, args: list[str]) -> None:
    """The fault-injection soak (benchmarks/soak.py): make and Snakemake runs among its load, so both."""
    ensure_system_packages(session, BASE_PACKAGES + WAN_PACKAGES + ["make"])
    session.install(".[snakemake]")
    session.run("python", "benchmarks/soak.py", *args)


@nox.session
def soak(session: nox.Session) -> None:
    """The fault-injection soak, long (root: network namespaces): 30 minutes of faults unless
    `-- --minutes N`; its report in benchmarks/results/soak.json, exit 1 on any failure."""
    run_soak(session, session.posargs)


@nox.session(name="bench-pipelines")
def bench_pipelines(session: nox.Session) -> None:
    """The reference pipelines across two emulated WAN sites, each node with its own CPU: gmountpy's
    placements beside Gfarm and a central sshfs server (root). `-- --quick` for small inputs; other
    arguments go to benchmarks/wan/bench_pipelines.py for both pipelines, e.g. `-- --bandwidth-mbit 100`."""
    ensure_system_packages(session, BASE_PACKAGES + WAN_PACKAGES + GFARM_PACKAGES + PIPELINE_PACKAGES)
    install_project(session, "[pipelines,snakemake]")
    for name in ("montage", "event"):
        session.run("python", "-m", "benchmarks.wan.bench_pipelines", name, *session.posargs)


def _pipeline(session: nox.Session, name: str) -> None:
    ensure_system_packages(session, BASE_PACKAGES + PIPELINE_PACKAGES)
    install_project(session, "[pipelines,snakemake]")
    session.run("gmount", "pipeline", name, *(session.posargs or ["--compare"]))


@nox.session
def montage(session: nox.Session) -> None:
    """The Montage mosaic (16 tiles) on the embedded 4-node cluster: locality vs random vs one node.

    Arguments go to `gmount pipeline montage`, e.g. `nox -s montage -- --tiles 64 --engine snakemake`.
    """
    _pipeline(session, "montage")


@nox.session
def event(session: nox.Session) -> None:
    """Event recognition over 158 abstracts on the embedded 4-node cluster: locality vs random vs one node.

    Arguments go to `gmount pipeline event`, e.g. `nox -s event -- --docs 16 --engine snakemake`.
    """
    _pipeline(session, "event")
