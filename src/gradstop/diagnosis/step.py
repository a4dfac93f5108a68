"""diagnose_step: the one call to put around your own training step.

    with gp.diagnose_step(model, optimizer):
        optimizer.zero_grad()
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        optimizer.step()

records the step (``gradstop.record()``), watches ``optimizer.step()`` (which
gradients it found, which values it changed), and on leaving the block prints,
for every parameter, every tensor the model holds without registering it and
every tensor named in ``tensors=``, the verdict and the fix. A block that raises
(``loss.backward()`` on a loss with no graph) is reported too, then the error
goes on as usual.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import dis
import inspect
import linecache
import re
import sys
import textwrap
from dataclasses import dataclass, field

import torch

from ..forward import Recording, _Recorder
from ..graph import backward_nodes
from . import names as naming
from . import recorded, recorder
from .errors import carried, explain
from .facts import hook_name
from .recorder import passes
from .report import Diagnosis, attribute_notes, diagnose, frozen_parameter, module_notes
from .rules import Reason


@dataclass(frozen=True)
class StepRow:
    """One tensor of the step: the verdict, and what optimizer.step() did with it."""

    name: str
    diagnosis: Diagnosis | None  # None: no backward() ran in the block
    in_optimizer: bool | None  # None: no optimizer given
    grad_at_step: str  # "None", "zeros", "a gradient"; "" if no step ran
    changed: bool | None  # did the step change it? (None: no step ran)
    verdict: str = ""  # in PyTorch's terms, then the code: "cut by detach() (DETACHED)"
    problem: str = ""  # what is wrong with it, and the fix ("" if nothing)


@dataclass
class StepReport:
    """What ``diagnose_step`` found: one row per tensor, and notes."""

    losses: tuple[str, ...] = ()
    steps: int = 0
    rows: tuple[StepRow, ...] = ()
    notes: tuple[str, ...] = ()
    error: str = ""
    optimizer: bool = False  # was an optimizer given (so steps are counted)?
    explained: str = ""  # what the error means, and its fix
    unchecked: tuple[str, ...] = ()  # custom Functions on the path: values not checked
    behind: frozenset[str] = frozenset()  # the rows whose gradient came back through one
    ignoring: tuple[str, ...] = ()  # custom Functions whose backward() ignores grad_output
    caveat: str = ""  # why the rows whose gradient arrived are not Fine: see the note
    recording: Recording | None = field(default=None, repr=False)

    @property
    def reasons(self) -> dict[str, Reason]:
        return {r.name: r.diagnosis.reason for r in self.rows if r.diagnosis is not None}

    @property
    def problems(self) -> dict[str, str]:
        return {r.name: r.problem for r in self.rows if r.problem}

    def __str__(self) -> str:
        return "\n".join(_lines(self))

    __repr__ = __str__


@contextlib.contextmanager
def diagnose_step(model=None, optimizer=None, *, tensors=None, show=True):
    """Record one training step and report every parameter's gradient, with the fix.

    ``model``: the ``nn.Module`` being trained (its parameters, and tensors it holds
    without registering them, are reported); ``optimizer``: the optimizer, if the
    block steps it; ``tensors``: ``{"name": tensor}`` for any other tensor to report.
    The block should hold the forward pass and ``backward()``; ``optimizer.step()``
    too, to learn whether the weights change. Prints the report on leaving (unless
    ``show=False``); the report is the ``as`` value: ``with ... as step:``,
    ``step.rows``, ``step.reasons``, ``step.problems``.
    """
    _check(model, optimizer, tensors)
    found, caller, recording = StepReport(), sys._getframe(2), Recording()
    recording.notes["carried"] = carried(caller.f_locals, model)  # an earlier step's graph
    watch = _Watch(model, optimizer, tensors or {}, caller, recording)
    try:
        with _Recorder(recording):
            yield found
    except BaseException as err:
        found.error = f"{type(err).__name__}: {err}".splitlines()[0]
        raise
    finally:
        watch.close()
        recording.names = _tensor_names(caller)
        _fill(found, watch, recording, caller)
        if show:
            _print_once(str(found), (id(caller), caller.f_code, caller.f_lineno))


_LAST_PRINTED = {"text": "", "where": None, "repeats": 0}


def _print_once(text: str, where) -> None:
    """Print the report, unless the same block, running again in the same call (a loop),
    found the same as when it last printed."""
    if (text, where) != (_LAST_PRINTED["text"], _LAST_PRINTED["where"]):
        _LAST_PRINTED.update(text=text, where=where, repeats=0)
        print(text)
        return
    _LAST_PRINTED["repeats"] += 1
    if _LAST_PRINTED["repeats"] == 1:
        print("diagnose_step: the same report again (not printed again while it repeats).")


def _check(model, optimizer, tensors) -> None:
    if model is not None and not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}"
        )
    if tensors is not None and not (
        isinstance(tensors, dict) and all(isinstance(t, torch.Tensor) for t in tensors.values())
    ):
        raise TypeError("tensors must be a dict of names to tensors: tensors={'w': w}")
    if model is None and optimizer is None and not tensors:
        raise ValueError("give the model, the optimizer or tensors={...} to report on")


def _tensor_names(frame) -> dict[int, str]:
    return {
        id(v): k
        for k, v in frame.f_locals.items()
        if isinstance(v, torch.Tensor) and naming.is_name(k)
    }


def _grad_state(grad) -> str:
    if grad is None:
        return "None"
    return "a gradient" if bool(grad.any()) else "zeros"


def _holds_gradient(owner) -> bool:
    """Whether any parameter of an optimizer or a module has a non-zero .grad."""
    if hasattr(owner, "param_groups"):
        params = [p for group in owner.param_groups for p in group["params"]]
    else:
        params = list(owner.parameters())
    with torch._C.DisableTorchFunction():  # not part of the reader's step
        return any(p.grad is not None and bool(p.grad.any()) for p in params)


class _Watch:
    """The tensors to report, their values before the block, their gradients at the step,
    and the order of the block's optimizer.step() and zero_grad() calls among its
    backward passes (``events``: each with the number of backward passes before it)."""

    def __init__(self, model, optimizer, tensors, caller, recording):
        self.model, self.optimizer, self.tensors = model, optimizer, tensors
        self.recording = recording
        self.grad_mode_at_start = torch.is_grad_enabled()  # a bare set_grad_enabled(False)
        self.candidates = _candidates(model, optimizer, tensors, caller)
        self.before = {id(t): t.detach().clone() for _, t, _ in self.candidates}
        self.at_step: dict[int, str] = {}
        self.steps = 0
        self.events: list[tuple[str, int]] = []  # ("step" or "zero_grad", backward passes)
        self.handle = None
        self.wrapped: list[tuple[object, bool, object]] = []
        if optimizer is not None:
            self.handle = optimizer.register_step_pre_hook(self._pre_step)
        self.forwards, self.forward_handles = {"wrapper": 0, "inner": 0}, []
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            for key, module in (("wrapper", model), ("inner", model.module)):
                self.forward_handles.append(module.register_forward_pre_hook(self._counter(key)))
        for owner in (optimizer, model):
            if owner is not None:
                self._watch_zero_grad(owner)
        self.clips: list[tuple[str, int]] = []  # (function, backward passes before it)
        self.zero_clips: list[str] = []  # clipping called with a limit of 0: "max_norm=0"
        self.patched: list[tuple[object, str, object]] = []
        self._watch_clipping(caller)
        self.inputs: dict[int, torch.Tensor] = {}  # the tensors passed to the model
        self.losses: list[torch.Tensor] = []  # the tensors backward() ran from (at the end)
        if model is not None:
            hook = model.register_forward_pre_hook(self._note_inputs, with_kwargs=True)
            self.forward_handles.append(hook)

    def _watch_clipping(self, caller) -> None:
        """Note each clip_grad_norm_() / clip_grad_value_() call, and when it ran: as
        torch.nn.utils.<name>, and under any name the caller's module imported it as."""
        wrappers: dict[int, object] = {}
        for name in ("clip_grad_norm_", "clip_grad_value_"):
            original = getattr(torch.nn.utils.clip_grad, name)
            if not getattr(original, "_gradstop_watch", False):  # not wrapped already
                wrappers[id(original)] = self._clipping(original, name)
        namespaces = (vars(torch.nn.utils), vars(torch.nn.utils.clip_grad), caller.f_globals)
        for names in namespaces:
            for key, value in list(names.items()):
                if id(value) in wrappers:
                    names[key] = wrappers[id(value)]
                    self.patched.append((names, key, value))

    def _clipping(self, original, name: str):
        keyword = "max_norm" if name == "clip_grad_norm_" else "clip_value"

        def clipping(*args, **kwargs):
            self.clips.append((name, self.backward_passes()))
            limit = kwargs.get(keyword, args[1] if len(args) > 1 else None)
            if isinstance(limit, (int, float)) and limit == 0:
                self.zero_clips.append(f"{name}() with {keyword}={limit}")
            return original(*args, **kwargs)

        clipping._gradstop_watch = True
        return clipping

    def clipped_too_early(self) -> str:
        """The clipping function that ran only before the block's last backward()."""
        last = self.backward_passes()
        early = [name for name, n in self.clips if n < last]
        after = [name for name, n in self.clips if n == last]
        return early[0] if last and early and not after else ""

    def _note_inputs(self, module, args, kwargs) -> None:
        for value in (*args, *kwargs.values()):
            for t in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(t, torch.Tensor):
                    self.inputs[id(t)] = t

    def _counter(self, key: str):
        def count(module, args) -> None:
            self.forwards[key] += 1

        return count

    def backward_passes(self) -> int:
        """How many backward passes that fill .grad have run in the block so far."""
        return sum(p.fills for p in passes(self.recording))

    def _watch_zero_grad(self, owner) -> None:
        """Note each zero_grad() of the optimizer or the model (PyTorch has no hook for it)."""
        original, had = owner.zero_grad, "zero_grad" in vars(owner)

        def zero_grad(*args, **kwargs):
            # a zero_grad() that finds no gradient to clear throws nothing away (a GAN's
            # generator step after the discriminator's backward through fake.detach())
            kind = "zero_grad" if _holds_gradient(owner) else "zero_grad of nothing"
            self.events.append((kind, self.backward_passes()))
            return original(*args, **kwargs)

        owner.zero_grad = zero_grad
        self.wrapped.append((owner, had, original))

    @property
    def step_before_backward(self) -> bool:
        """The first optimizer.step() ran before any backward(), and a backward() after it."""
        steps = [n for kind, n in self.events if kind == "step"]
        return bool(steps) and steps[0] == 0 and self.backward_passes() > steps[-1]

    def wiped(self) -> int:
        """zero_grad() calls that threw away the gradients of earlier backward passes (with
        no optimizer.step() since them) before more backward passes ran."""
        count, last = 0, 0  # backward passes at the last step() or zero_grad()
        for kind, n in self.events:
            if kind == "zero_grad of nothing":
                continue
            if kind == "zero_grad" and n > last and n < self.backward_passes():
                count += 1
            last = n
        return count

    def cleared_last(self) -> bool:
        """A zero_grad() that found gradients ran after the block's last backward()."""
        last = self.backward_passes()
        return last > 0 and ("zero_grad", last) in self.events

    def _pre_step(self, optimizer, args, kwargs) -> None:
        self.steps += 1
        self.events.append(("step", self.backward_passes()))
        if self.steps > 1:
            return
        with torch._C.DisableTorchFunction():  # not part of the reader's step
            for group in optimizer.param_groups:
                for p in group["params"]:
                    self.at_step[id(p)] = _grad_state(p.grad)

    def held(self) -> set[int] | None:
        if self.optimizer is None:
            return None
        return {id(p) for group in self.optimizer.param_groups for p in group["params"]}

    def close(self) -> None:
        for names, key, original in reversed(self.patched):
            names[key] = original
        if self.handle is not None:
            self.handle.remove()
        for handle in self.forward_handles:
            handle.remove()
        for owner, had, original in self.wrapped:
            if had:
                owner.zero_grad = original
            else:
                del owner.zero_grad


