"""Loss lowerings: nll_loss (1d and 2d, forward and backward), mse_loss, binary_cross_entropy,
and the backward of multi_margin_loss and multilabel_margin_loss (their forwards decompose).

nll views the input as (N, C, S) and the target as (N, S), S the coalesced spatial dims, so the
1d and 2d ops share one kernel. mse and bce are map-reduces over operands broadcast to one shape;
their backward is the same pointwise kernel with the incoming gradient as one more operand.

>>> import torch, eager_neuron
>>> logp = torch.tensor([[0.0, -1.0, -2.0], [-3.0, 0.0, -1.0]]).to("neuron")
>>> torch.nn.functional.nll_loss(logp, torch.tensor([1, 0]).to("neuron")).item()
2.0
"""

from __future__ import annotations

import numpy as np
import torch

from ..kernels import loss as kloss
from ..kernels import reduce as kr
from ..launch import checked, launch
from .common import NP_TYPE, coalesce, strided_np
from .reduce import F64

_REDUCTIONS = (0, 1, 2)   # none, mean, sum (torch.nn._reduction)


def _float(t: torch.Tensor) -> None:
    if not t.is_floating_point():
        raise NotImplementedError(f"loss of {t.dtype}")


def _nsc(t: torch.Tensor, lead: int) -> np.ndarray:
    """t as (lead dims..., S): the first `lead` dims kept (padded with size 1 for a batchless
    input), the rest coalesced into one."""
    shape, stride = list(t.shape), list(t.stride())
    head_shape, head_stride = shape[:lead], stride[:lead]
    while len(head_shape) < lead:                    # (C,) input / () target: no batch dim
        head_shape.insert(0, 1)
        head_stride.insert(0, 0)
    rest, (rest_stride,) = coalesce(tuple(shape[lead:]), [tuple(stride[lead:])])
    if len(rest) != 1:
        raise NotImplementedError("nll_loss over spatial dims that do not coalesce")
    return strided_np(t, tuple(head_shape) + rest, tuple(head_stride) + rest_stride)


def _scalar2(t: torch.Tensor) -> np.ndarray:
    return strided_np(t, (1, 1), (0, 0))


def _raise_target(err: np.ndarray) -> None:
    checked(_check_target, err)   # the fast path replays the check (launch.checked)


def _check_target(err: np.ndarray) -> None:
    if err[1]:
        raise IndexError(f"Target {int(err[0])} is out of bounds.")


def _check_01(err: np.ndarray) -> None:
    if err[1]:
        raise RuntimeError("all elements of input should be between 0 and 1")


def _weight(w, dtype) -> tuple[np.ndarray, int]:
    """(class weights, step): no weights is [1] read with step 0 (same kernel either way)."""
    if w is None:
        return np.ones(1, dtype), 0
    if not w.is_contiguous():
        raise NotImplementedError("non-contiguous class weights")
    return w.view(-1).numpy(), 1


def _nll_views(x: torch.Tensor, t: torch.Tensor, per_elem: list) -> tuple:
    """x as (N, C, S); target and the per-element tensors (loss / its grad for reduction none,
    same shape as the target) as (N, S); a batchless (C,) input is N = S = 1."""
    if x.dim() == 1:
        xv = strided_np(x, (1, x.shape[0], 1), (0, x.stride(0), 0))
        return xv, _scalar2(t), [_scalar2(p) for p in per_elem]
    return _nsc(x, 2), _nsc(t, 1), [_nsc(p, 1) for p in per_elem]


_TYPE_NAME = {torch.uint8: "Byte", torch.int8: "Char", torch.int16: "Short",
              torch.int32: "Int", torch.int64: "Long", torch.bool: "Bool"}


def _check_target_dtype(func, t: torch.Tensor) -> None:
    """The CPU kernels' target dtype checks: int64 everywhere; uint8 too for 1-d nll_loss
    (forward and backward), which the 2-d forms refuse; other dtypes refused with each
    kernel's own words."""
    if t.dtype == torch.int64:
        return
    name = func._schema.name
    two_d, backward = "2d" in name, "backward" in name
    got = _TYPE_NAME.get(t.dtype, str(t.dtype).replace("torch.", ""))
    if t.dtype == torch.uint8:
        if two_d:
            raise RuntimeError("expected scalar type Long but found Byte")
        return
    if backward and not two_d:
        raise RuntimeError(f"expected scalar type Long but found {got}")
    raise RuntimeError(f"expected target dtype to be Long or Byte, but got {got}")


