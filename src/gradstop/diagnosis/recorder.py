"""What a recording notes for the diagnosis, beyond the forward view's calls.

``gradstop.record()`` notes every torch operation (``gradstop.forward``). The
diagnosis reads four more things off the same run, through the recorder's
``BEFORE`` and ``AFTER`` lists:

- the backward passes: ``loss.backward()``, ``torch.autograd.backward``,
  ``torch.autograd.grad``, with the tensors they start from and their
  ``inputs`` (a pass may fill no ``.grad`` at all, or only some);
- each read of ``t.grad`` (``w = w - lr * w.grad`` starts there);
- each ``register_hook``, with the state of the tensor it was put on (a hook
  registered before an in-place operation stays with the value before it);
- each module whose backward hooks PyTorch set up: its input and output nodes
  (``BackwardHookFunctionBackward``), so a full backward hook is told from a
  pre-hook, and a module whose input did not require grad is seen.

For an operation that cuts the graph it also notes the reader's line
(``where``), and for one run with recording off, the custom autograd Function
whose forward ran it (``region``: ``CheckpointFunction`` for a reentrant
checkpoint).
"""

from __future__ import annotations

import inspect
import linecache
import os
import sys
from dataclasses import dataclass, field

import torch

from .. import forward
from ..forward import PASSES, Recording
from ..graph import gradient_targets

# Library code the reader did not write: a call's line is the first frame outside.
_LIBRARIES = tuple(
    os.path.dirname(module.__file__) + os.sep for module in (torch, forward, os, inspect)
)
_HOOKS_FILE = os.path.join("torch", "utils", "hooks.py")
_FUNCTION_FILE = os.path.join("torch", "autograd", "function.py")
_CONTEXTLIB = os.path.join("torch", "utils", "_contextlib.py")
_OPTIM = os.path.join("torch", "optim", "")
# The region of a call an optimizer's step made: not part of the forward pass.
STEP = "optimizer.step()"
# Operations that make a tensor from data outside PyTorch (a NumPy array, numbers).
FROM_DATA = frozenset({"tensor", "as_tensor", "asarray", "from_numpy"})


@dataclass(frozen=True)
class Pass:
    """One backward pass: what it started from and which tensors it fills."""

    kind: str  # "backward()", "torch.autograd.backward()", "torch.autograd.grad()"
    outputs: tuple[torch.Tensor, ...]
    inputs: tuple[torch.Tensor, ...] | None  # inputs=, or autograd.grad's; None: every leaf
    fills: bool  # does it fill .grad? (autograd.grad returns the gradients instead)
    # id() of each leaf in its graph whose .grad was None just after it ran (filled in
    # when it returns; a custom Function's backward may have returned None for them)
    left_none: set[int] = field(default_factory=set, compare=False)


@dataclass(frozen=True)
class HookNote:
    """A ``register_hook`` call: the tensor's state then, the hook, its handle."""

    state: int
    hook: object
    handle: object

    @property
    def removed(self) -> bool:
        hooks = self.handle.hooks_dict_ref()
        return hooks is None or self.handle.id not in hooks


@dataclass
class ModuleCall:
    """One call of a module with backward hooks: the nodes PyTorch put around it."""

    hook: object  # torch.utils.hooks.BackwardHook: .module, .user_hooks, .user_pre_hooks
    input_node: object = None  # runs its full backward hooks (None: no input required grad)
    output_node: object = None  # runs its backward pre-hooks

    @property
    def module(self) -> torch.nn.Module:
        return self.hook.module


def passes(recording: Recording) -> list[Pass]:
    return recording.notes.setdefault("passes", [])


def hook_notes(recording: Recording) -> list[HookNote]:
    return recording.notes.setdefault("hooks", [])


def data_assignments(recording: Recording) -> dict[int, str]:
    """id(tensor) -> where ``tensor.data = value`` ran, for each assignment to ``.data``."""
    return recording.notes.setdefault("data assignments", {})


def grad_reads(recording: Recording) -> list[tuple[int, int]]:
    """(state of the tensor, state of its .grad) for each read of ``t.grad``."""
    return recording.notes.setdefault("grad reads", [])


def grad_calls(recording: Recording) -> list:
    """Each torch.autograd.grad() as a call from its outputs and inputs to the gradients
    it returned (without create_graph=True those have no graph: a cut)."""
    return recording.notes.setdefault("grad calls", [])