def _candidates(model, optimizer, tensors, caller) -> list[tuple[str, torch.Tensor, bool | None]]:
    """(name, tensor, registered) for each tensor to report, each once."""
    found: dict[int, tuple[str, torch.Tensor, bool | None]] = {}
    if model is not None:
        for name, p in model.named_parameters():
            found.setdefault(id(p), (name, p, True))
        for name, t in naming.loose_tensors(model).values():
            found.setdefault(id(t), (name, t, False))
        for name, t in model.named_buffers():
            if t.requires_grad:  # a buffer: in state_dict(), never in parameters()
                found.setdefault(id(t), (name, t, False))
    if optimizer is not None:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        for i, p in enumerate(params):
            name = (
                naming.local_name(p, caller.f_locals, caller.f_globals)
                or f"the optimizer's parameter {i} (not the model's)"
            )
            found.setdefault(id(p), (name, p, None))
    for name, t in tensors.items():
        found[id(t)] = (name, t, None)
    return list(found.values())


def _losses(recording: Recording, caller) -> tuple[list, list[str]]:
    """The tensors backward() ran from, and their names.

    An autograd.grad() inside the step (a gradient penalty) is part of the forward
    pass, not a loss, unless no backward() that fills .grad ran.
    """
    ran = passes(recording)
    filling = [p for p in ran if p.fills] or ran
    losses = list({id(t): t for p in filling for t in p.outputs}.values())
    names = [
        recording.names.get(id(t)) or naming.local_name(t, caller.f_locals, {}) or "the loss"
        for t in losses
    ]
    return losses, names


def _fill(found: StepReport, watch: _Watch, recording: Recording, caller) -> None:
    """Diagnose every watched tensor against the losses backward() ran from."""
    losses, loss_names = _losses(recording, caller)
    watch.losses = losses
    model = watch.model
    modules = dict(model.named_modules()) if model is not None else naming.known_modules(caller)
    held, rows = watch.held(), []
    candidates = list(watch.candidates)
    if model is not None:
        known = {id(t) for _, t, _ in candidates} | (held or set())
        outside = naming.outside_leaves(losses, known, caller)
        candidates += [(n, t, False) for n, t in outside if id(t) not in watch.inputs]
        found.notes += _input_note(outside, watch, recording)
    for name, tensor, registered in candidates:
        in_optimizer = None if held is None else id(tensor) in held
        flag = False if registered is False and not in_optimizer else None
        diagnosis = _best(losses, loss_names, tensor, name, recording, modules, flag)
        at_step = watch.at_step.get(id(tensor), "None") if watch.steps and in_optimizer else ""
        before = watch.before.get(id(tensor))  # None: first seen in the graph
        changed = None if not watch.steps or before is None else not torch.equal(before, tensor)
        row = StepRow(name, diagnosis, in_optimizer, at_step, changed)
        verdict, problem = _verdict(row, tensor, before, watch, bool(found.error))
        rows.append(StepRow(name, diagnosis, in_optimizer, at_step, changed, verdict, problem))
    found.losses, found.steps, found.rows = tuple(loss_names), watch.steps, tuple(rows)
    found.optimizer, found.caveat = watch.optimizer is not None, _caveat(watch)
    found.notes = _ddp_note(watch) + found.notes  # first: it explains rows that all read "Fine"
    found.notes += module_notes(model, recording) if model is not None else ()
    found.notes += _rebound(watch, recording, caller)
    found.notes += _wiped_note(watch) + _unmoved_note(watch, rows, recording) + _prefix_note(rows)
    found.notes += _eval_note(model, rows) + _layout_notes(model, rows) + _model_notes(model)
    found.notes += _late_binding_note(watch.candidates) + _grad_mode_note(watch.grad_mode_at_start)
    found.notes += _code_notes(caller, watch, recording)
    found.unchecked = _custom_functions(watch, recording)
    behind = _leaves_behind_functions(losses, found.unchecked)
    found.behind = frozenset(name for name, t, _ in candidates if id(t) in behind)
    found.notes += _non_finite_note(watch, losses) + _custom_function_note(found, losses)
    found.explained = (
        explain(found.error.split(": ", 1)[-1], recording, modules) if found.error else ""
    )
    found.recording = recording


