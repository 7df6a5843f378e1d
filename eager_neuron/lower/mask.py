"""Mask lowerings: nonzero, masked_select (DYNAMIC: the output size is the mask's count) and
masked_scatter. A dynamic op counts the mask first (one launch, read back to size the output), then
fills: count_steps, fill_steps and select_steps yield the requests (lower/index.py drives them).

>>> import torch, eager_neuron
>>> from eager_neuron.lower.mask import count_nonzero
>>> count_nonzero(torch.tensor([0., 2., -0., 3.]))
2
"""

from __future__ import annotations

import numpy as np
import torch

from .. import launch as _launch
from ..context import _TLS as _ctx_tls
from ..kernels import index as kix
from ..launch import launch
from .common import HALF, coalesce
from .shape import nbytes as _nbytes
from .shape import np_view as _np


def core_index(index: int) -> int:
    """The core a DYNAMIC op allocates on: given, or the one dispatch set for this op."""
    return _launch.current_core() if index == -1 else index


def count_steps(x: torch.Tensor):
    """Number of non-zero elements of x: the count kernel's request (a generator a lowering
    yields from, or dispatch drives); returns the count read back."""
    if x.numel() == 0:
        return 0
    ctx = getattr(_ctx_tls, "ctx", None)
    if ctx is not None:
        ctx.capture = None   # a count read on the host sizes what follows: never replayed
    cshape, (cstr,) = coalesce(tuple(x.shape), [x.stride()])   # order does not matter here
    rank, bits = len(cshape), x.dtype in HALF
    out = np.zeros(1, np.int64)
    key = ("index", "count", rank, bits)   # rank of the mask; half floats as bits
    yield (key, lambda: kix.render_count(rank, bits), (_np(x, cshape, cstr), out),
           x.numel(), _nbytes(x))
    return int(out[0])


def count_nonzero(x: torch.Tensor) -> int:
    """Number of non-zero elements (count_steps' request, launched here)."""
    steps = count_steps(x)
    try:
        while True:
            launch(*next(steps))
    except StopIteration as stop:
        return stop.value


def fill_steps(x: torch.Tensor, out: torch.Tensor, fill: int = -1):
    """out's rows = coordinates of x's non-zeros (rows left over: `fill`): the request."""
    if out.numel() == 0:
        return
    x = x.view(1) if x.dim() == 0 else x
    bits = x.dtype in HALF
    key = ("index", "nonzero", x.dim(), bits)
    yield (key, lambda: kix.render_nonzero(x.dim(), bits), (_np(out), _np(x), int(fill)),
           x.numel(), _nbytes(x, out))


def lower_nonzero_static(func, a, outs):
    """nonzero padded with fill_value (or cut) to a static number of rows: no count needed."""
    for req in fill_steps(a["self"], outs[0], a["fill_value"]):
        launch(*req)


def lower_masked_scatter(func, a, outs):
    out, self, mask, source = outs[0], a["self"], a["mask"], a["source"]
    if mask.dtype != torch.bool or source.dtype != out.dtype:
        raise NotImplementedError("masked_scatter with a non-bool mask or another source dtype")
    if out.numel() == 0:
        return
    copy = out is not self
    m, full = mask.expand(out.shape), self.expand(out.shape)
    cshape, cstr = coalesce(tuple(out.shape), [out.stride(), m.stride(), full.stride()])
    err = np.zeros(4, np.int64)
    rank = len(cshape)
    launch(("index", "masked_scatter", rank), lambda: kix.render_masked_scatter(rank),
           (_np(out, cshape, cstr[0]), _np(m, cshape, cstr[1]), _np(source), copy,
            _np(full, cshape, cstr[2]), err),
           bytes_moved=_nbytes(m) + 2 * _nbytes(out))
    if err[0]:
        raise RuntimeError(f"aten::masked_scatter: expected source to have at least as many "
                           f"elements as ones in mask ({err[1]}), got {err[3]}")


def select_steps(self: torch.Tensor, mask: torch.Tensor, out: torch.Tensor):
    """out[:n] = self[mask] (broadcast), out[n:] = 0; out is 1-D: the request."""
    if out.numel() == 0:
        return
    shape = torch.broadcast_shapes(self.shape, mask.shape)
    x, m = self.expand(shape), mask.expand(shape)
    cshape, cstr = coalesce(tuple(shape), [x.stride(), m.stride()])
    rank = len(cshape)
    yield (("index", "masked_select", rank), lambda: kix.render_masked_select(rank),
           (_np(out), _np(x, cshape, cstr[0]), _np(m, cshape, cstr[1])), 0.0,
           _nbytes(m) + 2 * _nbytes(out))


def lower_masked_scatter_backward(func, a, outs):
    """The source's gradient: grad[mask] in order, zero-padded to the source's size."""
    out = outs[0]
    if a["mask"].dtype != torch.bool or not out.is_contiguous():
        raise NotImplementedError("masked_scatter_backward with a non-bool mask")
    for req in select_steps(a["grad_output"], a["mask"], out.view(-1)):
        launch(*req)