def module_calls(recording: Recording) -> dict[int, ModuleCall]:
    return recording.notes.setdefault("modules", {})


# ---------------------------------------------------------------------------
# The notes, taken as the run goes.


def before(recording: Recording, func, args, kwargs) -> None:
    """A backward pass is noted before it runs (it may raise)."""
    if func not in PASSES:
        return
    bound = inspect.signature(func).bind(*args, **kwargs).arguments
    outputs = bound.get("self", bound.get("tensors", bound.get("outputs")))
    inputs = bound.get("inputs")
    kind = {torch.autograd.grad: "torch.autograd.grad()"}.get(func, "backward()")
    if func is torch.autograd.backward:
        kind = "torch.autograd.backward()"
    passes(recording).append(
        Pass(
            kind,
            _tensors(outputs),
            None if inputs is None else _tensors(inputs),
            kind != "torch.autograd.grad()",
        )
    )
    recording.notes.setdefault("running", []).append(len(passes(recording)) - 1)


def _note_grad_call(recording: Recording, args, kwargs, result) -> None:
    bound = inspect.signature(torch.autograd.grad).bind(*args, **kwargs).arguments
    taken = _tensors(bound.get("outputs")) + _tensors(bound.get("inputs"))
    made = [t for t in _tensors(result) if t is not None]
    if not taken or not made:
        return
    call = forward._Call(
        "autograd.grad",
        [recording.state_of(t) for t in taken],
        [recording.new_state(t, made_by="autograd.grad") for t in made],
    )
    call.where = _where()
    grad_calls(recording).append(call)


def _finished(recording: Recording) -> None:
    """A backward pass returned: note the leaves of its graph whose .grad is still None."""
    running = recording.notes.setdefault("running", [])
    if not running:
        return
    ran = passes(recording)[running.pop()]
    if not ran.fills:
        return
    with torch._C.DisableTorchFunction():  # reading .grad here is no read of the reader's
        for output in ran.outputs:
            for node, _ in gradient_targets(output):
                leaf = getattr(node, "variable", None)
                if leaf is not None and leaf.grad is None:
                    ran.left_none.add(id(leaf))


def _tensors(value) -> tuple[torch.Tensor, ...]:
    if isinstance(value, torch.Tensor):
        return (value,)
    if isinstance(value, dict):
        value = list(value.values())
    return tuple(t for t in value or () if isinstance(t, torch.Tensor))


def after(recording: Recording, func, args, kwargs, result, call) -> None:
    """Note .grad reads, hooks and module hooks; where a cut ran and in which region."""
    if func in PASSES:
        _finished(recording)
    if func is torch.autograd.grad:
        _note_grad_call(recording, args, kwargs, result)
    getter = _getter(func)
    if _setter(func) == "data" and args and isinstance(args[0], torch.Tensor):
        data_assignments(recording)[id(args[0])] = _where() + _inside_library()
    if getter == "grad" and isinstance(result, torch.Tensor):
        grad_reads(recording).append((recording.state_of(args[0]), recording.state_of(result)))
    elif getter in ("grad_fn", "requires_grad"):
        _note_module(recording, getter, result)
    elif func is torch.Tensor.register_hook:
        state = recording.state_of(args[0])
        hook_notes(recording).append(HookNote(state, args[1], result))
    if call is None:
        return
    if not call.grad_enabled:
        call.region = _region()
    brought_in = call.name in FROM_DATA and not call.inputs  # a round trip may end here
    if (
        _cuts(recording, call)
        or _in_place(recording, call)
        or call.wrote
        or call in recording.exits
    ):
        call.where = _where()
    elif brought_in:
        call.where = _where()


def _getter(func) -> str | None:
    """``"grad"`` for the read of ``t.grad`` (an attribute read the recorder sees)."""
    if getattr(func, "__name__", None) != "__get__":
        return None
    return getattr(getattr(func, "__self__", None), "__name__", None)


def _setter(func) -> str | None:
    """``"data"`` for an assignment ``t.data = value``."""
    if getattr(func, "__name__", None) != "__set__":
        return None
    return getattr(getattr(func, "__self__", None), "__name__", None)