def _verdict(row: StepRow, tensor, before, watch: _Watch, raised: bool) -> tuple[str, str]:
    diagnosis = row.diagnosis
    if row.name in watch.tensors and not tensor.requires_grad and row.changed is False:
        return _UNWRITTEN_VERDICT, _UNWRITTEN  # named by the reader: meant to change?
    if not tensor.requires_grad and row.changed and before is not None:
        return UPDATED, ""  # an EMA, a target network: written in place, no gradient
    if diagnosis is not None and not row.changed and frozen_parameter(tensor, diagnosis):
        return FROZEN, ""
    verdict, problem = _assess(row, watch)
    if raised and diagnosis is not None and diagnosis.reason is Reason.NOT_YET:
        return verdict, _STOPPED  # the error is the cause; the usual NOT_YET advice is not
    if diagnosis is not None and diagnosis.reached and _is_buffer(tensor, watch.model):
        return "a buffer, not a parameter", _BUFFER.format(
            name=row.name, attr=row.name.rsplit(".", 1)[-1]
        )
    if verdict and not problem and _non_finite_grad(tensor):
        finite = all(bool(torch.isfinite(t.detach()).all()) for t in watch.losses)
        return "its .grad holds NaN or inf", _NON_FINITE if finite else _NON_FINITE_LOSS
    if _updated_by_hand(diagnosis, before, tensor, watch):
        return "", ""  # filled, used and reset inside the block: a fine step
    if diagnosis is not None and diagnosis.reason is Reason.NOT_YET and watch.cleared_last():
        return _CLEARED, _cleared_problem(watch)  # filled, then reset before any use
    return verdict, problem


UPDATED = "updated in place by the block, without a gradient (requires_grad=False)"
_UNWRITTEN_VERDICT = "unchanged by the block (requires_grad=False, and nothing wrote to it)"
_UNWRITTEN = (
    "nothing in the block changed it, and no gradient can (it does not require grad). If "
    "something here should update it (an EMA of the weights, a target network), that "
    "update did not write into it: write in place, under torch.no_grad(), as "
    "p.mul_(decay).add_(q, alpha=1 - decay) or p.copy_(new), or load the values with "
    "load_state_dict(); assigning a new tensor to a state_dict() entry (state[key] = new) "
    "or to a loop variable only rebinds that name."
)


def _updated_by_hand(diagnosis, before, tensor, watch: _Watch) -> bool:
    """NOT_YET only because the block read .grad, changed the tensor, then reset .grad
    (with torch.no_grad(): w -= lr * w.grad; w.grad = None): a hand-written step."""
    if diagnosis is None or diagnosis.reason is not Reason.NOT_YET or before is None:
        return False
    states = watch.recording.states
    read = any(states[s].tensor is tensor for s, _ in recorder.grad_reads(watch.recording))
    return read and watch.backward_passes() > 0 and not torch.equal(before, tensor)


_CLEARED = "backward() filled its .grad, then zero_grad() cleared it"


def _cleared_problem(watch: _Watch) -> str:
    """zero_grad() after the block's last backward(): the gradient existed, and is gone."""
    after = [kind for kind, n in watch.events if n == watch.backward_passes()]
    stepped = "step" in after[after.index("zero_grad") :]
    where = (
        "before optimizer.step(), so the step found .grad None and did not move it"
        if stepped
        else "so .grad reads None after the block"
    )
    return (
        f"zero_grad() ran after the last backward() of the block, {where}: call zero_grad() "
        "before backward() or after step(), never between them (and read .grad before it)."
    )


_BUFFER = (
    "backward() from the loss reaches {name} and fills its .grad, but {name} is a buffer "
    "(register_buffer): state_dict() and .to() include it, model.parameters() does not, "
    "so no optimizer built from the model changes it. To train it, make it a parameter: "
    "self.{attr} = nn.Parameter(...) in place of register_buffer."
)


def _is_buffer(tensor, model) -> bool:
    return model is not None and any(b is tensor for b in model.buffers())


_NON_FINITE = (
    "the note on NaN below says how to find the operation whose backward made it, and "
    "the usual fix."
)


_NON_FINITE_LOSS = (
    "the loss itself is NaN or inf, so every gradient from it is: find the step where the "
    "loss first stops being finite (print it each step) and what made it grow there (a "
    "learning rate too high, gradients left unclipped, a log or division at 0)."
)


def _non_finite_grad(tensor) -> bool:
    # a non-leaf's .grad is read only if it keeps one (reading it otherwise warns)
    grad = tensor.grad if (tensor.is_leaf or tensor.retains_grad) else None
    return grad is not None and not bool(torch.isfinite(grad).all())


_STOPPED = (
    "the graph of the loss reaches it, but the block raised (above) before a backward() "
    "filled its .grad: fix that error first, then run the step again."
)


def _late_binding_note(candidates) -> tuple[str, ...]:
    """Hooks on several tensors that are one function reading one variable when it runs."""
    by_code: dict[object, list[tuple[str, object]]] = {}
    for name, tensor, _ in candidates:
        for hook in (getattr(tensor, "_backward_hooks", None) or {}).values():
            if getattr(hook, "__code__", None) is not None and not hook.__defaults__:
                by_code.setdefault(hook.__code__, []).append((name, hook))
    notes = []
    for hooked in by_code.values():
        shared = _shared_variables([hook for _, hook in hooked]) if len(hooked) > 1 else {}
        for variable, value in shared.items():
            names = ", ".join(name for name, _ in hooked)
            notes.append(
                f"the hooks on {names} are one function that reads {variable} when it runs "
                f"(now {value!r}), not the value {variable} had when each was registered: if "
                f"each was meant to keep its own, bind it as a default argument "
                f"(lambda grad, {variable}={variable}: ...)"
            )
    return tuple(notes)


def _shared_variables(hooks) -> dict[str, object]:
    """Plain values (numbers, tensors) that every hook reads from one shared place."""
    first, shared = hooks[0], {}
    code = first.__code__
    for i, variable in enumerate(code.co_freevars):
        cells = {id(hook.__closure__[i]) for hook in hooks}
        if len(cells) == 1:
            shared[variable] = first.__closure__[i].cell_contents
    for variable in code.co_names:
        if variable in first.__globals__ and all(h.__globals__ is first.__globals__ for h in hooks):
            shared[variable] = first.__globals__[variable]
    return {k: v for k, v in shared.items() if isinstance(v, (int, float, torch.Tensor))}


def _code_notes(caller, watch: _Watch, recording: Recording) -> tuple[str, ...]:
    """What the reader's code did that changes nothing it meant to change."""
    discarded = _discarded_hook_note(recording, watch.candidates)
    return _comparison_note(caller) + _clip_note(watch) + discarded


