"""The soak's workload: writers, workflows and readers on every node, each operation recorded.

- ShellWriter (one per node): `cp`, `dd`, `cat >` and `tar -x` of source files with
  known SHA-256 through the node's mount, into shared directories (homed at either
  site) and into directories of its own made on the way (`mkdir -p`);
- ApiWriter: `Cluster.write_bytes` and `Cluster.put` (from a process inside a site:
  the library reaches the daemons over the emulated network), asking any node,
  sometimes placing the file on the node with the small disk; `Cluster.checksum`
  of files already written;
- WorkflowRunner: real `make` runs with `include $(shell gmount make-include)` and
  real `snakemake --executor gmount` runs over inputs spread on all four nodes;
- Reader (one per node): `cat` (bytes checked), `ls -l` (names checked when no
  fault is around) and `stat` (sizes checked likewise) of what was written.

Every operation becomes a judge.Op in the Ledger; every file whose close (or API
call, or workflow) succeeded becomes an Expected entry, checked from every node
at the end.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import select
import signal
import subprocess
import sys
import tarfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from .cluster import BIN, FULL_NODE, NODES, SoakCluster
from .judge import Op, errno_lost_on, errnos_in, errnos_of_exception

SOAK = "soak"  # the top directory of everything the soak writes, in the namespace
SIZES = [0, 1, 100, 4096, 65_543, 131_072, 440_000, 1 << 20, 3_000_000]
SIZE_WEIGHTS = [1, 2, 4, 6, 6, 4, 3, 2, 1]
SHELL_TIMEOUT = 90.0   # no single cp/cat/ls may take longer: a node that dies or hangs never hangs anyone else
WORKFLOW_TIMEOUT = 300.0


@dataclass(frozen=True)
class Source:
    path: Path
    size: int
    sha: str


@dataclass(frozen=True)
class Expected:
    path: str        # in the namespace, relative: soak/...
    sha: str
    size: int
    closed: float    # when the close (API call, workflow) returned
    by: str          # which operation on which node
    alt: str | None = None  # after a directory rename that failed: the file may be under this name instead


@dataclass
class Ledger:
    """Everything the workload did: every operation, every file it may expect to find, every symlink,
    and every name it removed (which must stay removed)."""

    ops: list[Op] = field(default_factory=list)
    files: dict[str, Expected] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)
    gone: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _keys: list[str] = field(default_factory=list)

    def record(self, op: Op) -> Op:
        with self.lock:
            self.ops.append(op)
        return op

    def expect(self, path: str, sha: str, size: int, closed: float, by: str, alt: str | None = None) -> None:
        with self.lock:
            if path not in self.files:
                self._keys.append(path)
            self.files[path] = Expected(path, sha, size, closed, by, alt)

    def withdraw(self, prefix: str) -> list[Expected]:
        """Take the files below `prefix` out (they are about to be renamed or removed)."""
        with self.lock:
            taken = [e for p, e in self.files.items() if p.startswith(prefix)]
            for expected in taken:
                del self.files[expected.path]
            self._keys = [k for k in self._keys if k in self.files]
            return taken

    def holds(self, path: str) -> bool:
        with self.lock:
            return path in self.files

    def some_files(self, rng: random.Random, count: int = 1) -> list[Expected]:
        with self.lock:
            keys = [rng.choice(self._keys) for _ in range(count)] if self._keys else []
            return [self.files[k] for k in keys]

    def in_directory(self, directory: str, before: float) -> set[str]:
        """Names of the files in `directory` whose close returned before `before`."""
        prefix = directory.rstrip("/") + "/"
        with self.lock:
            return {p[len(prefix):] for p, e in self.files.items()
                    if p.startswith(prefix) and "/" not in p[len(prefix):] and e.closed < before}


class Sources:
    """Local files of known contents (on the harness's scratch disk) that writers copy into the mounts."""

    def __init__(self, directory: Path, rng: random.Random, count: int) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.files: list[Source] = []
        for i in range(count):
            size = SIZES[i] if i < len(SIZES) else rng.choices(SIZES, SIZE_WEIGHTS)[0]
            data = rng.randbytes(size)
            path = directory / f"src{i:03}.bin"
            path.write_bytes(data)
            self.files.append(Source(path, size, hashlib.sha256(data).hexdigest()))
        self.bundles: list[tuple[Path, dict[str, Source]]] = []
        for b in range(4):
            members = {f"m{j}.bin": rng.choice(self.files) for j in range(3)}
            path = directory / f"bundle{b}.tar"
            with tarfile.open(path, "w") as tar:
                for name, source in members.items():
                    tar.add(source.path, arcname=name)
            self.bundles.append((path, members))

    def pick(self, rng: random.Random) -> Source:
        return rng.choices(self.files, [SIZE_WEIGHTS[SIZES.index(s.size)] if s.size in SIZES else 1
                                        for s in self.files])[0]


def run_tool(argv: list[str], timeout: float, cwd: str = "/", env: dict[str, str] | None = None
             ) -> tuple[int, bytes, str]:
    """Run a command in a process group of its own; (exit status, stdout, stderr). A command that
    does not finish within `timeout` is killed and reported as -1 with a message saying so."""
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd, env=env,
                               start_new_session=True)
    try:
        out, err = process.communicate(timeout=timeout)
        return process.returncode, out, err.decode(errors="replace")
    except subprocess.TimeoutExpired:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            out, err = process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            out, err = b"", b"(did not even end after SIGKILL: stuck in the kernel)"
        return -1, out, f"hung: did not finish within {timeout:.0f} s. {err.decode(errors='replace')[-300:]}"


