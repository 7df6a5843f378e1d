"""Reduction lowerings: sum/mean/prod, max/min/arg*, any/all, var/std, logsumexp, norms, scans.

Every reduction is one kernel over a zero-copy strided view: the kept dims first, the reduced dims
last, each group coalesced (`split`). Float sums accumulate in float64 with `fastmath={'reassoc'}`
so LLVM vectorizes the loop and the float32 result is within one rounding of torch's cascade sum;
a float32 sum/mean of one contiguous row runs serially in blocks ("block" mode): a prange over
chunks measured 20x slower on a busy 2-core host (thread oversubscription).

>>> import torch, eager_neuron
>>> torch.arange(6.0, device="neuron").view(2, 3).sum(1).tolist()
[3.0, 12.0]
"""

from __future__ import annotations

import math

import torch

from .. import cost, errors
from ..cache.families import REDUCE
from ..context import _TLS as _ctx_tls
from ..kernels import compile as kc
from ..kernels import reduce as kr
from ..launch import launch
from .cast import cast_steps, launches
from .common import NP_TYPE, coalesce, strided_np

PARALLEL_MIN = 1 << 18   # elements read; below this a prange launch costs more than it saves
F64 = "np.float64"


# ---------------------------------------------------------------------------------------------
# views: kept dims first, reduced dims last
# ---------------------------------------------------------------------------------------------

def red_dims(x: torch.Tensor, dim, empty_is_all: bool = True) -> list[int]:
    """Wrapped reduced dims; None means all, and so does [] except for any/all.dims."""
    nd = x.dim()
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0 and empty_is_all):
        return list(range(nd))
    dims = [dim] if isinstance(dim, int) else list(dim)
    if nd == 0:
        return []
    return sorted({d % nd for d in dims})


def split(full: list, red: list, small: list = (), keepdim: bool = True, sort: bool = False):
    """(kept shape, reduced shape, full views, small views), both groups coalesced.

    `full` tensors have the input's shape and become rank ko+kr views; `small` tensors have the
    reduced shape (size-1 dims if keepdim) and become rank ko views. `sort` orders the reduced dims
    by falling stride so the innermost loop walks memory (only for order-free reductions).
    """
    x = full[0]
    kept = [d for d in range(x.dim()) if d not in red]
    red = sorted(red, key=lambda d: -abs(x.stride(d))) if sort else list(red)
    kst = [[t.stride(d) for d in kept] for t in full]
    kst += [[t.stride(d) for d in kept] if keepdim else list(t.stride()) for t in small]
    kshape, kst = coalesce(tuple(x.shape[d] for d in kept), kst)
    rshape, rst = coalesce(tuple(x.shape[d] for d in red), [[t.stride(d) for d in red]
                                                           for t in full])
    fviews = [strided_np(t, kshape + rshape, ks + rs) for t, ks, rs in zip(full, kst, rst)]
    sviews = [strided_np(t, kshape, ks) for t, ks in zip(small, kst[len(full):])]
    return kshape, rshape, fviews, sviews


def acc_type(dtype) -> str:
    """Accumulator for sums: float64 for floats (torch's CPU acc type for scans), int64 else."""
    if dtype == torch.bool:
        raise NotImplementedError("sum/prod/scan into bool")
    return F64 if dtype.is_floating_point else "np.int64"


def extreme_init(dtype, op: str) -> str:
    """The identity of max (lowest value) or min (highest value) in the input's own type."""
    t = NP_TYPE[dtype]
    low = op in ("max", "argmax")
    if dtype == torch.bool:
        return "False" if low else "True"
    if dtype.is_floating_point:
        return f"{t}({'-' if low else ''}np.inf)"
    info = torch.iinfo(dtype)
    return f"{t}({info.min if low else info.max})"


# ---------------------------------------------------------------------------------------------
# the one reduction driver
# ---------------------------------------------------------------------------------------------