def _discarded_hook_note(recording: Recording, candidates) -> tuple[str, ...]:
    """A tensor hook that rebinds its gradient argument and returns nothing: the new
    value is thrown away, and PyTorch keeps the gradient it passed in."""
    tensors = [state.tensor for state in recording.states] + [t for _, t, _ in candidates]
    hooks = {
        id(h): h
        for t in tensors
        for h in (getattr(t, "_backward_hooks", None) or {}).values()
        if getattr(h, "__code__", None) is not None and h.__name__ != "<lambda>"
    }
    notes = []
    for hook in hooks.values():
        rebound = _rebound_without_return(hook)
        if rebound is not None:
            argument, value = rebound
            notes.append(
                f"the hook {hook_name(hook)} sets {argument} = {value} and returns nothing, "
                f"so the new value is thrown away and the gradient goes on unchanged: "
                f"return it instead, `return {value}`"
            )
    return tuple(notes)


def _rebound_without_return(hook) -> tuple[str, str] | None:
    """(argument, new value) if ``hook`` assigns to its first argument and never returns
    a value; else None."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(hook)))
    except (OSError, TypeError, SyntaxError):
        return None
    function = next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)), None)
    if function is None or not function.args.args:
        return None
    argument = function.args.args[0].arg
    assigned, returns = None, False
    for node in _own_nodes(function):
        if isinstance(node, ast.Return) and node.value is not None:
            returns = returns or not (
                isinstance(node.value, ast.Constant) and node.value.value is None
            )
        targets = node.targets if isinstance(node, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == argument for t in targets):
            assigned = ast.unparse(node.value)
    return (argument, assigned) if assigned and not returns else None


def _own_nodes(function):
    """The nodes of a function's body, not those of functions defined inside it."""
    stack = list(function.body)
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(node))


def _clip_note(watch: _Watch) -> tuple[str, ...]:
    """Gradient clipping called before the backward() whose gradient the step uses."""
    name = watch.clipped_too_early()
    if not name:
        return ()
    return (
        f"{name}() ran before the block's last backward(), so it clipped what .grad held "
        "then (after zero_grad(): nothing), and the gradient backward() computed afterwards "
        "reached optimizer.step() unclipped: call it after loss.backward() and before "
        "optimizer.step()",
    )


def _input_note(outside, watch: _Watch, recording: Recording) -> tuple[str, ...]:
    """Tensors passed to the model that require grad: data, not parameters to register
    (unless a backward pass asked for their gradient: inputs= or autograd.grad)."""
    asked = {id(t) for p in passes(recording) for t in (p.inputs or ())}
    names = [n for n, t in outside if id(t) in watch.inputs and id(t) not in asked]
    if not names:
        return ()
    which = ", ".join(names)
    return (
        f"{which}: passed to the model as input, and requires grad, so backward() fills its "
        ".grad (the gradient with respect to the input, as for a saliency map or an "
        "adversarial example). It is data, not a parameter: no optimizer changes it, and "
        "nothing needs registering. If you did not mean to ask for that gradient, create it "
        "without requires_grad=True (it only costs time)",
    )


def _full_hook_note(model) -> tuple[str, ...]:
    """A module's full backward hook, which cannot change its own parameters' gradients."""
    notes = []
    for name, module in model.named_modules() if model is not None else ():
        own = [
            f"{name}.{n}" if name else n
            for n, p in module.named_parameters(recurse=False)
            if p.requires_grad
        ]
        if not (module._backward_hooks and own):
            continue
        who = name or "the model"
        hooks = ", ".join(hook_name(h) for h in module._backward_hooks.values())
        where = "".join(f"[{part}]" if part.isdigit() else f".{part}" for part in name.split("."))
        first = f"model{where if name else ''}.{own[0].rsplit('.', 1)[-1]}"
        notes.append(
            f"{who} has a full backward hook ({hooks}): it gets and may replace grad_input, "
            f"the gradient for {who}'s input, which goes on to the layers before it; "
            f"{who}'s own parameters ({', '.join(own)}) get their gradients from "
            "grad_output, so the hook cannot change them. To change a parameter's gradient, "
            f"hook the parameter: {first}.register_hook(lambda grad: grad * mask) (with "
            "momentum or weight decay, also re-apply the mask to the weight after each step)"
        )
    return tuple(notes)


def _comparison_note(caller) -> tuple[str, ...]:
    """A statement that compares requires_grad (`p.requires_grad == False`) and so does
    nothing, in the code that runs the step: the file of each frame up the stack, and a
    notebook's cells."""
    files = {frame.f_code.co_filename for frame in _frames(caller)}
    files |= {f for f in linecache.cache if "ipykernel" in f or f.startswith("<ipython-input")}
    notes = []
    for filename in sorted(files):
        for line, text in _no_op_comparisons(filename):
            notes.append(
                f"`{text}` ({_where(filename)}line {line}) compares and throws the answer "
                "away: it freezes or unfreezes nothing. Assign instead: "
                f"`{text.replace(' == ', ' = ').replace(' != ', ' = not ')}`, or call "
                "requires_grad_(False) on the tensor or module"
            )
    return tuple(notes)


def _frames(frame):
    while frame is not None:
        yield frame
        frame = frame.f_back


def _where(filename: str) -> str:
    return "" if "ipykernel" in filename or filename.startswith("<") else f"{filename}, "


def _no_op_comparisons(filename: str) -> list[tuple[int, str]]:
    """(line, code) of each expression statement comparing a .requires_grad."""
    try:
        tree = ast.parse("".join(linecache.getlines(filename)))
    except (SyntaxError, ValueError):
        return []
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Compare)):
            continue
        sides = [node.value.left, *node.value.comparators]
        if any(isinstance(x, ast.Attribute) and x.attr == "requires_grad" for x in sides):
            found.append((node.lineno, ast.unparse(node.value)))
    return found


def _ddp_note(watch: _Watch) -> tuple[str, ...]:
    """The model is a DistributedDataParallel, but the block called its .module directly."""
    if not watch.forwards["inner"] or watch.forwards["wrapper"]:
        return ()
    return (
        "the model is a DistributedDataParallel, but its forward() never ran: the block "
        "called the wrapped module directly (ddp_model.module(x)), so DDP did not prepare "
        "the gradient all-reduce, each process stepped with its own gradient, and the "
        "replicas drift apart although every gradient arrived. Call the wrapper, "
        "ddp_model(x)",
    )


def _rebound(watch: _Watch, recording: Recording, caller) -> tuple[str, ...]:
    """A named tensor whose variable the block rebound to one computed from its .grad."""
    notes = []
    for name, tensor in watch.tensors.items():
        now = caller.f_locals.get(name)
        if not isinstance(now, torch.Tensor) or now is tensor or now.grad_fn is None:
            continue
        if recorded.from_grad(recording, recorded.links(recording, now, now)):
            notes.append(
                f"{name} now holds a new tensor computed from {name}.grad ({name} = {name} - "
                f"lr * {name}.grad): not a leaf, so the next backward() leaves {name}.grad "
                f"None, and the graph behind {name} grows every step; update it in place "
                f"instead, `with torch.no_grad(): {name} -= lr * {name}.grad`"
            )
    return tuple(notes)


def _wiped_note(watch: _Watch) -> tuple[str, ...]:
    """zero_grad() between backward passes of one step: gradient accumulation undone."""
    count = watch.wiped()
    if not count:
        return ()
    times = "once" if count == 1 else f"{count} times"
    stepped = ", and optimizer.step() used only the gradient of the last" if watch.steps else ""
    return (
        f"zero_grad() ran between backward passes with no optimizer.step() between them "
        f"({times}): each time it reset .grad and threw away the gradients the backward() "
        f"calls before it had summed there, so only the backward() calls after the last "
        f"zero_grad() count{stepped}. To accumulate gradients over micro-batches, call "
        "zero_grad() once per optimizer.step() (after the step, or before the first "
        "micro-batch), not before every backward(), and divide each micro-batch's loss by "
        "their number",
    )


