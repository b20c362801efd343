"""One node daemon: RPC server + export + locator + FUSE mount, in one trio process.

Started by a launcher (local subprocess or over SSH). It talks to the
launcher through a line protocol on stdin/stdout, so that the secret never
appears in argv or the environment:

    launcher -> daemon   {"node": .., "spec": {..}, "secret": "<hex>", "log": ".."}
    daemon -> launcher   GMOUNT STARTED {"pid": ..}     (after forking into its own session)
    daemon -> launcher   GMOUNT LISTENING {"pid": .., "host": .., "port": ..}
    launcher -> daemon   {"peers": {"n2": ["127.0.0.1", 40123], ...}}
    daemon -> launcher   GMOUNT READY {"pid": .., "mountpoint": ..}
    (any time)           GMOUNT ERROR <what went wrong and what to do>

After READY the daemon closes stdin/stdout and logs to its file only. It
unmounts and exits on SIGTERM or SIGINT (or the `shutdown` RPC).
"""

from __future__ import annotations

import errno
import faulthandler
import json
import logging
import os
import resource
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

import pyfuse3
import trio

from .._trio import open_nursery
from .._version import __version__
from ..cluster.config import ClusterSpec, NodeSpec
from ..cluster.jobsocket import socket_path as jobs_socket_path
from ..cluster.overlay import Overlay
from ..errors import GmountError
from ..protocol import rpc
from ..protocol.tls import NodeCredentials, certificate_problem, client_context, server_context
from . import readahead
from .bypass import BypassServer
from .bypass import socket_path as bypass_socket_path
from .control import NodeControl
from .directories import MountpointSeal, directory_problems
from .export import Export
from .fuse import GmountOperations
from .index import DirectoryIndex, ExportWatcher, Homes, IndexLocator, Owners
from .jobs import JobPlacer, serve_jobs
from .locator import FloodLocator, Locator
from .namespace import Namespace
from .passthrough import Passthrough
from .peers import PeerAddress, PeerPool
from .puts import PutJournal
from .replicas import ReplicaTable
from .service import NodeService
from .startup import LINE_PREFIX, default_log_path, put_journal_path, replica_table_path

log = logging.getLogger("gmountpy.node")


def _say(out: TextIO, kind: str, payload: Any) -> None:
    text = payload if isinstance(payload, str) else json.dumps(payload)
    out.write(f"{LINE_PREFIX} {kind} {text}\n")
    out.flush()


#: The daemon's log file once set up: where a stalled event loop's tracebacks go.
_log_stream: TextIO | None = None
#: An event loop that has not run for this long has its threads' tracebacks written to the log.
STALL_REPORT_AFTER = 5.0
#: The event loop not seen running for this long while mounted: wake the FUSE reader (_FuseReaderNudge).
FUSE_NUDGE_AFTER = 2.0


def _setup_logging(path: str) -> None:
    global _log_stream
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.fchmod(fd, 0o600)
    _log_stream = os.fdopen(fd, "a", buffering=1)
    handler = logging.StreamHandler(_log_stream)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)


def _prepare_dirs(node: NodeSpec) -> None:
    export, mountpoint = node.export, node.mountpoint
    problems = directory_problems(node)
    if problems:
        raise GmountError("; ".join(problems))
    os.makedirs(export, exist_ok=True)
    if os.path.ismount(mountpoint):
        raise GmountError(f"mountpoint {mountpoint} is already mounted: run `gmount down` "
                          f"for the cluster using it, or `fusermount3 -u {mountpoint}`")
    try:
        os.makedirs(mountpoint, exist_ok=True)
    except OSError as exc:
        if exc.errno == errno.ENOTCONN:  # a dead FUSE mount left behind
            raise GmountError(f"mountpoint {mountpoint} is a stale mount: "
                              f"run `fusermount3 -u -z {mountpoint}`") from None
        raise
    if os.listdir(mountpoint):
        raise GmountError(f"mountpoint {mountpoint} is not empty: choose an empty directory")


FUSE_CONF = "/etc/fuse.conf"


def check_allow_other(node: str, euid: int, fuse_conf: str = FUSE_CONF) -> None:
    """allow_other needs root or `user_allow_other` in /etc/fuse.conf; say so before mounting."""
    if euid == 0:
        return
    try:
        with open(fuse_conf) as f:
            allowed = any(line.strip() == "user_allow_other" for line in f)
    except OSError:
        allowed = False
    if not allowed:
        raise GmountError(f"node {node}: the cluster file sets allow_other, but {fuse_conf} on this host has no "
                          f"`user_allow_other` line, so a non-root user may not mount with allow_other. "
                          f"Fix: add a line `user_allow_other` to {fuse_conf} (as root), or remove allow_other "
                          "from the cluster file")