def reduce(op: str, x: torch.Tensor, outs: list, red: list, keepdim: bool, *, load_t: str,
           acc_t: str, scalars: tuple = (), init: str = "", what: str = "") -> tuple | None:
    """The launch that reduces x over `red` into outs (same shape each) with kernels/reduce.py
    op `op`, as launch()'s positional arguments; None when there is nothing to compute. The
    lowering launches it (dispatch -> lowering -> launch)."""
    # 1. shape check: the meta output must be what these dims give, else decline
    keep = [1 if d in red else s for d, s in enumerate(x.shape)] if keepdim else \
        [s for d, s in enumerate(x.shape) if d not in red]
    if any(tuple(o.shape) != tuple(keep) for o in outs):
        raise NotImplementedError(f"{what}: unexpected output shape for dims {red}")
    if outs[0].numel() == 0:
        return None
    _passes, _finals, _merge, flags = kr.OPS[op]
    if x.numel() == 0 and op in ("max", "min", "argmax", "argmin", "norminf", "normninf",
                                 "kmax32", "kmax64", "kmin32", "kmin64"):
        # no identity to return: torch's own errors
        if len(red) == x.dim():
            raise IndexError(f"{what}(): Expected reduction dim to be specified for "
                             "input.numel() == 0.")
        d = next(d for d in red if x.shape[d] == 0)
        raise IndexError(f"{what}(): Expected reduction dim {d} to have non-zero size.")
    # 2. views and mode
    kshape, rshape, (a,), views = split([x], red, outs, keepdim, sort="index" not in flags)
    ko, kdim = len(kshape), len(rshape)
    n_out = views[0].size
    parallel = x.numel() >= PARALLEL_MIN and kc.parallel_allowed()
    item = a.itemsize
    if flags:
        mode = "row"
    elif ko == 1 and kdim == 1 and a.strides[1] != item and a.strides[0] == item and n_out > 1:
        mode = "col"
    elif (n_out == 1 and kdim == 1 and op in ("sum", "mean") and load_t == "np.float32"
          and a.strides[1] == item):
        mode = "block"   # serial blocks, see kernels/reduce.py
    elif n_out == 1 and kdim == 1 and parallel:
        mode = "chunk"
    else:
        mode = "row"
    parallel = parallel and (mode == "chunk" or kshape[0] > 1) and mode != "block"
    fastmath = acc_t == F64 and op in ("sum", "mean", "norm1", "norm2", "norm0")
    stores = tuple(NP_TYPE[o.dtype] for o in outs)
    key = ("reduce", op, ko, kdim, acc_t, load_t, stores, len(scalars), mode, parallel,
           fastmath, init)

    def render():
        return REDUCE.render(key)   # from the key alone (cache/families.py names its fields)

    passes = 2 if "multi" in flags else 1
    scalar = op in ("logsumexp", "normp")
    # cost.reduction_work per pass over x; the outputs (their own dtypes) written once
    flops, nbytes = cost.reduction_work(x.numel() * passes, 0, x.element_size())
    return (key, render, tuple(views) + (a,) + tuple(scalars),
            flops * (2 if scalar or passes > 1 else 1),
            nbytes + sum(o.numel() * o.element_size() for o in outs),
            "scalar" if scalar else "vector")


# ---------------------------------------------------------------------------------------------
# lowerings
# ---------------------------------------------------------------------------------------------

def _sum_like(op: str):
    def lower(func, a, outs):
        out = outs[0]
        x = a["self"]
        red = red_dims(x, a.get("dim"))
        t = NP_TYPE[out.dtype]
        req = reduce(op, x, [out], red, a.get("keepdim", False), load_t=t,
                     acc_t=acc_type(out.dtype), what=op)
        if req is not None:
            launch(*req)
    lower.__name__ = f"lower_{op}"
    return lower


_KEY_BITS = {torch.float32: 32, torch.float64: 64}


