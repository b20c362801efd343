"""What protects a cluster, and where it is weak: the findings behind `gmount audit`.

Read-only: it looks at the cluster file, the launcher's state files, the
exports (directly for nodes on this machine, through the running daemons for
the others) and the certificates. It never changes anything.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import stat
from dataclasses import asdict, dataclass
from typing import Any

from .._trio import open_nursery
from ..cluster import state as state_store
from ..cluster.config import ClusterSpec, NodeSpec
from ..cluster.state import ClusterState
from ..errors import GmountError
from ..protocol.client import ask as ask_node
from ..protocol.client import run_sync
from ..protocol.messages import Lookup
from ..protocol.tls import RENEW_WITHIN, expires, expiring

OK, INFO, WARN = "ok", "info", "warn"


@dataclass(frozen=True)
class Finding:
    level: str    # ok, info or warn
    topic: str    # links, secrets, certificates, exports, mount, ssh
    subject: str  # what it is about: a link, a file, a node
    message: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def audit(spec: ClusterSpec) -> list[Finding]:
    """Every finding for this cluster, in a stable order (links, secrets, certificates, exports, mount, ssh)."""
    running = state_store.load(spec.name)
    findings = _links(spec)
    findings += _secrets(spec.name, running)
    if spec.tls and running is not None:
        findings += _certificates(spec.name)
    findings += _exports(spec, running)
    findings += _allow_other(spec)
    if spec.launcher == "ssh":
        findings += _ssh(spec)
    return findings


# --- links ----------------------------------------------------------------------------------------


def _machine(node: NodeSpec) -> str:
    return "this machine" if node.host is None else node.host.rpartition("@")[2]


def _loopback(address: str) -> bool:
    return ipaddress.ip_address(address).is_loopback


def _links(spec: ClusterSpec) -> list[Finding]:
    """Per pair of sites (and within each site): how peer connections are protected."""
    findings: list[Finding] = []
    if spec.tls:
        protection = "TLS 1.3 (encrypted; certificates from the cluster CA) + HMAC handshake"
    else:
        protection = "frames authenticated (ChaCha20-Poly1305 MAC, sequence numbers), NOT encrypted"
    sites = list(spec.sites)
    pairs = [(a, a) for a in sites] + [(a, b) for i, a in enumerate(sites) for b in sites[i + 1:]]
    for a, b in pairs:
        nodes = [spec.nodes[n] for n in spec.sites[a]] + ([] if a == b else [spec.nodes[n] for n in spec.sites[b]])
        if a == b and len(nodes) < 2:
            continue
        subject = f"{a} <-> {b}" if a != b else f"within {a}"
        machines = {_machine(n) for n in nodes}
        on_loopback = all(_loopback(n.listen) for n in nodes) and machines == {"this machine"}
        if spec.tls:
            findings.append(Finding(OK, "links", subject, protection))
        elif on_loopback:
            findings.append(Finding(OK, "links", subject, f"{protection}; loopback only, on one machine"))
        else:
            findings.append(Finding(WARN, "links", subject, f"{protection}: file data and names cross the network "
                                                            "in clear between hosts; set tls = true"))
    for node in spec.nodes.values():
        address = ipaddress.ip_address(node.listen)
        if address.is_unspecified:
            findings.append(Finding(INFO if spec.tls else WARN, "links", f"node {node.name}",
                                    f"listens on {node.listen}: reachable on every network of its host"
                                    + ("" if spec.tls else " without TLS; set tls = true, or listen to the one "
                                                           "address its peers use")))
        elif not spec.tls and not address.is_loopback:
            findings.append(Finding(INFO, "links", f"node {node.name}", f"listens on {node.listen} without TLS"))
    return findings


# --- secrets ---------------------------------------------------------------------------------------


def _mode_finding(path: str, what: str, private_mode: int) -> Finding | None:
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return None
    if mode & 0o077:
        return Finding(WARN, "secrets", path, f"{what} has mode {mode:04o}: other users can read it; "
                                              f"chmod {private_mode:o} {path}")
    return Finding(OK, "secrets", path, f"{what}, mode {mode:04o}")


def _secrets(name: str, running: ClusterState | None) -> list[Finding]:
    base = state_store.state_dir()
    if running is None:
        return [Finding(INFO, "secrets", base, f"cluster {name} is not running: no secret of it on disk")]
    findings = [f for f in (
        _mode_finding(base, "the state directory", 0o700),
        _mode_finding(os.path.join(base, name + ".secret"), "the cluster secret", 0o600),
        _mode_finding(os.path.join(base, name + ".tls.json"), "the TLS keys (CA and nodes)", 0o600),
        _mode_finding(os.path.join(base, name + ".json"), "the cluster state", 0o600),
    ) if f is not None]
    return findings


# --- certificates ----------------------------------------------------------------------------------


def _certificates(name: str) -> list[Finding]:
    try:
        ca, nodes = state_store.load_tls(name)
    except GmountError as exc:
        return [Finding(WARN, "certificates", name, str(exc))]
    findings = []
    for subject, pem in [("cluster CA", ca)] + [(f"node {n}", c["cert"]) for n, c in nodes.items()]:
        until = f"valid until {expires(pem):%Y-%m-%d %H:%M} UTC"
        if expiring(pem, within=RENEW_WITHIN):
            remedy = ("run `gmount down` and `gmount up` (a new CA)" if subject == "cluster CA"
                      else "run `gmount up` to renew it")
            findings.append(Finding(WARN, "certificates", subject, f"{until}, less than {RENEW_WITHIN.days} days "
                                                                     f"left: {remedy}"))
        else:
            findings.append(Finding(OK, "certificates", subject, until))
    if state_store.load_tls_ca_key(name) is None:
        findings.append(Finding(INFO, "certificates", "cluster CA", "its key was not kept: `gmount up` cannot "
                                                                    "renew node certificates in place"))
    return findings


# --- exports ---------------------------------------------------------------------------------------


def _export_modes(spec: ClusterSpec, running: ClusterState | None) -> dict[str, int | str]:
    """Mode of each export root: stat for nodes on this machine, the daemon's answer for the others."""
    modes: dict[str, int | str] = {}
    remote = []
    for node in spec.nodes.values():
        if node.host is None:
            try:
                modes[node.name] = os.stat(node.export).st_mode
            except OSError as exc:
                modes[node.name] = f"cannot stat {node.export}: {exc.strerror}"
        elif running is not None and node.name in running.nodes:
            remote.append(node.name)
        else:
            modes[node.name] = "not checked: the cluster is not running and the node is on another host"

    async def ask(state: ClusterState, node: str) -> None:
        try:
            attr = await ask_node(state, node, Lookup("/"), timeout=5.0)
            if attr is None:
                raise OSError(errno.ENOENT, f"node {node} has no export root")
            modes[node] = attr.mode
        except (OSError, GmountError) as exc:
            modes[node] = f"not checked: {exc}"

    async def ask_all() -> None:
        assert running is not None
        async with open_nursery() as nursery:
            for node in remote:
                nursery.start_soon(ask, running, node)

    if remote:
        run_sync(ask_all)
    return modes