def _raise_file_limit(wanted: int) -> None:
    """Let the process hold the open handles tuning allows (up to the hard limit the system sets)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit from %d to %d: %s", soft, target, exc)


class NodeDaemon:
    def __init__(self, spec: ClusterSpec, me: str, secret: bytes,
                 credentials: NodeCredentials | None = None) -> None:
        self.spec = spec
        self.credentials = credentials
        self.me = me
        self.node = spec.node(me)
        self.secret = secret
        self.overlay = Overlay(spec)
        self.export = Export(self.node.export)

    def _locator(self, pool: PeerPool) -> tuple[Locator, DirectoryIndex | None]:
        """The locator `tuning.lookup` names; with a directory index, the index this node keeps as a home."""
        tuning = self.spec.tuning
        tiers = self.overlay.lookup_tiers(self.me)
        if tuning.lookup == "flood":
            return FloodLocator(pool, tiers, ttl=tuning.attr_ttl, negative_ttl=tuning.negative_ttl), None
        nodes = tuple(self.spec.nodes)
        central = (tuning.central_node or nodes[0]) if tuning.lookup == "central" else None
        sites = list(self.spec.sites)
        homes = Homes(nodes, {n: s.site for n, s in self.spec.nodes.items()}, central,
                      {(a, b): self.overlay.site_rtt(a, b) for a in sites for b in sites})
        index = DirectoryIndex(pool, self.overlay.lookup_order(self.me),
                               lease=IndexLocator.lease_for(tuning.negative_ttl), rescan=tuning.index_rescan,
                               revoke_timeout=min(1.0, tuning.rpc_timeout / 3), ask_timeout=tuning.rpc_timeout / 3,
                               homes=homes, verify_misses=tuning.index_verify_misses,
                               split_entries=tuning.index_split_entries, owners=Owners(self.export))
        return IndexLocator(pool, tiers, homes, ttl=tuning.attr_ttl, negative_ttl=tuning.negative_ttl,
                            index=index), index

    async def run(self, sock: socket.socket, peers: dict[str, PeerAddress], out: TextIO) -> None:
        info = {"node": self.me, "site": self.node.site, "cluster": self.spec.name, "version": __version__,
                "mountpoint": self.node.mountpoint, "export": self.node.export}
        tuning = self.spec.tuning
        service = NodeService(self.export, info, replicas=ReplicaTable(replica_table_path(self.spec.name, self.me)),
                              tuning=tuning, puts=PutJournal(put_journal_path(self.spec.name, self.me)))
        request_limits = rpc.RequestLimits(tuning.requests_per_connection, tuning.requests_per_node, self.me)
        readahead.NODE_BUDGET.limit = tuning.readahead_mib << 20
        _raise_file_limit(tuning.handles_per_node + 1024)  # the mount's own files and sockets besides
        async with open_nursery() as nursery:
            server_tls = client_tls = None
            if self.credentials is not None:  # mutual TLS: the node's certificate serves and connects
                server_tls = server_context(self.credentials)
                client_tls = client_context(self.credentials.ca, self.credentials)
            pool = PeerPool(self.me, service, self.secret, nursery, rpc_timeout=tuning.rpc_timeout,
                            connect_timeout=tuning.connect_timeout, ssl_context=client_tls)
            pool.set_peers(peers)
            locator, index = self._locator(pool)
            if index is not None and isinstance(locator, IndexLocator):
                service.add_operations(index.operations())
                service.add_operations(locator.operations())  # homes' revocations of the homes and listings they told
                watcher = ExportWatcher(pool, locator.homes)
                service.add_operations(watcher.operations())
                nursery.start_soon(_watch_export_forever, watcher, max(0.2, tuning.attr_ttl or 1.0))
            namespace = Namespace(self.me, {n: s.site for n, s in self.spec.nodes.items()}, self.export,
                                  pool, locator, nursery)
            if isinstance(locator, IndexLocator):
                nursery.start_soon(_flush_owed_forever, locator)
            control = NodeControl(self.me, self.spec, self.overlay, service=service, pool=pool, locator=locator,
                                  index=index, namespace=namespace, limits=request_limits, server_tls=server_tls,
                                  client_tls=client_tls, credentials=self.credentials)
            service.add_operations(control.operations())
            service.on_created = namespace.created_by_put
            ops = GmountOperations(namespace, tuning.attr_ttl, tuning.negative_ttl, service.counters)
            control.mount = ops
            if tuning.passthrough:
                ops.passthrough = Passthrough.arm()
            if tuning.bypass:
                control.bypass = await self._serve_bypass(nursery, namespace, service, ops,
                                                          index.owners if index is not None else None)

            listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))

            async def handler(stream: trio.SocketStream) -> None:
                await rpc.handle_connection(stream, service.dispatch, secret=self.secret, name=self.me,
                                            ssl_context=server_tls, limits=request_limits)

            nursery.start_soon(trio.serve_listeners, handler, [listener])
            mountpoint = os.path.realpath(self.node.mountpoint)  # as the kernel will name it (not mounted yet)
            placer = JobPlacer(self.me, self.spec, self.overlay, namespace, mountpoint)
            await nursery.start(serve_jobs, placer, jobs_socket_path(mountpoint))

            options = set(pyfuse3.default_options)
            options.add(f"fsname=gmount-{self.spec.name}-{self.me}")
            options.add("subtype=gmount")
            if self.spec.allow_other:
                options.add("allow_other")  # with default_permissions: the kernel checks modes
            seal = MountpointSeal(self.node.mountpoint)  # the directory under the mount, unwritable while mounted
            try:
                pyfuse3.init(ops, self.node.mountpoint, options)
            except BaseException:
                seal.close()
                raise
            seal.seal()
            try:
                log.info("node %s mounted %s (export %s)", self.me, self.node.mountpoint, self.node.export)

                async def watch_signals(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
                    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                        task_status.started()
                        async for signum in signals:
                            log.info("received signal %d, unmounting", signum)
                            control.shutdown.set()

                # SIGTERM is caught before anyone hears READY: a `down` right after `up` still unmounts
                await nursery.start(watch_signals)
                _say(out, "READY", {"pid": os.getpid(), "mountpoint": self.node.mountpoint})
                _detach_stdio()

                nudge = _FuseReaderNudge(self.node.mountpoint)

                async def stop_when_asked() -> None:
                    await control.shutdown.wait()
                    nudge.stop()  # no request of its own on a mount being unmounted
                    pyfuse3.terminate()

                nursery.start_soon(stop_when_asked)
                nursery.start_soon(nudge.keep_beating)
                nudge.start()
                if _log_stream is not None:
                    nursery.start_soon(_report_stalls, _log_stream)
                try:
                    await pyfuse3.main()
                finally:
                    nudge.stop()
            finally:
                with trio.CancelScope(shield=True):
                    pyfuse3.close(unmount=True)
                    seal.unseal()
                    log.info("node %s unmounted %s", self.me, self.node.mountpoint)
                nursery.cancel_scope.cancel()
            await pool.aclose()


    async def _serve_bypass(self, nursery: trio.Nursery, namespace: Namespace, service: NodeService,
                            ops: GmountOperations, owners: Owners | None) -> BypassServer | None:
        """Jobs' preload library asks this node which files it may use from the export (bypass.py)."""
        try:
            server = BypassServer(namespace, service, bypass_socket_path(self.spec.name, self.me),
                                  any_user=self.spec.allow_other, on_changed=ops.changed_outside, owners=owners)
            await nursery.start(server.serve)
        except OSError as exc:
            log.warning("node %s: the local bypass for jobs is off (they use the mount): %s", self.me, exc)
            return None
        ops.bypass_xattr = server.xattr_value
        return server


