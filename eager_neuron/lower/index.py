"""Index/gather lowerings: embedding (+ backward), index_select, gather, scatter*, index_add,
index / index_put (advanced indexing), masked_scatter, and the data-dependent nonzero,
masked_select and boolean-mask index (DYNAMIC: meta cannot give their output shape).

(Just over 500 lines: the index family's lowerings share take/put/scatter and their error
record; the dynamic-size entry points and the CPU-checked one_hot/arg reductions end it.)

Every op is planned onto a few kernels (kernels/index.py): `take` reads self[i0[b], i1[b], .., r]
for broadcast index positions b and rest dims r; `put` is its write (or accumulate); `gather` /
`scatter` work along one axis; `count` + `nonzero` turn a mask into coordinates. Dims are
permuted and coalesced into numpy views here, so kernels see only a few loop ranks.

>>> import torch, eager_neuron
>>> w = torch.arange(6.).view(3, 2).to("neuron")
>>> torch.nn.functional.embedding(torch.tensor([2, 0]).to("neuron"), w).cpu().tolist()
[[4.0, 5.0], [0.0, 1.0]]
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .. import errors
from ..kernels import index as kix
from ..launch import checked, launch
from .cast import cast_steps, launches
from .common import HALF, NP_TYPE, coalesce
from .mask import (
    core_index,
    count_steps,
    fill_steps,
    lower_masked_scatter,
    lower_masked_scatter_backward,
    lower_nonzero_static,
    select_steps,
)
from .shape import LOWERINGS as SHAPE_LOWERINGS
from .shape import axis_views as _axis_views
from .shape import nbytes as _nbytes
from .shape import np_view as _np


def _raise_bad(err: np.ndarray, op: str, dims) -> None:
    checked(_check_bad, err, op, dims)   # the fast path replays the check (launch.checked)


def _check_bad(err: np.ndarray, op: str, dims) -> None:
    """Turn a kernel's error record (flag, value, axis, size) into the CPU's IndexError."""
    if err[0]:
        raise IndexError(f"{op}: index {err[1]} is out of bounds for dimension "
                         f"{dims[err[2]]} with size {err[3]}")


def _store(dtype) -> str:
    return "({}) != 0" if dtype == torch.bool else NP_TYPE.get(dtype, "np.int16") + "({})"


def _int_index(t: torch.Tensor, op: str) -> None:
    if t.dtype not in (torch.int64, torch.int32):
        raise IndexError(f"{op}: tensors used as indices must be long or int, got {t.dtype}")


# ---------------------------------------------------------------------------------------------
# take / put: the two kernels behind embedding, index_select, index, index_add, index_put
# ---------------------------------------------------------------------------------------------

def _split(data_p, idx_p, nb: int, k: int, rest_p):
    """Coalesce the index-position dims (over data_p's first nb dims and the indices) and the
    rest dims (over data_p's and rest_p's trailing dims); returns the numpy views and ranks."""
    bshape = tuple(data_p.shape[:nb])
    ex = [i.expand(bshape) for i in idx_p]
    cb, bstr = coalesce(bshape, [data_p.stride()[:nb]] + [e.stride() for e in ex])
    rshape = tuple(data_p.shape[nb:])
    cr, rstr = coalesce(rshape, [data_p.stride()[nb:], rest_p.stride()[k:]])
    d = _np(data_p, cb + cr, bstr[0] + rstr[0])
    s = _np(rest_p, tuple(rest_p.shape[:k]) + cr, tuple(rest_p.stride()[:k]) + rstr[1])
    iv = [_np(e, cb, st) for e, st in zip(ex, bstr[1:])]
    return d, s, iv, len(cb), len(cr)


def _pair(out: torch.Tensor, full: torch.Tensor):
    """Coalesced numpy views of out and a same-shape tensor for a kernel's copy loop."""
    cs, cst = coalesce(tuple(out.shape), [out.stride(), full.stride()])
    return _np(out, cs, cst[0]), _np(full, cs, cst[1]), len(cs)


# take, put and _scatter build their launch (launch()'s positional arguments, with the host
# check of the kernel's error record; None: nothing to launch) and the lowering makes it:
# dispatch -> lowering -> launch.

def take(op: str, out_p, src_p, idxs, dims, wrap: bool) -> tuple | None:
    """out_p[b.., r..] = src_p[idxs[0][b..], .., r..]; out_p is (B + R), src_p (K + R)."""
    k = len(idxs)
    nb = out_p.dim() - (src_p.dim() - k)
    if math.prod(out_p.shape[:nb]) == 0:
        return None
    o, s, iv, cb, cr = _split(out_p, idxs, nb, k, src_p)
    err = np.zeros(4, np.int64)
    key = ("index", "take",
           cb,     # coalesced index-position loop rank
           k,      # number of index tensors
           cr)     # coalesced rest loop rank
    return (key, lambda: kix.render_take(cb, k, cr), (o, s, *iv, wrap, err), 0.0,
            2 * _nbytes(out_p) + _nbytes(*idxs), "vector", "fp32", None, None, None,
            (_check_bad, err, op, dims))


def _scalar_as(dt: np.dtype, value):
    """A Python scalar converted to the kernel's dtype as ATen's Scalar.to<T>() converts it: an
    integer wraps (index_add_(..., alpha=-1) on uint8 adds 255 * source, mod 256), a bool is
    value != 0. (numpy refused: OverflowError, -1 out of bounds for uint8.)"""
    if dt.kind == "b":
        return dt.type(bool(value))
    if dt.kind in "iu" and isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        info = np.iinfo(dt)
        low = info.min if dt.kind == "i" else -int(info.max)   # c10's checked conversion
        if not low <= int(value) <= info.max:
            raise RuntimeError(f"value cannot be converted to type {_C_TYPE[dt.name]} without "
                               "overflow")
        return np.array(value, dtype=np.int64).astype(dt)[()]
    return dt.type(value)


_C_TYPE = {"int8": "int8_t", "uint8": "uint8_t", "int16": "int16_t", "int32": "int",
           "int64": "int64_t"}


def put(op: str, out, out_p, vals_p, idxs, dims, *, self=None, wrap=False, accumulate=False,
        alpha=None, zero=False, pad=None, freq=False, store=None, scale="{}") -> tuple:
    """out_p[idxs[0][b..], .., r..] (+)= vals_p[b.., r..] * alpha; out_p is a permuted view of
    out. `self` given: out starts as a copy of it (the functional form, in the same launch);
    `scale` formats vals * alpha before the add, `store` the stored value."""
    k = len(idxs)
    nb = vals_p.dim() - (out_p.dim() - k)
    v, o, iv, cb, cr = _split(vals_p, idxs, nb, k, out_p)
    copy = self is not None and out is not self
    dst, full, rc = _pair(out, self if copy else out)
    one = _scalar_as(np.dtype(o.dtype), 1 if alpha is None else alpha)
    err = np.zeros(4, np.int64)
    store = store or _store(out.dtype)
    key = ("index", "put", cb, k, cr,   # loop ranks, as for take
           rc,                            # coalesced rank of the copy (out = self) loop
           freq,                          # rows scaled by 1 / index frequency
           store,                         # the output's store cast
           scale)                         # vals * alpha's rounding (half 1-d index_add)
    # NOTE: wrap, accumulate, copy, zero and padding are runtime flags: one compiled kernel
    # serves index_put, index_add and embedding backward of the same ranks and dtype.
    return (key, lambda: kix.render_put(cb, k, cr, rc, freq, store, scale),
            (o, v, *iv, wrap, accumulate, copy, zero, pad is not None,
             -1 if pad is None else int(pad), one, err, dst, full),
            vals_p.numel() if accumulate else 0,
            2 * _nbytes(vals_p) + _nbytes(*idxs) + 2 * _nbytes(self if copy else None),
            "vector", "fp32", None, None, None, (_check_bad, err, op, dims))


def _flat_index(index: torch.Tensor, op: str) -> torch.Tensor:
    _int_index(index, op)
    if index.dim() > 1:
        raise IndexError(f"{op}: index must be a vector or a scalar, got {index.dim()} dims")
    return index.reshape(-1)


def _dim(a: dict, t: torch.Tensor) -> int:
    if not isinstance(a["dim"], int):   # the Dimname overloads share the op name
        raise NotImplementedError("named dimensions")
    d, n = a["dim"], t.dim()
    if not -n <= d < n:   # as the CPU (a 0-d self counts as 1-d): never wrap silently
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], "
                         f"but got {d})")
    return d % n