@dataclass(frozen=True)
class Context:
    """What every worker shares: the cluster, the ledger, the stop signal, the run's seed."""

    cluster: SoakCluster
    ledger: Ledger
    stop: threading.Event
    seed: int


class Worker(threading.Thread):
    """A loop of operations, `pause` seconds apart, until `stop` is set; a crash of the worker itself
    (a bug of the harness) is kept for the report, not lost."""

    def __init__(self, name: str, context: Context, pause: tuple[float, float]) -> None:
        super().__init__(name=name, daemon=True)
        self.cluster = context.cluster
        self.ledger = context.ledger
        self.stop = context.stop
        self.rng = random.Random(f"{context.seed}-{name}")
        self.pause = pause
        self.crash: str | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self.step()
                self.stop.wait(self.rng.uniform(*self.pause))
        except Exception as exc:
            self.crash = f"{self.name}: {exc!r}\n{traceback.format_exc()}"
        finally:
            self.finish()

    def step(self) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        pass

    def shell(self, kind: str, node: str, script: str, writes: bool = True, timeout: float = SHELL_TIMEOUT,
              ) -> tuple[Op, bytes]:
        start = time.time()
        code, out, err = run_tool(["sh", "-c", script], timeout)
        op = Op(kind, node, start, time.time(), writes_on=(node,) if writes else ())
        if code != 0:
            op.error = err.strip() or f"exit status {code}, no message"
            op.errnos = errnos_in(err)
        return self.ledger.record(op), out


def shared_directories() -> dict[str, str]:
    """The shared directories: made through n1's mount (homed at east) and n3's (homed at west)."""
    return {**{f"{SOAK}/shared/e{i}": "n1" for i in range(3)}, **{f"{SOAK}/shared/w{i}": "n3" for i in range(3)}}


def q(path: Path | str) -> str:
    """Quoted for sh."""
    return "'" + str(path).replace("'", "'\\''") + "'"


