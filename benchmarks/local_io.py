"""Local I/O of a job gmount starts, for bench_core.py: direct, mount, bypass, kernel passthrough, sshfs.

The job (bypass_job.py) runs on n1 through `Cluster.run`, as `gmount run` and the workflow
plugins start jobs, and measures each operation on n1's export directly and then through:

- `bypass`: n1's mount, with the job's bypass library (the default for jobs gmount starts);
- `mount`: n1's mount with GMOUNT_BYPASS=0 (every byte through the daemon);
- `sshfs`: an sshfs mount of n1's export over ssh to 127.0.0.1 (a private sshd);
- `passthrough`: the mount of a second cluster whose daemons use kernel FUSE passthrough
  (tuning `passthrough = true`; root only), with GMOUNT_BYPASS=0.

Each repeat runs the modes back to back, and each job times its two sides in alternating
slices, so the ratios come from one run on one (shared, noisy) machine.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

JOB = Path(__file__).resolve().parent / "bypass_job.py"
OPS = {"read_cold": "MB/s", "read_warm": "MB/s", "random_4k": "ops/s", "write": "MB/s", "stat_cold": "ops/s"}
MODES = ("bypass", "mount", "sshfs", "passthrough")


def make_stat_fixtures(export: Path, modes: tuple[str, ...], repeats: int, n_files: int) -> None:
    """Fresh empty files for each cold stat pass: one directory per mode, repeat and side."""
    for mode in modes:
        for r in range(repeats):
            for side in ("direct", "target"):
                d = export / "bench" / "jstat" / f"{mode}-{side}-r{r}"
                d.mkdir(parents=True)
                for i in range(n_files):
                    os.close(os.open(d / f"f{i:05d}", os.O_CREAT | os.O_WRONLY, 0o644))


def sshfs_problem() -> str | None:
    for tool in ("sshfs", "ssh-keygen", "/usr/sbin/sshd", "fusermount3"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (Debian packages sshfs, openssh-server, openssh-client)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def sshfs_mount(directory: Path, work: Path, log: Callable[[str], None]) -> Iterator[Path]:
    """`directory` mounted with sshfs through a private sshd on 127.0.0.1 (this user's keys, made here)."""
    work.mkdir(parents=True, exist_ok=True)
    for key in ("host", "user"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(work / key)], check=True)
    (work / "authorized_keys").write_text((work / "user.pub").read_text())
    port = _free_port()
    config = work / "sshd_config"
    config.write_text("\n".join([
        f"ListenAddress 127.0.0.1:{port}", f"HostKey {work / 'host'}", f"AuthorizedKeysFile {work / 'authorized_keys'}",
        "PermitRootLogin prohibit-password", "PasswordAuthentication no", "StrictModes no", "UsePAM no",
        f"PidFile {work / 'sshd.pid'}", "Subsystem sftp internal-sftp", "LogLevel ERROR", ""]))
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege separation directory
    sshd = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", str(config)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    mnt = work / "mnt"
    mnt.mkdir()
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or sshd.poll() is not None:
                    raise RuntimeError("the private sshd for sshfs did not start") from None
                time.sleep(0.1)
        user = os.environ.get("USER") or "root"
        subprocess.run(["sshfs", f"{user}@127.0.0.1:{directory}", str(mnt), "-p", str(port), "-o",
                        f"IdentityFile={work / 'user'},StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null,"
                        "LogLevel=ERROR"], check=True, timeout=30)
        log(f"sshfs: {directory} mounted on {mnt} through sshd on 127.0.0.1:{port}")
        yield mnt
    finally:
        subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True)
        sshd.terminate()
        try:
            sshd.wait(5)
        except subprocess.TimeoutExpired:
            sshd.kill()
            sshd.wait()


def run_job(cluster: str, node: str, export: Path, target: Path, big: str, stat_root: str, mode: str, r: int,
            bypass: bool, write_mib: int, n_random: int, n_files: int) -> dict[str, list[float]]:
    """One job on `node` started as gmount starts jobs; its paired measurements."""
    import json

    from gmountpy import Cluster

    command = (f"{sys.executable} {JOB} --export {export} --target {target} --big {big} "
               f"--stat-direct {export / stat_root / f'{mode}-direct-r{r}'} "
               f"--stat-target {target / stat_root / f'{mode}-target-r{r}'} "
               f"--stat-files {n_files} --write-mib {write_mib} --random {n_random} --seed {r + 1}")
    saved = os.environ.get("GMOUNT_BYPASS")
    os.environ["GMOUNT_BYPASS"] = "1" if bypass else "0"
    try:
        result = Cluster.open(cluster).run(command, on=node, cwd="/", timeout=900)
    finally:
        if saved is None:
            del os.environ["GMOUNT_BYPASS"]
        else:
            os.environ["GMOUNT_BYPASS"] = saved
    if result.returncode != 0:
        raise RuntimeError(f"the {mode} job failed ({result.returncode}): {result.stderr[-2000:]}")
    measured: dict[str, list[float]] = json.loads(result.stdout.strip().splitlines()[-1])
    return measured


def add_rows(res: Any, samples: dict[str, dict[str, list[list[float]]]], read_mib: dict[str, int], write_mib: int,
             n_random: int, n_files: int) -> None:
    """One row per mode and operation: target vs direct, paired per repeat."""
    for op, unit in OPS.items():
        for mode in MODES:
            pairs = samples.get(mode, {}).get(op)
            if not pairs:
                continue
            size = read_mib.get(mode, 0)
            label = {"read_cold": f"seq read {size} MiB, caches dropped", "read_warm": f"seq read {size} MiB, cached",
                     "random_4k": f"random 4 KiB reads ({n_random}, cached)",
                     "write": f"seq write {write_mib} MiB (new file)",
                     "stat_cold": f"cold stat of {n_files} local files"}[op]
            res.add(f"job {mode}: {label}", unit, [p[1] for p in pairs], [p[0] for p in pairs],
                    n_files if op == "stat_cold" else 1, mode=mode, op=op)


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 30's targets, checked against this run's rows."""
    by = {(r.get("mode"), r.get("op")): r for r in rows if r.get("mode")}
    checks: list[dict[str, Any]] = []

    def ratio(mode: str, op: str, least: float, what: str) -> None:
        row = by.get((mode, op))
        value = row["ratio"] if row else None
        checks.append({"target": what, "value": value, "met": value is not None and value >= least})

    ratio("bypass", "read_cold", 0.97, "bypass seq read, caches dropped >= 0.97x direct")
    ratio("bypass", "read_warm", 0.97, "bypass seq read, cached >= 0.97x direct")
    ratio("bypass", "random_4k", 0.90, "bypass random 4 KiB reads >= 0.9x direct")
    ratio("bypass", "write", 0.95, "bypass seq write >= 0.95x direct")
    stat = by.get(("bypass", "stat_cold"))
    sshfs = by.get(("sshfs", "stat_cold"))
    rate = stat["mount"] if stat else None
    checks.append({"target": "bypass cold stat >= 12,000/s", "value": rate, "met": rate is not None and rate >= 12_000})
    if stat and sshfs:
        paired = [a / b for a, b in zip(stat["samples"]["mount"], sshfs["samples"]["mount"], strict=False) if b]
        value = sorted(paired)[len(paired) // 2] if paired else None
        checks.append({"target": "bypass cold stat >= 2x sshfs", "value": value,
                       "met": value is not None and value >= 2})
    return checks