def _at_least_1d(*ts):
    return [t.view(1) if t.dim() == 0 else t for t in ts]


def lower_embedding(func, a, outs):
    weight, indices = a["weight"], a["indices"]
    if weight.dim() != 2:
        raise NotImplementedError("embedding with a weight that is not 2-D")
    _int_index(indices, "aten::embedding")
    req = take("aten::embedding", outs[0], weight, [indices], (0,), wrap=False)
    if req is not None:
        launch(*req)


def lower_embedding_backward(func, a, outs):
    grad, indices = a["grad_output"], a["indices"]
    out = outs[0]
    # NOTE: grad is indices.shape + (D,); a negative padding_idx means none (nn.Embedding has
    # already turned -1 into num_weights - 1 before it gets here).
    pad = a["padding_idx"] if a["padding_idx"] >= 0 else None
    req = put("aten::embedding_dense_backward", out, out, grad, [indices], (0,), accumulate=True,
              zero=True, pad=pad, freq=bool(a["scale_grad_by_freq"]))
    if req is not None:
        launch(*req)


def lower_index_select(func, a, outs):
    self, out = _at_least_1d(a["self"], outs[0])
    dim = _dim(a, self)
    index = _flat_index(a["index"], "aten::index_select")
    req = take("aten::index_select", out.movedim(dim, 0), self.movedim(dim, 0), [index], (dim,),
               wrap=False)
    if req is not None:
        launch(*req)


