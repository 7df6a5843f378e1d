"""Make neuron tensors traceable by PT2 (dynamo, AOTAutograd, torch.export) as plain device tensors.

A NeuronTensor is a wrapper subclass; it carries `__tensor_flatten__` so that `Module.to("neuron")`
swaps parameters in place (tied weights stay one parameter). But that same protocol makes dynamo
fakeify it as a *traceable subclass*: the fake is a NeuronTensor whose `_data` is a FakeTensor, and
every traced op then enters the neuron dispatcher, which runs real Numba kernels on fake memory
(`.numpy() is not supported for tensor subclasses`). A neuron tensor should trace as a CUDA tensor
does: a plain FakeTensor on device `neuron:i` whose ops run meta kernels and never reach a kernel.

So the flatten protocol is shown only to `torch.nn` (Module._apply, parametrize: the in-place swap)
and hidden from the tracing stack (fake tensors, dynamo, AOTAutograd, export, FX).

>>> import torch, eager_neuron
>>> from torch.utils._python_dispatch import is_traceable_wrapper_subclass
>>> is_traceable_wrapper_subclass(torch.ones(2, device="neuron"))   # as the tracers see it
False
"""

from __future__ import annotations

import os
import sys

import torch

from ..tensor import NeuronTensor

_NN_DIR = os.path.dirname(torch.nn.__file__) + os.sep
_DISPATCH_FILE = os.path.join(os.path.dirname(torch.__file__), "utils", "_python_dispatch.py")
_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# dynamo's VariableBuilder._wrap admits a tensor subclass with its own __torch_dispatch__ only
# when it is traceable; it then fakeifies through MetaConverter, which must see a plain tensor.
# builder.infer_subclass_type answers None for a traceable subclass: the variable is then a plain
# TensorVariable, as a CUDA tensor's (otherwise a TensorWithTFOverrideVariable whose every op
# inlines Tensor.__torch_function__, and a graph break inside it, x[x > 0], failed at run time
# with a NameError on dynamo's `__subclass_Tensor_...` global)
_BUILDER_FILE = os.path.join(os.path.dirname(torch.__file__), "_dynamo", "variables",
                             "builder.py")
_BUILDER = frozenset(((_BUILDER_FILE, "_wrap"), (_BUILDER_FILE, "infer_subclass_type")))


def _visible() -> bool:
    """True when the caller (past torch's protocol check helpers) is torch.nn or eager_neuron."""
    f = sys._getframe(2)
    for _ in range(4):
        if f is None:
            return False
        name = f.f_code.co_filename
        if name != _DISPATCH_FILE:
            return (name.startswith(_NN_DIR) or name.startswith(_PKG_DIR)
                    or (name, f.f_code.co_name) in _BUILDER)
        f = f.f_back
    return False


class _NNOnly:
    """A method that exists (for hasattr and calls) only when torch.nn asks for it."""

    def __init__(self, fn, static: bool):
        self.fn = fn
        self.static = static

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, obj, owner=None):
        if not _visible():
            raise AttributeError(self.name)
        if self.static or obj is None:
            return self.fn
        return self.fn.__get__(obj, owner)


def install() -> None:
    """Idempotent: wrap NeuronTensor's flatten protocol so only torch.nn sees it."""
    d = NeuronTensor.__dict__
    if isinstance(d.get("__tensor_flatten__"), _NNOnly):
        return
    flat = _NNOnly(d["__tensor_flatten__"], static=False)
    flat.name = "__tensor_flatten__"
    unflat = _NNOnly(d["__tensor_unflatten__"].__func__, static=True)
    unflat.name = "__tensor_unflatten__"
    NeuronTensor.__tensor_flatten__ = flat
    NeuronTensor.__tensor_unflatten__ = unflat
    NeuronTensor.__coerce_same_metadata_as_tangent__ = _coerce_tangent
    _proxy_handles_neuron()


def _proxy_handles_neuron() -> None:
    """make_fx (real tensors: torch.func.linearize, functionalize tracing, FX's symbolic
    helpers) records a neuron tensor it has no proxy for as a constant, as a CUDA tensor.

    Its proxy mode handles only the tensor types in HANDLED_TYPES and answers NotImplemented
    for any other subclass, expecting the subclass to unwrap itself and call again: a neuron
    tensor is not a wrapper of something traceable, so its op then ran with the mode still on,
    the funnel's own meta tensors and host copies were traced instead of the op, and the graph
    returned an uninitialized buffer (linearize's jvp_fn gave garbage). Only proxy_call reads
    this tuple (torch 2.13); idempotent.
    """
    from torch.fx.experimental import proxy_tensor

    if NeuronTensor not in proxy_tensor.HANDLED_TYPES:
        proxy_tensor.HANDLED_TYPES = (*proxy_tensor.HANDLED_TYPES, NeuronTensor)


def _coerce_tangent(self, expected_meta=None, expected_type=None):
    """AOTAutograd traced the backward with plain (fake) neuron tensors: a real NeuronTensor
    tangent is that plain tensor at run time."""
    if expected_type in (None, torch.Tensor) and expected_meta is None:
        return self
    return None


def run_outside_fake(fn, *args, **kwargs):
    """Run the neuron runtime for real while a tracer's FakeTensorMode is active.

    `torch.tensor(data, device="neuron")` traced by dynamo reaches the PrivateUse1 copy impls
    (dispatch.install_privateuse1_impls) with the Python key excluded but the fake mode still
    current: the runtime's host allocations then become FakeTensors inside a real NeuronTensor
    (dynamo fails on its data_ptr). A CUDA copy allocates real memory there; so does this, and
    the tracer fakeifies the result as a constant. One dict lookup when no fake mode is active.

    >>> import torch
    >>> run_outside_fake(lambda: 3)
    3
    """
    mode = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE)
    if mode is None:
        return fn(*args, **kwargs)
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        return fn(*args, **kwargs)


def trace_tensor_ctor_on_cpu() -> None:
    """`torch.tensor(data, device="neuron")` traced by dynamo becomes a CPU constant and a
    `_to_copy` to the device (a factory replayed by the program), as a CUDA tensor traces on a
    machine without CUDA.

    FakeTensorMode materializes the constructor's data on the device whenever the PrivateUse1
    backend is available (its `avoid_device_init` is False): the C++ constructor then copies
    to neuron with the Python key excluded, the copy allocates real memory and the following
    `lift_fresh` meets a real NeuronTensor, which the fake mode refuses (the tracer fails on
    its data_ptr). Telling the fake mode that neuron needs no device init makes it lift the
    CPU data and move the fake to neuron: no device memory while tracing, nothing real in the
    graph but a CPU constant. Only the fake mode reads this (torch 2.13); idempotent.

    >>> import torch, eager_neuron
    >>> f = torch.compile(lambda x: x + torch.tensor([1., 2.], device="neuron"), backend="neuron")
    >>> f(torch.zeros(2, device="neuron")).tolist()
    [1.0, 2.0]
    """
    import torch._subclasses.fake_tensor as ft

    orig = ft._is_privateuse1_backend_available
    if getattr(orig, "_en_neuron", False):
        return

    def _is_privateuse1_backend_available():
        if torch._C._get_privateuse1_backend_name() == "neuron":
            return False
        return orig()

    _is_privateuse1_backend_available._en_neuron = True
    ft._is_privateuse1_backend_available = _is_privateuse1_backend_available