def lower_nll_forward(func, a, outs):
    x, t, reduction = a["self"], a["target"], a["reduction"]
    out, tw = outs
    _check_target_dtype(func, t)
    _float(x)
    if reduction not in _REDUCTIONS or (x.dim() > 1 and x.shape[1] == 0):
        raise NotImplementedError("nll_loss with this reduction or no classes")
    none = reduction == 0
    xv, tv, pv = _nll_views(x, t, [out] if none else [])
    ov = pv[0] if none else _scalar2(out)
    wv, ws = _weight(a["weight"], xv.dtype)
    err = np.zeros(2, np.int64)
    store = NP_TYPE[out.dtype]
    launch(("loss", "nll", F64, store), lambda: kr.render_nll(F64, store),
           (ov, strided_np(tw, (1,), (0,)), err, xv, tv, wv, ws, int(reduction),
            int(a["ignore_index"])),
           flops=float(2 * t.numel()),
           bytes_moved=float(t.numel() * (t.element_size() + x.element_size())),
           engine="vector")
    _raise_target(err)


def lower_nll_backward(func, a, outs):
    g, x, t, reduction = a["grad_output"], a["self"], a["target"], a["reduction"]
    gi = outs[0]
    _check_target_dtype(func, t)
    _float(x)
    if reduction not in _REDUCTIONS or gi.numel() == 0:
        raise NotImplementedError("nll_loss backward with this reduction or no elements")
    none = reduction == 0
    giv, tv, pv = _nll_views(gi, t, [g] if none else [])
    wv, ws = _weight(a["weight"], giv.dtype)
    err = np.zeros(2, np.int64)
    store = NP_TYPE[gi.dtype]
    launch(("loss", "nll_bw", F64, store), lambda: kr.render_nll_backward(F64, store),
           (giv, err, pv[0] if none else _scalar2(g), tv, wv, ws,
            _scalar2(a["total_weight"]).reshape(1), int(reduction), int(a["ignore_index"])),
           flops=float(t.numel()), bytes_moved=float(gi.numel() * gi.element_size()),
           engine="vector")
    _raise_target(err)


# ---------------------------------------------------------------------------------------------
# pointwise losses: mse, binary cross entropy
# ---------------------------------------------------------------------------------------------

_LOG = "(math.log({v}) if {v} > 0 else A(-np.inf))"
_BCE = ("-x2 * (x1 * max(" + _LOG.format(v="x0") + ", A(-100)) + (A(1) - x1) * max("
        + _LOG.format(v="(A(1) - x0)") + ", A(-100)))")
_BCE_BW = "x3 * x2 * (x0 - x1) / max((A(1) - x0) * x0, A(1e-12))"
_IN_01 = "x0 >= 0 and x0 <= 1"
# binary_cross_entropy: ATen checks each element's input, then its target ("all elements of
# target should be between 0 and 1"); a NaN fails
_BCE_01 = (_IN_01, "x1 >= 0 and x1 <= 1")


def _pointwise(name: str, expr: str, operands: list, out: torch.Tensor, reduction: int,
               grad: bool, check: str = ""):
    """Forward (grad False): out = expr summed over the broadcast operands, / numel for mean,
    or per element for reduction none. Backward (grad True): out = expr per element, where the
    expression divides by `div` (numel for mean, else 1). Returns (the launch as launch()'s
    positional arguments, its error flags), None when there is nothing to launch: the lowering
    launches it and checks the flags (_launch_checked)."""
    for t in operands:
        _float(t)
    if reduction not in _REDUCTIONS:
        raise NotImplementedError(f"{name} reduction {reduction}")
    shape = torch.broadcast_shapes(*(t.shape for t in operands))
    n = 1
    for s in shape:
        n *= s
    reduce = not grad and reduction != 0
    if n == 0 and not reduce:
        return
    if not reduce and tuple(out.shape) != tuple(shape):
        raise NotImplementedError(f"{name}: output shape {tuple(out.shape)} != {tuple(shape)}")
    ts = [t.expand(shape) for t in operands]
    strides = ([] if reduce else [out.stride()]) + [t.stride() for t in ts]
    cshape, cst = coalesce(tuple(shape), strides)
    views = [strided_np(t, cshape, st) for t, st in zip(ts, cst[0 if reduce else 1:])]
    rank, store = len(cshape), NP_TYPE[out.dtype]
    # a reduced loss lands in out[0, ..]: a one-element view of the same rank and layout
    ov = strided_np(out, (1,) * rank, (0,) * rank) if reduce else \
        strided_np(out, cshape, cst[0])
    div = float(n if reduction == 1 else 1)
    err = np.zeros(2, np.int64)
    key = ("loss", name, expr, rank, len(views), F64, store, check)
    return ((key, lambda: kr.render_pointwise(expr, rank, len(views), F64, store, check),
             (ov, err) + tuple(views) + (int(reduce), div), float(4 * n),
             float(sum(t.numel() * t.element_size() for t in operands)
                   + out.numel() * out.element_size()),
             "scalar" if "math." in expr else "vector"), err)


