"""Sort lowerings: sort / argsort / topk and the order statistics kthvalue, median, nanmedian,
mode; one row kernel per op (kernels/sort.py) that runs the CPU's own algorithm, so values *and*
the indices of tied elements match torch's CPU kernels.

Which algorithm the CPU picks, and so which one runs here: `sort(stable=True)` is any stable
sort; `stable=False` is libstdc++'s introsort, except where ATen takes a stable path itself (a
stride-0 sort dim returns identity indices; a 1-D ascending integer tensor of >= 32768
elements goes through fbgemm's radix sort).

>>> import torch, eager_neuron
>>> v, i = torch.tensor([3., 1., 2., 1.]).to("neuron").sort(stable=True)
>>> v.cpu().tolist(), i.cpu().tolist()
([1.0, 1.0, 2.0, 3.0], [1, 3, 2, 0])
"""

from __future__ import annotations

import numpy as np
import torch

from .. import errors
from ..context import _TLS as _ctx_tls
from ..kernels import sort as kso
from ..launch import checked, launch
from .cast import cast_steps, launches
from .common import COMPLEX, HALF
from .shape import axis_views, nbytes

GRAIN = 32768   # at::internal::GRAIN_SIZE: ATen's radix-sort threshold
HIST_GRAIN = 200   # ATen's histogram parallel_for grain (elements per thread, at least)


def _as_1d(*ts):
    return [t.view(1) if t.dim() == 0 else t for t in ts]


def rows(op: str, self: torch.Tensor, vals: torch.Tensor, inds: torch.Tensor, dim: int,
         p0: int = 0, p1: int = 0, keepdim: bool = True) -> tuple | None:
    """The launch of kernels/sort.py row op `op` along `dim` of self into vals/inds (the same
    rank as self with dim of length m: the sorted prefix, or 1 for the one-element
    statistics), as launch()'s positional arguments for the lowering to make (None: empty)."""
    self, vals, inds = _as_1d(self, vals, inds)
    dim %= self.dim()
    if not keepdim and vals.dim() < self.dim():
        vals, inds = vals.unsqueeze(dim), inds.unsqueeze(dim)
    if vals.numel() == 0 or self.numel() == 0:
        return None
    m = vals.shape[dim]
    v, i, s = axis_views(self.shape, dim, [(vals, m), (inds, m), (self, self.shape[dim])])
    c = s.ndim - 1
    n = self.shape[dim]
    return (("sort", op, c), lambda: kso.render_rows(op, c), (v, i, s, int(p0), int(p1)),
            float(self.numel() * max(1, int(np.log2(max(n, 2))))),
            float(nbytes(self, vals, inds)))


def _wrap_dim(dim: int, x: torch.Tensor) -> int:
    """dim wrapped as ATen's maybe_wrap_dim does (a 0-d tensor as 1-d), or its IndexError:
    "Dimension out of range" (a modulo accepted any dim: sort(dim=5) of a 2-d tensor
    answered)."""
    from torch._prims_common import canonicalize_dim

    return canonicalize_dim(max(x.dim(), 1), dim)


def _check_dtype(op: str, x: torch.Tensor) -> None:
    if x.is_complex():
        raise NotImplementedError(f"{op} of a complex tensor")


def _refuse_bool(kernel: str, x: torch.Tensor) -> None:
    """The CPU kernels of kthvalue/median/searchsorted have no bool instance: refuse it as they
    do (an answer here would be one the CPU never gives)."""
    if x.dtype == torch.bool:
        raise errors.NotImplementedForDtype(kernel, torch.bool)


def lower_sort(func, a, outs):
    """sort / sort.stable (argsort arrives here too: it decomposes to sort)."""
    self = a["self"]
    vals, inds = outs
    _check_dtype("sort", self)
    dim = _wrap_dim(a["dim"], self)
    stable = bool(a.get("stable") or False)
    desc = bool(a["descending"])
    n = self.shape[dim] if self.dim() else 1
    # the CPU's own stable paths: a stride-0 sort dim keeps identity indices (all ties), and
    # fbgemm's radix sort for long 1-D ascending integer rows
    if self.dim() and n > 1 and self.stride(dim) == 0:
        stable = True
    if (self.dim() == 1 and not desc and n >= GRAIN and not self.is_floating_point()
            and self.dtype != torch.bool):
        stable = True
    req = rows("sort", self, vals, inds, dim, desc, stable)
    if req is not None:
        launch(*req)


