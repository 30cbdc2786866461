"""The one Markdown table formatter: pandas' `DataFrame.to_markdown` (which needs `tabulate`).

Every table the project prints or writes (the run table, lm-eval's speculation statistics, the
analysis tables, the cost model) goes through `markdown_table`, so missing values, numbers and
pipes in cells look the same everywhere.
"""
from __future__ import annotations

import math
from typing import Callable, Iterable, Mapping

import pandas as pd

MISSING = "–"


def format_cell(value, fmt: str | Callable | None = None) -> str:
    """A cell as text: `fmt` (a format spec like ".2f", or a function) for a present number,
    MISSING for None/NaN, whole floats >= 100 (context lengths, token counts) without decimals,
    other floats to 3 significant digits."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return MISSING
    if callable(fmt):
        return fmt(value)
    if fmt is not None and isinstance(value, (int, float)) and not isinstance(value, bool):
        return format(value, fmt)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) >= 100 else f"{value:.3g}"
    return str(value).replace("|", "\\|")


def markdown_table(rows, columns: Iterable[str] | None = None,
                   formats: Mapping[str, str | Callable] | None = None) -> str:
    """A GitHub Markdown table of `rows` (a DataFrame, or a list of dicts), one line per row.

    `columns` picks and orders the columns (default: all); `formats` maps a column to its format."""
    frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    if columns is not None:
        frame = frame.reindex(columns=list(columns))
    formats = dict(formats or {})
    text = pd.DataFrame({column: [format_cell(v, formats.get(column)) for v in frame[column]]
                         for column in frame.columns}, columns=frame.columns)
    return text.to_markdown(index=False, disable_numparse=True, tablefmt="github")