def _index_add(func, a, outs, store=None, scale="{}"):
    """index_add's steps (lower_index_add launches them): put's launch, or for a half self the
    float32 copies, put's launch rounding as the CPU does, and the cast back."""
    if outs[0].dtype in HALF:
        return (yield from _index_add_half(func, a, outs))
    self, out, source = _at_least_1d(a["self"], outs[0], a["source"])
    dim = _dim(a, self)
    index = _flat_index(a["index"], "aten::index_add")
    alpha = a["alpha"]
    req = put(func._schema.name, outs[0], out.movedim(dim, 0), source.movedim(dim, 0), [index],
              (dim,), self=a["self"], accumulate=True, alpha=None if alpha == 1 else alpha,
              store=store, scale=scale)
    if req is not None:
        yield req


def _half_store(dtype) -> str:
    return "_round_bf16({})" if dtype == torch.bfloat16 else "_round_f16({})"


def _index_add_half(func, a, outs):
    """bfloat16 / float16 in float32 scratch, rounded where the CPU's index_add_cpu_ rounds
    (alpha is first cast to the half type, as Scalar.to<scalar_t>() and add's alpha are):
    1. a 0-d or 1-d self: a scalar loop, `self[index[i]] += source[i] * alpha` in the half type:
       the product rounded, then the sum;
    2. alpha 1 along the first or last dim, an int64 index and source's sizes those of self
       elsewhere: it calls scatter_add_, which sums in float32 and rounds once;
    3. else: self.select(dim, index[i]).add_(source.select(dim, i), alpha) per index, each add
       rounded once (add's vectorised loop; its scalar tail rounds the product first, as our
       add does not either: docs/NUMERICS.md)."""
    from .half import _half_round, _up_steps

    out, self, source, alpha = outs[0], a["self"], a["source"], a["alpha"]
    dim = a["dim"] % max(self.dim(), 1) if isinstance(a["dim"], int) else a["dim"]
    rnd = _half_store(out.dtype)
    store, scale = rnd, "{}"
    if self.dim() <= 1:
        scale = rnd
    elif (alpha == 1 and dim in (0, self.dim() - 1) and a["index"].dtype == torch.int64
          and source.dim() == self.dim()
          and all(self.shape[d] == source.shape[d] for d in range(self.dim()) if d != dim)):
        store = None
    # self's float32 copy is dense: an expanded self (stride 0) must not be written through
    self32 = torch.empty(self.shape, dtype=torch.float32)
    yield from cast_steps(self, self32)
    src32 = yield from _up_steps(source, source)
    half_alpha = alpha if isinstance(alpha, bool) else _half_round(alpha, out.dtype)
    yield from _index_add(func, dict(a, self=self32, source=src32, alpha=half_alpha), [self32],
                          store=store, scale=scale)
    yield from cast_steps(self32, out)   # the launches lower_to_copy makes