def _weights(a, like: torch.Tensor) -> torch.Tensor:
    w = a.get("weight")
    return w if w is not None else torch.ones((), dtype=like.dtype)


# each pointwise loss launches the request _pointwise built, then checks its flags (the
# kernel's out-of-[0, 1] report): dispatch -> lowering -> launch
def lower_mse(func, a, outs):
    step = _pointwise("mse", "(x0 - x1) * (x0 - x1)", [a["self"], a["target"]], outs[0],
                      a["reduction"], False)
    if step is not None:
        launch(*step[0])
        checked(_check_01, step[1])


def lower_mse_backward(func, a, outs):
    # d/dx of mean((x - y)^2) = 2 (x - y) g / n
    step = _pointwise("mse_bw", "A(2) * (x0 - x1) * x2 / A(div)",
                      [a["self"], a["target"], a["grad_output"]], outs[0], a["reduction"], True)
    if step is not None:
        launch(*step[0])
        checked(_check_01, step[1])


def _check_bce(err: np.ndarray) -> None:
    """The kernel flagged the first element whose input (err[0] 0) or target (1) is outside
    [0, 1] or NaN."""
    if err[1]:
        what = "target" if err[0] == 1 else "input"
        raise RuntimeError(f"all elements of {what} should be between 0 and 1")


def lower_bce(func, a, outs):
    x = a["self"]
    step = _pointwise("bce", _BCE, [x, a["target"], _weights(a, x)], outs[0], a["reduction"],
                      False, _BCE_01)
    if step is not None:
        launch(*step[0])
        checked(_check_bce, step[1])


def lower_bce_backward(func, a, outs):
    x = a["self"]
    step = _pointwise("bce_bw", _BCE_BW + " / A(div)",
                      [x, a["target"], _weights(a, x), a["grad_output"]], outs[0],
                      a["reduction"], True)
    if step is not None:
        launch(*step[0])
        checked(_check_01, step[1])


# ---------------------------------------------------------------------------------------------
# margin losses (backward; the forwards decompose into kernels we have)
# ---------------------------------------------------------------------------------------------

def _rows(t: torch.Tensor) -> torch.Tensor:
    """A 0-d/1-d loss operand as one row (1, C), an (N, C) one as is."""
    return t.reshape(1, -1) if t.dim() <= 1 else t


def _per_row(go: torch.Tensor, n: int) -> np.ndarray:
    """grad_output as an (N,) view: a reduced (one-element) gradient read with stride 0."""
    return strided_np(go, (n,), (0,)) if go.numel() == 1 else go.reshape(n).numpy()


def _scale(reduction: int, n: int, dim: int) -> float:
    return 1.0 / (n * dim) if reduction == 1 else 1.0 / dim


def lower_multi_margin_backward(func, a, outs):
    x, gi, t, w = a["self"], outs[0], a["target"], a["weight"]
    _float(x)
    if gi.numel() == 0 or a["grad_output"].dtype != x.dtype or (w is not None and
                                                                 w.dtype != x.dtype):
        raise NotImplementedError("multi_margin_loss backward: empty or mixed dtypes")
    p = a["p"]
    if p not in (1, 2):
        raise NotImplementedError(f"multi_margin_loss backward with p={p}")
    xv, gv = _rows(x), _rows(gi)
    n, dim = xv.shape
    has_w = w is not None
    wv = _weight(w, xv.numpy().dtype)[0]
    T = NP_TYPE[x.dtype]
    err = np.zeros(2, np.int64)
    launch(("loss", "multi_margin_bw", T, p == 1, has_w),
           lambda: kloss.render_multi_margin_backward(T, p == 1, has_w),
           (gv.numpy(), _per_row(a["grad_output"], n), xv.numpy(), t.reshape(n).numpy(), wv,
            float(a["margin"]), _scale(a["reduction"], n, dim), err),
           flops=float(4 * x.numel()), bytes_moved=float(2 * x.numel() * x.element_size()),
           engine="vector")
    if err[1]:
        raise IndexError(f"multi_margin_loss: target {int(err[0])} is out of bounds for "
                         f"{dim} classes")


