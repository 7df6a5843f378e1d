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

from .. import errors
from ..kernels import extras as kex
from ..launch import launch
from .cast import cast_steps, launches
from .common import COMPLEX, HALF, NP_TYPE

VERSION = 1


def _alloc(index, shape, dtype):
    from ..buffers import alloc
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
    return (yield from unique_along(a, index, consecutive=False))


def unique_along(a, index, consecutive: bool):
    """unique_dim, or unique_consecutive with a dim (`consecutive`: only runs of equal slices
    collapse, in their order): a generator of launch requests (dispatch makes each) that
    returns [(values, block), (inverse, block), (counts, block)]."""

    x, dim = a["self"], a["dim"]
    if x.dtype in COMPLEX:   # the CPU's unique_dim has no complex instance
        raise errors.NotImplementedForDtype("unique_dim", x.dtype)
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
        yield from cast_steps(moved, rows)
    xr = rows.numpy().reshape(n, m)
    perm, tmp, group = (np.empty(n, np.int64) for _ in range(3))
    res = np.zeros(1, np.int64)
    if n and consecutive:
        yield (("extras", "unique_rows_consecutive", VERSION),
               lambda: kex.render("unique_rows_consecutive"), (xr, perm, group, res),
               float(n * m), float(xr.nbytes))
    elif n:
        yield (("extras", "unique_rows", VERSION), lambda: kex.render("unique_rows"),
               (xr, perm, tmp, group, res), float(n * max(1, np.log2(max(n, 2))) * m),
               float(xr.nbytes * 2))
    k = int(res[0])
    out_shape = list(x.shape)
    out_shape[dim] = k
    values, vblock = _alloc(index, tuple(out_shape), x.dtype)
    inverse, iblock = _alloc(index, (n,), torch.int64)
    counts, cblock = _alloc(index, (k,), torch.int64)
    if n:
        vtmp = torch.empty((k,) + rest, dtype=work)
        yield (("extras", "unique_rows_fill", VERSION), lambda: kex.render("unique_rows_fill"),
               (xr, perm, group, vtmp.numpy().reshape(k, m), inverse.numpy(), counts.numpy()),
               float(n * m), float(xr.nbytes * 2))
        if values.numel():
            yield from cast_steps(vtmp, values.movedim(dim, 0))
    return [(values, vblock), (inverse, iblock), (counts, cblock)]


# ---------------------------------------------------------------------------------------------
# histogramdd: _histogramdd_bin_edges, _histogramdd_from_bin_cts, _histogramdd_from_bin_tensors
# (no meta kernels in PyTorch: DYNAMIC, they allocate their own outputs; generators of launch
# requests dispatch makes, as their helpers below)
# ---------------------------------------------------------------------------------------------

_HDD_FLOAT = frozenset({torch.float32, torch.float64})


def _hdd_input(x: torch.Tensor, weight, nd: int):
    """x as a contiguous (N, D) array (a device copy when strided), weight as (N,): steps."""

    if x.dtype not in _HDD_FLOAT:
        raise NotImplementedError(f"histogramdd on {x.dtype}")
    if x.dim() < 1 or x.shape[-1] != nd:
        raise RuntimeError(f"torch.histogramdd: expected input to have {nd} as its innermost "
                           f"dimension (one per bin specification), got shape {tuple(x.shape)}")
    n = x.numel() // nd if nd else 0
    xs = x if x.is_contiguous() else None
    if xs is None:
        xs = torch.empty(x.shape, dtype=x.dtype)
        yield from cast_steps(x, xs)
    x2 = xs.numpy().reshape(n, nd)
    if weight is not None:
        if weight.dtype != x.dtype or weight.numel() != n:
            raise RuntimeError("torch.histogramdd: weight should have the same dtype as input "
                               f"and one element per sample ({n}), got {weight.dtype} "
                               f"{tuple(weight.shape)}")
        ws = weight if weight.is_contiguous() else None
        if ws is None:
            ws = torch.empty(weight.shape, dtype=weight.dtype)
            yield from cast_steps(weight, ws)
        w = ws.numpy().reshape(-1)
    else:
        w = np.zeros(1, x2.dtype)
    return x2, w


