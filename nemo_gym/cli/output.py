"""Console output shared by every command: tables on stdout, one-line red errors on stderr."""

from __future__ import annotations

import sys

from rich.console import Console

console = Console(highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)


def print_error(message: str) -> None:
    """``error: <message>`` on stderr, red on a terminal."""
    if err_console.is_terminal:
        err_console.print(f"[bold red]error:[/bold red] [red]{_escape(message)}[/red]")
    else:
        sys.stderr.write(f"error: {message}\n")
        sys.stderr.flush()


def print_warning(message: str) -> None:
    if err_console.is_terminal:
        err_console.print(f"[yellow]warning: {_escape(message)}[/yellow]")
    else:
        sys.stderr.write(f"warning: {message}\n")
        sys.stderr.flush()


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)