def lower_topk(func, a, outs):
    self = a["self"]
    vals, inds = outs
    _check_dtype("topk", self)
    if self.dtype == torch.bool:
        raise NotImplementedError("topk of a bool tensor (the CPU has no kernel for it)")
    req = rows("topk", self, vals, inds, a["dim"], bool(a["largest"]), bool(a["sorted"]))
    if req is not None:
        launch(*req)


def lower_kthvalue(func, a, outs):
    self, k = a["self"], a["k"]
    vals, inds = outs
    _check_dtype("kthvalue", self)
    _refuse_bool("kthvalue_cpu", self)
    req = rows("kthvalue", self, vals, inds, a["dim"], k - 1, 0, a["keepdim"])
    if req is not None:
        launch(*req)


def _median_dim(ignore_nan: bool):
    def lower(func, a, outs):
        self = a["self"]
        vals, inds = outs
        _check_dtype("median", self)
        _refuse_bool("median_out", self)
        if self.dim() and self.shape[a["dim"]] == 0:
            raise IndexError("median() cannot compute median for a dimension of size 0 "
                             "because the operation does not have an identity")
        req = rows("median", self, vals, inds, a["dim"], int(ignore_nan), 0, a["keepdim"])
        if req is not None:
            launch(*req)
    return lower


def _median_all(ignore_nan: bool):
    def lower(func, a, outs):
        self = a["self"]
        _check_dtype("median", self)
        _refuse_bool("median_cpu", self)
        if self.numel() == 0:
            # ATen: NaN converted to the dtype (-2**63 for int64, 0 for int16), no error. Written
            # on the host, so no fast-path runner (a replay would not write it)
            ctx = getattr(_ctx_tls, "ctx", None)
            if ctx is not None:
                ctx.capture = None
            outs[0].copy_(torch.tensor(float("nan")).to(outs[0].dtype))
            return
        flat = self.reshape(-1) if self.is_contiguous() else self.flatten()
        idx = torch.empty((1,), dtype=torch.int64)
        req = rows("median", flat, outs[0].view(1), idx, 0, int(ignore_nan))
        if req is not None:
            launch(*req)
    return lower


def lower_mode(func, a, outs):
    self = a["self"]
    vals, inds = outs
    _check_dtype("mode", self)
    if self.dim() and self.shape[a["dim"]] == 0:
        raise IndexError("mode(): Expected reduction dim to have non-zero size.")
    req = rows("mode", self, vals, inds, a["dim"], 0, 0, a["keepdim"])
    if req is not None:
        launch(*req)


# ---------------------------------------------------------------------------------------------
# searchsorted / bucketize: binary search per element (ATen's cus_lower_bound / upper_bound)
# ---------------------------------------------------------------------------------------------

def search(out: torch.Tensor, x, bd: torch.Tensor, sorter, right: bool) -> tuple | None:
    """The binary-search kernel's launch of every element of x into bd (launch()'s positional
    arguments, for the lowering to make; None: empty)."""
    if not isinstance(x, torch.Tensor):
        x = torch.full((), x, dtype=bd.dtype)   # the Scalar overloads: a one-element operand
    if x.is_complex() or bd.is_complex():
        raise NotImplementedError("searchsorted of complex tensors")
    if x.dtype == bd.dtype:   # mixed dtypes compare in their common (non-bool) type
        _refuse_bool("searchsorted_out_cpu", x)
    x, out = _as_1d(x, out)
    if out.numel() == 0:
        return None
    nb = bd.shape[-1]
    lead = tuple(x.shape[:-1])
    bde = bd.expand(lead + (nb,)) if bd.dim() == 1 else bd
    use = sorter is not None
    srt = sorter if use else torch.zeros((1,), dtype=torch.int64).expand(bde.shape)
    srt = srt.expand(lead + (nb,)) if srt.dim() == 1 else srt
    m = x.shape[-1]
    last = x.dim() - 1
    o, v, b, st = axis_views(x.shape, last, [(out, m), (x, m), (bde, nb), (srt, nb)])
    c = v.ndim - 1
    store = "np.int32" if out.dtype == torch.int32 else "np.int64"
    return (("sort", "search", c, store), lambda: kso.render_search(c, store),
            (o, v, b, st, bool(right), use),
            float(x.numel() * max(1, int(np.log2(max(nb, 2))))),
            float(nbytes(x, out) + nbytes(bd)))