def _hdd_outer(x2: np.ndarray, rng, nd: int) -> tuple[list, list]:
    """The leftmost and rightmost edge of each dim: `range`, else the data's min and max (0 and
    1 for no data); equal ones widened by 0.5 either way; not finite -> the CPU's error
    (steps: the min/max kernel's request)."""
    if rng is not None:
        if len(rng) != 2 * nd:
            raise RuntimeError(f"torch.histogramdd: for a {nd}-dimensional histogram, range "
                               f"should have {2 * nd} elements, but got {len(rng)}")
        left = [float(rng[2 * d]) for d in range(nd)]
        right = [float(rng[2 * d + 1]) for d in range(nd)]
    elif x2.shape[0]:
        lo = np.empty(nd, x2.dtype)
        hi = np.empty(nd, x2.dtype)
        yield (("extras", "hdd_minmax", VERSION), lambda: kex.render("hdd_minmax"),
               (x2, lo, hi), x2.size, x2.nbytes)
        left, right = [float(v) for v in lo], [float(v) for v in hi]
    else:
        left, right = [0.0] * nd, [1.0] * nd
    for d in range(nd):
        if not (np.isfinite(left[d]) and np.isfinite(right[d])):
            raise ValueError(f"torch.histogramdd: range of [{left[d]}, {right[d]}] is not finite")
        if left[d] > right[d]:
            raise ValueError(f"torch.histogramdd: min should not exceed max, but got min "
                             f"{left[d]} max {right[d]} for dimension {d}")
        if left[d] == right[d]:
            left[d] -= 0.5
            right[d] += 0.5
    return left, right


def _hdd_edges(x2, bins, rng, dtype, index) -> list:
    nd = len(bins)
    if any(b <= 0 for b in bins):
        raise RuntimeError(f"torch.histogramdd: bins must be > 0, got {list(bins)}")
    left, right = yield from _hdd_outer(x2, rng, nd)
    npt = x2.dtype.type
    out = []
    for d in range(nd):
        e, block = _alloc(index, (bins[d] + 1,), dtype)
        yield (("extras", "hdd_edges", VERSION), lambda: kex.render("hdd_edges"),
               (e.numpy(), npt(left[d]), npt(right[d])), bins[d] + 1, e.numpy().nbytes)
        out.append((e, block))
    return out


def _hdd_count(x2, w, use_w, edges: list, density: bool, dtype, index):
    nbins = np.array([e.numel() - 1 for e in edges], np.int64)
    eoff = np.zeros(len(edges), np.int64)
    if len(edges) > 1:
        eoff[1:] = np.cumsum([e.numel() for e in edges])[:-1]
    flat_edges = np.concatenate([np.ascontiguousarray(e.numpy()) for e in edges]) \
        if edges else np.zeros(0, x2.dtype)
    hist, block = _alloc(index, tuple(int(b) for b in nbins), dtype)
    acc = np.zeros(max(hist.numel(), 1), np.float64)
    hv = hist.numpy().reshape(-1) if hist.numel() else np.zeros(1, x2.dtype)
    yield (("extras", "hdd_count", VERSION), lambda: kex.render("hdd_count"),
           (x2, flat_edges, eoff, nbins, w, bool(use_w), bool(density), acc, hv),
           float(x2.size * max(1, np.log2(max(int(nbins.max(initial=1)), 2)))),
           float(x2.nbytes + hv.nbytes))
    return [(hist, block)]


def dynamic_hdd_bin_edges(func, a, index=-1):
    x, bins = a["self"], list(a["bins"])
    x2, _ = yield from _hdd_input(x, None, len(bins))
    return (yield from _hdd_edges(x2, bins, a.get("range"), x.dtype, index))


def dynamic_hdd_from_bin_cts(func, a, index=-1):
    x, bins, weight = a["self"], list(a["bins"]), a.get("weight")
    x2, w = yield from _hdd_input(x, weight, len(bins))
    made = yield from _hdd_edges(x2, bins, a.get("range"), x.dtype, index)
    edges = [e for e, _b in made]
    return (yield from _hdd_count(x2, w, weight is not None, edges, bool(a.get("density")),
                                  x.dtype, index))


