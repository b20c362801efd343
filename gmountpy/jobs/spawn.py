"""Commands started on a node without waiting for them: what workflow executors need.

`Cluster.run` waits for its command; an executor runs many jobs at once,
polls them and must be able to stop every one of them on Ctrl-C. So
`Cluster.spawn` hands back a `Spawned`: a local process the caller owns.

- On a local cluster the command is `/bin/sh -c` with its working directory
  in the node's mount, in a session of its own, so stopping it signals the
  whole process group (the shell and everything it started).
- On an SSH cluster the local process is OpenSSH's `ssh` client. The remote
  side runs the command under `setsid` and watches its stdin: when the
  local end goes away (stopped, killed, or the connection drops) the remote
  process group is sent SIGTERM, then SIGKILL, so nothing is left behind.

Why OpenSSH's client here and asyncssh in the launcher ("SSH: two clients" in
docs/design.md): a job must be a process its executor owns, with its output
written by the kernel to the executor's files, and make starts one per recipe.
`ssh_argv` reads the cluster file's `[ssh]` table as the launcher does.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import IO, Any

from ..cluster.config import NodeSpec, SshOptions
from ..errors import GmountError

__all__ = ["Spawned", "local_argv", "ssh_argv"]


@dataclass
class Spawned:
    """A command started on a node: poll it, wait for it, or stop it (with everything it started)."""

    node: str
    command: str
    cwd: str
    process: subprocess.Popen[bytes]
    over_ssh: bool = False
    started: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int:
        return self.process.pid

    def poll(self) -> int | None:
        """The exit status (128+N for a signal, like a shell) once it ended, else None."""
        code = self.process.poll()
        return None if code is None else _shell_status(code)

    def wait(self, timeout: float | None = None) -> int:
        return _shell_status(self.process.wait(timeout))

    def stop(self, grace: float = 5.0) -> int:
        """SIGTERM the command's process group, SIGKILL it after `grace` seconds; the exit status."""
        if self.process.poll() is None:
            if self.over_ssh:
                _close(self.process.stdin)  # the remote watcher stops the remote group
            _signal_group(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        _signal_group(self.process.pid, signal.SIGKILL)  # stragglers that ignored SIGTERM
        self.process.wait()
        _close(self.process.stdin)
        return _shell_status(self.process.returncode)


def local_argv(command: str) -> list[str]:
    return ["/bin/sh", "-c", command]


def remote_script(command: str, cwd: str, env: Mapping[str, str], prelude: str = "") -> str:
    """The shell text run on the node: the command in its own session, stopped when stdin ends.
    `prelude` (shell text ending in `; `) runs first in the job's shell (bypass.remote_prelude)."""
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    job = f"cd {shlex.quote(cwd)} && {prelude}{exports} exec /bin/sh -c {shlex.quote(command)}"
    # A background job's stdin is /dev/null unless redirected, so the watcher reads fd 3, a copy of
    # the real stdin; `kill -SIG -PID` (no `--`: dash refuses it) signals the job's whole session.
    return (f"exec 3<&0; setsid /bin/sh -c {shlex.quote(job)} </dev/null 3<&- & pid=$!; "
            "( while read -r _ <&3; do :; done; kill -TERM -$pid 2>/dev/null; sleep 5; "
            "kill -KILL -$pid 2>/dev/null ) & watcher=$!; exec 3<&-; "
            "wait $pid; status=$?; kill $watcher 2>/dev/null; exit $status")


def ssh_argv(node: NodeSpec, options: SshOptions, command: str, cwd: str, env: Mapping[str, str],
             prelude: str = "") -> list[str]:
    """OpenSSH client arguments reaching `node` as the launcher does (same keys, known_hosts, config)."""
    if node.host is None:
        raise ValueError(f"node {node.name!r} has no host to reach over SSH")
    argv = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, round(options.connect_timeout))}",
            "-o", "ServerAliveInterval=30"]
    if options.config is None:
        argv += ["-F", "/dev/null"]
    elif len(options.config) > 1:  # asyncssh reads them all; one silently dropped here would differ
        raise GmountError(f"[ssh] config lists {len(options.config)} files, but jobs on SSH nodes start with "
                          f"OpenSSH's ssh, which reads one: name one file, with Include lines for the others")
    elif options.config:
        argv += ["-F", options.config[0]]
    if node.ssh_port != 22:
        argv += ["-p", str(node.ssh_port)]
    for key in options.identity:
        argv += ["-i", key, "-o", "IdentitiesOnly=yes"]
    if not options.verify_host_keys:
        argv += ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]
    elif options.known_hosts is not None:
        argv += ["-o", f"UserKnownHostsFile={options.known_hosts}"]
    script = remote_script(command, cwd, env, prelude)
    return [*argv, "--", node.host, f"exec /bin/sh -c {shlex.quote(script)}"]


def start(node: str, command: str, cwd: str, argv: list[str], env: Mapping[str, str], *, over_ssh: bool,
          stdout: Any, stderr: Any) -> Spawned:
    """Start argv in a session of its own (cwd only matters locally: SSH changes it remotely)."""
    process = subprocess.Popen(argv, cwd=None if over_ssh else cwd, env=dict(env),
                               stdin=subprocess.PIPE if over_ssh else subprocess.DEVNULL,
                               stdout=stdout, stderr=stderr, start_new_session=True)
    return Spawned(node, command, cwd, process, over_ssh)


def _shell_status(code: int) -> int:
    return 128 - code if code < 0 else code


def _signal_group(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _close(stream: IO[bytes] | None) -> None:
    if stream is not None:
        try:
            stream.close()
        except OSError:
            pass
