"""Data-dependent ops that used to reach the CPU fallback: repeat_interleave.Tensor (the index
form behind `x.repeat_interleave(tensor_repeats)`) and unique along a dim (unique_dim). Both are
DYNAMIC: one launch counts (the output size), dispatch allocates, a second launch fills.

>>> import torch, eager_neuron
>>> r = torch.tensor([2, 0, 3]).to("neuron")
>>> torch.repeat_interleave(r).cpu().tolist()
[0, 0, 2, 2, 2]
>>> x = torch.tensor([[1, 2], [0, 5], [1, 2]]).to("neuron")
>>> torch.unique(x, dim=0).cpu().tolist()
[[0, 5], [1, 2]]
"""

from __future__ import annotations

import numpy as np
import torch

from ..kernels import extras as kex
from ..launch import launch
from .common import HALF, NP_TYPE

VERSION = 1


def _alloc(index, shape, dtype):
    from ..dispatch import alloc
    from .mask import core_index

    stride = torch.empty(shape, device="meta").stride()
    return alloc(core_index(index), tuple(shape), stride, dtype)


def dynamic_repeat_interleave(func, a, index=-1):
    reps = a["repeats"]
    if reps.dim() == 0:
        reps = reps.view(1)
    if reps.dim() != 1:
        raise RuntimeError("repeat_interleave only accept 1D vector as repeat")
    if reps.dtype not in (torch.int64, torch.int32):
        raise NotImplementedError(f"repeat_interleave.Tensor on {reps.dtype}")
    r = reps.numpy()
    res = np.zeros(2, np.int64)
    if r.shape[0]:
        launch(("extras", "repeat_count", VERSION), lambda: kex.render("repeat_count"),
               (r, res), flops=r.shape[0], bytes_moved=r.nbytes)
    if res[1]:
        raise RuntimeError("repeats can not be negative")
    total = int(res[0])
    size = a.get("output_size")
    if size is not None and int(size) != total:
        raise RuntimeError("allocated size does not match required size")
    out, block = _alloc(index, (total,), reps.dtype)
    if total:
        launch(("extras", "repeat_fill", VERSION), lambda: kex.render("repeat_fill"),
               (out.numpy(), r), flops=total, bytes_moved=out.numpy().nbytes + r.nbytes)
    return [(out, block)]


def dynamic_unique_dim(func, a, index=-1):
    from .cast import cast

    x, dim = a["self"], a["dim"]
    if x.dim() == 0 or (x.dtype not in NP_TYPE and x.dtype not in HALF):
        raise NotImplementedError(f"unique_dim on a {x.dim()}-d {x.dtype} tensor")
    dim = dim + x.dim() if dim < 0 else dim
    if not 0 <= dim < x.dim():
        raise IndexError(f"Dimension out of range (expected to be in range of "
                         f"[{-x.dim()}, {x.dim() - 1}], but got {a['dim']})")
    n = x.shape[dim]
    moved = x.movedim(dim, 0)
    rest = tuple(moved.shape[1:])
    m = int(np.prod(rest)) if rest else 1
    if n > 0 and m == 0:
        raise RuntimeError("There are 0 sized dimensions, and they aren't selected, so unique "
                           "cannot be applied")
    work = torch.float32 if x.dtype in HALF else x.dtype   # half: exact in float32
    rows = torch.empty((n,) + rest, dtype=work)
    if rows.numel():
        cast(moved, rows)
    xr = rows.numpy().reshape(n, m)
    perm, tmp, group = (np.empty(n, np.int64) for _ in range(3))
    res = np.zeros(1, np.int64)
    if n:
        launch(("extras", "unique_rows", VERSION), lambda: kex.render("unique_rows"),
               (xr, perm, tmp, group, res), flops=float(n * max(1, np.log2(max(n, 2))) * m),
               bytes_moved=float(xr.nbytes * 2))
    k = int(res[0])
    out_shape = list(x.shape)
    out_shape[dim] = k
    values, vblock = _alloc(index, tuple(out_shape), x.dtype)
    inverse, iblock = _alloc(index, (n,), torch.int64)
    counts, cblock = _alloc(index, (k,), torch.int64)
    if n:
        vtmp = torch.empty((k,) + rest, dtype=work)
        launch(("extras", "unique_rows_fill", VERSION), lambda: kex.render("unique_rows_fill"),
               (xr, perm, group, vtmp.numpy().reshape(k, m), inverse.numpy(), counts.numpy()),
               flops=float(n * m), bytes_moved=float(xr.nbytes * 2))
        if values.numel():
            cast(vtmp, values.movedim(dim, 0))
    return [(values, vblock), (inverse, iblock), (counts, cblock)]


LOWERINGS: dict = {}
DYNAMIC = {
    "aten::repeat_interleave.Tensor": dynamic_repeat_interleave,
    "aten::unique_dim": dynamic_unique_dim,
}
