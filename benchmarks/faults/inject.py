"""Faults the soak injects, each undone by the same object (also after an error or Ctrl-C).

- kill: SIGKILL a node's daemon; after `hold` seconds `gmount up` (run as a user
  would, inside a site) restarts it. Targets are chosen among the homes and backups
  of the soak's shared directories (`homes_of`), and at random.
- disk_full: a filler file beside n4's export (same tmpfs) until the disk takes no
  more; removed after `hold`.
- drop: iptables inside a site drops a share of its packets to and from the other
  site (`-m statistic --mode random`); 1.0 cuts the sites apart.
- delay: iptables inside a site hands its packets to the other site to a second
  copy of the WAN harness's delay program (NFQUEUE), which holds them for `ms`.
- conn_kill: `ss -K` inside a site closes every TCP connection from it to one
  node's daemon, in bursts, while the workload keeps requests in flight.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.wan import sites as wan
from gmountpy.cluster.overlay import Overlay
from gmountpy.node.index.homes import Homes

from .cluster import FULL_NODE, NODES, SITE_OF, SITES, SoakCluster
from .judge import Fault

IPTABLES = wan.IPTABLES
DELAY_QUEUE = 71  # the NFQUEUE number of the extra delay inside a site (a namespace of its own)


def homes_of(cluster: SoakCluster, directory: str, creator: str) -> tuple[str, str | None]:
    """The home and backup of a directory made through `creator`'s mount (docs/design.md, the index)."""
    spec = cluster.spec
    assert spec is not None
    overlay = Overlay(spec)
    sites = list(spec.sites)
    homes = Homes(tuple(spec.nodes), {n: s.site for n, s in spec.nodes.items()}, None,
                  {(a, b): overlay.site_rtt(a, b) for a in sites for b in sites})
    home = homes.of_creator(directory, creator)
    return home, homes.backup(directory, home)


