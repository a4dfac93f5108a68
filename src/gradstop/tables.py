"""The chapters' outcome tables, printed as plain text.

A chapter that states a rule runs it over a family of cases and prints one row per
case, so the reader sees every outcome the assertions below the table check::

    gp.print_table({"leaf": {"is_leaf": True, "grad_fn": None}})
"""


def _cell(value) -> str:
    """True/False read as yes/no; everything else as str() prints it."""
    if value is True:
        return "yes"
    if value is False:
        return "no"
    return str(value)


def format_table(rows: dict, first: str = "case") -> str:
    """{row name: {column: value}} as aligned text, one line per row, header first.

    Every row must have the same columns, in the same order.
    """
    if not isinstance(rows, dict) or not rows:
        raise ValueError("rows must be a non-empty dict {row name: {column: value}}")
    first_row = next(iter(rows.values()))
    columns = list(first_row) if isinstance(first_row, dict) else None
    for name, row in rows.items():
        if not isinstance(row, dict) or list(row) != columns:
            raise ValueError(f"row {name!r} has columns {row!r}; expected {columns}")
    lines = [[first, *columns]]
    lines += [[str(name), *map(_cell, row.values())] for name, row in rows.items()]
    widths = [max(len(line[i]) for line in lines) for i in range(len(columns) + 1)]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines
    )


def print_table(rows: dict, first: str = "case") -> None:
    """Print format_table(rows, first)."""
    print(format_table(rows, first))