_NUMBERED = re.compile(r"^(.*?)(\d+)\.")  # "layers.10.linear1.weight": "layers.", 10


def _prefix_note(rows) -> tuple[str, ...]:
    """Layers of one numbered container frozen as a test by prefix leaves them: layers.1,
    layers.10 and layers.11 frozen, layers.2 to 9 not (startswith("layers.1"))."""
    containers: dict[str, dict[int, set[bool]]] = {}
    for row in rows:
        if match := _NUMBERED.match(row.name):
            layers = containers.setdefault(match[1], {})
            layers.setdefault(int(match[2]), set()).add(row.verdict == FROZEN)
    for prefix, layers in containers.items():
        frozen = sorted(i for i, kinds in layers.items() if kinds == {True})
        trained = sorted(i for i, kinds in layers.items() if False in kinds)
        for short in frozen:
            longer = [i for i in frozen if i != short and str(i).startswith(str(short))]
            between = [i for i in trained if short < i < max(longer, default=short)]
            if longer and between:
                return (_prefix_sentence(prefix, short, longer, between),)
    return ()


def _prefix_sentence(prefix: str, short: int, longer: list[int], between: list[int]) -> str:
    names = [f"{prefix}{i}" for i in longer]
    caught = " and ".join([", ".join(names[:-1]), names[-1]] if names[1:] else names)
    verb = "are" if names[1:] else "is"
    first, last = f"{prefix}{between[0]}", f"{prefix}{between[-1]}"
    return (
        f"{prefix}{short} is frozen, and so {verb} {caught}, while {first} to {last} "
        f'train: a name test such as name.startswith("{prefix}{short}") matches {caught} '
        f'too; test name.startswith("{prefix}{short}.") (with the dot), or freeze the '
        f"modules themselves ({prefix.rstrip('.')}[{short}].requires_grad_(False))"
    )


def _unmoved_note(watch: _Watch, rows, recording: Recording) -> tuple[str, ...]:
    """No optimizer.step(), .grad read to compute new values, and no parameter changed."""
    if watch.steps or not watch.backward_passes():
        return ()
    computed = [
        name
        for name, tensor, _ in watch.candidates
        if torch.equal(watch.before[id(tensor)], tensor.detach())
        and _computed_from_grad(recording, tensor)
    ]
    moved = any(not torch.equal(watch.before[id(t)], t.detach()) for _, t, _ in watch.candidates)
    if not computed or moved:
        return ()
    return (
        f"the block computed new values from {', '.join(computed)} and their .grad "
        "(p - lr * p.grad), but changed no parameter: `p = p - lr * p.grad` binds the name "
        "p to a new tensor and leaves the parameter as it was (in `for p in "
        "model.parameters():` it rebinds only the loop variable). Update each parameter "
        "in place, `with torch.no_grad(): p -= lr * p.grad` (or p.sub_(lr * p.grad)), then "
        "p.grad = None; or use an optimizer",
    )


def _non_finite_note(watch: _Watch, losses) -> tuple[str, ...]:
    """A .grad that holds NaN or inf after a backward() from a finite loss."""
    if not watch.backward_passes():
        return ()
    finite_losses = all(bool(torch.isfinite(t.detach()).all()) for t in losses)
    bad = [
        name
        for name, tensor, _ in watch.candidates
        # a non-leaf's .grad is read only if it keeps one (reading it otherwise warns)
        if _non_finite_grad(tensor)
    ]
    if not bad or not finite_losses:
        return ()
    return (
        f"{', '.join(bad)}: .grad holds NaN or inf, although the loss is finite, so a "
        "backward function made it. Run the step once under "
        "torch.autograd.set_detect_anomaly(True): it names the operation whose backward "
        "first returned NaN. A common cause is torch.where(cond, f(x), other) with f "
        "infinitely steep where cond is False (sqrt or log at 0): where() sends that "
        "branch a zero gradient, and zero times inf is NaN. Make the input safe before f, "
        "f(torch.where(cond, x, safe)), not only its output",
    )


# Regions that are not a custom Function the reader wrote.
_NOT_WRITTEN = ("CheckpointFunction", "BackwardHookFunction", recorder.STEP)


def _custom_functions(watch: _Watch, recording: Recording) -> tuple[str, ...]:
    """The custom autograd Functions a backward() of the block ran through."""
    if not watch.backward_passes():
        return ()
    regions = {
        c.region
        for c in recording.calls
        if c.region and c.region not in _NOT_WRITTEN and not c.region.startswith("Compiled")
    }
    return tuple(sorted(regions))


def _leaves_behind_functions(losses, functions: tuple[str, ...]) -> frozenset[int]:
    """The leaves whose gradient came back through one of these custom Functions."""
    nodes = {f"{name}Backward" for name in functions}
    behind, seen = set(), set()
    stack = [(t.grad_fn, False) for t in losses if t.grad_fn is not None]
    while stack:
        node, under = stack.pop()
        under = under or type(node).__name__ in nodes
        if (id(node), under) in seen:
            continue
        seen.add((id(node), under))
        leaf = getattr(node, "variable", None)
        if under and leaf is not None:
            behind.add(id(leaf))
        stack += [(n, under) for n, _ in node.next_functions if n is not None]
    return frozenset(behind)


def _custom_function_note(found: StepReport, losses) -> tuple[str, ...]:
    """A backward() ran through a custom autograd Function: its backward() is unchecked,
    and wrong for certain if it never reads the gradient it is handed."""
    written = found.unchecked
    if not written:
        return ()
    name = written[0]
    found.ignoring = tuple(n for n in written if _ignores_grad_output(_function_class(losses, n)))
    if found.ignoring:
        ignored = found.ignoring[0]
        arg = _function_class(losses, ignored).backward.__code__.co_varnames[1]
        return (
            f"{ignored}.backward() never reads the gradient it is handed ({arg}): by the "
            f"chain rule it must return {arg} times its own derivative; as written, what it "
            f"returns does not depend on the loss at all. Multiply it by {arg}, then check "
            f"it: torch.autograd.gradcheck({ignored}.apply, inputs) with small "
            "double-precision inputs that require grad",
        )
    return (
        f"the gradient passes through the custom autograd Function{'s' * (len(written) > 1)} "
        f"{', '.join(written)}, whose backward() is your code: autograd uses what it returns "
        "and checks its shape, dtype and device, not its values, so a wrong formula (one "
        "that ignores grad_output, say) raises nothing. Compare it with finite differences: "
        f"torch.autograd.gradcheck({name}.apply, inputs), inputs being the arguments of "
        "apply() with each floating-point tensor small, in double precision and requiring "
        "grad (other arguments as they are)",
    )


def _function_class(losses, name: str):
    """The custom Function class called ``name`` whose node is on the losses' graphs."""
    for node in (n for t in losses for n in backward_nodes(t)):
        cls = getattr(node, "_forward_cls", None)
        if cls is not None and cls.__name__ == name:
            return cls
    return None


def _ignores_grad_output(cls) -> bool:
    """Does ``cls.backward`` never read any of the gradients it is handed?"""
    code = getattr(getattr(cls, "backward", None), "__code__", None)
    if code is None or code.co_argcount < 2 or code.co_flags & inspect.CO_VARARGS:
        return False
    grads = set(code.co_varnames[1 : code.co_argcount])
    loads = {i.argval for i in dis.get_instructions(code) if i.opname.startswith("LOAD")}
    return not grads & loads and not code.co_freevars and not code.co_cellvars


def _computed_from_grad(recording: Recording, tensor) -> bool:
    """Was a new tensor computed from ``tensor`` and a read of its .grad?"""
    states = recording.states
    grads = {g for t, g in recorder.grad_reads(recording) if states[t].tensor is tensor}
    if not grads:
        return False
    g = recorded.links(recording, tensor, tensor)
    both = g.reach(grads, kept=False) & g.reach(g.mine, kept=False)
    return any(states[i].tensor is not tensor for i in both)


