"""Normalization lowerings: softmax/log_softmax (+ backward), layer, group and batch norm
(+ backward).

Views come from `reduce.split`: the normalized dims last, everything else first, coalesced. Batch
norm's running statistics are updated in place in the running buffers (their host-backed memory
is the device memory), as PyTorch's CPU kernel does, or written to new outputs for the functional
variant.

>>> import torch, eager_neuron
>>> torch.softmax(torch.zeros(2, 4, device="neuron"), 1)[0].tolist()
[0.25, 0.25, 0.25, 0.25]
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch._prims_common import canonicalize_dim

from .. import errors
from ..kernels import compile as kc
from ..kernels import norm as kn
from ..launch import launch
from .common import HALF, NP_TYPE
from .reduce import F64, PARALLEL_MIN, red_dims, split


def _acc(t: torch.Tensor) -> str:
    if not t.is_floating_point():
        raise NotImplementedError(f"normalization of {t.dtype}")
    return F64


def _parallel(n: int, outer: int) -> bool:
    return n >= PARALLEL_MIN and outer > 1 and kc.parallel_allowed()


def _bytes(*ts) -> float:
    return float(sum(t.numel() * t.element_size() for t in ts if isinstance(t, torch.Tensor)))


def _flat(t: torch.Tensor) -> np.ndarray:
    """A 1-d view of a contiguous parameter or statistic."""
    if not t.is_contiguous():
        raise NotImplementedError("non-contiguous normalization parameter")
    return t.view(-1).numpy()


# NOTE: an absent array is a one-element stand-in of the data's dtype and of the real array's
# rank and layout, so the kernel's signature (and the compiled kernel) is the same either way.
def _dummy(like: np.ndarray, rank: int, value: float = 0.0) -> np.ndarray:
    return np.full((1,) * rank, value, like.dtype)


def _param(t, dtype, identity: float) -> tuple[np.ndarray, int]:
    """(array, step): weight/bias read at k * step; absent means [identity] with step 0."""
    if t is None:
        return np.full(1, identity, dtype), 0
    return _flat(t), 1


def _out1(t, like: np.ndarray) -> np.ndarray:
    return _flat(t) if t is not None else _dummy(like, 1)


# ---------------------------------------------------------------------------------------------
# softmax
# ---------------------------------------------------------------------------------------------

def _softmax(log: bool, safe: bool = False):
    def lower(func, a, outs):
        x, out = a["self"], outs[0]
        # ATen's maybe_wrap_dim (a 0-d input as 1-d): its IndexError for a dim out of range
        canonicalize_dim(max(x.dim(), 1), a["dim"])
        if out.numel() == 0:
            return
        if not (x.dtype.is_floating_point or x.dtype.is_complex):
            # the CPU's refusal, by the kernel it would pick (a 0-d input is viewed as 1-d)
            last = x.dim() == 0 or a["dim"] % x.dim() == x.dim() - 1
            raise errors.NotImplementedForDtype(
                f"{'log_' if log else ''}softmax{'_lastdim' if last else ''}_kernel_impl",
                x.dtype)
        acc = _acc(out)
        kshape, _r, (ov, xv), _ = split([out, x], red_dims(x, a["dim"]))
        ko, store = len(kshape), NP_TYPE[out.dtype]
        par = _parallel(x.numel(), kshape[0])
        launch(("norm", "softmax", log, ko, acc, store, par, *(("safe",) if safe else ())),
               lambda: kn.render_softmax(log, ko, acc, store, par, safe), (ov, xv),
               flops=float(4 * x.numel()), bytes_moved=_bytes(x) * 3 + _bytes(out),
               engine="scalar")
    return lower


def _softmax_backward(log: bool):
    def lower(func, a, outs):
        gi, g, y = outs[0], a["grad_output"], a["output"]
        if gi.numel() == 0:
            return
        acc = _acc(gi)
        kshape, _r, views, _ = split([gi, g, y], red_dims(g, a["dim"]))
        ko, store = len(kshape), NP_TYPE[gi.dtype]
        par = _parallel(g.numel(), kshape[0])
        launch(("norm", "softmax_bw", log, ko, acc, store, par),
               lambda: kn.render_softmax_backward(log, ko, acc, store, par), tuple(views),
               flops=float(4 * g.numel()), bytes_moved=_bytes(g, y) * 2 + _bytes(gi),
               engine="scalar" if log else "vector")
    return lower


# ---------------------------------------------------------------------------------------------
# layer norm
# ---------------------------------------------------------------------------------------------

def _ln_views(x, normalized_shape, full, small):
    axis = x.dim() - len(normalized_shape)
    kshape, rshape, fviews, sviews = split(full, list(range(axis, x.dim())), small)
    if not 1 <= len(kshape) <= _LN_OUTER_MAX:
        raise NotImplementedError(f"layer norm over {len(kshape)} uncoalesced leading dims")
    return kshape, rshape, fviews, sviews


# leading dims that do not coalesce (a transposed input: Whisper's conv output permuted to
# (batch, time, channel)) are looped over as they are, up to this many
_LN_OUTER_MAX = 4


def lower_layer_norm(func, a, outs):
    x, w, b, eps = a["input"], a["weight"], a["bias"], float(a["eps"])
    out, mean, rstd = outs
    if out.numel() == 0:
        if mean.numel():
            raise NotImplementedError("layer norm over an empty normalized shape")
        return
    acc = _acc(x)
    kshape, rshape, (ov, xv), (mv, rv) = _ln_views(x, a["normalized_shape"], [out, x],
                                                   [mean, rstd])
    kr, ko = len(rshape), len(kshape)
    store, stat = NP_TYPE[out.dtype], NP_TYPE[mean.dtype]
    par = _parallel(x.numel(), kshape[0])
    launch(*_affine_request(("norm", "layer_norm", kr, acc, store, stat, par,
                             *((ko,) if ko != 1 else ())),
                            lambda: kn.render_layer_norm(kr, acc, store, stat, par, ko),
                            (ov, mv, rv, xv), w, b, eps, x, out))


def _affine_request(key, render, views, w, b, eps, x, out) -> tuple:
    """Layer and group norm's forward launch, as launch()'s arguments (the lowering launches
    it): `views` (out, mean, rstd, x), then the weight and bias read at k * step (absent: a
    one-element identity, step 0) and eps."""
    xv = views[3]
    (wv, ws), (bv, bs) = _param(w, xv.dtype, 1), _param(b, xv.dtype, 0)
    return (key, render, (*views, wv, bv, ws, bs, eps), float(8 * x.numel()),
            _bytes(x) * 3 + _bytes(out, w, b), "vector")


def lower_layer_norm_backward(func, a, outs):
    g, x, mean, rstd, w = a["grad_out"], a["input"], a["mean"], a["rstd"], a["weight"]
    gi, gw, gb = outs
    if x.numel() == 0:
        raise NotImplementedError("layer norm backward of an empty input")
    acc = _acc(x)
    full = [x, g] + ([gi] if gi is not None else [])
    kshape, rshape, fviews, (mv, rv) = _ln_views(x, a["normalized_shape"], full, [mean, rstd])
    kr, ko = len(rshape), len(kshape)
    stores = tuple(NP_TYPE[(o if o is not None else x).dtype] for o in outs)
    par = _parallel(x.numel(), kshape[0])
    nch = min(math.prod(kshape), 32) if par else 1
    wv, ws = _param(w, fviews[0].dtype, 1)
    launch(("norm", "layer_norm_bw", kr, acc, stores, par, *((ko,) if ko != 1 else ())),
           lambda: kn.render_layer_norm_backward(kr, acc, stores, par, ko),
           (fviews[2] if gi is not None else _dummy(fviews[0], 1 + kr), _out1(gw, fviews[0]),
            _out1(gb, fviews[0]), fviews[1], fviews[0], mv, rv, wv, ws,
            int(gi is not None), int(gw is not None), int(gb is not None), nch),
           flops=float(12 * x.numel()), bytes_moved=_bytes(x, g) * 2 + _bytes(gi, gw, gb),
           engine="vector")


# ---------------------------------------------------------------------------------------------
# group norm
# ---------------------------------------------------------------------------------------------

def _gn_view(t: torch.Tensor, a) -> np.ndarray:
    """t as its (batch, group, channel in the group, spatial) view; NotImplementedError (the
    decomposition runs) when the spatial dims do not merge into one strided dim."""
    n, c, hw, grp = int(a["N"]), int(a["C"]), int(a["HxW"]), int(a["group"])
    try:
        return t.view(n, grp, c // grp, hw).numpy()
    except RuntimeError:
        raise NotImplementedError("group norm over spatial dims that do not merge") from None


def _gn_stat(t: torch.Tensor, xv: np.ndarray) -> np.ndarray:
    try:
        return t.view(xv.shape[:2]).numpy()
    except RuntimeError:
        raise NotImplementedError("group norm statistics of another layout") from None


def lower_group_norm(func, a, outs):
    x, w, b, eps = a["input"], a["weight"], a["bias"], float(a["eps"])
    out, mean, rstd = outs
    if x.numel() == 0:
        raise NotImplementedError("group norm of an empty input")
    xv, ov = _gn_view(x, a), _gn_view(out, a)
    mv, rv = _gn_stat(mean, xv), _gn_stat(rstd, xv)
    acc, store, stat = _acc(x), NP_TYPE[out.dtype], NP_TYPE[mean.dtype]
    par = _parallel(x.numel(), xv.shape[0] * xv.shape[1])
    launch(*_affine_request(("norm", "group_norm", acc, store, stat, par),
                            lambda: kn.render_group_norm(acc, store, stat, par),
                            (ov, mv, rv, xv), w, b, eps, x, out))


def lower_group_norm_backward(func, a, outs):
    g, x, mean, rstd, w = a["grad_out"], a["input"], a["mean"], a["rstd"], a["weight"]
    gi, gw, gb = outs
    if x.numel() == 0:
        raise NotImplementedError("group norm backward of an empty input")
    xv, gv = _gn_view(x, a), _gn_view(g, a)
    giv = _gn_view(gi, a) if gi is not None else _dummy(xv, 4)
    mv, rv = _gn_stat(mean, xv), _gn_stat(rstd, xv)
    acc = _acc(x)
    stores = tuple(NP_TYPE[(o if o is not None else x).dtype] for o in outs)
    par = _parallel(x.numel(), xv.shape[0] * xv.shape[1])
    wv, ws = _param(w, xv.dtype, 1)
    launch(("norm", "group_norm_bw", acc, stores, par),
           lambda: kn.render_group_norm_backward(acc, stores, par),
           (giv, _out1(gw, xv), _out1(gb, xv), gv, xv, mv, rv, wv, ws,
            int(gi is not None), int(gw is not None), int(gb is not None)),
           flops=float(12 * x.numel()), bytes_moved=_bytes(x, g) * 2 + _bytes(gi, gw, gb),
           engine="vector")


# ---------------------------------------------------------------------------------------------
# batch norm
# ---------------------------------------------------------------------------------------------

def _bn_red(x: torch.Tensor) -> list:
    if x.dim() < 2:
        raise NotImplementedError("batch norm of a tensor with fewer than 2 dims")
    return [0] + list(range(2, x.dim()))


def _batch_norm(a, outs, train: bool, rm, rv, rm_out, rv_out, rnd: bool = False):
    """rnd: the statistics are stored as bfloat16/float16, and the CPU normalizes with those
    rounded values; a second launch (train=2) redoes `out` from them. A generator of launch
    requests (each built when the one before has run) that _half_aware's lowering launches."""
    x, w, b = a["input"], a["weight"], a["bias"]
    out, smean, sinv = outs[0], outs[1], outs[2]
    if x.numel() == 0:
        raise NotImplementedError("batch norm of an empty input")
    has_run = rm is not None and rv is not None
    if not train and not has_run:
        raise NotImplementedError("batch norm in eval mode without running stats")
    acc = _acc(x)
    kshape, rshape, (xv, ov), _ = split([x, out], _bn_red(x), sort=True)
    kr, c, dt = len(rshape), x.shape[1], xv.dtype
    save = smean.numel() == c and sinv.numel() == c
    store, stat = NP_TYPE[out.dtype], NP_TYPE[smean.dtype]
    run = NP_TYPE[(rm_out if train and has_run else x).dtype]
    par = _parallel(x.numel(), kshape[0])
    (wv, ws), (bv, bs) = _param(w, dt, 1), _param(b, dt, 0)
    stats = (_flat(smean), _flat(sinv)) if save else (_dummy(xv, 1),) * 2
    runs = (_flat(rm_out), _flat(rv_out)) if train and has_run else (_dummy(xv, 1),) * 2
    key = ("norm", "batch_norm.3",   # .3: with the train=2 mode and the rnd flag
           kr, acc, store, stat, run, par)
    rnd_var = int(bool(rnd) and rnd == torch.bfloat16)

    def go(mode: int, run_flag: int, save_flag: int) -> tuple:
        return (key, lambda: kn.render_batch_norm(kr, acc, store, stat, run, par),
                (ov,) + stats + runs + (xv, wv, bv, _flat(rm) if has_run else _dummy(xv, 1),
                                        _flat(rv) if has_run else _dummy(xv, 1), ws, bs, mode,
                                        run_flag, save_flag, rnd_var, float(a["momentum"]),
                                        float(a["eps"])),
                float(6 * x.numel()), _bytes(x) * (3 if mode == 1 else 1) + _bytes(out),
                "vector")

    yield go(int(train), int(train and has_run), int(save))
    if train and rnd and save:
        from .cast import cast_steps

        for t in (smean, sinv):
            half = torch.empty_like(t, dtype=rnd)
            yield from cast_steps(t, half)
            yield from cast_steps(half, t)
        yield go(2, 0, 0)


