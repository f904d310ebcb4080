"""The prepare progress line on stderr (documents, tokens, tokens per second, elapsed)."""

from __future__ import annotations


def progress_bar(enabled: bool):
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("[bold]prepare"),
        BarColumn(),
        TextColumn("{task.fields[docs]:,} docs"),
        TextColumn("{task.completed:,.0f} tokens"),
        TextColumn("{task.fields[rate]:,.0f} tok/s"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        disable=not enabled,
        transient=False,
    )