def _model_notes(model) -> tuple[str, ...]:
    return attribute_notes(model) + _full_hook_note(model)


def _layout_notes(model, rows) -> tuple[str, ...]:
    """What the model's layout does to gradients: a frozen parameter that one module holds
    in two places; an embedding row kept at zero by padding_idx."""
    if model is None:
        return ()
    frozen = {r.name for r in rows if r.verdict == FROZEN}
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    shared = {
        tuple(dict.fromkeys(n.rpartition(".")[0] or n for n in places))
        for places in names.values()
        if len(places) > 1 and places[0] in frozen
    }
    notes = [
        f"{places[0]} is also {' and '.join(places[1:])}: one module in {len(places)} "
        "places, so freezing it in one froze it in all. Freeze only the layers that belong "
        "to the part you mean (and rebuild the optimizer if it took only what trained)"
        for places in sorted(shared)
    ]
    for prefix, module in model.named_modules():
        index = getattr(module, "padding_idx", None)
        grad = getattr(getattr(module, "weight", None), "grad", None)
        if isinstance(module, torch.nn.Embedding) and index is not None and grad is not None:
            name = f"{prefix}.weight" if prefix else "weight"
            notes.append(
                f"{name}[{index}] gets no gradient, by design (padding_idx={index}): right "
                f"if {index} marks padding; if {index} is a real category, drop padding_idx"
            )
    return tuple(notes[:3])


def _eval_note(model, rows) -> tuple[str, ...]:
    """A module in eval mode whose parameters still get gradients: eval() freezes nothing."""
    if model is None:
        return ()
    trained = {r.name for r in rows if r.diagnosis is not None and r.diagnosis.reached}
    found, said = [], []
    for name, module in model.named_modules():
        if module.training or any(name.startswith(f"{p}.") or not p for p in said):
            continue
        mine = [
            f"{name}.{n}" if name else n
            for n, p in module.named_parameters()
            if p.requires_grad and (f"{name}.{n}" if name else n) in trained
        ]
        if mine:
            said.append(name)
            who = name or "the model"
            found.append(
                f"{who} is in eval mode ({who if name else 'model'}.eval()), which changes only "
                "what dropout and batch norm do in the forward pass and freezes nothing: its "
                f"parameters ({', '.join(mine[:4])}{', ...' if len(mine) > 4 else ''}) still "
                "get gradients, and optimizer.step() changes them. To freeze a parameter, "
                "call requires_grad_(False) on it before the forward pass (or leave it out "
                "of the optimizer)"
            )
    return tuple(found)


def _grad_mode_note(enabled_at_start: bool) -> tuple[str, ...]:
    """Gradient recording was already off when the block began."""
    if enabled_at_start:
        return ()
    return (
        "gradient recording was already off when the block began "
        "(torch.is_grad_enabled() was False): something before it switched it off for "
        "the whole thread and did not switch it back, most often torch.set_grad_enabled"
        "(False) called on its own line (not in a with statement), for instance in an "
        "evaluation function. Write `with torch.no_grad():` around the evaluation instead "
        "(or call torch.set_grad_enabled(True) after it)",
    )


def _best(losses, loss_names, tensor, name, recording, modules, flag) -> Diagnosis | None:
    """The verdict against the first loss that reaches the tensor, else the first loss."""
    found = [
        diagnose(loss, tensor, recording, (name, loss_name), modules, flag)
        for loss, loss_name in zip(losses, loss_names, strict=True)
    ]
    reached = next((d for d in found if d.reached), None)
    if reached is not None or len({d.sentence for d in found}) < 2:
        return reached or (found[0] if found else None)
    # no loss reaches it, each cut its own way: which cut is the mistake (a GAN's
    # generator loss through fake.detach()) is for the reader, so each is named
    each = " ".join(f"[{name}] {d.sentence}" for name, d in zip(loss_names, found, strict=True))
    return dataclasses.replace(found[0], sentence=f"no loss of the block reaches it. {each}")


def _lr_zero(watch: _Watch, tensor_id: int) -> bool:
    return _zero_lr_group(watch, tensor_id) is not None


def _groups_holding(watch: _Watch, tensor_id: int) -> list[dict]:
    groups = watch.optimizer.param_groups if watch.optimizer is not None else []
    return [g for g in groups if any(id(p) == tensor_id for p in g["params"])]


def _zero_lr_group(watch: _Watch, tensor_id: int) -> dict | None:
    return next((g for g in _groups_holding(watch, tensor_id) if g.get("lr") == 0), None)


def _lr_zero_reason(watch: _Watch, tensor_id: int) -> str:
    """Why the learning rate is 0: a scheduler set it (its group keeps ``initial_lr``)."""
    group = _zero_lr_group(watch, tensor_id)
    initial = group.get("initial_lr") if group is not None else None
    if not initial:
        return "its learning rate is 0"
    return (
        f"its learning rate is 0, set by a learning-rate scheduler (the group's initial_lr "
        f"is {initial:g}): check the factor the scheduler gives this step (for LambdaLR, "
        "what lr_lambda returned; an integer division such as step // warmup is 0 until "
        "the warm-up ends: use step / warmup)"
    )


# A parameter frozen on purpose (requires_grad_(False), a leaf the step left alone) is
# not a problem to fix: it is reported on a line of its own, with the way to unfreeze.
FROZEN = "frozen: requires_grad is False"


def _assess(row: StepRow, watch: _Watch) -> tuple[str, str]:
    """The row's verdict, and its problem with the fix ("" when the tensor is fine)."""
    d = row.diagnosis
    if d is None:
        return "", ""
    verdict = f"{d.reason.value} ({d.reason.name})"
    problem = d.sentence if d.reason is not Reason.OK else ""
    alone, remark = _step_remark(row, watch)
    if not problem and remark:
        verdict = alone
    return verdict, " ".join(part for part in (problem, remark) if part)


def _step_remark(row: StepRow, watch: _Watch) -> tuple[str, str]:
    """What optimizer.step() did with the tensor, when that is the problem."""
    reached = row.diagnosis.reached
    unregistered = row.diagnosis.reason is Reason.UNREGISTERED  # its sentence says it all
    if watch.step_before_backward and reached and row.in_optimizer:
        return _early_step_remark(row)
    if watch.steps and reached and row.in_optimizer is False and not unregistered:
        return _not_held_remark(watch)
    if reached and row.grad_at_step == "None" and not row.changed:
        return (
            "optimizer.step() ran while its .grad was None",
            "optimizer.step() ran while its .grad was None, so it did not move it: call "
            "zero_grad() before backward() or after step(), never between them.",
        )
    if row.changed and row.grad_at_step in ("zeros", "None"):
        return (
            "changed by optimizer.step() although its gradient was zero",
            f"Its gradient was {row.grad_at_step} at the step, yet optimizer.step() moved it: "
            "momentum or weight decay does that. Zeroing a gradient (a hook, a mask) does not "
            "freeze a parameter: leave it out of the optimizer, or set requires_grad_(False) "
            "before the forward pass.",
        )
    if row.grad_at_step == "zeros" and reached and watch.zero_clips:
        return _zero_clip_remark(watch.zero_clips[0])
    if row.changed is False and row.grad_at_step == "zeros" and reached:
        return (
            "its gradient was all zeros, so optimizer.step() did not move it",
            f"Its gradient was all zeros at the step, so optimizer.step() did not move it: "
            f"{_flat_advice(_zero_causes(watch.losses, _tensor_of(row, watch), watch.recording))}",
        )
    if row.changed is False and row.grad_at_step == "a gradient":
        lr_zero = _lr_zero(watch, id_of(row, watch))
        why = _lr_zero_reason(watch, id_of(row, watch)) if lr_zero else _too_small(row, watch)
        return "the step did not change it", f"optimizer.step() did not change it: {why}."
    if row.changed and row.grad_at_step == "a gradient":
        return _partly_moved(row, watch)
    return "", ""