# the batch norm variants: generators of launch requests (_half_aware makes their lowerings)
def lower_native_batch_norm(func, a, outs, rnd=False):
    rm, rv = a["running_mean"], a["running_var"]
    yield from _batch_norm(a, outs, a["training"], rm, rv, rm, rv, rnd)


def lower_bn_no_stats(func, a, outs, rnd=False):
    yield from _batch_norm(a, outs, a["training"], None, None, None, None, rnd)


def lower_bn_no_training(func, a, outs, rnd=False):
    yield from _batch_norm(a, outs, False, a["running_mean"], a["running_var"], None, None, rnd)


def lower_bn_with_update(func, a, outs, rnd=False):
    rm, rv = a["running_mean"], a["running_var"]
    yield from _batch_norm(a, outs, True, rm, rv, rm, rv, rnd)   # outs[3]: the empty reserve


def lower_bn_functional(func, a, outs, rnd=False):
    rm, rv = a["running_mean"], a["running_var"]
    train = a["training"]
    if not train:
        # the new running stats are copies of the old ones
        from .cast import cast_steps

        yield from cast_steps(rm, outs[3])
        yield from cast_steps(rv, outs[4])
    yield from _batch_norm(a, outs, train, rm, rv, outs[3], outs[4], rnd)


# ---------------------------------------------------------------------------------------------
# what the CPU returns where the meta functions differ; half precision
# ---------------------------------------------------------------------------------------------

