"""Errors raised during a neuron backward reach the caller, and leave no half-written state.

Why this module exists: torch 2.13 registers a Python device guard for PrivateUse1 whose
`exchangeStream` (noexcept) calls back into Python. The autograd engine holds a stream guard
around every neuron node; when Python code run by that node raises (our __torch_dispatch__, a
tensor hook, a custom Function's backward), C++ unwinds with the Python error still *pending*,
the guard's destructor calls into Python, that call fails inside a noexcept function and the
process aborts ("terminate called without an active exception", exit 134).

A C++ exception that carries no pending Python error unwinds cleanly: the engine marks the graph
task failed, runs no further node of it (so no AccumulateGrad writes `.grad` after the failure)
and rethrows on the thread that called backward(). So Python code on the engine's side never
raises: it stashes its exception and returns a value the engine's C++ rejects with a plain C++
error (`POISON` for an op, a mismatched gradient for a hook). The wrapped engine entry then
raises the stashed exception, with its own type and message, in the caller's thread.

>>> import torch, eager_neuron
>>> x = torch.ones(3, device="neuron", requires_grad=True)
>>> y = x * 2
>>> _ = y.register_hook(lambda g: 1 / 0)
>>> try:
...     y.sum().backward()
... except ZeroDivisionError:
...     print("caught", x.grad)
caught None
"""

from __future__ import annotations

import functools
import threading

import torch
import torch.autograd
import torch.autograd.function
import torch.autograd.graph

_lock = threading.Lock()
_pending: list = []


def in_backward() -> bool:
    """True while the autograd engine executes a node's backward on this thread."""
    return torch._C._current_autograd_node() is not None


def stash(exc: BaseException) -> None:
    with _lock:
        _pending.append(exc)


def _take_pending():
    with _lock:
        first = _pending[0] if _pending else None
        _pending.clear()
    return first


class _Poison:
    """Returned to C++ in place of an op's result: converting it to a Tensor (or a tuple of
    them) fails with a C++ cast error, which stops the graph task without a pending Python
    error."""

    def __repr__(self) -> str:
        return "<a neuron op failed during backward: backward() raises its error>"


POISON = _Poison()


def failed(exc: BaseException):
    """An op failed on autograd's side: stash `exc` (raised by backward()) and return POISON.

    dispatch() returns this from __torch_dispatch__ instead of raising.
    """
    stash(exc)
    return POISON


# ---------------------------------------------------------------------------------------------
# user Python code run by the engine: tensor hooks, post-accumulate-grad hooks, Function.backward
# ---------------------------------------------------------------------------------------------

def _wrong_grad(grad):
    """A tensor-hook result that check_variable_result rejects with a C++ std::runtime_error
    (different dtype and size than `grad`)."""
    if grad is None:
        return torch.empty(1)  # "can't replace a None gradient with a non-None value"
    dtype = torch.bool if grad.dtype != torch.bool else torch.uint8
    return torch.empty(0, dtype=dtype)


def _not_returned(hook, res, want: str):
    """The TypeError torch's C++ raises (with a pending Python error: the abort) when a hook
    returns neither None nor `want`, in the CPU's words."""
    name = getattr(hook, "__name__", type(hook).__name__)
    return TypeError(f"expected {want}, but hook returned '{type(res).__name__}' "
                     f"(hook {name!r})")


def _guard_tensor_hook(hook):
    @functools.wraps(hook)
    def guarded(grad):
        if not in_backward():
            return hook(grad)
        try:
            res = hook(grad)
        except BaseException as exc:   # noqa: BLE001 -- raised by backward()
            stash(exc)
            return _wrong_grad(grad)
        if res is not None and not isinstance(res, torch.Tensor):
            stash(_not_returned(hook, res, "Variable"))
            return _wrong_grad(grad)
        return res

    return guarded


def _guard_post_acc_hook(hook):
    @functools.wraps(hook)
    def guarded(tensor):
        if not in_backward():
            return hook(tensor)
        try:
            res = hook(tensor)
        except BaseException as exc:   # noqa: BLE001 -- raised by backward()
            stash(exc)
            # not POISON: a non-tensor result is a TypeError raised with a pending Python error
            # (the abort again); a tensor of another dtype/size fails a C++ check cleanly
            return _wrong_grad(tensor)
        if res is not None and not isinstance(res, torch.Tensor):
            stash(_not_returned(hook, res, "Variable"))
            return _wrong_grad(tensor)
        return res

    return guarded


def _is_neuron(t) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "neuron"


def _guarded_register_hook(orig):
    def register_hook(self, hook):
        if _is_neuron(self):
            hook = _guard_tensor_hook(hook)
        return orig(self, hook)

    register_hook.__doc__ = orig.__doc__
    register_hook.__wrapped__ = orig
    return register_hook


