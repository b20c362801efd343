"""Execution: running and starting shell commands on a node, in its mount, locally or over SSH."""

from __future__ import annotations

import asyncio
import os
import posixpath
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .._sync import blocking
from ..cluster import registry
from ..errors import GmountError
from ..jobs import bypass
from ..jobs.spawn import Spawned
from .paths import PathLike, Paths
from .placing import Job, Placer
from .results import CommandTimeout, Node, RunResult
from .view import ClusterView


class Execution:
    """`api.Cluster.run` and `api.Cluster.spawn` (documented there)."""

    def __init__(self, view: ClusterView, paths: Paths, placer: Placer) -> None:
        self._view = view
        self._paths = paths
        self._placer = placer

    def run(self, command: str | Sequence[str], *, on: str | Node | None = None,
            near: PathLike | Iterable[PathLike] | None = None, timeout: float | None = None,
            cwd: PathLike = "/", capture: bool = True) -> RunResult:
        if on is not None and near is not None:
            raise ValueError("give `on` or `near`, not both")
        if timeout is not None and timeout <= 0:
            raise ValueError(f"`timeout` must be positive, got {timeout}")
        text = command if isinstance(command, str) else shlex.join(command)
        if not text.strip():
            raise ValueError("`command` must not be empty")
        inputs = near if near is not None else []
        node = self._view.node_name(on) if on is not None else self._placer.place(inputs).node
        directory = self._paths.resolve(cwd, None)[0]
        with Job(self._view.name, node):
            if self._view.is_ssh(node):
                # no local process lives exactly as long as the remote command: this one stands in
                shown = registry.register(self._view.name, node, job_label(text), os.getpid(), kind="api",
                                          directory=directory)
                try:
                    over_ssh: RunResult = blocking(asyncio.run,
                                                   self._run_ssh(node, text, directory, timeout, capture))
                finally:
                    registry.unregister(shown)
                return over_ssh
            return self._run_local(node, text, directory, timeout, capture)

    def spawn(self, command: str, *, on: str | Node, cwd: PathLike = "/", env: Mapping[str, str] | None = None,
              stdout: Any = None, stderr: Any = None, job: str | None = None, kind: str = "api") -> Spawned:
        spawned = self._start(command, on=on, cwd=cwd, env=env, stdout=stdout, stderr=stderr)
        registry.register(self._view.name, spawned.node, job or job_label(command), spawned.pid, kind=kind,
                          directory=self._paths.resolve(cwd, None)[0])
        return spawned

    def _start(self, command: str, *, on: str | Node, cwd: PathLike, env: Mapping[str, str] | None,
               stdout: Any, stderr: Any) -> Spawned:
        from ..jobs import spawn as spawning

        if not command.strip():
            raise ValueError("`command` must not be empty")
        node = self._view.node_name(on)
        directory = self._paths.resolve(cwd, None)[0]
        node_spec = self._view.state.spec.nodes[node]
        extra = {**(env or {}), **self._command_env(node)}
        if self._view.is_ssh(node):
            where = posixpath.join(node_spec.mountpoint, directory.lstrip("/"))
            argv = spawning.ssh_argv(node_spec, self._view.state.spec.ssh, command, where, extra,
                                     bypass.remote_prelude(node_spec.python, {**os.environ, **extra}))
            return spawning.start(node, command, where, argv, os.environ, over_ssh=True, stdout=stdout,
                                  stderr=stderr)
        where = os.path.join(node_spec.mountpoint, directory.lstrip("/"))
        if not os.path.isdir(where):
            raise GmountError(f"cannot run on node {node}: {directory} is not a directory in its mount ({where})")
        job_env = {**os.environ, **extra}
        return spawning.start(node, command, where, spawning.local_argv(command),
                              {**job_env, **bypass.job_environment(job_env)}, over_ssh=False, stdout=stdout,
                              stderr=stderr)

    def _command_env(self, node: str) -> dict[str, str]:
        return {"GMOUNT_NODE": node, "GMOUNT_SITE": self._view.state.spec.nodes[node].site,
                "GMOUNT_CLUSTER": self._view.name}

    def _run_local(self, node: str, command: str, directory: str, timeout: float | None,
                   capture: bool) -> RunResult:
        mountpoint = self._view.state.spec.nodes[node].mountpoint
        cwd = os.path.join(mountpoint, directory.lstrip("/"))
        if not os.path.isdir(cwd):
            raise GmountError(f"cannot run on node {node}: {directory} is not a directory in its mount ({cwd})")
        started = time.monotonic()
        pipe = subprocess.PIPE if capture else None
        env = {**os.environ, **self._command_env(node)}
        process = subprocess.Popen(command, shell=True, cwd=cwd, env={**env, **bypass.job_environment(env)},
                                   stdin=subprocess.DEVNULL if capture else None, stdout=pipe, stderr=pipe,
                                   start_new_session=capture)
        registry.register(self._view.name, node, job_label(command), process.pid, kind="api", directory=directory)
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill(process, group=capture)
            out, err = process.communicate()
            raise CommandTimeout(node, command, timeout or 0, _text(out), _text(err)) from None
        except BaseException:
            _kill(process, group=capture)
            process.wait()
            raise
        code = process.returncode
        return RunResult(node, command, cwd, 128 - code if code < 0 else code, _text(out), _text(err),
                         time.monotonic() - started)

    async def _run_ssh(self, node: str, command: str, directory: str, timeout: float | None,
                       capture: bool) -> RunResult:
        import asyncssh

        # Reach the node exactly as the launcher does (user@host, port, keys, known_hosts, ssh config).
        from ..launch.ssh import _connect_options, _connect_problem, destination

        spec = self._view.state.spec
        node_spec = spec.nodes[node]
        dest = destination(node_spec)
        cwd = posixpath.join(node_spec.mountpoint, directory.lstrip("/"))
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in self._command_env(node).items())
        prelude = bypass.remote_prelude(node_spec.python)  # the node's own copy of the bypass library
        inner = f"cd {shlex.quote(cwd)} && {prelude}{exports} exec /bin/sh -c {shlex.quote(command)}"
        remote = f"exec /bin/sh -c {shlex.quote(inner)}"  # any login shell, even csh, can exec sh
        started = time.monotonic()
        try:
            async with asyncssh.connect(dest.hostname, **_connect_options(spec.ssh, dest)) as conn:
                streams: dict[str, Any] = {} if capture else {"stdout": sys.stdout, "stderr": sys.stderr}
                result = await conn.run(remote, check=False, timeout=timeout, **streams)
        except asyncssh.TimeoutError as exc:
            raise CommandTimeout(node, command, timeout or 0, _text(exc.stdout), _text(exc.stderr)) from None
        except (OSError, asyncssh.Error) as exc:
            raise GmountError(f"cannot run on node {node}: {_connect_problem(exc, dest, spec.ssh)}") from None
        if result.exit_status is not None:
            code = result.exit_status
        else:
            signame = result.exit_signal[0] if result.exit_signal else ""
            number = getattr(signal, f"SIG{signame}", None)
            code = 128 + int(number) if number is not None else 255
        return RunResult(node, command, cwd, code, _text(result.stdout), _text(result.stderr),
                         time.monotonic() - started)


def job_label(command: str, width: int = 60) -> str:
    """A command as `gmount top` shows a job started without a name: one line, at most `width` characters."""
    line = " ".join(command.split())
    return line if len(line) <= width else line[:width - 3] + "..."


def _kill(process: subprocess.Popen[bytes], group: bool) -> None:
    try:
        if group:
            os.killpg(process.pid, signal.SIGKILL)
        else:
            process.kill()
    except ProcessLookupError:
        pass


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data if isinstance(data, str) else data.decode(errors="replace")