def _stat_dtype(x, *params):
    """The CPU's rule: a half input with float32 parameters ("mixed type") keeps float32
    statistics; otherwise they have the input's dtype (the meta functions say float32)."""
    if x.dtype not in HALF:
        return x.dtype
    given = [p for p in params if p is not None]
    if given and all(p.dtype == torch.float32 for p in given):
        return torch.float32
    return x.dtype


def _cpu_meta_stats(train_of):
    def cpu_meta(a, leaves):
        x = a["input"]
        dtype = _stat_dtype(x, a.get("weight"), a.get("bias"), a.get("running_mean"),
                            a.get("running_var"))
        train = train_of(a)
        out = list(leaves)
        for i in (1, 2):
            shape, stride, _dt = out[i]
            if not train and "running_mean" in a:
                shape, stride = (0,), (1,)   # eval: the CPU saves no statistics
            out[i] = (shape, stride, dtype)
        return out
    return cpu_meta


def _half_aware(lower32, train_of=None):
    """Half inputs computed in float32 (as run_upcast does) plus what it leaves out: running
    statistics written back in place, and rounded statistics where the CPU normalizes with
    them. lower32 is a generator of launch requests; the lowering made here launches them
    itself (dispatch -> lowering -> launch)."""
    def steps(func, a, outs):
        tensors = [v for v in a.values() if isinstance(v, torch.Tensor)]
        if not any(t.dtype in HALF for t in tensors + [o for o in outs if o is not None]):
            return (yield from lower32(func, a, outs))
        from .cast import cast_steps
        from .half import _up_steps, alloc_like

        up = {}
        for k, v in a.items():
            up[k] = (yield from _up_steps(v, v)) if isinstance(v, torch.Tensor) and \
                v.dtype in HALF else v
        tmp = [alloc_like(o, torch.float32) if isinstance(o, torch.Tensor) and o.dtype in HALF
               else o for o in outs]
        stat = outs[1].dtype if len(outs) > 1 and outs[1] is not None else None
        if train_of is not None:
            yield from lower32(func, up, tmp, rnd=stat if stat in HALF else False)
        else:
            yield from lower32(func, up, tmp)
        for o, t in zip(outs, tmp):
            if o is not t:
                yield from cast_steps(t, o)
        if train_of is not None and train_of(a):
            # NOTE: native_batch_norm's schema does not mark its running stats as written
            for name in ("running_mean", "running_var"):
                if up.get(name) is not a.get(name):
                    yield from cast_steps(up[name], a[name])

    def lower(func, a, outs):
        for req in steps(func, a, outs):
            launch(*req)
    lower.handles_half = True
    if train_of is not None:
        lower.cpu_meta = _cpu_meta_stats(train_of)
    return lower