class _FuseReaderNudge:
    """Wakes pyfuse3's reader when it waits in a read that no request will end.

    pyfuse3 reads /dev/fuse in blocking mode once the fd polled readable. A request withdrawn
    in between (its process killed before this daemon read it) leaves that read -- and with it
    the whole event loop: RPCs, other mounts' requests -- waiting for the next request on this
    mount, which may never come (CI saw a node stalled for minutes after tests killed jobs).
    A thread that sees the loop stalled makes one request of its own (`poke`: getxattr on the
    mount's root, which the kernel never caches); it waits for its answer before the next.
    """

    def __init__(self, mountpoint: str, after: float = FUSE_NUDGE_AFTER,
                 poke: Callable[[str], object] | None = None) -> None:
        self.mountpoint = mountpoint
        self.after = after
        self.poke = poke or (lambda path: os.getxattr(path, "user.gmount.node"))
        self.beat = time.monotonic()
        self.nudges = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gmount-fuse-nudge", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    async def keep_beating(self) -> None:
        """Runs on the event loop: while it runs, nobody is nudged."""
        while True:
            self.beat = time.monotonic()
            await trio.sleep(self.after / 4)

    def _run(self) -> None:
        while not self._stop.wait(self.after / 2):
            stalled = time.monotonic() - self.beat
            if stalled < self.after or self._stop.is_set():
                continue
            self.nudges += 1
            log.info("the event loop has not run for %.1f s: a request to %s wakes the FUSE reader",
                     stalled, self.mountpoint)
            try:
                self.poke(self.mountpoint)
            except OSError:
                pass  # any answer will do: the reader is awake


