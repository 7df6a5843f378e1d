"""Mask lowerings: nonzero, masked_select (DYNAMIC: the output size is the mask's count) and
masked_scatter. Each counts the mask first (one launch, read back to size the output), then fills.

>>> import torch, eager_neuron
>>> from eager_neuron.lower.mask import count_nonzero
>>> count_nonzero(torch.tensor([0., 2., -0., 3.]))
2
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .. import launch as _launch
from ..kernels import index as kix
from ..launch import launch
from .common import HALF, coalesce
from .shape import nbytes as _nbytes
from .shape import np_view as _np


def core_index(index: int) -> int:
    """The core a DYNAMIC op allocates on: given, or the one dispatch set for this op."""
    return _launch.current_core() if index == -1 else index


def count_nonzero(x: torch.Tensor) -> int:
    """Number of non-zero elements (one launch; the count is read back to size the output)."""
    if x.numel() == 0:
        return 0
    cshape, (cstr,) = coalesce(tuple(x.shape), [x.stride()])   # order does not matter here
    rank, bits = len(cshape), x.dtype in HALF
    out = np.zeros(1, np.int64)
    key = ("index", "count", rank, bits)   # rank of the mask; half floats as bits
    launch(key, lambda: kix.render_count(rank, bits), (_np(x, cshape, cstr), out),
           flops=x.numel(), bytes_moved=_nbytes(x))
    return int(out[0])


def fill_nonzero(x: torch.Tensor, out: torch.Tensor, fill: int = -1) -> None:
    """out's rows = coordinates of x's non-zeros (rows left over: `fill`)."""
    if out.numel() == 0:
        return
    x = x.view(1) if x.dim() == 0 else x
    bits = x.dtype in HALF
    key = ("index", "nonzero", x.dim(), bits)
    launch(key, lambda: kix.render_nonzero(x.dim(), bits), (_np(out), _np(x), int(fill)),
           flops=x.numel(), bytes_moved=_nbytes(x, out))


def lower_nonzero_static(func, a, outs):
    """nonzero padded with fill_value (or cut) to a static number of rows: no count needed."""
    fill_nonzero(a["self"], outs[0], a["fill_value"])


def nonzero_scratch(x: torch.Tensor) -> torch.Tensor:
    """(n, x.dim()) coordinates of x's non-zeros in host-backed scratch (like an SBUF tile)."""
    n = count_nonzero(x)
    out = torch.empty((n, x.dim()), dtype=torch.int64)
    fill_nonzero(x, out)
    return out


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


# DYNAMIC: the output size depends on the data, so dispatch cannot size it by meta first:
# fn(func, a, index) -> [(data, block), ...] allocated here on core `index` (None: the CPU).

def dynamic_nonzero(func, a, index=-1):
    from ..buffers import alloc

    x = a["self"]
    n = count_nonzero(x)
    # NOTE: the CPU returns nonzero column-major: strides (1, n)
    data, block = alloc(core_index(index), (n, x.dim()), (1, n), torch.int64)
    fill_nonzero(x, data)
    return [(data, block)]


def dynamic_masked_select(func, a, index=-1):
    from ..buffers import alloc

    self, mask = a["self"], a["mask"]
    if mask.dtype != torch.bool:
        raise NotImplementedError("masked_select with a non-bool mask")
    shape = torch.broadcast_shapes(self.shape, mask.shape)
    n = count_nonzero(mask.expand(shape)) if math.prod(shape) else 0
    data, block = alloc(core_index(index), (n,), (1,), self.dtype)
    _select(self, mask, data)
    return [(data, block)]


def _select(self: torch.Tensor, mask: torch.Tensor, out: torch.Tensor) -> None:
    """out[:n] = self[mask] (broadcast), out[n:] = 0; out is 1-D."""
    if out.numel() == 0:
        return
    shape = torch.broadcast_shapes(self.shape, mask.shape)
    x, m = self.expand(shape), mask.expand(shape)
    cshape, cstr = coalesce(tuple(shape), [x.stride(), m.stride()])
    rank = len(cshape)
    launch(("index", "masked_select", rank), lambda: kix.render_masked_select(rank),
           (_np(out), _np(x, cshape, cstr[0]), _np(m, cshape, cstr[1])),
           bytes_moved=_nbytes(m) + 2 * _nbytes(out))


def lower_masked_scatter_backward(func, a, outs):
    """The source's gradient: grad[mask] in order, zero-padded to the source's size."""
    out = outs[0]
    if a["mask"].dtype != torch.bool or not out.is_contiguous():
        raise NotImplementedError("masked_scatter_backward with a non-bool mask")
    _select(a["grad_output"], a["mask"], out.view(-1))