@dataclass
class Injector:
    """Injects and heals faults on a SoakCluster; every fault goes to `faults` (under `lock`)."""

    cluster: SoakCluster
    faults: list[Fault]
    lock: threading.Lock
    note_failure: Callable[[str, str], None]    # (what, detail): a failure of the harness's own checks
    _rules: list[tuple[str, list[str]]] = field(default_factory=list)   # (site, iptables rule spec) in place
    _delays: dict[str, subprocess.Popen[str]] = field(default_factory=dict)
    quarantined: list[str] = field(default_factory=list)  # files found under a bare mountpoint

    def _record(self, kind: str, nodes: Sequence[str], **detail: object) -> Fault:
        fault = Fault(kind, tuple(nodes), time.time(), detail=dict(detail))
        with self.lock:
            self.faults.append(fault)
        return fault

    def _healed(self, fault: Fault) -> None:
        fault.end = time.time()

    # -- kill and restart --------------------------------------------------------------------------

    def kill(self, node: str, hold: float, why: str, stop: threading.Event, also: Sequence[str] = ()) -> None:
        victims = [node, *also]
        fault = self._record("kill", victims, why=why)
        for victim in victims:
            try:
                os.kill(self.cluster.pid(victim), signal.SIGKILL)
            except ProcessLookupError:
                pass
        stop.wait(hold)
        self.restart(fault)

    def restart(self, fault: Fault | None = None, attempts: int = 10) -> None:
        """`gmount up` until every node runs again. Files found in a dead node's mountpoint while it is bare
        are outside every export: each is a failure; they are moved aside so that the node can mount."""
        outputs: list[str] = []
        for attempt in range(attempts):
            self._quarantine_bare_mountpoints()
            ok, output = self.cluster.up_again()
            outputs.append(output[-400:])
            if fault is not None:
                fault.detail["up"] = outputs
            if ok and all(self.cluster.alive(n) and self.cluster.mounted(n) for n in NODES):
                if fault is not None:
                    self._healed(fault)  # the fault lasts until every node is back
                return
            self.note_failure("gmount up", f"attempt {attempt + 1}: {output[-800:]}")
        raise RuntimeError(f"gmount up did not bring every node back in {attempts} attempts: {outputs[-1]}")

    def _quarantine_bare_mountpoints(self) -> None:
        """What landed in a dead node's mountpoint while it was bare is outside every export: count it
        and move it aside, so the node can be mounted again."""
        for node in NODES:
            if self.cluster.mounted(node):
                continue
            mountpoint = self.cluster.mount(node)
            try:
                entries = os.listdir(mountpoint)
            except OSError:
                continue
            if not entries:
                continue
            aside = self.cluster.base / "quarantine" / f"{node}-{time.time():.3f}"
            aside.mkdir(parents=True)
            for entry in entries:
                for root, _dirs, files in os.walk(mountpoint / entry):
                    self.quarantined += [os.path.join(root, f) for f in files]
                os.rename(mountpoint / entry, aside / entry)
            self.note_failure("bytes outside exports",
                              f"{node}'s bare mountpoint {mountpoint} took {', '.join(entries)} (moved to {aside})")

    # -- a full disk -----------------------------------------------------------------------------------

    def disk_full(self, hold: float, stop: threading.Event) -> None:
        fault = self._record("disk_full", [FULL_NODE])
        filled = fill(self.cluster.filler)
        fault.detail["filler_mib"] = round(filled / 2**20, 1)
        try:
            stop.wait(hold)
        finally:
            self.cluster.filler.unlink(missing_ok=True)
            self._healed(fault)

    # -- the network ------------------------------------------------------------------------------------

    def drop(self, site: str, probability: float, hold: float, stop: threading.Event) -> None:
        other = next(s for s in SITES if s != site)
        fault = self._record("drop", SITES[other] + SITES[site], site=site, probability=probability)
        match = ["-m", "statistic", "--mode", "random", "--probability", f"{probability}"] if probability < 1 else []
        rules = [["OUTPUT", "-d", self.cluster.subnet(other), *match, "-j", "DROP"],
                 ["INPUT", "-s", self.cluster.subnet(other), *match, "-j", "DROP"]]
        try:
            for rule in rules:
                self._add_rule(site, rule)
            stop.wait(hold)
        finally:
            self._remove_rules()
            self._healed(fault)

    def delay(self, site: str, ms: float, hold: float, stop: threading.Event) -> None:
        other = next(s for s in SITES if s != site)
        fault = self._record("delay", SITES[other] + SITES[site], site=site, ms=ms)
        try:
            process = self.cluster.spawn_in_site(site, [str(wan.delay_binary()), f"{DELAY_QUEUE}:{ms * 1000:.0f}"],
                                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            self._delays[site] = process
            assert process.stdout is not None
            line = process.stdout.readline()
            if line.strip() != "READY":
                raise RuntimeError(f"the delay program did not start in site {site}: {line!r}")
            self._add_rule(site, ["OUTPUT", "-d", self.cluster.subnet(other), "-j", "NFQUEUE",
                                  "--queue-num", str(DELAY_QUEUE)])
            stop.wait(hold)
        finally:
            self._remove_rules()
            self._stop_delays()
            self._healed(fault)

    def conn_kill(self, node: str, site: str, bursts: int, stop: threading.Event) -> None:
        fault = self._record("conn_kill", [node], site=site)
        killed = 0
        try:
            for _ in range(bursts):
                result = self.cluster.in_site(site, ["ss", "-K", "-t", "dst", self.cluster.address(node),
                                                     "dport", "=", f":{self.cluster.port(node)}"], timeout=30)
                killed += max(0, len([line for line in result.stdout.splitlines() if "ESTAB" in line]))
                if stop.wait(0.7):
                    break
        finally:
            fault.detail["connections_closed"] = killed
            self._healed(fault)

    def _add_rule(self, site: str, rule: list[str]) -> None:
        tagged = [*rule[:1], *rule[1:], "-m", "comment", "--comment", f"gmsoak-{os.getpid()}"]
        result = self.cluster.in_site(site, [IPTABLES, "-A", *tagged], timeout=30)
        if result.returncode != 0:
            raise RuntimeError(f"iptables in site {site}: {result.stderr.strip()}")
        self._rules.append((site, tagged))

    def _remove_rules(self) -> None:
        while self._rules:
            site, rule = self._rules.pop()
            self.cluster.in_site(site, [IPTABLES, "-D", *rule], timeout=30)

    def _stop_delays(self) -> None:
        for site, process in list(self._delays.items()):
            process.terminate()
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            for stream in (process.stdout, process.stderr):
                if stream is not None:
                    stream.close()
            del self._delays[site]

    def heal_everything(self) -> None:
        """Undo whatever is still in place (after an error): rules, delays, the filler, dead nodes."""
        self._remove_rules()
        self._stop_delays()
        self.cluster.filler.unlink(missing_ok=True)
        if not all(self.cluster.alive(n) and self.cluster.mounted(n) for n in NODES):
            self.restart()


def fill(path: Path) -> int:
    """Write `path` until its file system is full; returns the bytes written."""
    written = 0
    chunk = b"\0" * (1 << 20)
    with open(path, "wb", buffering=0) as f:
        while chunk:
            try:
                written += f.write(chunk)
            except OSError:
                chunk = chunk[:len(chunk) // 2]  # the last pieces, down to a byte
    return written


def site_of(node: str) -> str:
    return SITE_OF[node]