class ShellWriter(Worker):
    """Copies sources into the namespace through one node's mount with cp, dd, cat > and tar -x."""

    def __init__(self, context: Context, pause: tuple[float, float], node: str, sources: Sources) -> None:
        super().__init__(f"writer-{node}", context, pause)
        self.node = node
        self.sources = sources
        self.seq = 0

    def step(self) -> None:
        self.seq += 1
        mount = self.cluster.mount(self.node)
        if self.rng.random() < 0.5:
            directory = self.rng.choice(sorted(shared_directories()))
        else:
            directory = f"{SOAK}/own/{self.node}/b{self.seq // 25}"
        kind = self.rng.choices(["cp", "dd", "cat>", "tar", "ln -s"], [4, 3, 3, 1, 1])[0]
        name = f"{self.node}-{self.seq:05}"
        target = mount / directory
        if kind == "ln -s":  # `ls -l` of the directory then reads the link's attributes and xattrs
            link_to = f"../{name}-target"
            op, _ = self.shell("ln -s", self.node, f"mkdir -p {q(target)} && ln -s {q(link_to)} {q(target / name)}")
            if op.ok:
                with self.ledger.lock:
                    self.ledger.links[f"{directory}/{name}"] = link_to
            return
        if kind == "tar":
            bundle, members = self.rng.choice(self.sources.bundles)
            into = f"{directory}/{name}.x"
            script = (f"mkdir -p {q(mount / into)} && tar -xf {q(bundle)} -C {q(mount / into)} "
                      "--no-same-owner --no-same-permissions")
            op, _ = self.shell("tar", self.node, script)
            if op.ok:
                for member, source in members.items():
                    self.ledger.expect(f"{into}/{member}", source.sha, source.size, op.end, f"tar@{self.node}")
            return
        source = self.sources.pick(self.rng)
        dest = target / f"{name}.{kind.rstrip('>')}"
        copy = {"cp": f"cp {q(source.path)} {q(dest)}",
                "dd": f"dd if={q(source.path)} of={q(dest)} bs=64k status=none"
                      + (" conv=fsync" if self.rng.random() < 0.3 else ""),
                "cat>": f"cat {q(source.path)} > {q(dest)}"}[kind]
        op, _ = self.shell(kind, self.node, f"mkdir -p {q(target)} && {copy}")
        if op.ok:
            self.ledger.expect(f"{directory}/{dest.name}", source.sha, source.size, op.end, f"{kind}@{self.node}")


API_WORKER = """
import json, os, sys, traceback
from gmountpy import Cluster
cluster = Cluster.open(sys.argv[1])
for line in sys.stdin:
    request = json.loads(line)
    op, path = request["op"], request["path"]
    try:
        if op == "write_bytes":
            with open(request["source"], "rb") as f:
                data = f.read()
            reply = {"node": cluster.write_bytes(path, data, on=request["on"], from_node=request["from"])}
        elif op == "put":
            reply = {"node": cluster.put(request["source"], path, on=request["on"], from_node=request["from"])}
        elif op == "checksum":
            size, sha = cluster.checksum(path, from_node=request["from"])
            reply = {"size": size, "sha": sha}
        else:
            raise ValueError(op)
        reply["ok"] = True
    except Exception as exc:
        reply = {"ok": False, "type": type(exc).__name__, "errno": getattr(exc, "errno", None),
                 "message": str(exc), "traceback": traceback.format_exc()[-1500:]}
    print(json.dumps(reply), flush=True)
"""


