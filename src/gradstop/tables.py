"""The chapters' outcome tables, printed as plain text, and the one they print most:
who got a gradient.

A chapter that states a rule runs it over a family of cases and prints one row per
case, so the reader sees every outcome the assertions below the table check::

    gp.print_table({"leaf": {"is_leaf": True, "grad_fn": None}})

``grad_state(parts)`` says what backward() left in the ``.grad`` of each named part,
a module's parameters or one leaf tensor: ``"None"``, ``"zero"`` or ``"non-zero"``
(``"mixed (...)"`` when a module's parameters disagree). The chapters assert on
these words and print them with ``print_table``.
"""

import torch


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


def tensor_grad_state(tensor: torch.Tensor) -> str:
    """``"None"``, ``"zero"`` or ``"non-zero"``: what ``tensor.grad`` holds."""
    if not (tensor.is_leaf or tensor.retains_grad):
        raise ValueError(
            "this tensor is not a leaf, so backward() keeps no .grad on it: ask about "
            "the parameters (leaves), or call retain_grad() on it before backward()"
        )
    if tensor.grad is None:
        return "None"
    return "non-zero" if bool(tensor.grad.count_nonzero()) else "zero"


def _part_state(name: str, part: object) -> str:
    if isinstance(part, torch.Tensor):
        return tensor_grad_state(part)
    if not isinstance(part, torch.nn.Module):
        raise TypeError(f"{name!r}: expected a module or a tensor, got {type(part).__name__}")
    states = {p_name: tensor_grad_state(p) for p_name, p in part.named_parameters()}
    if not states:
        raise ValueError(f"{name!r} has no parameters to report on")
    if len(set(states.values())) == 1:
        return next(iter(states.values()))
    return "mixed (" + ", ".join(f"{p}: {s}" for p, s in states.items()) + ")"


def grad_state(parts: dict) -> dict[str, str]:
    """For each named part, what backward() left in its ``.grad``.

    A part is a module (all its parameters: one word when they agree, else
    ``"mixed (weight: non-zero, bias: None)"``) or a leaf tensor. A ``.grad`` with
    any non-zero element is ``"non-zero"``; an all-zero one, ``"zero"``.
    """
    if not isinstance(parts, dict) or not parts:
        raise TypeError("grad_state takes a dict of named parts, e.g. grad_state({'G': G, 'D': D})")
    return {name: _part_state(name, part) for name, part in parts.items()}
