"""One terminal-table printer for the CLI, `mxkit eval` and the benchmarks (no mxkit imports)."""

from __future__ import annotations

import sys
from typing import Collection, Optional, Sequence

__all__ = ["print_table"]


def print_table(
    columns: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    title: Optional[str] = None,
    plain: bool = False,
    right: Collection[str] = (),
    file=None,
) -> str:
    """Print string cells under ``columns``: with rich when it is installed and ``plain`` is False, as
    aligned plain text otherwise. Columns named in ``right`` are right-aligned. Cells never wrap.

    Returns the plain-text rendering in every case (callers may log it).
    """
    out = file if file is not None else sys.stdout
    widths = [max([len(c)] + [len(r[i]) for r in rows]) for i, c in enumerate(columns)]

    def line(vals) -> str:
        return "  ".join(
            v.rjust(w) if c in right else v.ljust(w) for v, w, c in zip(vals, widths, columns)
        ).rstrip()

    text = "".join(
        ([title + "\n"] if title else [])
        + [line(columns) + "\n", "  ".join("-" * w for w in widths) + "\n"]
        + [line(r) + "\n" for r in rows]
    )
    if not plain:
        try:
            from rich.console import Console
            from rich.table import Table
            from rich.text import Text
        except ImportError:
            pass
        else:
            class PipeConsole(Console):  # a closed stdout raises, as print does: rich's own default exits with 1
                def on_broken_pipe(self) -> None:
                    self.quiet = True
                    raise BrokenPipeError(32, "Broken pipe")

            table = Table(header_style="bold")  # (the title printed above it: rich wraps a title to the table)
            for c in columns:
                table.add_column(c, justify="right" if c in right else "left", no_wrap=True)
            for r in rows:
                table.add_row(*(Text(c) for c in r))  # (cells as text, not markup: "[x]" is kept)
            width = sum(widths) + 3 * len(widths) + 4
            if title:
                PipeConsole(file=out, width=max(width, len(title)), highlight=False, soft_wrap=True).print(
                    title, style="italic", markup=False)
            PipeConsole(file=out, width=width, highlight=False).print(table)
            return text
    print(text, end="", file=out, flush=True)
    return text
