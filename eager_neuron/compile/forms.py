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

from ..adaptive import MODULE as _adaptive
from ..decomps import _zero_padded
from ..lower.host import _PLAIN_TO_KW, _target_index
from ..lower.host import to_device as _to_device
from ..stats import STATS as _STATS
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
    as one zero pad of a unit step's gradient (decomps._zero_padded), else zeros and one
    strided copy into the slice, both neuron kernels. Neuron eager ran
    torch's reference decomposition (new_zeros and slice_scatter through the Python refs,
    ~300-500 us each against ~70 us here). False: take the dispatch path."""
    args, kwargs = loader(env)
    if kwargs or len(args) != 6 or type(args[0]) is not NeuronTensor:
        return False
    grad, sizes, dim, start, end, step = args
    CSTATS.eager_ops["aten::slice_backward"] += 1
    if step == 1:     # one zero-pad kernel (Llama's rotate_half: ~80 -> ~25 us a node)
        out = _zero_padded(grad, sizes, dim, start, end)
        if out is not None:
            env[node] = out
            return True
    out = _alloc(tuple(int(s) for s in sizes), grad.dtype, grad._index)
    out.zero_()
    aten.slice.Tensor(out, dim, start, end, step).copy_(grad)
    env[node] = out
    return True


def _run_to_device(node: Node, env: dict, loader) -> bool:
    """aten._to_copy of a contiguous CPU tensor to a neuron device with nothing else to change
    (the batch a training step moves: `x.to("neuron")` inside the graph) is lower/host.py's
    plain move (`to_device`: a device buffer, one copy, the transfer charged) without the
    PrivateUse1 door and dispatch (~45 -> ~15 us). False: dispatch decides (anything else)."""
    if not MOVES[0] or _adaptive.PENDING:
        return False
    args, kwargs = loader(env)
    if len(args) != 1:
        return False
    src = args[0]
    if type(src) is not torch.Tensor or kwargs.keys() - _PLAIN_TO_KW:
        return False
    index = _target_index(kwargs.get("device"))
    if index is None or kwargs.get("dtype") not in (None, src.dtype) or \
            kwargs.get("layout") not in (None, torch.strided) or kwargs.get("pin_memory") or \
            kwargs.get("memory_format") not in (None, torch.preserve_format) or \
            src.device.type != "cpu" or src.layout != torch.strided or src.requires_grad or \
            not src.is_contiguous() or src.is_conj() or src.is_neg():
        return False
    _STATS.ops += 1                          # (dispatch counts each op it runs)
    env[node] = _to_device(src, index)
    CSTATS.eager_ops["aten::_to_copy"] += 1
    CSTATS.direct_moves += 1
    return True


MOVES = [True]     # False: every _to_copy node through dispatch (measurements, tests)


# eager nodes with a cheaper form than their dispatch when no dispatch mode must see them;
# form(node, env, loader) -> False: run the node through dispatch (nothing was written)
_FORMS = {v: _run_view for v in _VIEWS}
_FORMS[aten.slice_backward.default] = _run_slice_backward
_FORMS[aten._to_copy.default] = _run_to_device