def _zero_clip_remark(call: str) -> tuple[str, str]:
    return (
        f"{call} set its gradient to zero",
        f"Its gradient was all zeros at the step: {call} scales every gradient to zero (and "
        "returns the norm from before clipping, so a logged norm looks fine). Pass the limit "
        "you mean, or skip the call when clipping is off (if max_norm: clip_grad_norm_(...)).",
    )


# Float types whose rounding step can swallow an optimizer's update (8 or 11 bits).
LOW_PRECISION = {torch.bfloat16: ("bfloat16", 256), torch.float16: ("float16", 2048)}


def _too_small(row: StepRow, watch: _Watch) -> str:
    tensor = _tensor_of(row, watch)
    if _feeds_batchnorm(row.name, watch.model):
        return (
            "the change is below float precision: a bias that feeds a BatchNorm gets no "
            "gradient but rounding (in training mode BatchNorm subtracts the batch mean, and "
            "the bias only shifts that mean), so leave it out: bias=False on that layer"
        )
    decayed = _decayed_lr(watch, id(tensor))
    if decayed:
        return decayed
    if tensor.dtype not in LOW_PRECISION:
        return "the change is below float precision"
    name, steps = LOW_PRECISION[tensor.dtype]
    return f"the change is below float precision. {_precision_advice(name, steps)}"


def _decayed_lr(watch: _Watch, tensor_id: int) -> str:
    """A learning rate a scheduler has taken below a millionth of where it started."""
    for group in _groups_holding(watch, tensor_id):
        initial, lr = group.get("initial_lr"), group.get("lr")
        if initial and lr is not None and 0 < lr < initial * 1e-6:
            return (
                f"its learning rate is {lr:.1e}, down from the initial_lr {initial:g} a "
                "scheduler started from: check how often scheduler.step() runs (a schedule "
                "meant per epoch, stepped every batch, decays that many times faster)"
            )
    return ""


def _feeds_batchnorm(name: str, model) -> bool:
    """Is ``name`` the bias of a layer that an nn.Sequential follows with a BatchNorm?"""
    if model is None or not name.endswith(".bias"):
        return False
    parent_name, _, index = name[: -len(".bias")].rpartition(".")
    parent = dict(model.named_modules()).get(parent_name)  # "": the model itself
    if not isinstance(parent, torch.nn.Sequential) or not index.isdigit():
        return False
    following = list(parent)[int(index) + 1 : int(index) + 2]
    return bool(following) and isinstance(following[0], torch.nn.modules.batchnorm._BatchNorm)


def _precision_advice(name: str, steps: int) -> str:
    return (
        f"In {name} an update smaller than about 1/{steps} of a weight rounds away: keep "
        f"the weights in float32 and compute in {name} under torch.autocast"
    )


def _partly_moved(row: StepRow, watch: _Watch) -> tuple[str, str]:
    """A low-precision tensor the step changed in a few entries only: updates rounded away."""
    tensor = _tensor_of(row, watch)
    before = watch.before.get(id(tensor))
    if tensor.dtype not in LOW_PRECISION or before is None or before.shape != tensor.shape:
        return "", ""
    with torch._C.DisableTorchFunction():  # not part of the reader's step
        moved, total = int((before != tensor).sum()), tensor.numel()
    if moved * 2 >= total:
        return "", ""
    name, steps = LOW_PRECISION[tensor.dtype]
    return (
        f"optimizer.step() changed only {moved} of its {total} entries",
        f"optimizer.step() changed only {moved} of its {total} entries: the others' "
        f"updates rounded away. {_precision_advice(name, steps)}.",
    )


# Operations whose derivative is zero wherever it exists: every gradient behind them is 0.
FLAT = {
    "RoundBackward0": "round()",
    "RoundBackward1": "round()",
    "FloorBackward0": "floor()",
    "CeilBackward0": "ceil()",
    "SignBackward0": "sign()",
    "TruncBackward0": "trunc()",
}


# Operations whose derivative is zero wherever the input lies outside their bounds.
SATURATING = {
    "ClampBackward1": "clamp()",
    "HardtanhBackward0": "hardtanh()",
    "ReluBackward0": "relu()",
}


def _tensor_of(row: StepRow, watch: _Watch):
    return next(t for name, t, _ in watch.candidates if name == row.name)


def _zero_causes(losses, tensor, recording: Recording) -> list[str]:
    """What between ``tensor`` and the losses can make its gradient zero: a flat
    operation; a softmax over a dimension of size 1 ("size-1 softmax:"); else a
    saturating one whose recorded output does not show it passing ("saturating:").
    The recording's outputs stand in for the saved tensors, freed by backward()."""
    made = {id(s.grad_fn): s.tensor for s in recording.states if s.grad_fn is not None}
    on_path = [(n, made.get(id(n))) for t in losses for n in _nodes_leading_to(t, tensor)]
    names = {type(n).__name__ for n, _ in on_path}
    flat = sorted({FLAT[n] for n in names if n in FLAT})
    softmaxes = [_size_one_softmax(n, out) for n, out in on_path]
    single = sorted({f"size-1 softmax:{found}" for found in softmaxes if found})
    saturating = {SATURATING[type(n).__name__] for n, out in on_path if _maybe_saturated(n, out)}
    return flat + single or sorted(f"saturating:{name}" for name in saturating)


def _nodes_leading_to(loss, tensor) -> list:
    """The backward nodes of ``loss`` from which ``tensor``'s own node is reached."""
    if loss.grad_fn is None:
        return []
    target = tensor.grad_fn if tensor.grad_fn is not None else None
    leads: dict[object, bool] = {}
    stack = [(loss.grad_fn, False)]
    while stack:  # iterative post-order: a deep graph must not hit Python's recursion limit
        node, expanded = stack.pop()
        if node in leads and not expanded:
            continue
        children = [c for c, _ in getattr(node, "next_functions", ()) if c is not None]
        if not expanded:
            stack.append((node, True))
            stack += [(c, False) for c in children if c not in leads]
            continue
        own = node is target or getattr(node, "variable", None) is tensor
        leads[node] = own or any(leads.get(c, False) for c in children)
    return [n for n, yes in leads.items() if yes and n is not target]


def _size_one_softmax(node, output) -> str:
    """ "softmax() of shape (6, 50, 1)": a softmax that is 1 everywhere (log_softmax: 0)
    over a shape with a dimension of size 1, the likely dimension it was taken over."""
    kinds = {"SoftmaxBackward0": ("softmax", 1.0), "LogSoftmaxBackward0": ("log_softmax", 0.0)}
    if type(node).__name__ not in kinds or output is None or 1 not in output.shape:
        return ""
    op, constant = kinds[type(node).__name__]
    with torch._C.DisableTorchFunction():  # not part of the reader's step
        if not bool((output == constant).all()):
            return ""
    return f"{op}() of shape {tuple(output.shape)}"


def _maybe_saturated(node, output) -> bool:
    """A saturating node, unless its recorded output shows it passing a gradient."""
    kind = type(node).__name__
    if kind not in SATURATING:
        return False
    if kind == "ReluBackward0" and output is not None:
        with torch._C.DisableTorchFunction():
            return not bool((output > 0).any())
    return True


