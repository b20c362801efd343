"""`python -m benchmarks.wan up|down CLUSTER.toml`: make a cluster file's sites real network namespaces."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable

import click

from gmountpy.errors import GmountError

from . import sites as wan


@click.group()
def cli() -> None:
    """Emulated WAN sites (network namespaces with the cluster file's RTTs) on this machine."""


@cli.command("up")
@click.argument("cluster_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--gmount", "start_gmount", is_flag=True, help="Also run `gmount up` on the emulated sites.")
@click.option("--node-cpus", is_flag=True, help="Give every node a cgroup with CPUs of its own (its daemon and the "
              "jobs that name it in GMOUNT_NODE run there).")
def up_command(cluster_file: str, start_gmount: bool, node_cpus: bool) -> None:
    """Create one namespace per site, the hub and the delays; print the cluster file for gmount."""
    emu = wan.up(cluster_file, node_cpus=node_cpus)
    click.echo(f"cluster {emu.name}: {len(emu.netns)} sites emulated (hub {emu.hub})")
    for site, ns in emu.netns.items():
        nodes = [f"{n}={emu.address[n]}" for n, s in emu.site_of.items() if s == site]
        click.echo(f"  {site:<12} {ns:<28} {' '.join(nodes)}")
    _echo_link(emu)
    if start_gmount:
        from gmountpy import launch
        from gmountpy.cluster.config import load_spec

        emu.gmount_up = True
        emu.save()
        try:
            launch.up(load_spec(emu.cluster_file))
            wan.own_cpus(emu, emu.name)
        except BaseException:
            wan.down(emu)
            raise
        click.echo("gmount is up on the emulated sites")
    else:
        click.echo(f"start gmount on it: gmount up {emu.cluster_file}")
    click.echo(f"run a command in a site: nsenter --net=/run/netns/{next(iter(emu.netns.values()))} -- CMD")
    click.echo(f"tear everything down: python -m benchmarks.wan down {cluster_file}")


@cli.command("down")
@click.argument("cluster", type=str)
def down_command(cluster: str) -> None:
    """Remove namespaces, delays, processes and mounts of an emulation (by cluster file or name)."""
    name = cluster
    if cluster.endswith(".toml"):
        _, spec, _ = wan.load_cluster(cluster)
        name = spec.name
    if wan.Emulation.load(name) is None:
        click.echo(f"no emulation of cluster {name!r} is recorded")
        return
    problems = wan.down(name)
    for problem in problems:
        click.echo(f"problem: {problem}", err=True)
    if problems:
        raise SystemExit(1)
    click.echo(f"emulation of {name} removed")


@cli.command("run", context_settings={"ignore_unknown_options": True})
@click.argument("cluster_file", type=click.Path(exists=True, dir_okay=False))
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.option("--site", help="The site whose namespace COMMAND runs in [default: the first].")
@click.option("--node-cpus", is_flag=True, help="Give every node a cgroup with CPUs of its own; COMMAND runs in the "
              "cgroup of the site's first node.")
def run_command(cluster_file: str, command: tuple[str, ...], site: str | None, node_cpus: bool) -> None:
    """Emulate the sites, `gmount up` on them, run COMMAND inside one site, tear everything down.

    `{cluster}` in COMMAND is replaced by the emulated cluster file, so a workflow runs under the
    WAN with one line, e.g. `run C.toml -- gmount pipeline montage --cluster {cluster}` (COMMAND after `--`). COMMAND's
    exit status is this command's. Teardown also happens on errors, Ctrl-C and SIGTERM (passed on
    to COMMAND first, so a pipeline's make stops its jobs before the mounts go).
    """
    with wan.emulate(cluster_file, node_cpus=node_cpus) as emu:
        where = site or next(iter(emu.netns))
        if where not in emu.netns:
            raise click.UsageError(f"no site {where!r} in {cluster_file}; sites: {', '.join(emu.netns)}")
        _echo_link(emu, err=True)
        with wan.gmount_cluster(emu):
            argv = [part.replace("{cluster}", emu.cluster_file) for part in command]
            click.echo(f"running in site {where} ({emu.netns[where]}): {' '.join(argv)}", err=True)
            groups = emu.node_cgroups()
            head = next(n for n, s in emu.site_of.items() if s == where)
            returncode = _run_forwarding_signals(["nsenter", f"--net=/run/netns/{emu.netns[where]}", "--", *argv],
                                                 preexec=groups.preexec(head) if groups is not None else None)
    if returncode != 0:
        raise SystemExit(returncode)


def _echo_link(emu: wan.Emulation, err: bool = False) -> None:
    """Every run states its RTT, bandwidth and what CPUs each node has."""
    described = emu.link()
    for link in described["links"]:
        cap = f"{link['bandwidth_mbit']:g} Mbit/s" if link["bandwidth_mbit"] else "no bandwidth cap"
        click.echo(f"  link {' <-> '.join(link['sites'])}: rtt {link['rtt_ms']:g} ms, {cap}", err=err)
    cpus = described["cpus"]
    if isinstance(cpus, dict):
        for node, given in cpus["nodes"].items():
            click.echo(f"  node {node}: {given['text']} ({cpus['hierarchy']})", err=err)
    else:
        click.echo(f"  nodes' CPUs: {cpus}", err=err)


def _run_forwarding_signals(argv: list[str], grace: float = 30.0,
                            preexec: Callable[[], None] | None = None) -> int:
    """Run `argv`; SIGTERM is passed on to it, and after Ctrl-C (which the terminal sends to it too)
    it gets `grace` seconds to stop before it is killed -- teardown comes after the command ended."""
    process: subprocess.Popen[bytes] | None = None
    held: list[int] = []

    def forward(signum: int, frame: object) -> None:
        if process is None:
            held.append(signum)  # arrived while the command was being started: sent once it runs
        else:
            process.send_signal(signum)

    previous = signal.signal(signal.SIGTERM, forward)  # before the start: no moment without it
    try:
        process = subprocess.Popen(argv, preexec_fn=preexec)
        for signum in held:
            process.send_signal(signum)
        return process.wait()
    except KeyboardInterrupt:
        if process is None:
            raise
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)


def main() -> int:
    try:
        cli.main(standalone_mode=False)
    except GmountError as exc:
        click.echo(f"gmount-wan: {exc}", err=True)
        return 1
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Abort:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