def dynamic_hdd_from_bin_tensors(func, a, index=-1):
    x, bins, weight = a["self"], list(a["bins"]), a.get("weight")
    x2, w = yield from _hdd_input(x, weight, len(bins))
    edges = []
    for d, e in enumerate(bins):
        if e.dtype != x.dtype or e.dim() != 1 or e.numel() < 1:
            raise RuntimeError(f"torch.histogramdd: bins[{d}] should be a 1-d {x.dtype} tensor "
                               f"with at least one edge, got {e.dtype} {tuple(e.shape)}")
        edges.append(e)
    return (yield from _hdd_count(x2, w, weight is not None, edges, bool(a.get("density")),
                                  x.dtype, index))


# ---------------------------------------------------------------------------------------------
# linalg_eig: the general eigen-solver (linalg.eig / eigvals)
# ---------------------------------------------------------------------------------------------

_EIG_IN = {torch.float32: (True, False), torch.float64: (True, True),
           torch.complex64: (False, False), torch.complex128: (False, True)}


def lower_linalg_eig(func, a, outs):
    x = a["self"]
    if x.dtype not in _EIG_IN:
        raise NotImplementedError(f"linalg_eig on {x.dtype}")
    real, double = _EIG_IN[x.dtype]
    w, v = outs
    n = x.shape[-1]
    batch = int(np.prod(x.shape[:-2])) if x.dim() > 2 else 1
    if w.numel() == 0 or batch == 0:
        return
    xs = torch.empty(x.shape, dtype=x.dtype)
    if real:
        for req in cast_steps(x, xs):
            launch(*req)
    else:
        xs.copy_(x)   # complex: a host copy of the operand's elements
    xa = xs.numpy().reshape(batch, n, n)
    if not np.isfinite(xa).all():
        raise RuntimeError("torch.linalg.eig: input tensor should not contain infs or NaNs.")
    wt = w if w.is_contiguous() else torch.empty(w.shape, dtype=w.dtype)
    vt = v if v.is_contiguous() else torch.empty(v.shape, dtype=v.dtype)
    status = np.zeros(batch + 1, np.int64)
    launch(("extras", "eig", real, double, VERSION), lambda: kex.render_eig(real, double),
           (xa, wt.numpy().reshape(batch, n), vt.numpy().reshape(batch, n, n), status),
           flops=float(batch * 10 * n ** 3), bytes_moved=float(xa.nbytes * 3))
    if (status[:batch] != 0).any():
        raise torch.linalg.LinAlgError(
            "torch.linalg.eig: The algorithm failed to converge because the input matrix is "
            "ill-conditioned or has too many repeated eigenvalues (error code: "
            f"{int(status[:batch].max())}).")
    if wt is not w:
        w.copy_(wt)
    if vt is not v:
        v.copy_(vt)


lower_linalg_eig.handles_complex = True

# ---------------------------------------------------------------------------------------------
# addr: beta * self + (alpha * vec1) * vec2 with the CPU's rounding points for half types
# (they round after every multiply and add: ATen's Vectorized<BFloat16/Half> arithmetic does;
# bit-identical with the CPU). float32/float64: the CPU goes through BLAS ger, whose order
# varies with the BLAS; ours is within an ulp of it.
# ---------------------------------------------------------------------------------------------

_ADDR_FLOAT = frozenset({torch.float32, torch.float64, torch.bfloat16, torch.float16})