def _warn_non_contiguous(values, boundaries, sorter) -> None:
    """ATen's searchsorted/bucketize warn once per process for each non-contiguous operand."""
    for t, what in ((values, "input value"), (boundaries, "boundary"), (sorter, "sorter")):
        if isinstance(t, torch.Tensor) and not t.is_contiguous():
            errors.warn(f"torch.searchsorted(): {what} tensor is non-contiguous, this will lower "
                        "the performance due to extra data copy when converting non-contiguous "
                        f"tensor to contiguous, please use contiguous {what} tensor if "
                        "possible. This message will only appear once per program.", once=True)


def _check_sorter(sorter: np.ndarray, n: int) -> None:
    """ATen's searchsorted checks the sorter's range before searching."""
    if sorter.size and (sorter.min() < 0 or sorter.max() >= n):
        raise RuntimeError("torch.searchsorted(): sorter index out of range")


def lower_searchsorted(func, a, outs):
    right = bool(a["right"]) or a.get("side") == "right"
    _warn_non_contiguous(a["self"], a["sorted_sequence"], a.get("sorter"))
    sorter = a.get("sorter")
    if sorter is not None:
        # on the host before the search (a replay of the fast path checks its own sorter)
        checked(_check_sorter, sorter.numpy(), int(sorter.shape[-1]) if sorter.dim() else 1)
    req = search(outs[0], a["self"], a["sorted_sequence"], a.get("sorter"), right)
    if req is not None:
        launch(*req)


def lower_bucketize(func, a, outs):
    _warn_non_contiguous(a["self"], a["boundaries"], None)
    req = search(outs[0], a["self"], a["boundaries"], None, bool(a["right"]))
    if req is not None:
        launch(*req)


# ---------------------------------------------------------------------------------------------
# DYNAMIC: unique / unique_consecutive (the output length is the number of distinct values)
# ---------------------------------------------------------------------------------------------

def _flat_f(x: torch.Tensor):
    """x as a 1-D kernel operand: a view when contiguous, else a device copy (scratch); half
    floats upcast to float32 (exact, and order and equality are unchanged). A generator of the
    copies' launches; returns the operand."""
    from .half import _up_steps
    from .shape import copy_request

    if x.dtype in HALF:
        x = yield from _up_steps(x, x)
    if x.is_contiguous():
        return x.reshape(-1)
    tmp = torch.empty(x.shape, dtype=x.dtype)
    req = copy_request(x, tmp)   # same dtype and shape: the remap kernel's launch
    if req is not None:
        yield req
    return tmp.view(-1)


def _store(tmp: torch.Tensor, out: torch.Tensor):
    """out = tmp, rounding float32 down to a half type (the cast kernel's steps, as
    lower_to_copy launches them)."""
    if tmp is not out and out.numel():
        yield from cast_steps(tmp, out)


def unique_flat(func, x, index, *, consecutive: bool, want_inv: bool, want_counts: bool,
                n_out: int = 3):
    """[(values, block), (inverse, block), (counts, block)][:n_out] of the flattened x: a
    generator of launch requests (dispatch makes each) that returns them."""
    from ..buffers import alloc
    from .mask import core_index

    if x.dtype in COMPLEX:   # the CPU's unique kernels have no complex instance
        raise errors.NotImplementedForDtype("unique", x.dtype)
    core = core_index(index)
    flat = yield from _flat_f(x)
    n = flat.numel()
    sk, perm = torch.empty(n, dtype=flat.dtype), torch.empty(n, dtype=torch.int64)
    tk, ti = torch.empty(n, dtype=flat.dtype), torch.empty(n, dtype=torch.int64)
    cnt = np.zeros(1, np.int64)
    args = (flat.numpy(), sk.numpy(), perm.numpy(), tk.numpy(), ti.numpy(), cnt)
    if n:
        yield (("sort", "unique_count", consecutive), lambda: kso.render_unique(consecutive),
               args, float(n * max(1, int(np.log2(max(n, 2))))), float(nbytes(flat) * 3))
    m = int(cnt[0])
    values, vblock = alloc(core, (m,), (1,), x.dtype)
    inv_shape = tuple(x.shape) if want_inv else (0,)
    inv_stride = torch.empty(inv_shape, device="meta").stride()
    inverse, iblock = alloc(core, inv_shape, inv_stride, torch.int64)
    counts, cblock = alloc(core, (m,) if want_counts else (0,), (1,), torch.int64)
    vtmp = values if values.dtype == flat.dtype else torch.empty(m, dtype=flat.dtype)
    if n:
        yield (("sort", "unique_fill"), kso.render_unique_fill,
               (sk.numpy(), perm.numpy(), vtmp.numpy(),
                inverse.view(-1).numpy() if want_inv else perm.numpy(),
                counts.numpy() if want_counts else perm.numpy(), want_inv, want_counts),
               float(n), float(nbytes(flat) * 3))
        yield from _store(vtmp, values)
    return [(values, vblock), (inverse, iblock), (counts, cblock)][:n_out]