lower_index_add = launches(_index_add)   # dispatch -> lower_index_add -> launch
lower_index_add.__name__ = "lower_index_add"
lower_index_add.handles_half = True


def lower_put(func, a, outs):
    """self.put(index, source): put on the flattened self (negative indices wrap)."""
    self, out, index, source = a["self"], outs[0], a["index"], a["source"]
    if not (out.is_contiguous() and index.is_contiguous() and source.is_contiguous()):
        raise NotImplementedError("put on non-contiguous tensors (flattening would copy)")
    if source.dtype != out.dtype:
        raise NotImplementedError("put with a source of another dtype")
    _int_index(index, "aten::put")
    req = put(func._schema.name, out, out.view(-1), source.view(-1), [index.view(-1)], (0,),
              self=self, wrap=True, accumulate=bool(a["accumulate"]))
    if req is not None:
        launch(*req)


# ---------------------------------------------------------------------------------------------
# advanced indexing: self[indices] and self[indices] = values
# ---------------------------------------------------------------------------------------------

def _adv_plan(self: torch.Tensor, indices: list):
    """(P: indexed dims, R: other dims, index tensors, result shape, perm result -> B + R)."""
    if len(indices) > self.dim():
        raise IndexError(f"too many indices for tensor of dimension {self.dim()}")
    idx = list(indices) + [None] * (self.dim() - len(indices))
    P = [d for d, t in enumerate(idx) if t is not None]
    R = [d for d, t in enumerate(idx) if t is None]
    if not P:
        raise NotImplementedError("advanced indexing without an index tensor")
    B = tuple(torch.broadcast_shapes(*(idx[d].shape for d in P)))
    nb = len(B)
    if P == list(range(P[0], P[0] + len(P))):  # adjacent: the broadcast dims replace them
        p0 = P[0]
        shape = tuple(self.shape[:p0]) + B + tuple(self.shape[P[-1] + 1:])
        perm = list(range(p0, p0 + nb)) + list(range(p0)) + list(range(p0 + nb, len(shape)))
    else:                                      # split: the broadcast dims go first
        shape = B + tuple(self.shape[d] for d in R)
        perm = list(range(len(shape)))
    return P, R, [idx[d] for d in P], shape, perm


def expand_masks(self: torch.Tensor, indices):
    """Boolean (or uint8) masks become one long index tensor per masked dim (via nonzero): a
    generator of the count and fill launches; returns the index list."""
    out = []
    for t in indices:
        if t is None or t.dtype not in (torch.bool, torch.uint8):
            if t is not None:
                _int_index(t, "aten::index")
            out.append(t)
            continue
        d = len(out)
        for j, size in enumerate(t.shape):
            if d + j >= self.dim() or self.shape[d + j] != size:
                raise IndexError(
                    f"The shape of the mask {list(t.shape)} at index {j} does not match the "
                    f"shape of the indexed tensor {list(self.shape)} at index {d + j}")
        coords = yield from _nonzero_scratch(t)
        out.extend(coords[:, j] for j in range(t.dim()))
    return out