def lower_multilabel_margin(func, a, outs):
    """Its own kernel: PyTorch 2.13's decomposition reads targets past the first -1."""
    x, t, (out, it) = a["self"], a["target"], outs
    _float(x)
    if x.numel() == 0 or a["reduction"] not in _REDUCTIONS:
        raise NotImplementedError("multilabel_margin_loss on an empty input")
    xv = _rows(x)
    n, dim = xv.shape
    ov = out.reshape(n) if a["reduction"] == 0 else out.reshape(1)
    T = NP_TYPE[x.dtype]
    launch(("loss", "multilabel_margin", T), lambda: kloss.render_multilabel_margin(T),
           (ov.numpy(), _rows(it).numpy(), xv.numpy(), _rows(t).numpy(), int(a["reduction"])),
           flops=float(3 * x.numel() * dim), bytes_moved=float(3 * x.numel() * x.element_size()),
           engine="vector")


def lower_multilabel_margin_backward(func, a, outs):
    x, gi, t, it = a["self"], outs[0], a["target"], a["is_target"]
    _float(x)
    if gi.numel() == 0 or a["grad_output"].dtype != x.dtype or it.dtype != x.dtype:
        raise NotImplementedError("multilabel_margin_loss backward: empty or mixed dtypes")
    xv = _rows(x)
    n, dim = xv.shape
    T = NP_TYPE[x.dtype]
    launch(("loss", "multilabel_margin_bw", T),
           lambda: kloss.render_multilabel_margin_backward(T),
           (_rows(gi).numpy(), _per_row(a["grad_output"], n), xv.numpy(), _rows(t).numpy(),
            _rows(it).numpy(), _scale(a["reduction"], n, dim)),
           flops=float(3 * x.numel() * dim), bytes_moved=float(3 * x.numel() * x.element_size()),
           engine="vector")


# NOTE: PyTorch 2.13 has no Meta kernels for these backward ops, and dispatch learns output
# metadata by running the op on meta tensors: the gradient has the input's metadata.
_META_LIB = torch.library.Library("aten", "IMPL")
_META_LIB.impl("multi_margin_loss_backward",
               lambda grad_output, self, *args, **kwargs: torch.empty_like(self), "Meta")
_META_LIB.impl("multilabel_margin_loss_backward",
               lambda grad_output, self, *args, **kwargs: torch.empty_like(self), "Meta")


def _multilabel_margin_forward_meta(self, target, reduction):
    # NOTE (module_db helper, issue 16): PyTorch's Meta (its decomposition) gives a 1-d input's
    # reduction="none" loss the shape [1]; ATen's CPU kernel returns a 0-d tensor, as for 0-d input
    rows = self.shape[0] if self.dim() == 2 else None
    loss = self.new_empty((rows,) if reduction == 0 and rows is not None else ())
    return loss, torch.empty_like(target, dtype=self.dtype)


_META_LIB.impl("multilabel_margin_loss_forward", _multilabel_margin_forward_meta, "Meta")

LOWERINGS = {
    "aten::multi_margin_loss_backward": lower_multi_margin_backward,
    "aten::multilabel_margin_loss_backward": lower_multilabel_margin_backward,
    "aten::multilabel_margin_loss_forward": lower_multilabel_margin,
    "aten::nll_loss_forward": lower_nll_forward,
    "aten::nll_loss2d_forward": lower_nll_forward,
    "aten::nll_loss_backward": lower_nll_backward,
    "aten::nll_loss2d_backward": lower_nll_backward,
    "aten::mse_loss": lower_mse,
    "aten::mse_loss_backward": lower_mse_backward,
    "aten::binary_cross_entropy": lower_bce,
    "aten::binary_cross_entropy_backward": lower_bce_backward,
}