def _extreme(op: str):
    """amax/amin, max/min (full), max.dim/min.dim (values, indices), argmax/argmin."""
    def lower(func, a, outs):
        x = a["self"]
        red = red_dims(x, a.get("dim"))
        t = NP_TYPE[x.dtype]
        schema = func._schema
        if x.dtype == torch.bool and schema.name.startswith("aten::arg"):
            raise RuntimeError(f"{schema.name[6:]}(): does not support bool input")
        indexed = schema.name.startswith("aten::arg") or schema.overload_name == "dim"
        kind = "arg" + op if indexed else op
        targets = list(outs)
        if indexed and len(outs) == 1:
            # argmax: the values go to scratch of the reduced shape
            targets = [torch.empty(outs[0].shape, dtype=x.dtype), outs[0]]
        bits = _KEY_BITS.get(x.dtype)
        if bits and not indexed:
            # float amax/amin/max/min: integer keys (kernels/reduce.py _key_extreme) vectorize
            req = reduce(f"k{op}{bits}", x, targets, red, a.get("keepdim", False), load_t="",
                         acc_t=f"np.int{bits}", what=schema.name.split("::")[1])
            if req is not None:
                launch(*req)
            return
        req = reduce(kind, x, targets, red, a.get("keepdim", False), load_t="", acc_t=t,
                     init=extreme_init(x.dtype, op), what=schema.name.split("::")[1])
        if req is not None:
            launch(*req)
    lower.__name__ = f"lower_{op}"
    return lower


def _logical(op: str):
    def lower(func, a, outs):
        x = a["self"]
        # NOTE: any(dim=()) reduces nothing (an elementwise test), unlike sum(dim=())
        red = red_dims(x, a.get("dim"), empty_is_all=func._schema.overload_name != "dims")
        req = reduce(op, x, outs, red, a.get("keepdim", False), load_t="", acc_t="np.bool_",
                     what=op)
        if req is not None:
            launch(*req)
    return lower


def warn_dof(name: str) -> None:
    """ATen's TORCH_WARN for var/std with degrees of freedom <= 0, at every call: the op gets
    no fast-path runner for this signature (its replay would skip the warning)."""
    ctx = getattr(_ctx_tls, "ctx", None)
    if ctx is not None:
        ctx.capture = None
    errors.warn(f"{name}(): degrees of freedom is <= 0. Correction should be strictly less "
                "than the reduction factor (input numel divided by output numel).")


def _variance(op: str, with_mean: bool):
    """var/std (.correction, .dim) and var_mean/std_mean: two passes in float64."""
    def lower(func, a, outs):
        x = a["self"]
        if not x.is_floating_point():
            raise NotImplementedError(f"{op} of {x.dtype}")
        red = red_dims(x, a.get("dim"))
        n = 1
        for d in red:
            n *= x.shape[d]
        if "correction" in a:
            corr = 1 if a["correction"] is None else a["correction"]
        else:
            corr = 1 if a.get("unbiased", True) else 0
        if n - corr <= 0:   # (a complex variance warns for each part, as ATen's does)
            warn_dof(f"{op}{'_mean' if with_mean else ''}")
        targets = list(outs) if with_mean else [outs[0], torch.empty(outs[0].shape,
                                                                      dtype=outs[0].dtype)]
        req = reduce(op, x, targets, red, a.get("keepdim", False), load_t=F64, acc_t=F64,
                     scalars=(float(max(0, n - corr)),), what=op)
        if req is not None:
            launch(*req)
    return lower


def lower_logsumexp(func, a, outs):
    x = a["self"]
    req = reduce("logsumexp", x, outs, red_dims(x, a["dim"]), a["keepdim"], load_t=F64, acc_t=F64,
                 what="logsumexp")
    if req is not None:
        launch(*req)


def lower_vector_norm(func, a, outs):
    x = a["self"]
    ord_ = a["ord"]
    ord_ = float(ord_) if not isinstance(ord_, torch.Tensor) else float(ord_.item())
    ops = {2.0: "norm2", 1.0: "norm1", 0.0: "norm0", float("inf"): "norminf",
           float("-inf"): "normninf"}
    op = ops.get(ord_, "normp")
    if x.dtype != outs[0].dtype and not x.is_floating_point():
        raise NotImplementedError("vector_norm of an integer tensor")
    req = reduce(op, x, outs, red_dims(x, a["dim"]), a["keepdim"], load_t=F64, acc_t=F64,
                 scalars=(ord_,) if op == "normp" else (), what="linalg_vector_norm")
    if req is not None:
        launch(*req)


