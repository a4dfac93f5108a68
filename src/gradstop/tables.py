"""Tables the chapters print, and the one they print most: who got a gradient.

``show(rows, first=...)``
    prints ``{row: {column: value}}`` as an aligned text table, ``True`` and
    ``False`` as yes and no (``table_text`` returns the same text).
``grad_state(parts)``
    what backward() left in the ``.grad`` of each named part, a module's
    parameters or one leaf tensor: ``"None"``, ``"zero"`` or ``"non-zero"``.
    The chapters assert on these words and print them with ``show``.
"""

from __future__ import annotations

import torch

GRAD_STATES = ("None", "zero", "non-zero")


def _cell(value: object) -> str:
    if value is True:
        return "yes"
    if value is False:
        return "no"
    return str(value)


def table_text(rows: dict, first: str = "case") -> str:
    """``rows`` as text: a header line, then one line per row, columns aligned.

    Every row must have the same columns, in the same order.
    """
    if not isinstance(rows, dict) or not rows:
        raise ValueError("rows must be a non-empty dict {row name: {column: value}}")
    bad = [name for name, row in rows.items() if not isinstance(row, dict)]
    if bad:
        raise TypeError(f"each row must be a dict {{column: value}}; not a dict: {bad}")
    columns = list(next(iter(rows.values())))
    for name, row in rows.items():
        if list(row) != columns:
            raise ValueError(f"row {name!r} has columns {list(row)}, the first row {columns}")
    text = [[first, *columns]]
    text += [[str(name), *(_cell(v) for v in row.values())] for name, row in rows.items()]
    widths = [max(len(line[i]) for line in text) for i in range(len(columns) + 1)]
    aligned = ("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in text)
    return "\n".join(line.rstrip() for line in aligned)


def show(rows: dict, first: str = "case") -> None:
    """Print ``{row: {column: value}}`` as a text table; True/False as yes/no."""
    print(table_text(rows, first))


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