def _train(a):
    return a["training"]


def _ln_cpu_meta(a, leaves):
    dtype = _stat_dtype(a["input"], a["weight"], a["bias"])
    return [leaves[0]] + [(shape, stride, dtype) for shape, stride, _dt in leaves[1:3]]


lower_layer_norm.cpu_meta = _ln_cpu_meta
lower_group_norm.cpu_meta = _ln_cpu_meta   # the same statistics dtype rule


def lower_batch_norm_backward(func, a, outs):
    g, x, w = a["grad_out"], a["input"], a["weight"]
    rm, rv, smean, sinv = a["running_mean"], a["running_var"], a["save_mean"], a["save_invstd"]
    train = a["train"]
    gi, gw, gb = outs
    if x.numel() == 0:
        raise NotImplementedError("batch norm backward of an empty input")
    if (train and (smean is None or sinv is None)) or (not train and (rm is None or rv is None)):
        raise NotImplementedError("batch norm backward without the statistics it needs")
    acc = _acc(x)
    full = [x, g] + ([gi] if gi is not None else [])
    kshape, rshape, fviews, _ = split(full, _bn_red(x), sort=True)
    kr, xv = len(rshape), fviews[0]
    stores = tuple(NP_TYPE[(o if o is not None else x).dtype] for o in outs)
    par = _parallel(x.numel(), kshape[0])
    wv, ws = _param(w, xv.dtype, 1)
    stat = [_flat(t) if t is not None else _dummy(xv, 1) for t in (rm, rv, smean, sinv)]
    launch(("norm", "batch_norm_bw", kr, acc, stores, par),
           lambda: kn.render_batch_norm_backward(kr, acc, stores, par),
           (fviews[2] if gi is not None else _dummy(xv, 1 + kr), _out1(gw, xv), _out1(gb, xv),
            fviews[1], xv, wv, ws, *stat, int(train), int(gi is not None), int(gw is not None),
            int(gb is not None), float(a["eps"])),
           flops=float(8 * x.numel()), bytes_moved=_bytes(x, g) * 2 + _bytes(gi),
           engine="vector")