async def _report_stalls(stream: TextIO, after: float = STALL_REPORT_AFTER) -> None:
    """Re-arm a watchdog thread every second: if the event loop stops running (a call that
    blocks it, a busy task), every thread's traceback goes to the log -- where it waits."""
    try:
        while True:
            faulthandler.dump_traceback_later(after, file=stream)
            await trio.sleep(after / 5)
    finally:
        faulthandler.cancel_dump_traceback_later()


async def _watch_export_forever(watcher: ExportWatcher, interval: float) -> None:
    """Files written straight into this node's export reach their homes within `interval` seconds."""
    while True:
        await trio.sleep(interval)
        try:
            await watcher.scan()
        except OSError as exc:
            log.warning("scanning the export for changes failed: %s", exc)


async def _flush_owed_forever(locator: IndexLocator) -> None:
    """Homes that were unreachable during a change hear of it once they answer again."""
    while True:
        await trio.sleep(1.0)
        await locator.flush_owed()


def _detach_stdio() -> None:
    """After READY the launcher (or SSH session) may go away: stop using its pipes."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)


def _daemonize() -> None:
    """Fork into a new session so the daemon outlives its launcher and SSH session.

    The launcher's child exits at once; the pipes stay with the daemon until READY.
    """
    if os.fork() > 0:
        os._exit(0)
    os.setsid()


def main() -> int:
    out = sys.stdout
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # outlive the SSH session or terminal
    try:
        config = json.loads(sys.stdin.readline() or "null")
        if not isinstance(config, dict):
            raise GmountError("no configuration line on stdin: the daemon is started by `gmount up`")
        spec = ClusterSpec.from_dict(config["spec"])
        me = config["node"]
        node = spec.node(me)
        secret = bytes.fromhex(config["secret"])
        _setup_logging(config.get("log") or default_log_path(spec.name, me))
        _daemonize()
        _say(out, "STARTED", {"pid": os.getpid()})
        _prepare_dirs(node)
        if not os.access("/dev/fuse", os.R_OK | os.W_OK):
            raise GmountError("/dev/fuse is not usable by this user: FUSE is needed on every node")
        if spec.allow_other:
            check_allow_other(me, os.geteuid())
        try:
            sock = socket.create_server((node.listen, node.port))
        except OSError as exc:
            raise GmountError(f"cannot listen on {node.listen}:{node.port}: {exc.strerror}; "
                              "choose another port in the cluster file") from None
        host, port = sock.getsockname()[:2]
        _say(out, "LISTENING", {"pid": os.getpid(), "host": host, "port": port})
        message = json.loads(sys.stdin.readline() or "null")
        if not isinstance(message, dict) or "peers" not in message:
            raise GmountError("launcher went away before sending the peer table")
        peers = {name: PeerAddress(h, int(p)) for name, (h, p) in message["peers"].items()}
        tls = config.get("tls")
        credentials = NodeCredentials(tls["ca"], tls["cert"], tls["key"]) if tls else None
        if credentials is not None:
            problem = certificate_problem(credentials, me, secret)
            if problem is not None:
                raise GmountError(problem)
        daemon = NodeDaemon(spec, me, secret, credentials)
    except (GmountError, OSError, ValueError, KeyError) as exc:
        log.error("startup failed: %s", exc)
        try:
            _say(out, "ERROR", str(exc) or type(exc).__name__)
        except (OSError, ValueError):
            pass  # the launcher is gone; the log says it
        return 1
    try:
        trio.run(daemon.run, sock, peers, out)
    except Exception as exc:
        log.exception("node %s failed", me)
        try:
            _say(out, "ERROR", f"node {me} failed: {exc}")
        except (OSError, ValueError):
            pass
        return 1
    return 0