def _exports(spec: ClusterSpec, running: ClusterState | None) -> list[Finding]:
    findings = []
    for name, mode in _export_modes(spec, running).items():
        node = spec.nodes[name]
        subject = f"node {name}: {node.export}"
        if isinstance(mode, str):
            findings.append(Finding(INFO, "exports", subject, mode))
            continue
        bits = stat.S_IMODE(mode)
        if bits & 0o002:
            findings.append(Finding(WARN, "exports", subject, f"mode {bits:04o}: any user of that host can change "
                                                              f"files the cluster serves; chmod o-w {node.export}"))
        elif bits & 0o020:
            findings.append(Finding(INFO, "exports", subject, f"mode {bits:04o}: the group can change files the "
                                                              "cluster serves"))
        elif bits & 0o004:
            findings.append(Finding(INFO, "exports", subject, f"mode {bits:04o}: other users of that host can read "
                                                              "it directly (not through the mount)"))
        else:
            findings.append(Finding(OK, "exports", subject, f"mode {bits:04o}"))
    return findings


# --- the mount and SSH ------------------------------------------------------------------------------


def _allow_other(spec: ClusterSpec) -> list[Finding]:
    everywhere = bool(getattr(spec, "allow_other", False))
    nodes = [n.name for n in spec.nodes.values() if everywhere or getattr(n, "allow_other", False)]
    if not nodes:
        return [Finding(OK, "mount", "allow_other", "off: only this user can use the mounts")]
    return [Finding(WARN, "mount", "allow_other", f"on for {', '.join(nodes)}: other users of those hosts can "
                                                  "read and write through the mount with this user's rights "
                                                  "on every node's export")]


def _ssh(spec: ClusterSpec) -> list[Finding]:
    if not spec.ssh.verify_host_keys:
        return [Finding(WARN, "ssh", "known_hosts", "host keys are not checked (known_hosts = false): a machine "
                                                    "in the middle can pose as a node and receive the cluster "
                                                    "secret; remove known_hosts = false")]
    where = spec.ssh.known_hosts or "~/.ssh/known_hosts (OpenSSH defaults)"
    return [Finding(OK, "ssh", "known_hosts", f"host keys checked against {where}")]


def summary(findings: list[Finding]) -> dict[str, Any]:
    warnings = [f for f in findings if f.level == WARN]
    return {"warnings": len(warnings), "findings": [f.to_dict() for f in findings]}
