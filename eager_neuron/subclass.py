"""A user's tensor subclass on neuron: `x.as_subclass(MyTensor)`.

On the CPU or CUDA, `as_subclass` gives the same tensor (an alias) as an instance of the user's
class: tensor subclasses built on the default `__torch_function__` (torchvision's tv_tensors,
units or named-tensor wrappers, `class MyT(torch.Tensor): pass`) rely on it for every op's result
and for `.to(device)`. A neuron tensor is a wrapper subclass (tensor.py) whose C++ tensor is
bound to its NeuronTensor object, so torch's own `as_subclass` refuses any class that is not a
NeuronTensor. Here the user's class gets a neuron twin, `class MyT(MyT, NeuronTensor)`, made once
per class: an alias of the tensor is re-classed to it, so `isinstance(y, MyT)` holds, the class's
methods and attributes work, and autograd records the alias as the CPU does.

The twin's `__torch_function__` is the user class's own, called as for that class (results of
the default one become the user's class again, through `as_subclass`). Its `__torch_dispatch__`
hands the op to the neuron funnel with the twins' operands seen as plain NeuronTensors for the
call (the funnel knows only that type), so an in-place op still returns the caller's object.
"""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_flatten

from .tensor import _NOT_COPIED, NeuronTensor

_TWINS: dict = {}   # the user's class -> its neuron twin
_DISABLED_TF = torch._C._disabled_torch_function_impl
_AS_SUBCLASS = torch._C.TensorBase.as_subclass
_INTERNAL = (*_NOT_COPIED, "_index")   # the wrapper's own attributes, never the user's state


def _twin_torch_function(cls, func, types, args=(), kwargs=None):
    user = cls._neuron_user_class
    types = tuple(getattr(t, "_neuron_user_class", t) for t in types)
    return user.__torch_function__(func, types, args, kwargs or {})


def _twin_torch_dispatch(cls, func, types, args=(), kwargs=None):
    for t in types:
        if not issubclass(t, NeuronTensor):
            return NotImplemented   # another subclass (AsyncCollectiveTensor...) unwraps first
    kwargs = kwargs or {}
    swapped = []
    for v in tree_flatten((args, kwargs))[0]:
        k = type(v)
        if k is not NeuronTensor and isinstance(v, NeuronTensor):
            v.__class__ = NeuronTensor
            swapped.append((v, k))
    try:
        return NeuronTensor.__torch_dispatch__(func, (NeuronTensor,), args, kwargs)
    finally:
        for v, k in swapped:
            v.__class__ = k


def _twin_reduce_ex(self, protocol):
    """torch.save / pickle: as a CPU subclass saves (torch._tensor._rebuild_from_type_v2), the
    plain neuron tensor's reduction, the user's class and the instance's own attributes."""
    user = type(self)._neuron_user_class
    state = {k: v for k, v in self.__dict__.items() if k not in _INTERNAL}
    rebuild, args = NeuronTensor.__reduce_ex__(self, protocol)
    return (torch._tensor._rebuild_from_type_v2, (rebuild, user, args, state))


def twin(cls: type) -> type:
    """The neuron twin of the user's tensor subclass `cls` (made once per class)."""
    t = _TWINS.get(cls)
    if t is not None:
        return t
    if getattr(cls, "__torch_dispatch__", None) is not torch.Tensor.__torch_dispatch__:
        raise TypeError(
            f"as_subclass({cls.__qualname__}) on neuron: {cls.__qualname__} defines its own "
            "__torch_dispatch__, so it is a wrapper subclass and cannot re-class a neuron "
            "tensor\n  fix: wrap the neuron tensor in it instead (as DTensor or torchao "
            "subclasses do: the neuron tensor as the inner tensor)")
    tf = cls.__dict__.get("__torch_function__", None)
    tf = getattr(cls, "__torch_function__", None) if tf is None else tf
    ns = {"__module__": cls.__module__, "__qualname__": cls.__qualname__,
          "__doc__": cls.__doc__, "_neuron_user_class": cls,
          "__torch_dispatch__": classmethod(_twin_torch_dispatch),
          "__reduce_ex__": _twin_reduce_ex,
          "__torch_function__": tf if tf is _DISABLED_TF else classmethod(_twin_torch_function)}
    try:
        t = type(cls.__name__, (cls, NeuronTensor), ns)
    except TypeError as exc:
        raise TypeError(f"as_subclass({cls.__qualname__}) on neuron: the class cannot be combined "
                        f"with a neuron tensor ({exc})\n  fix: drop its __slots__ or base classes "
                        "other than torch.Tensor") from exc
    return _TWINS.setdefault(cls, t)


def _reclass(t: torch.Tensor, cls: type) -> torch.Tensor:
    target = cls if issubclass(cls, NeuronTensor) else twin(cls)
    try:
        t.__class__ = target
    except TypeError as exc:
        raise TypeError(f"as_subclass({cls.__qualname__}) on neuron: {exc}\n  fix: drop the "
                        "class's __slots__") from exc
    return t


def as_subclass(self, cls):
    """NeuronTensor.as_subclass: an alias of self as an instance of cls (see the module doc)."""
    if not isinstance(cls, type) or not issubclass(cls, torch.Tensor) or \
            (not issubclass(cls, NeuronTensor) and issubclass(NeuronTensor, cls)):
        return _AS_SUBCLASS(self, cls)   # torch.Tensor itself, or torch's own TypeError
    with torch._C.DisableTorchFunctionSubclass():
        out = torch.ops.aten.alias.default(self)
    return _reclass(out, cls)


def install() -> None:
    NeuronTensor.as_subclass = as_subclass