def _index(self, indices, out) -> tuple | None:
    """self[indices] into out: take's launch."""
    P, R, idxs, _shape, perm = _adv_plan(self, indices)
    return take("aten::index", out.permute(perm), self.permute(P + R), idxs, P, wrap=True)


def _index_put(func, a, outs, store=None):
    """index_put's steps (lower_index_put below launches them): the masks' coordinates, then
    put's launch."""
    self, out, values = a["self"], outs[0], a["values"]
    if out.dtype in HALF:
        return (yield from _index_put_half(func, a, outs))
    indices = yield from expand_masks(self, a["indices"])
    P, R, idxs, shape, perm = _adv_plan(self, indices)
    vals = values
    while vals.dim() > len(shape) and vals.shape[0] == 1:
        vals = vals[0]
    try:
        vals = vals.expand(shape)
    except RuntimeError:
        raise RuntimeError(f"shape mismatch: value tensor of shape {list(values.shape)} cannot "
                           f"be broadcast to indexing result of shape {list(shape)}") from None
    if vals.dtype != out.dtype:
        raise NotImplementedError("index_put with values of another dtype")
    req = put(func._schema.name, out, out.permute(P + R), vals.permute(perm), idxs, P, self=self,
              wrap=True, accumulate=bool(a["accumulate"]), store=store)
    if req is not None:
        yield req


def _index_put_half(func, a, outs):
    """Half floats in float32 scratch; an accumulate rounds after every add, as the CPU's
    bfloat16 / float16 `+=` does (duplicate indices give the CPU's sums, not float32's)."""
    from .half import _up_steps

    out = outs[0]
    self32 = yield from _up_steps(a["self"], a["self"])
    if self32 is a["self"]:
        self32 = a["self"].clone()   # NOTE: never for a half self (_up copies); kept for safety
    vals = a["values"]
    vals32 = (yield from _up_steps(vals, vals)) if vals.dtype in HALF else vals
    rnd = ("_round_bf16({})" if out.dtype == torch.bfloat16 else "_round_f16({})") \
        if a["accumulate"] else None
    yield from _index_put(func, dict(a, self=self32, values=vals32), [self32], store=rnd)
    yield from cast_steps(self32, out)   # the launches lower_to_copy makes


lower_index_put = launches(_index_put)   # dispatch -> lower_index_put -> launch
lower_index_put.__name__ = "lower_index_put"
lower_index_put.handles_half = True


# ---------------------------------------------------------------------------------------------
# gather / scatter along one axis
# ---------------------------------------------------------------------------------------------

def lower_gather(func, a, outs):
    self, index, out = _at_least_1d(a["self"], a["index"], outs[0])
    if index.numel() == 0:   # the CPU accepts an empty index of any integer dtype
        return
    _int_index(index, "aten::gather")
    dim = _dim(a, self)
    n = index.shape[dim]
    o, s, i = _axis_views(index.shape, dim, [(out, n), (self, self.shape[dim]), (index, n)])
    err = np.zeros(4, np.int64)
    c = o.ndim - 1
    launch(("index", "gather", c), lambda: kix.render_gather(c), (o, s, i, err),
           bytes_moved=2 * _nbytes(out) + _nbytes(index))
    _raise_bad(err, "aten::gather", (dim,))


_LEGACY = {"add": "sum", "multiply": "prod"}


def _identity(reduce: str, dtype):
    if reduce in ("sum", "mean"):
        return 0
    if reduce == "prod":
        return 1
    big = reduce == "amin"
    if dtype == torch.bool:
        return big
    if dtype.is_floating_point:
        return math.inf if big else -math.inf
    info = torch.iinfo(dtype)
    return info.max if big else info.min