def dynamic_unique2(func, a, index=-1):
    return (yield from unique_flat(func, a["self"], index, consecutive=False,
                       want_inv=bool(a["return_inverse"]), want_counts=bool(a["return_counts"])))


def dynamic_unique(func, a, index=-1):
    return (yield from unique_flat(func, a["self"], index, consecutive=False,
                                   want_inv=bool(a["return_inverse"]), want_counts=False,
                                   n_out=2))


def dynamic_unique_consecutive(func, a, index=-1):
    # ATen takes the flat path for dim=0 of a 1-d tensor (inverse and counts only on request),
    # not for dim=-1
    if a["dim"] is not None and not (a["dim"] == 0 and a["self"].dim() == 1):
        from .extras import unique_along

        return (yield from unique_along(a, index, consecutive=True))
    return (yield from unique_flat(func, a["self"], index, consecutive=True,
                                   want_inv=bool(a["return_inverse"]),
                                   want_counts=bool(a["return_counts"])))


# ---------------------------------------------------------------------------------------------
# histc (output size from meta) and bincount (DYNAMIC: max(x) + 1 bins)
# ---------------------------------------------------------------------------------------------

_HALF_KIND = {torch.bfloat16: 1, torch.float16: 2}   # halfround.ROUND_HALF's kinds