def _flat_advice(flat: list[str]) -> str:
    single = [name.split(":", 1)[1] for name in flat if name.startswith("size-1 softmax:")]
    if single:
        return (
            f"the loss passes through {' and '.join(single)}: a softmax over a dimension of "
            "size 1 is 1 whatever its input, so no gradient passes it. Take it over the "
            "dimension whose entries should compete (for scores of shape (batch, time, 1), "
            "dim=1)."
        )
    if not flat:
        return (
            "something on the path has a zero derivative here (a flat step such as round() "
            "or sign(), a clamp() past its bound, ReLUs that are all off): look at each "
            "operation between the parameter and the loss."
        )
    if flat[0].startswith("saturating:"):
        ops = " and ".join(name.split(":", 1)[1] for name in flat)
        return (
            f"the loss passes through {ops}, whose derivative is zero wherever the input lies "
            f"outside its bounds{' (below 0 for relu())' if 'relu()' in ops else ''}, so if "
            "every input fell outside them, every gradient behind it is zero. Look at the "
            "input's range: standardise the inputs (and initialise small), or use a smooth "
            "function instead (sigmoid for a clamp to [0, 1])."
        )
    ops = " and ".join(flat)
    return (
        f"the loss passes through {ops}, whose derivative is zero wherever it exists, so "
        "every gradient behind it is zero. Compute the loss from the value before it (for "
        "0/1 outputs, binary cross-entropy on the logits), or, to keep it in the forward "
        "pass, use a straight-through estimator: x + (x.round() - x).detach()."
    )


def _not_held_remark(watch: _Watch) -> tuple[str, str]:
    """The model's tensor is not among the optimizer's: left out, or a stale optimizer."""
    if _groups_leave_out(watch):
        return (
            "the gradient arrives, but no param group of the optimizer lists it",
            "optimizer.step() never changes it: every tensor the optimizer holds is one "
            "of the model's, but its param groups leave this one out; add it, "
            "optimizer.add_param_group({'params': [...], 'lr': ...}), or list its module "
            "in the groups when building the optimizer.",
        )
    return (
        "the gradient arrives, but the optimizer does not hold it",
        "optimizer.step() never changes it: the optimizer holds another tensor (a "
        "parameter replaced after the optimizer was built, or an optimizer built from "
        "another model's parameters): build the optimizer from the model you train, "
        "after it is final.",
    )


def _groups_leave_out(watch: _Watch) -> bool:
    """Every tensor the optimizer holds is one of the model's: it lacks some, holds no
    stale copy."""
    held = watch.held()
    if watch.model is None or not held:
        return False
    return held <= {id(p) for p in watch.model.parameters()}


def _early_step_remark(row: StepRow) -> tuple[str, str]:
    """optimizer.step() ran before any backward() of the block, and backward() after it."""
    used = (
        "while its .grad was None, so it did not move it"
        if row.grad_at_step == "None"
        else "so it moved it with the .grad left from an earlier backward(), not with "
        "this step's gradient"
    )
    return (
        "optimizer.step() ran before backward()",
        f"optimizer.step() ran before backward() in this step, {used}; the gradient "
        "backward() computed afterwards waits in .grad for the next step (or for a "
        "zero_grad() to clear it): call loss.backward() first, then optimizer.step().",
    )


def id_of(row: StepRow, watch: _Watch) -> int:
    return id(_tensor_of(row, watch))


def _lines(report: StepReport) -> list[str]:
    steps = f"; optimizer.step() ran {report.steps} time{'s' if report.steps != 1 else ''}"
    steps = steps if report.optimizer else ""
    ran = (
        f"backward() from {', '.join(report.losses)}"
        if report.losses
        else "no backward() ran in the block"
    )
    lines = [f"diagnose_step: {ran}{steps}."]
    if report.error:
        said = f"The block raised {report.error.split(' Hint:')[0]}"
        stop = "" if said.endswith((".", "!", "?")) else "."
        said += f"{stop} What it means: {report.explained}." if report.explained else ""
        lines.append(textwrap.fill(said, 78, subsequent_indent="  "))
    lines += _fine_and_frozen_lines(report)
    for names, row in _grouped([r for r in report.rows if r.problem]):
        lines.append(
            textwrap.fill(f"{', '.join(names)}: {row.verdict}", 78, subsequent_indent="  ")
        )
        problem = (
            row.problem if len(names) == 1 else f"(said for {row.name}, true of each) {row.problem}"
        )
        lines.append(textwrap.fill(problem, 78, initial_indent="    ", subsequent_indent="    "))
    lines += [textwrap.fill(f"Note: {n}.", 78, subsequent_indent="    ") for n in report.notes]
    if not report.losses and report.error:
        lines.append("The block raised before any backward() ran: fix that error first.")
    elif not report.losses:
        lines.append("Put loss.backward() inside the block, so the report knows the loss.")
    return lines


def _fine_and_frozen_lines(report: StepReport) -> list[str]:
    """The rows with nothing to fix: a line for the fine ones, for those behind a custom
    Function, for those updated without a gradient, and for the frozen ones."""
    ok = [r for r in report.rows if r.diagnosis is not None and not r.problem]
    ok = [r for r in ok if r.verdict not in (FROZEN, UPDATED)]
    through = [r.name for r in ok if r.name in report.behind]
    fine = [r.name for r in ok if r.name not in through]
    said = []
    if through and report.ignoring:
        said.append(
            f"A gradient arrived, through {', '.join(report.ignoring)}, a custom Function "
            "whose backward() ignores grad_output, so it is wrong (see the note): "
            + ", ".join(through)
        )
    elif through:
        said.append(
            f"A gradient arrived, through {', '.join(report.unchecked)} (a custom Function: "
            "its value is not checked, see the note): " + ", ".join(through)
        )
    if fine:
        moved = ", and optimizer.step() changed it" if report.steps else ""
        if report.caveat:  # not "Fine": the note says what the step got wrong
            said.append(f"The gradient arrived{moved}, but {report.caveat} (see the note): ")
            said[-1] += ", ".join(fine)
        else:
            said.append(f"Fine (the gradient arrived{moved}): " + ", ".join(fine))
    said += _without_gradient_lines(report)
    return [textwrap.fill(line, 78, subsequent_indent="  ") for line in said]


def _without_gradient_lines(report: StepReport) -> list[str]:
    """Rows that get no gradient on purpose: updated in place, or frozen."""
    frozen_rows = [r for r in report.rows if r.verdict == FROZEN]
    updated = [r.name for r in report.rows if r.verdict == UPDATED]
    said = []
    if updated:
        said.append(
            "Updated in place, without a gradient (requires_grad=False: an EMA or a target "
            "network, say): " + ", ".join(updated)
        )
    if frozen_rows:
        said.append(
            "Frozen (requires_grad=False, so no gradient; to train one, call "
            "requires_grad_() on it before the forward pass): "
            + ", ".join(r.name for r in frozen_rows)
            + _held_while_frozen(frozen_rows)
        )
    return said


def _caveat(watch: _Watch) -> str:
    """What a note says is wrong with every gradient that arrived ("" if nothing)."""
    if watch.clipped_too_early():
        return "unclipped"
    if watch.wiped():
        return "only from the backward() calls after the last zero_grad()"
    return ""


def _held_while_frozen(frozen: list[StepRow]) -> str:
    """Frozen tensors the optimizer was given: say so, in case the freezing caught too much."""
    held = sum(1 for r in frozen if r.in_optimizer)
    if not held:
        return ""
    return (
        f". The optimizer was given {'them' if held == len(frozen) else f'{held} of them'}: "
        "if any should train, find what set requires_grad=False on it (a freezing loop's "
        "condition, a requires_grad_(False) on a whole module)."
    )


def _grouped(rows: list[StepRow]) -> list[tuple[list[str], StepRow]]:
    """Rows whose verdict and fix differ only by the tensor's name, as one group."""
    groups: dict[tuple[str, str], tuple[list[str], StepRow]] = {}
    for row in rows:
        key = (row.verdict, row.problem.replace(row.name, "{}"))
        groups.setdefault(key, ([], row))[0].append(row.name)
    return list(groups.values())