def _scatter(op: str, a, outs, reduce=None, include_self=True, store=None,
             total="{}") -> tuple | None:
    """scatter's launch (None: nothing to launch); `store` formats every stored value, `total`
    a mean's sum before its division."""
    out, self, index = outs[0], a["self"], a["index"]
    src = a.get("src")
    value = src is None
    if not value and src.dtype != out.dtype:
        raise NotImplementedError("scatter with src of another dtype")
    if index.numel():   # the CPU accepts an empty index of any integer dtype
        _int_index(index, op)
    elif index.dim() > max(out.dim(), 1):
        # an empty index may have more dims than self (gather's backward of an empty index):
        # nothing is scattered, out is self
        if out is not self and out.numel():
            from .cast import cast as copy_into

            copy_into(self, out)
        return None
    out1, index1 = _at_least_1d(out, index)
    dim = _dim(a, out1)
    copy = out is not self
    parts = [(out1, out1.shape[dim]), (index1, index1.shape[dim])]
    if not value:
        parts.append((src.view(1) if src.dim() == 0 else src, index1.shape[dim]))
    views = _axis_views(index1.shape, dim, parts)
    o, i = views[0], views[1]
    kind = o.dtype.type   # scalars travel as the output's numpy type: one kernel signature
    s = kind(int(a["value"]) if isinstance(a["value"], bool) else a["value"]) if value \
        else views[2]
    cast = NP_TYPE.get(out.dtype, "np.int16")
    store = store or _store(out.dtype)
    err = np.zeros(4, np.int64)
    c = o.ndim - 1
    dst, full, rc = _pair(out, self)
    key = ("index", "scatter", c,
           rc,              # coalesced rank of the copy (out = self) loop
           value,           # src is a scalar
           cast, store,     # load and store casts of the output dtype
           total)           # a mean's sum rounded before the division (half types)
    # NOTE: the reduction, include_self and copy are runtime: one kernel per rank and dtype.
    return (key, lambda: kix.render_scatter(c, rc, value, cast, store, total),
            (o, s, i, kix.REDUCE[reduce], include_self, copy,
             kind(_identity(reduce or "sum", out.dtype)), err, dst, full),
            index.numel() if reduce else 0,
            2 * _nbytes(index) + _nbytes(None if value else src)
            + 2 * _nbytes(self if copy else None),
            "vector", "fp32", None, None, None, (_check_bad, err, op, (dim,)))


def lower_scatter(func, a, outs):
    reduce = a.get("reduce")
    if reduce is not None and isinstance(a.get("src"), torch.Tensor):   # ATen's warning
        errors.warn("The reduce argument of torch.scatter with Tensor src is deprecated and "
                    "will be removed in a future PyTorch release. Use torch.scatter_reduce "
                    "instead for more reduction options.", once=True)
    req = _scatter(func._schema.name, a, outs, None if reduce is None else _LEGACY[reduce])
    if req is not None:
        launch(*req)


def lower_scatter_add(func, a, outs):
    req = _scatter(func._schema.name, a, outs, "sum")
    if req is not None:
        launch(*req)


def _scatter_reduce(func, a, outs, store=None, total="{}"):
    """scatter_reduce's steps. Half types: the CPU sums (and multiplies) in float32 and stores
    the half type once, then a mean divides that rounded sum by the count in the half type."""
    if outs[0].dtype in HALF:
        return (yield from _reduce_half(func, a, outs, _scatter_reduce, "src", False))
    req = _scatter(func._schema.name, a, outs, a["reduce"], bool(a["include_self"]), store,
                   total)
    if req is not None:
        yield req


def _index_reduce(func, a, outs, store=None, total="{}"):
    """index_reduce along dim is a scatter_reduce whose index is `index` broadcast (stride 0)
    over the source's other dims. Half types: the CPU multiplies (adds, for a mean) one source
    slice at a time in the half type, each step rounded, then divides in the half type."""
    if outs[0].dtype in HALF:
        return (yield from _reduce_half(func, a, outs, _index_reduce, "source", True))
    errors.warn("index_reduce() is in beta and the API may change at any time.", once=True)
    self, source = _at_least_1d(a["self"], a["source"])
    dim = _dim(a, self)
    index = _flat_index(a["index"], "aten::index_reduce")
    shape = [1] * source.dim()
    shape[dim] = -1
    b = dict(a, index=index.view(shape).expand(source.shape), src=source, dim=dim)
    req = _scatter(func._schema.name, b, outs, a["reduce"], bool(a["include_self"]), store,
                   total)
    if req is not None:
        yield req