def _histc(func, a, outs):
    x, out = a["self"], outs[0]
    if not x.is_floating_point() and x.dtype != torch.bool:
        return (yield from _histc_int(x, out, int(a["bins"]), a["min"], a["max"]))
    if not x.is_floating_point():
        raise NotImplementedError(f"histc of {x.dtype}")
    bins = int(a["bins"])
    lo, hi = float(a["min"]), float(a["max"])
    flat = yield from _flat_f(x)
    bf = _HALF_KIND.get(x.dtype, 0)   # the half type the CPU computes in (kernels/halfround.py)
    hist = torch.empty(out.shape, dtype=torch.float32) if bf else out
    info = np.zeros(3, np.float64)
    # the CPU's at::parallel_for split over its threads: bfloat16 counts saturate per chunk
    n = x.numel()
    parts = min(torch.get_num_threads(), -(-n // HIST_GRAIN)) if n > HIST_GRAIN else 1
    chunk = max(1, -(-n // parts))
    yield (("sort", "histc"), kso.render_histc,
           (hist.numpy(), flat.numpy(), info, lo, hi, bins, lo == hi and n > 0, bf, chunk),
           float(4 * x.numel()), float(nbytes(x, out)), "vector", "fp32", None, None, None,
           (_histc_check, info))
    yield from _store(hist, out)


def _histc_check(info) -> None:
    """What the histc kernels flag (info[2]): a range that is not finite or empty. A host
    check of the launch's flags (launch's `check`): a fast-path replay makes it on its own."""
    if info[2]:
        if not all(np.isfinite(info[:2])):
            raise RuntimeError(f"torch.histc: range of [{info[0]}, {info[1]}] is not finite")
        raise RuntimeError("torch.histc: max must be larger than min")


lower_histc = launches(_histc)   # dispatch -> lower_histc -> launch
lower_histc.__name__ = "lower_histc"
lower_histc.handles_half = True


def _histc_int(x, out, bins, lo, hi):
    """Integer histc (the CPU refuses it; CUDA's semantics, which MoE routers rely on:
    transformers' grouped experts count tokens per expert with histc of int32 ids)."""
    info = np.zeros(3, np.int64)
    flat = yield from _flat_f(x)
    lo, hi = int(lo), int(hi)   # CUDA: Scalar.to<int64_t>() truncates
    yield (("sort", "histc_int"), kso.render_histc_int,
           (out.numpy(), flat.numpy(), info, lo, hi, bins, lo == hi and x.numel() > 0),
           float(4 * x.numel()), float(nbytes(x, out)), "vector", "fp32", None, None, None,
           (_histc_check, info))


def dynamic_histogram(func, a, index=-1):
    """histogram.bin_ct of a float32 or float64 tensor (optional weight, range, density).
    DYNAMIC only because the op has no meta kernel: the shapes are (bins,) and (bins + 1,).
    A generator of launch requests (dispatch makes each)."""
    from ..buffers import alloc
    from .mask import core_index
    from .shape import copy_request

    x, w = a["self"], a["weight"]
    given = isinstance(a["bins"], torch.Tensor)
    if given and (a["bins"].dim() != 1 or a["bins"].dtype != x.dtype):
        raise NotImplementedError("histogram bins of another dtype or rank")
    bins = a["bins"].numel() - 1 if given else int(a["bins"])
    core = core_index(index)
    hist, hblock = alloc(core, (bins,), (1,), x.dtype)
    edges, eblock = alloc(core, (bins + 1,), (1,), x.dtype)
    if x.dtype not in (torch.float32, torch.float64) or (w is not None and w.dtype != x.dtype):
        raise NotImplementedError(f"histogram of {x.dtype}")
    rng = a.get("range")
    if given:
        req = copy_request(a["bins"], edges)
        if req is not None:
            yield req
    flat = yield from _flat_f(x)
    wf = (yield from _flat_f(w)) if w is not None else flat
    n = x.numel()
    parts = min(torch.get_num_threads(), -(-n // HIST_GRAIN)) if n > HIST_GRAIN else 1
    info = np.zeros(3, np.float64)
    # no range and no data: ATen's outer edges start at [0, 1] (then nothing widens them)
    lo, hi = (float(rng[0]), float(rng[1])) if rng is not None else (0.0, 0.0 if n else 1.0)
    yield (("sort", "histogram"), kso.render_histogram,
           (hist.numpy(), edges.numpy(), flat.numpy(), wf.numpy(), info, lo, hi,
            rng is None, w is not None, bool(a["density"]), max(1, -(-n // parts)), given),
           float(6 * n), float(nbytes(x, hist, edges)))
    if info[2]:
        raise ValueError(f"histogram(): range of [{info[0]}, {info[1]}] is not finite or "
                         "reversed")
    return [(hist, hblock), (edges, eblock)]


def dynamic_bincount(func, a, index=-1):
    from ..buffers import alloc
    from .mask import core_index

    x, w, minlength = a["self"], a["weights"], int(a["minlength"])
    if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
        # the CPU dispatches on integral types before any other check
        raise errors.NotImplementedForDtype("bincount_cpu", x.dtype)
    if x.dim() != 1:
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    if minlength < 0:
        raise RuntimeError("minlength should be >= 0")
    if w is not None and (w.dim() != 1 or w.shape[0] != x.shape[0]):
        raise RuntimeError("weights should be 1-d and have the same length as input")
    dtype = torch.int64 if w is None else (
        torch.float32 if w.dtype == torch.float32 else torch.float64)
    if w is not None and w.is_complex():
        raise NotImplementedError("bincount with complex weights")
    info = np.zeros(2, np.int64)
    xv = x.numpy()
    wv = (yield from _flat_f(w)).numpy() if w is not None else xv
    key = ("sort", "bincount", w is not None)
    render = lambda: kso.render_bincount(w is not None)
    nbins = minlength
    if x.numel():
        yield (key, render, (np.zeros(1, np.dtype(str(dtype).split(".")[1])), xv, wv, info, 0),
               float(x.numel()), float(nbytes(x)))
        if info[0] < 0:
            raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
        nbins = max(int(info[1]) + 1, minlength)
    out, block = alloc(core_index(index), (nbins,), (1,), dtype)
    yield (key, render, (out.numpy(), xv, wv, info, 1), float(x.numel()),
           float(nbytes(x, out)))
    return [(out, block)]


DYNAMIC = {
    "aten::bincount": dynamic_bincount,
    "aten::histogram.bin_ct": dynamic_histogram,
    "aten::histogram.bins_tensor": dynamic_histogram,
    "aten::_unique2": dynamic_unique2,
    "aten::_unique": dynamic_unique,
    "aten::unique_consecutive": dynamic_unique_consecutive,
}

# the half types go through dispatch's float32 upcast: exact for values, order and ties
LOWERINGS = {
    "aten::sort": lower_sort,
    "aten::sort.stable": lower_sort,
    "aten::topk": lower_topk,
    "aten::kthvalue": lower_kthvalue,
    "aten::median": _median_all(False),
    "aten::nanmedian": _median_all(True),
    "aten::median.dim": _median_dim(False),
    "aten::nanmedian.dim": _median_dim(True),
    "aten::mode": lower_mode,
    "aten::searchsorted.Tensor": lower_searchsorted,
    "aten::searchsorted.Scalar": lower_searchsorted,
    "aten::bucketize.Tensor": lower_bucketize,
    "aten::bucketize.Scalar": lower_bucketize,
    "aten::histc": lower_histc,
}
