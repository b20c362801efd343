"""`gmount env`: shell lines that turn the local bypass on (or off) in the current shell."""

from __future__ import annotations

import click

from ..jobs import bypass


@click.command("env")
@click.option("--off", is_flag=True, help="Print the line that switches the bypass off instead.")
def command(off: bool) -> None:
    """Print `export` lines for `eval "$(gmount env)"`.

    After them, this shell's programs (and what they start) read and write the files a node
    holds straight from its export when they use that node's mount (docs/bypass.md).
    `eval "$(gmount env --off)"` switches it off again.
    """
    if off:
        click.echo(f"export {bypass.SWITCH}=0")
        return
    click.echo(bypass.shell_lines(), nl=False)