def _reduce_half(func, a, outs, steps, key: str, each: bool):
    """A half-type reduction in float32 scratch: `steps` on the copies, every stored value
    rounded to the half type when `each` (else once, by the cast back), a mean's sum rounded
    before its division."""
    from .half import _up_steps

    out, self = outs[0], a["self"]
    self32 = torch.empty(self.shape, dtype=torch.float32)   # dense: never an expanded self
    yield from cast_steps(self, self32)
    src32 = yield from _up_steps(a[key], a[key])
    rnd = _half_store(out.dtype)
    yield from steps(func, dict(a, self=self32, **{key: src32}), [self32],
                     store=rnd if each else None, total=rnd)
    yield from cast_steps(self32, out)   # the launches lower_to_copy makes


lower_scatter_reduce = launches(_scatter_reduce)   # dispatch -> lowering -> launch
lower_scatter_reduce.__name__ = "lower_scatter_reduce"
lower_scatter_reduce.handles_half = True
lower_index_reduce = launches(_index_reduce)
lower_index_reduce.__name__ = "lower_index_reduce"
lower_index_reduce.handles_half = True


# ---------------------------------------------------------------------------------------------
# masks as steps (lower/mask.py's count_steps, fill_steps, select_steps): the requests a
# generator yields; dispatch makes them (two calls below it at most), not a helper.
# ---------------------------------------------------------------------------------------------

def _nonzero_scratch(x: torch.Tensor):
    """(n, x.dim()) coordinates of x's non-zeros in host-backed scratch: count, then fill."""
    n = yield from count_steps(x)
    out = torch.empty((n, x.dim()), dtype=torch.int64)
    yield from fill_steps(x, out)
    return out


# ---------------------------------------------------------------------------------------------
# DYNAMIC: output shape depends on the data. Each is a generator of launch requests dispatch
# makes (dispatch -> launch); it returns [(data, block), ...] on core `index`
# ---------------------------------------------------------------------------------------------

def dynamic_nonzero(func, a, index=-1):
    from ..buffers import alloc

    x = a["self"]
    n = yield from count_steps(x)
    # NOTE: the CPU returns nonzero column-major: strides (1, n)
    data, block = alloc(core_index(index), (n, x.dim()), (1, n), torch.int64)
    yield from fill_steps(x, data)
    return [(data, block)]


def dynamic_masked_select(func, a, index=-1):
    from ..buffers import alloc

    self, mask = a["self"], a["mask"]
    if mask.dtype != torch.bool:
        raise NotImplementedError("masked_select with a non-bool mask")
    shape = torch.broadcast_shapes(self.shape, mask.shape)
    n = (yield from count_steps(mask.expand(shape))) if math.prod(shape) else 0
    data, block = alloc(core_index(index), (n,), (1,), self.dtype)
    yield from select_steps(self, mask, data)
    return [(data, block)]


def dynamic_index(func, a, index=-1):
    """self[indices]: boolean masks become coordinates first, then meta sizes the output."""
    from ..buffers import alloc
    from ..meta import meta_outputs

    self = a["self"]
    indices = yield from expand_masks(self, a["indices"])
    leaves, _spec = meta_outputs(func, (self, indices), {})
    data, block = alloc(core_index(index), *leaves[0])
    req = _index(self, indices, data)
    if req is not None:
        yield req
    return [(data, block)]


