"""why_no_grad for one tensor, grad_report for every parameter of a model."""

from __future__ import annotations

import html
import sys
import textwrap
from dataclasses import dataclass

import torch

from ..forward import Recording
from ..graph import backward_nodes
from . import names as naming
from .facts import facts
from .rules import REACHED, Reason, decide, yes
from .sentences import sentence


@dataclass(frozen=True)
class Diagnosis:
    """Why ``tensor.grad`` is what it is: a reason code and one sentence.

    ``trail`` lists the questions of ``RULES`` that led here, each with its answer;
    ``uses``, with a recording, each recorded use of the tensor and what became of it.
    """

    reason: Reason
    sentence: str
    trail: tuple[str, ...] = ()
    uses: tuple[str, ...] = ()

    @property
    def reached(self) -> bool:
        """Does backward() from the output send gradient to the tensor?"""
        return self.reason in REACHED

    def __str__(self) -> str:
        """The reason and its sentence, wrapped to fit a notebook or a page."""
        return textwrap.fill(f"{self.reason.name}: {self.sentence}", 78, subsequent_indent="  ")

    __repr__ = __str__


def why_no_grad(output, tensor, *, recording: Recording | None = None) -> Diagnosis:
    """Why ``tensor`` gets no gradient (or a surprising one) from ``output.backward()``.

    ``output`` is the tensor you call backward() on (or will); ``tensor`` the one
    whose ``.grad`` is missing, zero or wrong. With ``recording`` (from ``with
    gradstop.record() as rec:`` around the forward pass, and the backward call
    if you like) it also says which operation cut the path, on which line, and
    what became of every use of the tensor; it then reads an output with no
    graph at all too. The answer is a ``Diagnosis``: ``.reason`` (a
    ``gradstop.Reason``), ``.sentence`` (the cause and the fix), ``.reached``.
    """
    check(output, tensor, recording)
    caller = sys._getframe(1)
    found = naming.names(output, tensor, recording, caller)
    return diagnose(output, tensor, recording, found, naming.known_modules(caller))


def diagnose(output, tensor, recording, names, modules=None, registered=None) -> Diagnosis:
    """why_no_grad without the checks and the name lookup (grad_report passes names)."""
    f = facts(output, tensor, recording, names, modules, registered)
    reason, trail = decide(f)
    uses = f.trace.uses if f.trace is not None else ()
    return Diagnosis(reason, sentence(reason, f), trail, uses)


def check(output, tensor, recording) -> None:
    for role, value in (("output", output), ("tensor", tensor)):
        if not isinstance(value, torch.Tensor):
            raise TypeError(
                f"{role} must be a torch.Tensor, got {type(value).__name__}: "
                "call why_no_grad(loss, w) with the tensor you call backward() on "
                "and the tensor whose gradient is missing"
            )
    if recording is not None and not isinstance(recording, Recording):
        raise TypeError(
            "recording must be the Recording from `with gradstop.record() as rec:`, "
            f"got {type(recording).__name__}"
        )
    if output.grad_fn is None and not output.requires_grad and recording is None:
        raise ValueError(
            "output has no autograd graph (requires_grad is False, grad_fn is None), so "
            "backward() on it raises 'element 0 of tensors does not require grad': nothing "
            "it was computed from required grad at the time (no_grad(), inference_mode(), "
            "detach(), a torch.tensor() copy, requires_grad set too late). Record the "
            "forward pass (`with gradstop.record() as rec:`) and pass recording=rec: the "
            "recording says which operation made it."
        )
    if (
        output.grad_fn is None
        and tensor.grad_fn is not None
        and any(getattr(node, "variable", None) is output for node in backward_nodes(tensor))
    ):
        raise ValueError(
            "output is a leaf that tensor was computed from: the arguments look swapped; "
            "call why_no_grad(loss, w) with the tensor you call backward() on first"
        )
    if recording is not None and not any(s.tensor is output for s in recording.states):
        raise ValueError(
            "output was not computed inside this recording: run the forward pass that "
            "makes it inside `with gradstop.record() as rec:`"
        )


# ---------------------------------------------------------------------------
# grad_report: every parameter of a model at once


@dataclass(frozen=True)
class ParameterRow:
    name: str
    reached: bool  # does backward() from the loss reach this parameter?
    stepped: bool | None  # is it in the optimizer? (None: no optimizer given)
    diagnosis: Diagnosis
    registered: bool = True  # a registered parameter of the model (not a loose tensor)
    frozen: bool = False  # a parameter frozen with requires_grad_(False): no gradient, as meant