def _inside_library() -> str:
    """ ", inside torch.nn.utils.vector_to_parameters()": the torch function the reader
    called, when the call being recorded ran inside it."""
    frame, called = sys._getframe(2), None
    while frame is not None and frame.f_code.co_filename.startswith(_LIBRARIES):
        if frame.f_code.co_filename.startswith(_LIBRARIES[0]):  # torch's own, not ours
            called = frame
        frame = frame.f_back
    if called is None or frame is None:
        return ""
    module = called.f_globals.get("__name__", "")
    if not module.startswith("torch.") or module.startswith("torch.overrides"):
        return ""
    public = module.rsplit(".", 1)[0] if module.rsplit(".", 1)[-1].startswith("_") else module
    return f", inside {public}.{called.f_code.co_qualname}()"


def _cuts(recording: Recording, call) -> bool:
    """Did ``call`` take a tensor on the graph and make one off it?"""
    states = recording.states
    taken = any(states[i].grad_fn is not None or states[i].requires_grad for i in call.inputs)
    return taken and any(states[o].grad_fn is None for o in call.outputs)


def _in_place(recording: Recording, call) -> bool:
    """Did ``call`` change one of its inputs in place (``mul_``, ``+=``, an optimizer's step)?"""
    inputs = {id(recording.states[i].tensor) for i in call.inputs}
    return any(id(recording.states[o].tensor) in inputs for o in call.outputs)


def _note_module(recording: Recording, getter: str, result) -> None:
    """PyTorch sets up a module's backward hooks in BackwardHook._apply_on_tensors."""
    frame = sys._getframe(3)
    for _ in range(4):
        if frame is None:
            return
        if frame.f_code.co_name == "_apply_on_tensors" and frame.f_code.co_filename.endswith(
            _HOOKS_FILE
        ):
            break
        frame = frame.f_back
    else:
        return
    hook, stage = frame.f_locals.get("self"), frame.f_back.f_code.co_name
    found = module_calls(recording).setdefault(id(hook), ModuleCall(hook))
    if getter == "grad_fn" and type(result).__name__ == "BackwardHookFunctionBackward":
        if stage == "setup_input_hook":
            found.input_node = result
        elif stage == "setup_output_hook":
            found.output_node = result


def _region() -> str:
    """The custom autograd Function whose forward is running, or an optimizer's step."""
    frame = sys._getframe(2)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "apply" and code.co_filename.endswith(_FUNCTION_FILE):
            cls = frame.f_locals.get("cls")
            return getattr(cls, "__name__", "")
        if _OPTIM in code.co_filename:
            return STEP
        frame = frame.f_back
    return ""


def _where() -> str:
    """The reader's expression that is running: "`torch.Tensor(losses)` (line 3)"."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith(_LIBRARIES):
        frame = frame.f_back
    if frame is None:
        return ""
    positions = list(frame.f_code.co_positions())[frame.f_lasti // 2]
    line, end_line, start, end = positions
    text = linecache.getline(frame.f_code.co_filename, line or frame.f_lineno)
    if line is not None and line == end_line and start is not None and end is not None:
        text = text[start:end]
    text = " ".join(text.split())
    if not text:
        return ""
    shown = f"`{text if len(text) <= 60 else text[:57] + '...'}`, line {frame.f_lineno}"
    return shown + _in_forward_hook(frame) + _in_decorated(frame)


def _in_decorated(frame) -> str:
    """Name the function whose @torch.no_grad() (or inference_mode) turned recording off."""
    below, caller = frame, frame.f_back
    while caller is not None:
        code = caller.f_code
        if code.co_name == "decorate_context" and code.co_filename.endswith(_CONTEXTLIB):
            mode = type(getattr(caller.f_locals.get("ctx_factory"), "__self__", None))
            if mode in (torch.no_grad, torch.inference_mode):
                name = below.f_code.co_qualname
                return f", inside {name}(), which is decorated with @torch.{mode.__name__}()"
        below, caller = caller, caller.f_back
    return ""


def _in_forward_hook(frame) -> str:
    """A forward hook's return value replaces the module's output: say so where it cuts."""
    caller = frame.f_back
    if caller is None or caller.f_code.co_name not in ("_call_impl", "inner"):
        return ""
    hook = caller.f_locals.get("hook")
    if getattr(hook, "__code__", None) is not frame.f_code:
        return ""
    return (
        f", in the forward hook {frame.f_code.co_name}(): a forward hook's return value, "
        "unless None, replaces the module's output, so a hook that only reads it should "
        "return nothing"
    )


forward.BEFORE.append(before)
forward.AFTER.append(after)