def _lowerings() -> dict:
    table = {
        "aten::embedding": lower_embedding,
        "aten::embedding_dense_backward": lower_embedding_backward,
        "aten::index_select": lower_index_select,
        "aten::gather": lower_gather,
        "aten::masked_scatter": lower_masked_scatter,
        "aten::masked_scatter_backward": lower_masked_scatter_backward,
        "aten::nonzero_static": lower_nonzero_static,
        "aten::put": lower_put,
        "aten::index_add": lower_index_add,
        "aten::index_put": lower_index_put,
        "aten::_index_put_impl_": lower_index_put,
        "aten::scatter_add": lower_scatter_add,
        "aten::scatter_reduce.two": lower_scatter_reduce,
        "aten::index_reduce": lower_index_reduce,
    }
    for ov in ("src", "value", "reduce", "value_reduce"):
        table[f"aten::scatter.{ov}"] = lower_scatter
    # the in-place variants (put_, index_add_, scatter_.src, ...) are read off the schemas by
    # eager_neuron/ops.py (this family's row allows them)
    return table


LOWERINGS = _lowerings()
DYNAMIC = {
    "aten::nonzero": dynamic_nonzero,
    "aten::masked_select": dynamic_masked_select,
    # NOTE: not in LOWERINGS: dispatch sizes kernel outputs by meta first, which raises for a
    # boolean mask; dynamic_index serves integer indices as well.
    "aten::index.Tensor": dynamic_index,
}
# shape ops (cat, pad, flip, roll, repeat, tril/triu, *_scatter) live next door; their old
# sort/topk entries are overridden by the sort family (lower/sort.py, registered later in ops)
LOWERINGS.update(SHAPE_LOWERINGS)


# ---------------------------------------------------------------------------------------------
# one_hot, checked as on the CPU
# ---------------------------------------------------------------------------------------------
# ATen's one_hot skips its bounds checks on PrivateUse1 devices (it relies on a device-side
# assert, which a host-simulated device never fires) and compares against arange: an index out
# of range silently became a zero row. aten::one_hot is CompositeImplicitAutograd, so it never
# reaches dispatch; an AutogradPrivateUse1 kernel checks first, then runs ATen's composite.

_ONE_HOT = torch.ops.aten.one_hot.default


def one_hot_checked(self: torch.Tensor, num_classes: int = -1) -> torch.Tensor:
    """aten::one_hot for neuron tensors: the CPU's errors for negative or too large classes.

    >>> import torch, eager_neuron, torch.nn.functional as F
    >>> F.one_hot(torch.tensor([0, 2], device="neuron"), 3).cpu().tolist()
    [[1, 0, 0], [0, 0, 1]]
    >>> F.one_hot(torch.tensor([0, 5], device="neuron"), 3)
    Traceback (most recent call last):
    ...
    RuntimeError: Class values must be smaller than num_classes.
    """
    if self.dtype == torch.int64 and self.numel() > 0:
        lo, hi = (int(v) for v in torch.aminmax(self.detach()))  # one host read, as the CPU
        if lo < 0:
            raise RuntimeError("Class values must be non-negative.")
        if num_classes != -1 and hi >= num_classes:
            raise RuntimeError("Class values must be smaller than num_classes.")
    return _ONE_HOT._op_dk(torch._C.DispatchKey.CompositeImplicitAutograd, self, num_classes)


def _arg_reduction_checked(op, name: str):
    """argmax/argmin with no dim of an empty tensor: the CPU raises IndexError, torch's meta
    function (which dispatch runs first) RuntimeError; the CPU's type wins."""
    def impl(self, dim=None, keepdim=False):
        if dim is None and self.numel() == 0:
            raise IndexError(f"{name}(): Expected reduction dim to be specified for "
                             "input.numel() == 0.")
        with torch._C._AutoDispatchBelowAutograd():
            return op(self, dim, keepdim)

    impl.__name__ = f"{name}_checked"
    return impl


_LIB = torch.library.Library("aten", "IMPL")
_LIB.impl("one_hot", one_hot_checked, "AutogradPrivateUse1")
for _name in ("argmax", "argmin"):
    _LIB.impl(_name, _arg_reduction_checked(getattr(torch.ops.aten, _name).default, _name),
              "AutogradPrivateUse1")