@dataclass(frozen=True)
class GradReport:
    """One row per named parameter (a shared one under each of its names), then one
    per tensor that requires grad and that the model holds without registering it."""

    rows: tuple[ParameterRow, ...]
    notes: tuple[str, ...] = ()  # module hooks that cannot act, or did not run

    @property
    def reached(self) -> frozenset[str]:
        return frozenset(r.name for r in self.rows if r.reached)

    @property
    def reasons(self) -> dict[str, Reason]:
        return {r.name: r.diagnosis.reason for r in self.rows}

    @property
    def not_stepped(self) -> frozenset[str]:
        """Parameters that get a gradient the optimizer never uses."""
        return frozenset(r.name for r in self.rows if r.reached and r.stepped is False)

    @property
    def unregistered(self) -> frozenset[str]:
        """Tensors the model holds and trains, but does not list in parameters()."""
        return frozenset(r.name for r in self.rows if not r.registered)

    def _notes(self, row: ParameterRow) -> str:
        if row.frozen:
            return (
                "frozen (requires_grad=False): no gradient, as a frozen layer should have; "
                "to train it, call requires_grad_() on it before the forward pass"
            )
        if not row.reached or row.diagnosis.reason not in (Reason.OK, Reason.NOT_YET):
            return row.diagnosis.sentence
        if row.stepped is False:
            return "gets a gradient, but is not in the optimizer: it never changes"
        return ""

    def __repr__(self) -> str:
        lines, said = [], {}  # a sentence said for one row is not repeated for the next
        for row in self.rows:
            mark = "reached" if row.reached else "frozen" if row.frozen else "NOT reached"
            lines.append(f"{row.name}: {mark}, {row.diagnosis.reason.name}")
            if note := self._notes(row):
                key = note.replace(row.name, "{}")
                note = f"(as for {said[key]})" if key in said else note
                said.setdefault(key, row.name)
                lines.append(
                    textwrap.fill(note, 78, initial_indent="    ", subsequent_indent="    ")
                )
        lines += [textwrap.fill(f"Note: {n}.", 78, subsequent_indent="    ") for n in self.notes]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        stepped = any(r.stepped is not None for r in self.rows)
        head = ["parameter", "reached", *(["in the optimizer"] if stepped else []), "reason", "why"]
        cells = [f"<th>{h}</th>" for h in head]
        body = []
        for row in self.rows:
            values = [f"<code>{html.escape(row.name)}</code>", yes(row.reached)]
            values += [yes(bool(row.stepped))] if stepped else []
            values += [row.diagnosis.reason.name, html.escape(self._notes(row))]
            body.append("<tr>" + "".join(f"<td>{v}</td>" for v in values) + "</tr>")
        notes = "".join(f"<p>Note: {html.escape(n)}.</p>" for n in self.notes)
        return f"<table><tr>{''.join(cells)}</tr>{''.join(body)}</table>{notes}"


def grad_report(loss, model, *, optimizer=None, recording: Recording | None = None) -> GradReport:
    """For each parameter of ``model``: does backward() from ``loss`` reach it, and why not.

    Every registered parameter gets a row, and so does every tensor that requires
    grad and that the model holds without registering it (a layer in a plain list,
    a tensor attribute), or that backward() reaches outside the model (a global
    the forward pass reads) and the optimizer does not hold: ``model.parameters()``
    and so an optimizer built from it miss those. With ``optimizer``, each row also
    says whether the optimizer holds that very tensor (a parameter replaced after
    the optimizer was built is not).
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        got = type(optimizer).__name__
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {got}")
    check(loss, loss, recording)
    caller = sys._getframe(1)
    loss_name = naming.names(loss, loss, recording, caller)[1]
    return report(loss, loss_name, model, optimizer, recording, caller)


def report(loss, loss_name, model, optimizer, recording, caller=None) -> GradReport:
    """grad_report without the checks (diagnose_step passes its own names)."""
    held = None
    if optimizer is not None:
        held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    modules = dict(model.named_modules(remove_duplicate=False))
    rows = []
    candidates = [(n, p, True) for n, p in model.named_parameters(remove_duplicate=False)]
    candidates += [(n, t, False) for n, t in naming.loose_tensors(model).values()]
    known = {id(t) for _, t, _ in candidates} | (held or set())
    candidates += [(n, t, False) for n, t in naming.outside_leaves([loss], known, caller)]
    for name, tensor, registered in candidates:
        stepped = None if held is None else id(tensor) in held
        flag = None if registered or stepped else False
        found = diagnose(loss, tensor, recording, (name, loss_name), modules, flag)
        frozen = registered and frozen_parameter(tensor, found)
        rows.append(ParameterRow(name, found.reached, stepped, found, registered, frozen))
    return GradReport(tuple(rows), module_notes(model, recording) + attribute_notes(model))


def frozen_parameter(tensor, found: Diagnosis) -> bool:
    """A parameter frozen with requires_grad_(False): no gradient, as meant, not a fault."""
    return (
        found.reason is Reason.NO_REQUIRES_GRAD
        and isinstance(tensor, torch.nn.Parameter)
        and tensor.is_leaf
    )


def module_notes(model, recording) -> tuple[str, ...]:
    """Backward hooks of the model's modules that a recording shows did not run."""
    if recording is None:
        return ()
    from .recorder import STEP, module_calls

    ran = {id(c.module) for c in module_calls(recording).values()}
    forward = [c for c in recording.calls if c.region != STEP]  # not the optimizer's
    used = {id(recording.states[i].tensor) for c in forward for i in c.inputs}
    notes = []
    for name, module in model.named_modules():
        hooked = module._backward_hooks or module._backward_pre_hooks
        mine = [p for p in module.parameters(recurse=False) if id(p) in used]
        if hooked and mine and id(module) not in ran:
            notes.append(
                f"{name or 'the model'} has backward hooks, and its parameters were used, but "
                f"it was not called as {name or 'model'}(...): a call of its .forward() "
                "skips every module hook"
            )
    return tuple(notes)


def attribute_notes(model) -> tuple[str, ...]:
    """``module.requires_grad = False``: a plain attribute that PyTorch never reads."""
    if model is None:
        return ()
    notes = []
    for name, module in model.named_modules():
        value = vars(module).get("requires_grad")
        if isinstance(value, bool):
            who = "model" + "".join(
                f"[{part}]" if part.isdigit() else f".{part}" for part in name.split(".") if part
            )
            notes.append(
                f"{who}.requires_grad = {value} set a plain attribute of the module, which "
                "PyTorch never reads: it changes no parameter's requires_grad (each still "
                "trains as before). To freeze or unfreeze the module's parameters, call "
                f"{who}.requires_grad_({value}) (with the underscore)"
            )
    return tuple(notes)
