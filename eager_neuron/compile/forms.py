"""Eager nodes of a compiled graph with a cheaper form than their dispatch, and the allocator of
kernel stores (compile/program.py's interpreter and compile/planned.py's plans share them).

A view of a neuron tensor is the same view of its host data on the same memory block (what
dispatch's view path computes, without the dispatcher round trip); `slice_backward` is zeros
and one strided copy. Each form returns False to send the node through dispatch (nothing was
written). Used only when no dispatch mode must see the ops (program.py checks).

>>> import torch
>>> torch.ops.aten.t.default in _FORMS
True
"""

from __future__ import annotations

import torch
from torch.fx import Node

from ..tensor import NeuronTensor
from .stats import CSTATS

aten = torch.ops.aten

try:
    from ..dispatch import alloc as _d_alloc
    from ..dispatch import wrap as _d_wrap
except ImportError:   # the dispatch owner moved them: the public way still works
    _d_alloc = _d_wrap = None


def _alloc(shape, dtype, index):
    if _d_alloc is None:
        return torch.empty(shape, dtype=dtype, device=torch.device("neuron", index))
    stride = []
    acc = 1
    for s in reversed(shape):
        stride.append(acc)
        acc *= max(int(s), 1)
    data, block = _d_alloc(index, tuple(shape), tuple(reversed(stride)), dtype)
    return _d_wrap(data, block, index)


_FAKE = torch._C._TorchDispatchModeKey.FAKE
# aten views whose result on a neuron tensor is the same view of its host data, on the same
# memory block (what dispatch's view path computes, without the dispatcher round trip)
_VIEWS = frozenset({
    aten.view.default, aten._unsafe_view.default, aten.t.default, aten.transpose.int,
    aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default,
    aten.expand.default, aten.slice.Tensor, aten.permute.default, aten.select.int,
    aten.detach.default, aten.alias.default, aten.as_strided.default,
})


# the same views as Tensor methods on the host data (~1.5 us a call less than the OpOverload's
# Python frame; 232 views per Llama training step)
_VIEW_METHODS = {
    aten.view.default: torch.Tensor.view, aten._unsafe_view.default: torch.Tensor.view,
    aten.t.default: torch.Tensor.t, aten.transpose.int: torch.Tensor.transpose,
    aten.unsqueeze.default: torch.Tensor.unsqueeze, aten.squeeze.dim: torch.Tensor.squeeze,
    aten.squeeze.default: torch.Tensor.squeeze, aten.expand.default: torch.Tensor.expand,
    aten.permute.default: torch.Tensor.permute, aten.select.int: torch.Tensor.select,
    aten.detach.default: torch.Tensor.detach, aten.as_strided.default: torch.Tensor.as_strided,
}


def _run_view(node: Node, env: dict, loader) -> bool:
    """A view of a neuron tensor, straight from its host data; False: take the dispatch path
    (another operand kind, or a view the host tensor refuses: dispatch raises the error)."""
    args, kwargs = loader(env)
    base = args[0] if args else None
    if type(base) is not NeuronTensor:
        return False
    data = base._data
    if data.is_conj() or data.is_neg():
        return False
    try:
        out = _VIEW_METHODS.get(node.target, node.target)(data, *args[1:], **kwargs)
    except Exception:    # (dispatch gives the error its neuron form)
        return False
    env[node] = NeuronTensor(out, base._block, base._index)
    CSTATS.graph_views += 1
    return True


def _run_slice_backward(node: Node, env: dict, loader) -> bool:
    """aten.slice_backward (the gradient of a slice: Llama's rotate_half, 8 per training step)
    as zeros and one strided copy into the slice, both neuron kernels. Neuron eager ran
    torch's reference decomposition (new_zeros and slice_scatter through the Python refs,
    ~300-500 us each against ~70 us here). False: take the dispatch path."""
    args, kwargs = loader(env)
    if kwargs or len(args) != 6 or type(args[0]) is not NeuronTensor:
        return False
    grad, sizes, dim, start, end, step = args
    CSTATS.eager_ops["aten::slice_backward"] += 1
    out = _alloc(tuple(int(s) for s in sizes), grad.dtype, grad._index)
    out.zero_()
    aten.slice.Tensor(out, dim, start, end, step).copy_(grad)
    env[node] = out
    return True


# eager nodes with a cheaper form than their dispatch when no dispatch mode must see them;
# form(node, env, loader) -> False: run the node through dispatch (nothing was written)
_FORMS = {v: _run_view for v in _VIEWS}
_FORMS[aten.slice_backward.default] = _run_slice_backward