def scan_views(x: torch.Tensor, dim: int, outs: list) -> tuple:
    """(kept shape, views of outs + [x]) with the scanned dim last and the others coalesced."""
    if x.dim() == 0:
        return (1,), [strided_np(t, (1, 1), (0, 0)) for t in (*outs, x)]
    d = dim % x.dim()
    kept = [i for i in range(x.dim()) if i != d]
    ts = (*outs, x)
    kshape, kst = coalesce(tuple(x.shape[i] for i in kept),
                           [[t.stride(i) for i in kept] for t in ts])
    return kshape, [strided_np(t, kshape + (x.shape[d],), ks + (t.stride(d),))
                    for t, ks in zip(ts, kst)]


def _scan(op: str):
    def lower(func, a, outs):
        x, out = a["self"], outs[0]
        if out.numel() == 0:
            return
        acc_t = acc_type(out.dtype)
        if op == "logcumsumexp" and not out.dtype.is_floating_point:
            raise NotImplementedError("logcumsumexp of an integer tensor")
        kshape, views = scan_views(x, a["dim"], [out])
        ko = len(kshape)
        parallel = x.numel() >= PARALLEL_MIN and kshape[0] > 1 and kc.parallel_allowed()
        # logcumsumexp loads in the accumulator type (ATen computes it in double)
        load_t = acc_t if op == "logcumsumexp" else NP_TYPE[out.dtype]
        store = NP_TYPE[out.dtype]
        key = ("reduce", op, ko, acc_t, load_t, store, parallel)
        launch(key, lambda: kr.render_scan(op, ko, acc_t, load_t, store, parallel),
               tuple(views), flops=float(x.numel() * (20 if op == "logcumsumexp" else 1)),
               bytes_moved=float(x.numel() * x.element_size() + out.numel() * out.element_size()),
               engine="scalar" if op == "logcumsumexp" else "vector")
    return lower


def _scan_index(op: str):
    """cummax / cummin: (values, indices)."""
    def lower(func, a, outs):
        x = a["self"]
        if outs[0].numel() == 0:
            return
        kshape, views = scan_views(x, a["dim"], list(outs))
        ko = len(kshape)
        parallel = x.numel() >= PARALLEL_MIN and kshape[0] > 1 and kc.parallel_allowed()
        launch(("reduce", op, ko, parallel), lambda: kr.render_scan_index(op, ko, parallel),
               tuple(views), flops=float(x.numel()),
               bytes_moved=float(x.numel() * (2 * x.element_size() + 8)), engine="vector")
    return lower


def _segment_reduce(func, a, outs):
    """segment_reduce over lengths or offsets (the CPU's loop; contiguous data and lengths):
    steps (lower_segment_reduce launches them: dispatch -> lower_segment_reduce -> launch)."""
    from .half import _up_steps

    data, out, axis = a["data"], outs[0], a["axis"] % max(a["data"].dim(), 1)
    lens = a["lengths"] if a["lengths"] is not None else a["offsets"]
    if a["indices"] is not None or lens is None or a["reduce"] not in kr.SEGMENT:
        raise NotImplementedError("segment_reduce with indices")
    if not (data.is_contiguous() and lens.is_contiguous()):
        raise NotImplementedError("segment_reduce of a non-contiguous tensor")
    if not data.is_floating_point():
        raise NotImplementedError(f"segment_reduce of {data.dtype}")
    if out.numel() == 0:
        return
    # the half type the CPU's running value rounds to (kernels/halfround.py ROUND_HALF's kinds)
    bf = {torch.bfloat16: 1, torch.float16: 2}.get(data.dtype, 0)
    d32 = (yield from _up_steps(data, data)) if bf else data
    o32 = torch.empty(out.shape, dtype=torch.float32) if bf else out
    outer = math.prod(data.shape[:axis])
    inner = math.prod(data.shape[axis + 1:])
    init = a["initial"]
    if init is not None and bf:   # initial.to<scalar_t>(): the half value
        init = float(torch.tensor(float(init), dtype=torch.float64).to(data.dtype))
    yield (("reduce", "segment"), kr.render_segment,
           (o32.numpy().reshape(outer, out.shape[axis], inner),
            d32.numpy().reshape(outer, data.shape[axis], inner),
            lens.numpy().reshape(outer, -1), kr.SEGMENT[a["reduce"]], a["offsets"] is not None,
            init is not None, float(0 if init is None else init), bf),
           float(data.numel()), float(data.numel() * data.element_size()))
    if bf:
        yield from cast_steps(o32, out)   # what lower_to_copy launches


