"""Distance lowerings: _pdist_forward/_backward and _cdist_forward/_backward (torch.pdist,
torch.cdist and nn.functional.pdist), float32/float64, one launch each.

cdist operands are viewed as (B1, B2, rows, M): batch dims coalesced into at most two
(broadcast batch dims are stride-0 views, never copies). The p-norm kernel is chosen by the
class of p:
0, 1, 2, inf or general (and 0 < p < 2 in backward), as PyTorch's CPU kernels split it.

>>> import torch, eager_neuron
>>> x = torch.tensor([[0.0, 0.0], [3.0, 4.0]]).to("neuron")
>>> torch.pdist(x).tolist()
[5.0]
"""

from __future__ import annotations

import math

import torch

from ..kernels import compile as kc
from ..kernels import distance as kdist
from ..launch import launch
from .common import NP_TYPE, coalesce, strided_np
from .linalg_base import zero

VERSION = 1              # bump when this family's rendered source changes (disk cache key)
PARALLEL_MIN = 1 << 16   # multiply-adds below which a prange launch costs more than it saves
_FLOAT = frozenset({torch.float32, torch.float64})


def _norm(p: float, backward: bool) -> str:
    if p < 0 or math.isnan(p):
        raise NotImplementedError(f"distance with p={p}")
    if p == 0:
        return "zero"
    if p == 1:
        return "one"
    if p == 2:
        return "two"
    if math.isinf(p):
        return "inf"
    return "lt_two" if backward and p < 2 else "general"


def _check(*ts: torch.Tensor) -> None:
    dtype = ts[0].dtype
    if dtype not in _FLOAT or any(t.dtype != dtype for t in ts):
        raise NotImplementedError(f"distance on {[t.dtype for t in ts]}")


def _parallel(work: int) -> bool:
    return work >= PARALLEL_MIN and kc.parallel_allowed()


def _batched(ts: list, batch: tuple) -> list:
    """Each (*batch', rows, cols) tensor as a (B1, B2, rows, cols) numpy view, batch dims
    broadcast to `batch` and coalesced (NotImplementedError when more than two remain)."""
    full = [t.expand(batch + tuple(t.shape[-2:])) for t in ts]
    if batch:
        shape, strides = coalesce(batch, [tuple(t.stride()[:-2]) for t in full])
    else:
        shape, strides = (1,), [(0,)] * len(full)
    if len(shape) > 2:
        raise NotImplementedError("cdist batch dims that do not coalesce into two")
    if len(shape) == 1:
        shape, strides = (1,) + shape, [(0,) + st for st in strides]
    return [strided_np(t, shape + tuple(t.shape[-2:]), st + tuple(t.stride()[-2:]))
            for t, st in zip(full, strides)]


def lower_cdist(func, a, outs):
    x1, x2, p, out = a["x1"], a["x2"], float(a["p"]), outs[0]
    _check(x1, x2)
    if out.numel() == 0:   # before the matmul-mode refusal: nothing to round differently
        return
    mode = a["compute_mode"] or 0
    if p == 2 and (mode == 1 or (mode == 0 and (x1.shape[-2] > 25 or x2.shape[-2] > 25))):
        # PyTorch computes this case as a matmul (|a|^2 + |b|^2 - 2 a.b): a different rounding
        raise NotImplementedError("cdist p=2 in matmul mode")
    norm = _norm(p, False)
    o, v1, v2 = _batched([out, x1, x2], tuple(out.shape[:-2]))
    T = NP_TYPE[out.dtype]
    work = out.numel() * x1.shape[-1]
    parallel = _parallel(work)
    launch(("distance", "cdist", VERSION, norm, T, parallel),
           lambda: kdist.render_cdist(norm, T, parallel), (o, v1, v2, p),
           flops=3.0 * work, bytes_moved=float((x1.numel() + x2.numel() + out.numel())
                                                * out.element_size()), engine="vector")


def lower_cdist_backward(func, a, outs):
    grad, x1, x2, dist, p, gi = a["grad"], a["x1"], a["x2"], a["cdist"], float(a["p"]), outs[0]
    _check(grad, x1, x2, dist)
    if gi.numel() == 0:
        return
    if grad.numel() == 0:
        # an empty distance matrix (no rows in the other operand, or an empty batch that x1
        # is broadcast over): the gradient is zero, and the kernel would write none of it
        zero(gi)
        return
    norm = _norm(p, True)
    batch = tuple(grad.shape[:-2])
    # x1 broadcast over grad's batch (the x2 gradient of a broadcast cdist): the kernel sums
    # the batch copies into one stride-0 view of gi, serially
    accumulate = tuple(x1.shape[:-2]) != batch
    g, v1, v2, d, gv = _batched([grad, x1, x2, dist, gi], batch)
    T = NP_TYPE[gi.dtype]
    work = grad.numel() * x1.shape[-1]
    parallel = not accumulate and _parallel(work)
    launch(("distance", "cdist_bw", VERSION, norm, T, parallel, accumulate),
           lambda: kdist.render_cdist_backward(norm, T, parallel, accumulate),
           (gv, g, v1, v2, d, p),
           flops=6.0 * work, bytes_moved=float((2 * x1.numel() + x2.numel() + 2 * grad.numel())
                                                * gi.element_size()), engine="vector")


def lower_pdist(func, a, outs):
    x, p, out = a["self"], float(a["p"]), outs[0]
    _check(x)
    if out.numel() == 0:
        return
    norm = _norm(p, False)
    T = NP_TYPE[out.dtype]
    work = out.numel() * x.shape[1]
    parallel = _parallel(work)
    launch(("distance", "pdist", VERSION, norm, T, parallel),
           lambda: kdist.render_pdist(norm, T, parallel), (out.numpy(), x.numpy(), p),
           flops=3.0 * work, bytes_moved=float((x.numel() + out.numel()) * out.element_size()),
           engine="vector")


def lower_pdist_backward(func, a, outs):
    grad, x, dist, p, gi = a["grad"], a["self"], a["pdist"], float(a["p"]), outs[0]
    _check(grad, x, dist)
    if gi.numel() == 0:
        return
    if grad.numel() == 0:   # one row: no pairs, a zero gradient
        zero(gi)
        return
    norm = _norm(p, True)
    T = NP_TYPE[gi.dtype]
    work = grad.numel() * x.shape[1]
    parallel = _parallel(work)
    launch(("distance", "pdist_bw", VERSION, norm, T, parallel),
           lambda: kdist.render_pdist_backward(norm, T, parallel),
           (gi.numpy(), grad.numpy(), x.numpy(), dist.numpy(), p), flops=6.0 * work,
           bytes_moved=float((2 * x.numel() + 2 * grad.numel()) * gi.element_size()),
           engine="vector")


LOWERINGS = {
    "aten::_cdist_forward": lower_cdist,
    "aten::_cdist_backward": lower_cdist_backward,
    "aten::_pdist_forward": lower_pdist,
    "aten::_pdist_backward": lower_pdist_backward,
}
