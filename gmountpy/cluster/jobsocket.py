"""Where a node's daemon answers "which node for a job with these inputs", and a client for it.

Each node daemon listens on a unix socket on its own machine, named after
its mountpoint, so that a job wrapper which knows only the directory it runs
in (make's `gmount-job`, the Snakemake executor) finds it without reading
the cluster's state: `/tmp/gmountpy-<uid>/jobs-<FNV-1a 64 of the
mountpoint>.sock`. The place is fixed (not $TMPDIR, not $XDG_*): a daemon
started over SSH and a make run from a terminal see different environments
but the same /tmp. The directory belongs to the user alone (mode 0700):
the daemon refuses to serve from one that is not, the C client refuses to
connect through it, and the daemon answers only its own user (SO_PEERCRED).

The protocol is small enough for a C client: one request per connection,
fields ending with NUL, then end of file; the reply likewise.

    request   "gmount-jobs/1" "place" <cwd> <pinned node or ""> <input> <input> ...
              "gmount-jobs/1" "place-planned" <cwd> <pinned node or ""> <planned node> <input> ...
    reply     "ok" "node=n3" "site=..." ... | "error" <message>

`cwd` is an absolute path inside the daemon's mount; inputs are relative
to it or absolute. "place-planned" names the node DAG-aware staging planned
the job on (`gmountpy.jobs.prestage`): it wins when the rule counts it a
candidate. The reply's keys are in `REPLY_KEYS`. Standard library only: the
Snakemake executor and tests use `place` below.
"""

from __future__ import annotations

import os
import socket

__all__ = ["MAGIC", "REPLY_KEYS", "JobsError", "decode_reply", "encode_request", "place", "socket_directory",
           "socket_path"]

MAGIC = "gmount-jobs/1"
#: What an "ok" reply carries: the chosen node and its site, the cluster, the node asked (make's node),
#: the working directory as a namespace path and as a path on the chosen node's mount on this machine
#: ("" when that node is on another machine: `remote` is "1"), why, and the input bytes it holds
#: (`bytes_local`) and must read from other nodes (`bytes_remote`) over `inputs` files.
REPLY_KEYS = ("node", "site", "cluster", "make_node", "cwd", "dir", "remote", "reason", "inputs", "bytes_local",
              "bytes_remote")
#: Largest request or reply accepted (a recipe with thousands of prerequisites fits easily).
MAX_MESSAGE = 16 << 20


class JobsError(Exception):
    """The daemon answered, with an error (the message says what and on which node)."""


def socket_directory(uid: int | None = None) -> str:
    return f"/tmp/gmountpy-{os.geteuid() if uid is None else uid}"


def fnv1a64(data: bytes) -> int:
    value = 0xCBF29CE484222325
    for byte in data:
        value = ((value ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return value


def socket_path(mountpoint: str, uid: int | None = None) -> str:
    """The socket of the daemon mounted at `mountpoint` (as the kernel shows it: a real path)."""
    return os.path.join(socket_directory(uid), f"jobs-{fnv1a64(os.fsencode(mountpoint)):016x}.sock")


def encode_request(cwd: str, inputs: list[str], pin: str | None = None, planned: str | None = None) -> bytes:
    fields = [MAGIC, "place-planned", cwd, pin or "", planned, *inputs] if planned else \
        [MAGIC, "place", cwd, pin or "", *inputs]
    for field in fields:
        if "\0" in field:
            raise ValueError(f"a NUL character cannot be sent: {field!r}")
    return b"".join(os.fsencode(field) + b"\0" for field in fields)


def decode_reply(data: bytes) -> dict[str, str]:
    """The "ok" reply's keys and values; JobsError for an "error" reply, ValueError for anything else."""
    if not data.endswith(b"\0"):
        raise ValueError("truncated reply from the node daemon's job socket")
    fields = [os.fsdecode(field) for field in data[:-1].split(b"\0")]
    if fields[0] == "error":
        raise JobsError(fields[1] if len(fields) > 1 else "the node daemon refused the request")
    if fields[0] != "ok":
        raise ValueError(f"unexpected reply from the node daemon's job socket: {fields[0]!r}")
    reply = dict(field.partition("=")[::2] for field in fields[1:])
    missing = [key for key in REPLY_KEYS if key not in reply]
    if missing:
        raise ValueError(f"the node daemon's reply lacks {', '.join(missing)}")
    return reply


def place(mountpoint: str, cwd: str, inputs: list[str], pin: str | None = None,
          timeout: float = 60.0, planned: str | None = None) -> dict[str, str]:
    """Ask the daemon mounted at `mountpoint` where a job run in `cwd` with `inputs` belongs
    (`planned`: the node DAG-aware staging planned it on, taken if a candidate).

    OSError when the daemon cannot be reached (no socket: an older daemon, or
    another machine's mount); JobsError when it answers with an error.
    """
    request = encode_request(cwd, inputs, pin, planned)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(socket_path(mountpoint))
        sock.sendall(request)
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        size = 0
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            size += len(chunk)
            if size > MAX_MESSAGE:
                raise ValueError("the node daemon's reply is too large")
            chunks.append(chunk)
    return decode_reply(b"".join(chunks))
