"""fio through gmountpy, sshfs and the disk, local and remote files, across an emulated WAN link.

    python -m benchmarks.wan.bench_io [--quick] [--size-mib N] [--rtt-ms 10] [--out PATH]

Two sites, one node each (`near` and `far`, RTT --rtt-ms apart), emulated with
benchmarks.wan. Every measurement runs on `near`'s side:

- direct:               fio on the file in near's export (the disk, through the host page cache)
- gmount local:         the same file through near's gmount mount (one FUSE hop, no network)
- gmount local_path:    the path from the `user.gmount.local_path` xattr (bypasses FUSE entirely)
- gmount remote:        a file held by `far`, through near's mount (RPCs across the link)
- sshfs remote:         the same far file through sshfs (sshd in far's site, sshfs in near's)
- glusterfs local:      a distribute volume over one brick on near and one on far (glusterd and
                        brick per node, benchmarks/wan/glusterfs.py), mounted on near; a file
                        whose DHT hash puts it on near's brick
- glusterfs remote:     a file of the same volume on far's brick, through near's gluster mount

Jobs: sequential read (1 MiB blocks), random read (4 KiB, iodepth 1), sequential
write (1 MiB; gmount creates land on the local node, so it has no remote write;
sshfs and glusterfs write remote files, glusterfs local ones too). fio
invalidates the file's page cache before each job (`invalidate=1`); the export
file itself stays in the host page cache, so `direct` is a memory-speed baseline.
Ratios to `direct` in the same run are what the plot shows.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from . import glusterfs
from . import sites as wan
from .bench_meta import _interrupt, describe_run, log
from .sshfs import wait_mounted, wait_port

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"

JOBS = {
    "seq_read": ["--rw=read", "--bs=1M"],
    "rand_read": ["--rw=randread", "--bs=4k", "--iodepth=1"],
    "seq_write": ["--rw=write", "--bs=1M", "--end_fsync=1"],
}


def fio(path: Path, job: str, size_mib: int, runtime: float) -> dict[str, float]:
    argv = ["fio", "--name=" + job, f"--filename={path}", f"--size={size_mib}M", "--ioengine=psync",
            "--invalidate=1", f"--runtime={runtime:g}", "--output-format=json", *JOBS[job]]
    if job == "rand_read":
        argv.append("--time_based")
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        raise wan.WanError(f"fio {job} on {path} failed: {result.stderr.strip() or result.stdout[-500:]}")
    data = json.loads(result.stdout[result.stdout.index("{"):])
    side = data["jobs"][0]["write" if job == "seq_write" else "read"]
    return {"MB_per_s": side["bw_bytes"] / 1e6, "iops": side["iops"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="64 MiB files, 3 s random reads")
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--rtt-ms", type=float, default=10.0)
    parser.add_argument("--no-glusterfs", action="store_true", help="leave GlusterFS out")
    parser.add_argument("--out", type=Path, default=RESULTS / "wan_io.json")
    args = parser.parse_args(argv)
    size = 64 if args.quick else args.size_mib
    runtime = 3.0 if args.quick else 15.0
    if (why := wan.problem()) is not None:
        log(f"cannot run: {why}")
        return 1
    with_gluster = not args.no_glusterfs
    if with_gluster and (why := glusterfs.ensure_installed(log)) is not None:
        log(f"glusterfs skipped: {why}")
        with_gluster = False
    signal.signal(signal.SIGTERM, _interrupt)
    run = describe_run()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="gmw-io-") as tmp, ExitStack() as stack:
        work = Path(tmp)
        old_state = os.environ.get("XDG_STATE_HOME")
        os.environ["XDG_STATE_HOME"] = str(work / "state")
        stack.callback(lambda: os.environ.__setitem__("XDG_STATE_HOME", old_state) if old_state
                       else os.environ.pop("XDG_STATE_HOME", None))
        cluster = "\n".join([f'name = "wanio-{os.getpid()}"', "create_export = true", "[defaults]",
                             f'export = "{work}/{{node}}/export"', f'mountpoint = "{work}/{{node}}/mnt"',
                             '[sites.here]', 'nodes = ["near"]',
                             '[sites.there]', 'nodes = ["far"]', "[[links]]", 'sites = ["here", "there"]',
                             f"rtt_ms = {args.rtt_ms}", ""])
        (work / "cluster.toml").write_text(cluster)
        for node, name in (("near", "local.bin"), ("far", "remote.bin")):
            (work / node / "export").mkdir(parents=True)
            subprocess.run(["fio", "--name=fill", f"--filename={work / node / 'export' / name}", f"--size={size}M",
                            "--rw=write", "--bs=1M", "--output-format=terse"], check=True, capture_output=True)
        emu = stack.enter_context(wan.emulate(work / "cluster.toml", workdir=work))
        stack.enter_context(wan.gmount_cluster(emu))
        near_mnt, near_exp = work / "near" / "mnt", work / "near" / "export"
        local_path = Path(os.getxattr(near_mnt / "local.bin", "user.gmount.local_path").decode())
        sshfs_mnt = _sshfs(emu, work, stack)
        targets = {
            "direct": {"read": near_exp / "local.bin", "write": near_exp / "w-direct.bin"},
            "gmount local": {"read": near_mnt / "local.bin", "write": near_mnt / "w-gmount.bin"},
            "gmount local_path": {"read": local_path},
            "gmount remote": {"read": near_mnt / "remote.bin"},
            "sshfs remote": {"read": sshfs_mnt / "remote.bin", "write": sshfs_mnt / "w-sshfs.bin"},
        }
        if with_gluster:
            targets.update(_gluster(emu, work, stack, size))
        for job in JOBS:
            for target, paths in targets.items():
                path = paths.get("write" if job == "seq_write" else "read")
                if path is None:
                    continue
                measured = fio(path, job, size, runtime)
                rows.append({"job": job, "target": target, **measured})
                log(f"{job:<10} {target:<18} {measured['MB_per_s']:>9.1f} MB/s {measured['iops']:>9.0f} IOPS")
        run["loadavg_end"] = os.getloadavg()
    direct = {r["job"]: r["MB_per_s"] for r in rows if r["target"] == "direct"}
    for row in rows:
        row["ratio_to_direct"] = row["MB_per_s"] / direct[row["job"]] if direct.get(row["job"]) else None
    result = {"benchmark": "wan_io", **run, "rtt_ms": args.rtt_ms, "size_mib": size, "runtime_s": runtime,
              "cluster": cluster.replace(str(work), "$WORK"), "results": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    log(f"wrote {args.out}")
    print(table(result))
    plot(result, args.out.with_suffix(".png"))
    return 0


def _sshfs(emu: wan.Emulation, work: Path, stack: ExitStack) -> Path:
    """sshd in far's site serving far's export; sshfs mounted from near's site."""
    keys = work / "keys"
    keys.mkdir()
    for key in ("host", "user"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / key)], check=True)
    (keys / "authorized_keys").write_text((keys / "user.pub").read_text())
    address = emu.address["far"]
    (keys / "sshd_config").write_text("\n".join([
        f"ListenAddress {address}:22", f"HostKey {keys / 'host'}", f"AuthorizedKeysFile {keys / 'authorized_keys'}",
        "PermitRootLogin prohibit-password", "PasswordAuthentication no", "StrictModes no", "UsePAM no",
        f"PidFile {work / 'sshd.pid'}", "Subsystem sftp internal-sftp", "LogLevel ERROR", ""]))
    os.makedirs("/run/sshd", exist_ok=True)
    emu.spawn("far", ["/usr/sbin/sshd", "-D", "-e", "-f", str(keys / "sshd_config")],
              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(emu, "far", address, 22)
    mnt = work / "sshfs"
    mnt.mkdir()
    emu.add_mount(str(mnt))
    emu.spawn("near", ["sshfs", "-f", f"root@{address}:{work / 'far' / 'export'}", str(mnt), "-o",
                       (f"IdentityFile={keys / 'user'},StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null,"
                        "LogLevel=ERROR")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_mounted(mnt)
    stack.callback(lambda: subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True))
    return mnt


def _gluster(emu: wan.Emulation, work: Path, stack: ExitStack, size_mib: int) -> dict[str, dict[str, Path]]:
    """A distribute volume over near and far, mounted on near; files placed on either brick by their names.

    The DHT hash of a name picks the brick, so empty candidates are created until
    each brick holds a read and a write target; the read targets are then filled.
    """
    volume = glusterfs.GlusterFs(emu, work, nodes=["near", "far"])
    stack.enter_context(volume.running())
    mnt = volume.mount("near")
    picked: dict[tuple[str, str], Path] = {}
    for i in range(200):
        if len(picked) == 4:
            break
        path = mnt / f"g{i}.bin"
        path.touch()
        holder = volume.holder(path)
        use = next((u for u in ("read", "write") if (u, holder) not in picked), None)
        if use is None:
            path.unlink()
        else:
            picked[(use, holder)] = path
    if len(picked) < 4:
        raise glusterfs.GlusterError(f"200 names did not give two files on each brick: {sorted(picked)}")
    for holder in ("near", "far"):
        subprocess.run(["fio", "--name=fill", f"--filename={picked[('read', holder)]}", f"--size={size_mib}M",
                        "--rw=write", "--bs=1M", "--output-format=terse"], check=True, capture_output=True)
    return {"glusterfs local": {"read": picked[("read", "near")], "write": picked[("write", "near")]},
            "glusterfs remote": {"read": picked[("read", "far")], "write": picked[("write", "far")]}}


def table(result: dict[str, Any]) -> str:
    lines = ["| job | target | MB/s | IOPS | ratio to direct |", "|---|---|---:|---:|---:|"]
    for r in result["results"]:
        ratio = "-" if r["ratio_to_direct"] is None else f"{r['ratio_to_direct']:.3f}"
        lines.append(f"| {r['job']} | {r['target']} | {r['MB_per_s']:.1f} | {r['iops']:.0f} | {ratio} |")
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["results"]
    jobs = list(dict.fromkeys(r["job"] for r in rows))
    targets = list(dict.fromkeys(r["target"] for r in rows))
    ratio = {(r["job"], r["target"]): r["ratio_to_direct"] or 0 for r in rows}
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / len(targets)
    for k, target in enumerate(targets):
        xs = [i + k * width for i in range(len(jobs))]
        ax.bar(xs, [ratio.get((job, target), 0) for job in jobs], width, label=target)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(jobs))], jobs)
    ax.set_yscale("log")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_ylabel("throughput ÷ direct disk (same run)")
    ax.legend(fontsize=8)
    ax.set_title(f"fio across an emulated {result['rtt_ms']:g} ms RTT link, {result['size_mib']} MiB files — "
                 f"commit {result['commit'][:10]}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
