"""An op's operands: neuron tensors swapped for their host-backed buffers (and the one device
they share), a written argument found back by its schema name.

The funnel unwraps every op's arguments here; the CPU fallback and the in-place view ops do the
same, without importing the funnel.

>>> import torch, eager_neuron
>>> from eager_neuron.operands import unwrap_args
>>> x = torch.ones(2, device="neuron:1")
>>> uargs, ukw, index = unwrap_args((x, 2), {})
>>> type(uargs[0]).__name__, uargs[0].device.type, index
('Tensor', 'cpu', 1)
"""

from __future__ import annotations

import torch

from . import errors
from .buffers import _span
from .lower.common import DEVICE_DTYPES, schema_args
from .tensor import NeuronTensor


def _unwrap(x, state):
    if type(x) is NeuronTensor:
        idx = x.device.index
        if state[0] is None:
            state[0] = idx
        elif state[0] != idx:
            raise RuntimeError(
                "Expected all tensors to be on the same device, but found at least two devices, "
                f"neuron:{state[0]} and neuron:{idx}! Move one with .to('neuron:{state[0]}').")
        return x._data
    if isinstance(x, (list, tuple)) and x and not isinstance(x[0], (int, float, bool)):
        return type(x)(_unwrap(v, state) for v in x)
    if isinstance(x, torch.Tensor) and x.dtype not in DEVICE_DTYPES:
        _check_tensor(x)
    return x


def _check_tensor(x: torch.Tensor) -> None:
    if x.is_complex():
        raise errors.UnsupportedTensorError(
            f"{x.dtype} tensors are not supported on neuron (complex64 and complex128 are)\n"
            f"{errors.where()}\n  fix: convert with x.to(torch.complex64)")
    if x.layout != torch.strided:
        raise errors.UnsupportedTensorError(
            f"{x.layout} tensors are not supported on neuron\n{errors.where()}\n"
            "  fix: call .to_dense() first")
    if x.is_quantized:
        raise errors.UnsupportedTensorError(
            f"quantized tensors ({x.dtype}) are not supported on neuron\n{errors.where()}\n"
            "  fix: dequantize() first")


def unwrap_args(args, kwargs):
    """(args, kwargs, core index) with every neuron tensor replaced by its host buffer; index
    None when no neuron tensor is among them (NeuronMode's CPU tensors)."""
    state = [None]
    # NOTE: the common operand (a neuron tensor on the call's device) inline, not via _unwrap
    # and a generator: this runs once per op
    uargs = []
    for a in args:
        if type(a) is NeuronTensor:
            idx = a.device.index
            if state[0] is None:
                state[0] = idx
            if state[0] == idx:
                uargs.append(a._data)
                continue
        uargs.append(_unwrap(a, state))
    uargs = tuple(uargs)
    ukw = {k: _unwrap(v, state) for k, v in kwargs.items()} if kwargs else {}
    return uargs, ukw, state[0]


def _original(func, args, kwargs, name):
    """The caller's own argument `name` (a written tensor comes back as the caller's object)."""
    for i, (arg_name, _d, _k) in enumerate(schema_args(func)):
        if arg_name == name:
            return args[i] if i < len(args) else kwargs[name]
    raise KeyError(name)


def spans(args, kwargs) -> list:
    """Byte spans [(lo, hi), ...] of the neuron tensors among an op's arguments (adaptive
    eager's gate: which other thread's pending group this op touches)."""
    out = []
    for x in (*args, *kwargs.values()):
        if type(x) is NeuronTensor:
            out.append(_span(x._data))
        elif isinstance(x, (list, tuple)):
            out.extend(_span(v._data) for v in x if type(v) is NeuronTensor)
    return out
