"""Console output shared by every command: tables and reports on stdout, progress and one-line errors on stderr.

On a terminal the output is Rich: colours, tables with borders, wrapped to the window. Anywhere else (a file, a pipe,
``| tee``, a CI log) it is plain text: markup is dropped, nothing is wrapped or cut at 80 columns, so every path and
URL is whole on its line, and a table is written as aligned columns, one line per row. Every command prints through
:data:`console` (stdout) or :data:`err_console` (stderr); none creates its own Rich console.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from nemo_gym.config.secrets import mask_text

EXIT_BROKEN_PIPE = 141
"""What a shell reports for a process stopped by SIGPIPE (128 + 13): the reader of the output went away."""
COLUMN_GAP = "  "
"""Between two columns of a plain table."""


class GymConsole(Console):
    """A Rich console that writes plain, unwrapped lines when its stream is not a terminal."""

    def print(self, *objects: Any, sep: str = " ", end: str = "\n", markup: bool | None = None, **options: Any) -> None:
        """Rich on a terminal; otherwise each object as plain text (tables as aligned columns), never wrapped."""
        if self.is_terminal:
            super().print(*objects, sep=sep, end=end, markup=markup, **options)
            return
        parse_markup = self._markup if markup is None else markup
        self.file.write(sep.join(self._plain(obj, parse_markup) for obj in objects) + end)
        self.file.flush()

    def _plain(self, obj: Any, parse_markup: bool) -> str:
        if isinstance(obj, Table):
            return "\n".join(plain_table_lines(obj))
        if isinstance(obj, str | Text):
            return plain_text(obj, parse_markup)
        with self.capture() as captured:  # any other renderable: Rich's own text, unwrapped
            super().print(obj, soft_wrap=True, crop=False)
        return captured.get().rstrip("\n")


def plain_text(value: Any, parse_markup: bool = True) -> str:
    """The text of a cell or message without Rich markup (``[red]x[/red]`` -> ``x``; ``\\[`` -> ``[``)."""
    if isinstance(value, Text):
        return value.plain
    if isinstance(value, str):
        return Text.from_markup(value, emoji=False).plain if parse_markup else value
    return "" if value is None else str(value)


def plain_table_lines(table: Table) -> list[str]:
    """A table as text lines: the title, a header line, then one line per row; columns padded to their widest
    cell (right-aligned where the column is), two spaces apart, never truncated. A multi-line cell is joined into
    one line so that every row stays on one line."""
    columns = table.columns
    header = [_one_line(plain_text(column.header)) for column in columns]
    rows = _transpose([[_one_line(plain_text(cell)) for cell in column.cells] for column in columns], len(columns))
    body = ([header] if table.show_header else []) + rows
    widths = [max((len(row[i]) for row in body), default=0) for i in range(len(columns))]
    lines = [plain_text(table.title)] if table.title else []
    for row in body:
        cells = [
            cell.rjust(widths[i]) if columns[i].justify == "right" else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        lines.append(COLUMN_GAP.join(cells).rstrip())
    return lines


def _one_line(text: str) -> str:
    return " ".join(text.splitlines())


def _transpose(columns: list[list[str]], count: int) -> list[list[str]]:
    height = max((len(cells) for cells in columns), default=0)
    return [[columns[i][r] if r < len(columns[i]) else "" for i in range(count)] for r in range(height)]


console = GymConsole(highlight=False, soft_wrap=True)
err_console = GymConsole(stderr=True, highlight=False, soft_wrap=True)


def print_error(message: str) -> None:
    """``error: <message>`` on stderr, red on a terminal; a URL's userinfo or a bearer credential in it is masked."""
    err_console.print(f"[bold red]error:[/bold red] [red]{escape(mask_text(message))}[/red]")


def print_warning(message: str) -> None:
    err_console.print(f"[yellow]warning: {escape(mask_text(message))}[/yellow]")


def stop_writing_stdout() -> int:
    """The reader of stdout went away (``gym list environments | head``): end quietly, as Unix tools do.

    Later writes, and the interpreter's flush at exit, go to /dev/null instead of raising again.
    """
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return EXIT_BROKEN_PIPE