class ApiWriter(Worker):
    """Cluster.write_bytes / put / checksum from a Python process inside the east site."""

    def __init__(self, context: Context, pause: tuple[float, float], sources: Sources) -> None:
        super().__init__("api", context, pause)
        self.sources = sources
        self.seq = 0
        self.process: subprocess.Popen[str] | None = None

    def _worker(self) -> subprocess.Popen[str]:
        if self.process is None or self.process.poll() is not None:
            self.process = self.cluster.spawn_in_site("east", [sys.executable, "-c", API_WORKER, self.cluster.name],
                                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                      stderr=subprocess.DEVNULL, cwd="/")
        return self.process

    def ask(self, request: dict[str, object], timeout: float = SHELL_TIMEOUT) -> dict[str, object]:
        process = self._worker()
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(json.dumps(request) + "\n")
        process.stdin.flush()
        ready, _, _ = select.select([process.stdout], [], [], timeout)
        if not ready:
            self.finish()
            return {"ok": False, "errno": None, "message": f"hung: no answer within {timeout:.0f} s"}
        line = process.stdout.readline()
        if not line:
            self.finish()
            return {"ok": False, "errno": None, "message": "the API worker process died"}
        reply: dict[str, object] = json.loads(line)
        return reply

    def step(self) -> None:
        asking = self.rng.choice(NODES)
        if self.rng.random() < 0.25:
            for expected in self.ledger.some_files(self.rng):
                start = time.time()
                reply = self.ask({"op": "checksum", "path": "/" + expected.path, "from": asking})
                op = Op("checksum", asking, start, time.time())
                self._failed(op, reply)
                if reply.get("ok") and (reply.get("sha"), reply.get("size")) != (expected.sha, expected.size):
                    op.wrong = (f"Cluster.checksum of {expected.path} from {asking}: {reply.get('size')} B "
                                f"{reply.get('sha')}, not the {expected.size} B {expected.sha} written")
                self.ledger.record(op)
            return
        self.seq += 1
        source = self.sources.pick(self.rng)
        kind = self.rng.choice(["write_bytes", "put"])
        on = FULL_NODE if self.rng.random() < 0.25 else None
        path = f"{SOAK}/api/d{self.seq // 20}/a{self.seq:05}.bin"
        start = time.time()
        before = self._targets(path, asking) if on is None else ()
        reply = self.ask({"op": kind, "path": "/" + path, "source": str(source.path), "on": on, "from": asking})
        writes_on = (on,) if on is not None else tuple(dict.fromkeys(before + self._targets(path, asking)))
        op = Op(kind, asking, start, time.time(), writes_on=writes_on, path=path)
        self._failed(op, reply)
        self.ledger.record(op)
        if op.ok:
            self.ledger.expect(path, source.sha, source.size, op.end, f"{kind}@{asking}")

    def _targets(self, path: str, asking: str) -> tuple[str, ...]:
        """Where a new file `path` written without `on` goes (api/files.py, near_directory): a node whose
        export holds its directory, or the nearest ancestor any holds; `asking` when none does."""
        directory = os.path.dirname(path)
        while directory:
            holders = tuple(n for n in NODES if (self.cluster.export(n) / directory).is_dir())
            if holders:
                return holders
            directory = os.path.dirname(directory)
        return (asking,)

    @staticmethod
    def _failed(op: Op, reply: dict[str, object]) -> None:
        if reply.get("ok"):
            return
        op.error = f"{reply.get('type', '')}: {reply.get('message')}"
        code = reply.get("errno")
        op.errnos = (code,) if isinstance(code, int) else errnos_of_exception(Exception(str(reply.get("message"))))

    def finish(self) -> None:
        if self.process is not None:
            if self.process.poll() is None:
                self.process.kill()
            self.process.wait()
            for stream in (self.process.stdin, self.process.stdout):
                if stream is not None:
                    stream.close()
            self.process = None


MAKEFILE = """\
include $(shell gmount make-include)
all: merged.txt
sum%.txt: in%.bin
\tsha256sum < $< > $@
merged.txt: sum1.txt sum2.txt sum3.txt sum4.txt
\tcat $^ > $@
"""

SNAKEFILE = """\
rule all:
    input: "merged.txt"

rule sums:
    input: "in{i}.bin"
    output: "sum{i}.txt"
    shell: "sha256sum < {input} > {output}"

rule merge:
    input: expand("sum{i}.txt", i=[1, 2, 3, 4])
    output: "merged.txt"
    shell: "cat {input} > {output}"
"""


