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
from types import MethodType

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


def _poisoned(node, exc: BaseException):
    stash(exc)
    # PyNode::apply rejects a result with more non-None entries than forward inputs
    # ("returned an incorrect number of gradients": a C++ std::runtime_error)
    n = len(getattr(node, "needs_input_grad", ()) or ()) + 1
    return (POISON,) * max(n, 2)


def _device_checked(node, res):
    """A custom Function's gradients on the devices of its inputs, as the engine checks them
    for plain tensors (validate_outputs: it skips tensor subclasses, so a CPU gradient for a
    neuron input would land in `.grad` as a CPU tensor): a 0-d gradient is moved, another one
    is refused in the engine's words. Gradient i is checked against edge i while every forward
    input up to i is a tensor (needs_input_grad cannot tell a non-tensor input from a tensor
    that needs no gradient, and edges exist only for tensors)."""
    single = not isinstance(res, tuple)
    grads = (res,) if single else res
    nexts = node.next_functions
    needs = node.needs_input_grad or ()
    sure = len(grads) if len(grads) == len(nexts) else \
        next((i for i, need in enumerate(needs) if not need), len(nexts))
    fixed = None
    for i in range(min(sure, len(grads), len(nexts))):
        g = grads[i]
        fn = nexts[i][0]
        if not isinstance(g, torch.Tensor) or fn is None:
            continue
        want, have = fn._input_metadata[nexts[i][1]].device, g.device
        if have == want or (have.type != "neuron" and want.type != "neuron"):
            continue
        if g.dim() != 0:
            raise RuntimeError(f"Function {type(node).__name__} returned an invalid gradient at "
                               f"index {i} - expected device {want} but got {have}")
        fixed = fixed or list(grads)
        fixed[i] = g.to(want)
    if fixed is None:
        return res
    return fixed[0] if single else tuple(fixed)


def _guarded_backward_apply(orig):
    def apply(self, *args):
        if not in_backward():
            return orig(self, *args)
        neuron = any(_is_neuron(a) for a in args)
        try:
            res = orig(self, *args)
        except BaseException as exc:   # noqa: BLE001 -- raised by backward()
            if not neuron:
                raise   # no neuron node's guard around it: raised as torch raises it
            return _poisoned(self, exc)
        try:
            return _device_checked(self, res)
        except RuntimeError as exc:
            return _poisoned(self, exc)

    apply.__wrapped__ = orig
    return apply


def _guard_unpack_hook(unpack):
    """A saved-tensor unpack hook (`saved_tensors_hooks`, non-reentrant checkpointing's
    recomputation) run during a neuron backward: an exception is stashed and the hook returns
    a non-tensor, which the engine refuses with a C++ TypeError (no pending Python error)."""
    @functools.wraps(unpack)
    def guarded(packed):
        if not in_backward():
            return unpack(packed)
        try:
            return unpack(packed)
        except BaseException as exc:   # noqa: BLE001 -- raised by backward()
            stash(exc)
            return POISON

    return guarded


def _guarded_push_hooks(orig):
    def _push_saved_tensors_default_hooks(pack_hook, unpack_hook):
        return orig(pack_hook, _guard_unpack_hook(unpack_hook))

    _push_saved_tensors_default_hooks.__wrapped__ = orig
    return _push_saved_tensors_default_hooks


def _guard_mode(mode) -> None:
    """A user's TorchDispatchMode, as it is pushed: its __torch_dispatch__ (an instance attribute
    now: torch's C++ looks it up on the mode object) stashes what it raises for an op on neuron
    tensors during a neuron backward and returns POISON, as our own dispatch does (raising
    there aborted the process). torch's own modes and ours are left as they are."""
    cls = type(mode)
    if cls.__module__.split(".")[0] in ("torch", "eager_neuron") or \
            getattr(getattr(mode.__dict__.get("__torch_dispatch__"), "__func__", None),
                    "_neuron_guarded", False):
        return
    orig = mode.__torch_dispatch__

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not in_backward():
            return orig(func, types, args, kwargs)
        try:
            return orig(func, types, args, kwargs)
        except BaseException as exc:   # noqa: BLE001 -- raised by backward()
            if not (_any_neuron(args) or _any_neuron(list((kwargs or {}).values()))):
                raise
            stash(exc)
            return POISON

    __torch_dispatch__._neuron_guarded = True
    try:
        # a bound method: torch's C++ refuses a plain function there (a classmethod's sign)
        mode.__torch_dispatch__ = MethodType(__torch_dispatch__, mode)
    except (AttributeError, TypeError):   # a mode with __slots__: left unguarded
        pass


def _guarded_push_mode(orig):
    def _push_mode(mode):
        _guard_mode(mode)
        return orig(mode)

    _push_mode.__wrapped__ = orig
    return _push_mode


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
    # NOTE: torch.autograd.graph.saved_tensors_hooks looks the name up at each __enter__
    ag = torch._C._autograd
    ag._push_saved_tensors_default_hooks = _guarded_push_hooks(
        ag._push_saved_tensors_default_hooks)
    # NOTE: TorchDispatchMode.__enter__ looks _push_mode up in its module at each call
    import torch.utils._python_dispatch as pd

    pd._push_mode = _guarded_push_mode(pd._push_mode)
