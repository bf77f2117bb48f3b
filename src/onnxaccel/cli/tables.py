"""Tables every command prints, built one way so they stay readable in an 80-column terminal.

Rich shares a too-narrow terminal out among the columns that may wrap; a number that may wrap is printed as
"120." over "745" and a header as "targe" over "t". So numbers never wrap here: a number column is
``no_wrap``, right-justified and at least as wide as its header, and the space a narrow terminal lacks is
taken from the text columns, which fold (a long target or node name continues on the next line). The box has
no vertical rules, no edge padding and collapsed padding, which leaves 2 characters between columns instead of 3.
"""

from __future__ import annotations

from rich import box
from rich.table import Table


def new_table(title: str | None = None, **kwargs) -> Table:
    """A table with a left-justified title, a rule under the header and no vertical rules."""
    kwargs.setdefault("box", box.SIMPLE_HEAD)
    kwargs.setdefault("pad_edge", False)
    kwargs.setdefault("collapse_padding", True)  # 2 spaces between columns instead of 3
    kwargs.setdefault("title_justify", "left")
    return Table(title=title, **kwargs)


def number_column(table: Table, header: str, *, min_width: int | None = None) -> None:
    """A right-justified column of numbers that never wraps or gets cut: at least as wide as ``header`` (and
    ``min_width``), so the header stays on one line too."""
    table.add_column(header, justify="right", no_wrap=True, min_width=max(len(header), min_width or 0))


def text_column(table: Table, header: str, *, min_width: int | None = None, max_width: int | None = None,
                no_wrap: bool = False) -> None:
    """A left-justified column of names or words that folds onto more lines when the terminal is narrow;
    at least as wide as the header's longest word, so the header is not broken inside a word.
    ``no_wrap`` keeps short words (on/off, ok) on one line."""
    longest = max((len(w) for w in header.split()), default=1)
    table.add_column(header, justify="left", overflow="fold", no_wrap=no_wrap,
                     min_width=max(longest, min_width or 0), max_width=max_width)


def columns(table: Table, headers: list[str] | tuple[str, ...], numbers: set[str] | tuple[str, ...]) -> Table:
    """Add ``headers`` in order: those in ``numbers`` as number columns, the rest as text columns."""
    for header in headers:
        if header in numbers:
            number_column(table, header)
        else:
            text_column(table, header)
    return table


def si(value: float) -> str:
    """3 significant digits with an SI prefix: 1.23k, 45.6M, 7.89T."""
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g}{prefix}"
    return f"{value:.3g}"