def _guarded_register_post_acc(orig):
    def register_post_accumulate_grad_hook(self, hook):
        if _is_neuron(self):
            hook = _guard_post_acc_hook(hook)
        return orig(self, hook)

    register_post_accumulate_grad_hook.__doc__ = orig.__doc__
    register_post_accumulate_grad_hook.__wrapped__ = orig
    return register_post_accumulate_grad_hook


def _any_neuron(x) -> bool:
    if isinstance(x, (list, tuple)):
        return any(_any_neuron(v) for v in x)
    return _is_neuron(x)


def _guard_node_hook(hook):
    """A hook on a node (a C++ node, a custom Function's; module full backward hooks): called with
    (grad_inputs, grad_outputs) or (grad_outputs,); a tuple of the wrong length fails the
    engine's check with a C++ std::runtime_error."""
    @functools.wraps(hook)
    def guarded(*args):
        if not in_backward() or not _any_neuron(args):
            return hook(*args)
        try:
            res = hook(*args)
        except BaseException as exc:   # noqa: BLE001 -- raised by backward()
            stash(exc)
            return tuple(args[0]) + (None,)
        if res is not None:
            if not isinstance(res, tuple):
                stash(_not_returned(hook, res, "tuple"))
                return tuple(args[0]) + (None,)
            if len(res) != len(args[0]):
                return res   # the engine's own clean "incorrect number of values" error
            bad = next((v for v in res if v is not None and not isinstance(v, torch.Tensor)),
                       None)
            if bad is not None:
                stash(_not_returned(hook, bad, "Variable"))
                return tuple(args[0]) + (None,)
        return res

    return guarded


def _guarded_function_register(orig):
    """`torch.autograd.Function._register_hook`, guarded. Every node's `register_hook` and
    `register_prehook` (C++ nodes such as MulBackward0 and custom Functions' nodes alike) go
    through it: torch's C++ looks the name up on `torch.autograd.Function` at each call
    (callRegisterFn in torch/csrc/autograd/python_cpp_function.cpp), while the node types
    themselves are immutable."""
    def _register_hook(backward_hooks, hook):
        return orig(backward_hooks, _guard_node_hook(hook))

    _register_hook.__doc__ = orig.__doc__
    _register_hook.__wrapped__ = orig
    return _register_hook


def _guarded_backward_apply(orig):
    def apply(self, *args):
        if not in_backward() or not any(_is_neuron(a) for a in args):
            return orig(self, *args)
        try:
            return orig(self, *args)
        except BaseException as exc:   # noqa: BLE001 -- raised by backward()
            stash(exc)
            # PyNode::apply rejects a result with more non-None entries than forward inputs
            # ("returned an incorrect number of gradients": a C++ std::runtime_error)
            n = len(getattr(self, "needs_input_grad", ()) or ()) + 1
            return (POISON,) * max(n, 2)

    apply.__wrapped__ = orig
    return apply


# ---------------------------------------------------------------------------------------------
# the engine entry: raise what was stashed, in the caller's thread
# ---------------------------------------------------------------------------------------------

def _wrap(run):
    def _engine_run_backward(*args, **kwargs):
        _take_pending()
        try:
            out = run(*args, **kwargs)
        except Exception:
            first = _take_pending()
            if first is None:
                raise
            # the engine's own error only says our POISON was rejected: the user wants theirs
            raise first.with_traceback(first.__traceback__) from None
        first = _take_pending()
        if first is not None:  # the failing code's result was never used (e.g. caught by user)
            raise first
        return out

    _engine_run_backward.__wrapped__ = run
    return _engine_run_backward


_installed = False


def install() -> None:
    global _installed
    if _installed:
        return
    _installed = True
    # NOTE: torch.autograd.backward/grad look the name up in torch.autograd's globals at call time
    torch.autograd._engine_run_backward = _wrap(torch.autograd._engine_run_backward)
    torch.autograd.graph._engine_run_backward = _wrap(torch.autograd.graph._engine_run_backward)
    T = torch.Tensor
    T.register_hook = _guarded_register_hook(T.register_hook)
    T.register_post_accumulate_grad_hook = _guarded_register_post_acc(
        T.register_post_accumulate_grad_hook)
    bcf = torch.autograd.function.BackwardCFunction
    bcf.apply = _guarded_backward_apply(bcf.apply)
    # hooks on nodes (`y.grad_fn.register_hook(f)`, `register_prehook`, module full backward
    # hooks): the node types cannot be patched, but they all register through this
    fn = torch.autograd.Function
    fn._register_hook = staticmethod(_guarded_function_register(fn._register_hook))