class WorkflowRunner(Worker):
    """Real make and Snakemake runs over four inputs written through the four nodes' mounts: each job
    runs on the node holding its input (gmount.mk, the gmount executor), the merge wherever it is put."""

    def __init__(self, context: Context, pause: tuple[float, float], engines: list[str], sources: Sources) -> None:
        super().__init__("workflows", context, pause)
        self.engines = engines
        self.sources = sources
        self.seq = 0

    def step(self) -> None:
        self.seq += 1
        engine = self.engines[(self.seq - 1) % len(self.engines)]
        directory = f"{SOAK}/{engine}/r{self.seq:03}"
        inputs = {}
        for i, node in enumerate(NODES, start=1):  # in<i>.bin held by n<i>
            source = self.sources.pick(self.rng)
            target = self.cluster.mount(node) / directory
            op, _ = self.shell("cp", node, f"mkdir -p {q(target)} && cp {q(source.path)} {q(target / f'in{i}.bin')}")
            if not op.ok:
                return
            self.ledger.expect(f"{directory}/in{i}.bin", source.sha, source.size, op.end, f"cp@{node}")
            inputs[i] = source
        head = self.rng.choice(NODES)
        here = self.cluster.mount(head) / directory
        text = MAKEFILE if engine == "make" else SNAKEFILE
        name = "Makefile" if engine == "make" else "Snakefile"
        op, _ = self.shell("cat>", head, f"cat > {q(here / name)} <<'EOF'\n{text}EOF\n")
        if not op.ok:
            return
        self.ledger.expect(f"{directory}/{name}", hashlib.sha256(text.encode()).hexdigest(), len(text), op.end,
                           f"cat>@{head}")
        env = {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
        argv = (["make", "-j2"] if engine == "make" else
                [sys.executable, "-m", "snakemake", "--executor", "gmount", "-j2", "--latency-wait", "10"])
        start = time.time()
        code, out, err = run_tool(self.cluster.site_argv(head, argv), WORKFLOW_TIMEOUT, cwd=str(here), env=env)
        op = Op(engine, head, start, time.time(), writes_on=tuple(NODES))
        if code != 0:
            text_out = out.decode(errors="replace") + err
            op.error = f"{engine} exited {code}: ...{(err or text_out)[-1500:]}"
            op.errnos = errnos_in(text_out)
            op.errno_lost_on = errno_lost_on(text_out)
        self.ledger.record(op)
        if not op.ok:
            return
        sums = {i: f"{inputs[i].sha}  -\n".encode() for i in inputs}
        for i, data in sums.items():
            self.ledger.expect(f"{directory}/sum{i}.txt", hashlib.sha256(data).hexdigest(), len(data), op.end,
                               f"{engine}@{head}")
        merged = b"".join(sums[i] for i in sorted(sums))
        self.ledger.expect(f"{directory}/merged.txt", hashlib.sha256(merged).hexdigest(), len(merged), op.end,
                           f"{engine}@{head}")


class Reader(Worker):
    """cat, ls -l and stat through one node's mount, of what the others wrote."""

    def __init__(self, context: Context, pause: tuple[float, float], node: str, attr_ttl: float) -> None:
        super().__init__(f"reader-{node}", context, pause)
        self.node = node
        self.attr_ttl = attr_ttl

    def step(self) -> None:
        mount = self.cluster.mount(self.node)
        picked = self.ledger.some_files(self.rng)
        if not picked:
            return
        expected = picked[0]
        what = self.rng.choices(["cat", "ls", "stat"], [3, 1, 1])[0]
        if what == "cat":
            op, out = self.shell("cat", self.node, f"cat {q(mount / expected.path)}", writes=False)
            if op.ok and hashlib.sha256(out).hexdigest() != expected.sha:
                op.wrong = (f"cat {expected.path} on {self.node}: {len(out)} B sha256 "
                            f"{hashlib.sha256(out).hexdigest()[:16]}, not the {expected.size} B written")
        elif what == "ls":
            directory = os.path.dirname(expected.path)
            names = self.ledger.in_directory(directory, time.time())
            op, out = self.shell("ls", self.node, f"ls -l {q(mount / directory)}", writes=False)
            if op.ok and not directory.startswith(f"{SOAK}/mv/"):  # names there are renamed and removed
                listed = {line.split(None, 8)[-1] for line in out.decode(errors="replace").splitlines()[1:]}
                missing = sorted(names - listed)
                if missing:
                    op.unless_fault = (f"ls -l {directory} on {self.node} lacks {len(missing)} names whose close "
                                       f"had returned: {missing[:5]}")
        else:
            op, out = self.shell("stat", self.node, f"stat -c %s {q(mount / expected.path)}", writes=False)
            if op.ok and int(out.split()[0]) != expected.size and op.start > expected.closed + self.attr_ttl + 0.5:
                op.unless_fault = (f"stat {expected.path} on {self.node}: size {int(out.split()[0])}, not "
                                   f"{expected.size}, {op.start - expected.closed:.1f} s after its close")
        if not op.ok and not self.ledger.holds(expected.path):
            op.raced = f"{expected.path} was renamed or removed by the soak's mover meanwhile"


class Appender(Worker):
    """O_APPEND writes through one node's mount into a file held by n4, the node whose disk fills. After
    every write the bytes on n4's disk must be exactly those the writes reported: a short write at a full
    disk says how much landed, an error that nothing did (else a program that retries the rest of an
    O_APPEND write duplicates data). After an error under another fault (the holder killed, the network
    cut), whether the bytes landed is not said: the appender then closes the file -- once close(2) has
    returned without error every write made through it has landed or never will (docs/failures.md) -- and
    takes the disk's word for it. A close that fails leaves that unknown, for good: the part is checked up
    to what the appender knew and it goes on in a new one."""

    LIMIT = 48 << 20  # then a new file (the disk is small)

    def __init__(self, context: Context, pause: tuple[float, float], node: str) -> None:
        super().__init__(f"appender-{node}", context, pause)
        self.node = node
        self.part = 0
        self.fd: int | None = None
        self.size = 0
        self.digest = hashlib.sha256()

    @property
    def path(self) -> str:
        return f"{SOAK}/append/from-{self.node}-{self.part}.log"

    def _open(self) -> bool:
        for node, action in ((FULL_NODE, "create"), (self.node, "open")):
            start = time.time()
            try:
                if action == "open":
                    self.fd = os.open(self.cluster.mount(node) / self.path, os.O_WRONLY | os.O_APPEND)
                elif not (self.cluster.export(FULL_NODE) / self.path).exists():
                    write_through(self.cluster, node, self.path, b"")  # through n4's mount: held by n4
            except OSError as exc:
                self.ledger.record(Op(action, node, start, time.time(), writes_on=(FULL_NODE,),
                                      error=f"{type(exc).__name__}: {exc}", errnos=errnos_of_exception(exc)))
                return False
        return True

    def step(self) -> None:
        if self.fd is None and not self._open():
            return
        assert self.fd is not None
        piece = self.rng.randbytes(self.rng.choice([4096, 65_536, 1 << 20, 1 << 20]))
        start = time.time()
        error: OSError | None = None
        try:
            told = os.write(self.fd, piece)
        except OSError as exc:
            told, error = 0, exc
        op = Op("append", self.node, start, time.time(), writes_on=(FULL_NODE,))
        if error is not None:
            op.error, op.errnos = f"{type(error).__name__}: {error}", errnos_of_exception(error)
            if not self._close():  # its writes are not settled: the disk may still change
                self.ledger.record(op)
                self._give_up_part()
                return
        on_disk = os.stat(self.cluster.export(FULL_NODE) / self.path).st_size
        if on_disk == self.size + told:
            self.size = on_disk
            self.digest.update(piece[:told])
        else:
            what = (f"append of {len(piece)} B to {self.path} through {self.node}: "
                    + (f"told {told} B" if error is None else f"failed ({error.strerror})")
                    + f", n4's disk got {on_disk - self.size} B"
                    + ("" if error is None else " after the close"))
            if error is not None and error.errno != errno.ENOSPC:
                op.unless_fault = what  # a lost reply: the bytes may or may not have landed (settled by now)
            else:
                op.wrong = what
            self._resync()
        self.ledger.record(op)
        if self.size >= self.LIMIT:
            if self._close():
                self._next_part()
            else:
                self._give_up_part()

    def _resync(self) -> None:
        """Take the disk's word: the file's contents as they are on n4."""
        data = (self.cluster.export(FULL_NODE) / self.path).read_bytes()
        self.size, self.digest = len(data), hashlib.sha256(data)

    def _close(self) -> bool:
        """Close the file; False if close failed (recorded): whether its writes landed is unknown."""
        if self.fd is None:
            return True
        fd, self.fd = self.fd, None
        start = time.time()
        try:
            os.close(fd)
        except OSError as exc:
            self.ledger.record(Op("close", self.node, start, time.time(), writes_on=(FULL_NODE,),
                                  error=f"{type(exc).__name__}: {exc}", errnos=errnos_of_exception(exc)))
            return False
        return True

    def _next_part(self) -> None:
        self.finish()
        self.part += 1
        self.size, self.digest = 0, hashlib.sha256()

    def _give_up_part(self) -> None:
        """A close failed: a write may still land at the end of this part. What the appender knew of it
        must be there, unchanged; then it goes on in a new part."""
        start = time.time()
        data = (self.cluster.export(FULL_NODE) / self.path).read_bytes()
        op = Op("append-check", self.node, start, time.time(), writes_on=(FULL_NODE,))
        if len(data) < self.size or hashlib.sha256(data[:self.size]).hexdigest() != self.digest.hexdigest():
            op.wrong = (f"{self.path} after a failed close: its first {self.size} B, whose appends had been "
                        f"told, are not those bytes on n4's disk ({len(data)} B there)")
        self.ledger.record(op)
        self.part += 1
        self.size, self.digest = 0, hashlib.sha256()

    def finish(self) -> None:
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None
        if (self.cluster.export(FULL_NODE) / self.path).exists():
            self.ledger.expect(self.path, self.digest.hexdigest(), self.size, time.time(), f"append@{self.node}")


class Mover(Worker):
    """Directory renames and removals through the mounts. A directory that three nodes wrote a file into
    (so each holds a copy of it) is renamed through a fourth mount; then one of its files is removed.
    A rename that succeeded moved every file; one that failed leaves each under exactly one of the two
    names (docs/failures.md); a removed name never comes back (README, Consistency 4)."""

    def __init__(self, context: Context, pause: tuple[float, float], sources: Sources) -> None:
        super().__init__("mover", context, pause)
        self.sources = sources
        self.seq = 0

    def step(self) -> None:
        self.seq += 1
        old = f"{SOAK}/mv/r{self.seq:04}"
        for node in self.rng.sample(NODES, 3):
            source = self.sources.pick(self.rng)
            target = self.cluster.mount(node) / old
            op, _ = self.shell("cp", node, f"mkdir -p {q(target)} && cp {q(source.path)} {q(target / node)}")
            if op.ok:
                self.ledger.expect(f"{old}/{node}", source.sha, source.size, op.end, f"cp@{node}")
        new = old + ".moved"
        by = self.rng.choice(NODES)
        taken = self.ledger.withdraw(old + "/")
        op, _ = self.shell("mv", by, f"mv {q(self.cluster.mount(by) / old)} {q(self.cluster.mount(by) / new)}")
        for e in taken:
            moved = new + e.path[len(old):]
            if op.ok:
                self.ledger.expect(moved, e.sha, e.size, e.closed, e.by)
            else:
                self.ledger.expect(e.path, e.sha, e.size, e.closed, e.by, alt=moved)
        if not op.ok or not taken:
            return
        victim = new + taken[0].path[len(old):]
        self.ledger.withdraw(victim)
        by = self.rng.choice(NODES)
        op, _ = self.shell("rm", by, f"rm {q(self.cluster.mount(by) / victim)}", writes=False)
        if op.ok:
            with self.ledger.lock:
                self.ledger.gone.add(victim)


def write_through(cluster: SoakCluster, node: str, path: str, data: bytes) -> None:
    """Write a file through a node's mount (setup; errors raise)."""
    target = cluster.mount(node) / path
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "wb") as f:
        f.write(data)