def _addr(func, a, outs):
    """addr's steps (lower_addr below launches them): the elementwise family's requests and
    the half casts between them."""
    from .complex_ew import real_steps
    from .elementwise import LOWERINGS as EW  # not the op table: lower/ never imports ops
    from .half import _half_round, _up_steps

    x, v1, v2, out = a["self"], a["vec1"], a["vec2"], outs[0]
    dt = out.dtype
    if dt not in _ADDR_FLOAT or any(t.dtype != dt for t in (x, v1, v2)):
        raise NotImplementedError(f"addr on {[t.dtype for t in (x, v1, v2)]} -> {dt}")
    beta, alpha = a["beta"], a["alpha"]
    if isinstance(beta, complex) or isinstance(alpha, complex) or isinstance(beta, bool):
        raise NotImplementedError("addr with complex or bool scalars")
    half = dt in HALF
    work = torch.float32 if half else dt
    mul, add = EW["aten::mul"], EW["aten::add"]
    mul_t, add_t = torch.ops.aten.mul.Tensor, torch.ops.aten.add.Tensor

    def rounded(t):
        """t rounded to the half dtype and back (exact float32 values of half numbers): steps."""
        if not half:
            return t
        h = torch.empty(t.shape, dtype=dt)
        yield from cast_steps(t, h)
        return (yield from _up_steps(h, h))

    def up(t):
        """t as float32 (a half t: its cast's steps; any other dtype: t itself)."""
        return (yield from _up_steps(t, t))

    if half:
        beta, alpha = _half_round(float(beta), dt), _half_round(float(alpha), dt)
    n, m = out.shape
    av1 = torch.empty((n,), dtype=work)
    yield from real_steps(mul, mul_t, {"self": (yield from up(v1)), "other": alpha}, [av1])
    prod = torch.empty((n, m), dtype=work)
    r_av1 = yield from rounded(av1)
    u_v2 = yield from up(v2)
    yield from real_steps(mul, mul_t, {"self": r_av1.view(n, 1), "other": u_v2.view(1, m)},
                          [prod])
    prod = yield from rounded(prod)
    if beta == 0:   # the CPU ignores self then (a NaN in it does not propagate)
        res = prod
    else:
        bs = torch.empty((n, m), dtype=work)
        u_x = yield from up(x)
        yield from real_steps(mul, mul_t, {"self": u_x.expand(n, m), "other": beta}, [bs])
        res = torch.empty((n, m), dtype=work)
        r_bs = yield from rounded(bs)
        yield from real_steps(add, add_t, {"self": r_bs, "other": prod, "alpha": 1}, [res])
    yield from cast_steps(res, out)


lower_addr = launches(_addr)   # dispatch -> lower_addr -> launch
lower_addr.__name__ = "lower_addr"
lower_addr.handles_half = True

# addr_ (read off the schema by ops.py) had no decomposition: it reached the CPU fallback
LOWERINGS: dict = {"aten::linalg_eig": lower_linalg_eig, "aten::addr": lower_addr}
DYNAMIC = {
    "aten::repeat_interleave.Tensor": dynamic_repeat_interleave,
    "aten::unique_dim": dynamic_unique_dim,
    "aten::_histogramdd_bin_edges": dynamic_hdd_bin_edges,
    "aten::_histogramdd_from_bin_cts": dynamic_hdd_from_bin_cts,
    "aten::_histogramdd_from_bin_tensors": dynamic_hdd_from_bin_tensors,
}


# ---------------------------------------------------------------------------------------------
# Meta kernels that refuse what the CPU refuses, with the CPU's exception type
# ---------------------------------------------------------------------------------------------
# dispatch sizes every output by running the op on meta tensors first. PyTorch's meta for frac
# is its Python reference, `x - trunc(x)`: on a bool tensor it raises sub's RuntimeError
# ("Subtraction ... with two bool tensors") and on an integer tensor it returns zeros, where
# the CPU raises NotImplementedError ('"frac_cpu" not implemented for 'Long'') for every
# non-float dtype, complex included.

def _frac_meta_check(x) -> None:
    if not x.dtype.is_floating_point:   # complex too: 'ComplexFloat'
        from ..errors import NotImplementedForDtype

        # the CPU's type and text (NotImplementedForDtype only carries them out of lowerings)
        raise NotImplementedError(str(NotImplementedForDtype("frac_cpu", x.dtype)))


def _frac_meta(self):
    _frac_meta_check(self)
    return torch._refs.frac(self)


def _frac_meta_(self):
    _frac_meta_check(self)
    return self


def _frac_meta_out(self, *, out):
    _frac_meta_check(self)
    return torch._refs.frac(self, out=out)


_META_LIB = torch.library.Library("aten", "IMPL")
_META_LIB.impl("frac", _frac_meta, "Meta")
_META_LIB.impl("frac_", _frac_meta_, "Meta")
_META_LIB.impl("frac.out", _frac_meta_out, "Meta")