lower_segment_reduce = launches(_segment_reduce)
lower_segment_reduce.__name__ = "lower_segment_reduce"
lower_segment_reduce.handles_half = True


def lower_segment_reduce_backward(func, a, outs):
    data, gi, axis = a["data"], outs[0], a["axis"] % max(a["data"].dim(), 1)
    lens = a["lengths"] if a["lengths"] is not None else a["offsets"]
    grad, out = a["grad"], a["output"]
    if lens is None or a["reduce"] not in kr.SEGMENT:
        raise NotImplementedError("segment_reduce_backward without lengths/offsets")
    if not all(t.is_contiguous() for t in (data, gi, grad, out, lens)):
        raise NotImplementedError("segment_reduce_backward of non-contiguous tensors")
    if gi.numel() == 0:
        return
    outer = math.prod(data.shape[:axis])
    inner = math.prod(data.shape[axis + 1:])
    segs = out.shape[axis] if out.dim() else 1
    init = a["initial"]
    launch(("reduce", "segment_bw"), kr.render_segment_backward,
           (gi.numpy().reshape(outer, data.shape[axis], inner),
            grad.numpy().reshape(outer, segs, inner), out.numpy().reshape(outer, segs, inner),
            data.numpy().reshape(outer, data.shape[axis], inner), lens.numpy().reshape(outer, -1),
            kr.SEGMENT[a["reduce"]], a["offsets"] is not None, float(1 if init is None else init)),
           flops=float(2 * data.numel()), bytes_moved=float(3 * data.numel() * data.element_size()))

_extreme_max, _extreme_min = _extreme("max"), _extreme("min")
LOWERINGS = {
    "aten::sum": _sum_like("sum"),
    "aten::sum.dim_IntList": _sum_like("sum"),
    "aten::mean": _sum_like("mean"),
    "aten::mean.dim": _sum_like("mean"),
    "aten::prod": _sum_like("prod"),
    "aten::prod.dim_int": _sum_like("prod"),
    "aten::amax": _extreme_max,
    "aten::amin": _extreme_min,
    "aten::max": _extreme_max,
    "aten::min": _extreme_min,
    "aten::max.dim": _extreme_max,
    "aten::min.dim": _extreme_min,
    "aten::argmax": _extreme_max,
    "aten::argmin": _extreme_min,
    "aten::any": _logical("any"),
    "aten::any.dim": _logical("any"),
    "aten::any.dims": _logical("any"),
    "aten::all": _logical("all"),
    "aten::all.dim": _logical("all"),
    "aten::all.dims": _logical("all"),
    "aten::var.correction": _variance("var", False),
    "aten::var.dim": _variance("var", False),
    "aten::std.correction": _variance("std", False),
    "aten::std.dim": _variance("std", False),
    "aten::var_mean.correction": _variance("var", True),
    "aten::std_mean.correction": _variance("std", True),
    "aten::logsumexp": lower_logsumexp,
    "aten::linalg_vector_norm": lower_vector_norm,
    "aten::cumsum": _scan("cumsum"),
    "aten::cumprod": _scan("cumprod"),
    "aten::logcumsumexp": _scan("logcumsumexp"),
    "aten::cummax": _scan_index("cummax"),
    "aten::cummin": _scan_index("cummin"),
    "aten::segment_reduce": lower_segment_reduce,
    "aten::_segment_reduce_backward": lower_segment_reduce_backward,
}
