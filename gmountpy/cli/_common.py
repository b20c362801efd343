"""Small helpers shared by subcommands."""

from __future__ import annotations

import string
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from rich.console import Console, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from ..cluster.config import ClusterSpec, load_spec

console = Console()
err_console = Console(stderr=True)


def print_whole(renderable: RenderableType) -> None:
    """Print tables to stdout: to a terminal within its width (columns set to fold wrap there);
    to a file or pipe as wide as the widest row, so that scripts get every path whole."""
    if console.is_terminal:
        console.print(renderable)
        return
    width = max(console.measure(renderable, options=console.options.update(width=1_000_000)).maximum, 20)
    Console(width=width, color_system=None).print(renderable)


def spec_from(path: str) -> ClusterSpec:
    return load_spec(path)


#: Characters a name may hold and still be shown bare (as GNU ls's shell-escape quoting does).
_BARE = frozenset(string.ascii_letters + string.digits + "%+,-./:=@_^")
_ESCAPES = {"\a": "\\a", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\v": "\\v", "\f": "\\f",
            "\r": "\\r", "\x1b": "\\E"}


def shown(name: str) -> str:
    """A file name or path as `ls` shows it on a terminal (shell-escape quoting): quoted when it
    holds anything but plain characters, control characters and undecodable bytes written as
    $'\\n' or $'\\377'. A name with a newline cannot forge a row of a table; pasted into a
    shell, the shown name is the name."""
    if name and all(c in _BARE or (ord(c) > 127 and c.isprintable()) for c in name):
        return name
    out: list[str] = []
    plain: list[str] = []

    def flush() -> None:
        if plain:
            out.append("'" + "".join(plain) + "'")
            plain.clear()

    for c in name:
        if c == "'":
            flush()
            out.append("\\'")
        elif c.isprintable():
            plain.append(c)
        else:
            flush()
            raw = c.encode("utf-8", "surrogateescape")
            out.append("$'" + (_ESCAPES.get(c) or "".join(f"\\{b:03o}" for b in raw)) + "'")
    flush()
    return "".join(out) or "''"


@contextmanager
def live_node_table(title: str, headers: tuple[str, ...], rows: Mapping[str, tuple[str, ...]],
                    styles: dict[str, str]) -> Iterator[Callable[[str, str], None]]:
    """A live table of nodes and their state while `up`/`down` run; yields the progress callback."""
    states = {name: "waiting" for name in rows}

    def table() -> Table:
        t = Table(title=title, show_edge=False)
        for column in ("node", *headers, "state"):
            t.add_column(column)
        for name, what in states.items():
            t.add_row(name, *(escape(v) for v in rows[name]), f"[{styles.get(what, 'white')}]{what}[/]")
        return t

    with Live(table(), console=console, transient=not console.is_terminal, refresh_per_second=8) as live:
        def progress(node: str, what: str) -> None:
            states[node] = what
            live.update(table())

        yield progress