LOWERINGS = {
    "aten::_softmax": _softmax(False),
    "aten::_log_softmax": _softmax(True),
    # attention's math path (SDPA with dropout): all -inf rows as zeros (was five ops)
    "aten::_safe_softmax": _softmax(False, safe=True),
    "aten::_softmax_backward_data": _softmax_backward(False),
    "aten::_log_softmax_backward_data": _softmax_backward(True),
    "aten::native_layer_norm": lower_layer_norm,
    "aten::native_layer_norm_backward": lower_layer_norm_backward,
    "aten::native_group_norm": lower_group_norm,
    "aten::native_group_norm_backward": lower_group_norm_backward,
    "aten::native_batch_norm": _half_aware(lower_native_batch_norm, _train),
    "aten::_native_batch_norm_legit": _half_aware(lower_native_batch_norm, _train),
    "aten::_native_batch_norm_legit.no_stats": _half_aware(lower_bn_no_stats, _train),
    "aten::_native_batch_norm_legit_no_training": _half_aware(lower_bn_no_training,
                                                              lambda a: False),
    "aten::_native_batch_norm_legit_functional": _half_aware(lower_bn_functional, _train),
    "aten::_batch_norm_with_update": _half_aware(lower_bn_with_update, lambda a: True),
    "aten::_batch_norm_no_update": _half_aware(lower_bn_no_training, lambda a: False),
    "aten::native_batch_norm_backward": lower_batch_norm_backward,
}
