"""Attention lowerings: F.scaled_dot_product_attention as one fused kernel, forward and backward.

Why a door of its own: `aten::scaled_dot_product_attention` is CompositeImplicitAutograd, and
PyTorch picks a fused backend for PrivateUse1 only through a C++ DispatchStub; left alone, every
call decomposes (above autograd, before dispatch sees it) into the math path: ~10 launches
forward (scale, mask, bmm, _safe_softmax's 5 ops, bmm) and as many backward, with the (L, S)
score matrix written to and read from memory each time. So this module registers the op's
AutogradPrivateUse1 kernel: supported calls become `aten::_scaled_dot_product_fused_attention_
overrideable` (the op PyTorch reserves for out-of-tree backends; its autograd formula calls the
`_backward` op), both lowered here to one kernel each (kernels/attention.py). The rest (dropout
in training, rank != 4, mismatched batch dims) takes the math path exactly as before.

>>> import torch, eager_neuron, torch.nn.functional as F
>>> q = torch.ones(1, 1, 2, 4, device="neuron")
>>> F.scaled_dot_product_attention(q, q, q).cpu().tolist()[0][0][0]
[1.0, 1.0, 1.0, 1.0]
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..kernels import attention as ka
from ..kernels import compile as kc
from ..launch import launch

aten = torch.ops.aten
# NOTE: not float64: logsumexp is float32 (its meta says so), and the backward rebuilds the
# probabilities from it, which would cost float64 its precision; float64 takes the math path
_FLOATS = frozenset({torch.float32, torch.bfloat16, torch.float16})


# ---------------------------------------------------------------------------------------------
# the door: which calls take the fused kernel
# ---------------------------------------------------------------------------------------------

def _fusable(q, k, v, mask, dropout_p, is_causal, enable_gqa) -> bool:
    # NOTE: dropout inside attention draws from the RNG as the math path does; a causal flag
    # with an explicit mask is the math path's error to raise
    if dropout_p > 0.0 or (is_causal and mask is not None):
        return False
    if not (q.dim() == k.dim() == v.dim() == 4) or q.dtype not in _FLOATS:
        return False
    if not (q.dtype == k.dtype == v.dtype) or q.is_nested:
        return False
    B, H, L, E = q.shape
    if k.shape[0] != B or v.shape[:3] != k.shape[:3] or k.shape[3] != E:
        return False
    Hk = k.shape[1]
    if Hk != H and not (enable_gqa and Hk > 0 and H % Hk == 0):
        return False
    if mask is not None:
        if mask.dtype != torch.bool and mask.dtype != q.dtype:
            return False
        try:
            torch.broadcast_shapes(mask.shape, (B, H, L, k.shape[2]))
        except RuntimeError:
            return False
    return True


def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
         enable_gqa=False):
    """AutogradPrivateUse1 kernel of aten::scaled_dot_product_attention."""
    if not _fusable(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa):
        return aten._scaled_dot_product_attention_math(
            query, key, value, attn_mask, dropout_p, is_causal, None, scale=scale,
            enable_gqa=enable_gqa)[0]
    return aten._scaled_dot_product_fused_attention_overrideable(
        query, key, value, attn_mask, 0.0, is_causal, False, scale=scale)[0]


_LIB = torch.library.Library("aten", "IMPL")
_LIB.impl("scaled_dot_product_attention", sdpa, "AutogradPrivateUse1")


# ---------------------------------------------------------------------------------------------
# lowerings
# ---------------------------------------------------------------------------------------------

def _mask_view(mask, shape4) -> tuple[str, np.ndarray]:
    """(kind, the mask as a (B, H, L, S) numpy view broadcast by strides)."""
    if mask is None:
        return "none", np.zeros((1, 1, 1, 1), np.float32)
    kind = "bool" if mask.dtype == torch.bool else "add"
    return kind, mask.expand(shape4).numpy()


def _parallel(b: int, work: int) -> bool:
    return b > 1 and work >= (1 << 15) and kc.parallel_allowed()


def _scale(scale, q) -> float:
    return float(scale) if scale is not None else 1.0 / math.sqrt(q.shape[-1])


def _check(q, k, v):
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise NotImplementedError("fused attention on rank-4 (B, H, L, E) views only")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise NotImplementedError("query heads that are not a multiple of key/value heads")


def _flops(q, k, v) -> float:
    B, H, L, E = q.shape
    return float(2 * B * H * L * k.shape[2] * (E + v.shape[3]))


def _bytes(*ts) -> float:
    return float(sum(t.numel() * t.element_size() for t in ts if isinstance(t, torch.Tensor)))


def lower_forward(func, a, outs):
    q, k, v, mask = a["query"], a["key"], a["value"], a["attn_bias"]
    if a["dropout_p"]:
        raise NotImplementedError("fused attention with dropout (the math path draws it)")
    if a["return_debug_mask"]:
        raise NotImplementedError("fused attention's debug mask")
    _check(q, k, v)
    out, lse = outs[0], outs[1]
    # NOTE: no dropout, so no RNG state: the kernel zeroes seed and offset (the backward
    # ignores them, but nothing is left undefined)
    seed, offset = (t.view(1).numpy() for t in (outs[6], outs[7]))
    shape4 = (*q.shape[:3], k.shape[2])
    kind, mv = _mask_view(mask, shape4)
    causal = bool(a["is_causal"])
    par = _parallel(q.shape[0] * q.shape[1], int(np.prod(shape4)))
    launch(("attention", "sdpa_fwd", kind, causal, par),
           lambda: ka.render_forward(kind, causal, par),
           (out.numpy(), lse.numpy(), seed, offset, q.numpy(), k.numpy(), v.numpy(), mv,
            _scale(a["scale"], q)),
           flops=_flops(q, k, v), bytes_moved=_bytes(q, k, v, mask, out, lse), engine="tensor")
    outs[4], outs[5] = q.shape[2], k.shape[2]


def lower_backward(func, a, outs):
    go, q, k, v, mask = a["grad_out"], a["query"], a["key"], a["value"], a["attn_bias"]
    if a["dropout_p"]:
        raise NotImplementedError("fused attention backward with dropout")
    _check(q, k, v)
    gq, gk, gv, gm = outs
    shape4 = (*q.shape[:3], k.shape[2])
    kind, mv = _mask_view(mask, shape4)
    mask_grad = (kind == "add" and isinstance(gm, torch.Tensor) and bool(a["grad_input_mask"][3])
                 and gm.numel() > 0)
    gmv = gm.expand(shape4).numpy() if mask_grad else np.zeros((1, 1, 1, 1), np.float32)
    # NOTE: threads split the batch; a mask gradient broadcast over the batch would be written
    # by several threads at once: serial then
    par = _parallel(q.shape[0], int(np.prod(shape4))) and not (
        mask_grad and gmv.strides[0] == 0)
    causal = bool(a["is_causal"])
    launch(("attention", "sdpa_bwd", kind, causal, mask_grad, par),
           lambda: ka.render_backward(kind, causal, mask_grad, par),
           (gq.numpy(), gk.numpy(), gv.numpy(), gmv, go.numpy(), q.numpy(), k.numpy(),
            v.numpy(), mv, a["out"].numpy(), a["logsumexp"].numpy(), _scale(a["scale"], q)),
           flops=2.5 * _flops(q, k, v),
           bytes_moved=_bytes(go, q, k, v, mask, a["out"], gq, gk, gv) + _bytes(gm) * mask_grad,
           engine="tensor")


LOWERINGS = {
    "aten::_scaled_dot_product_fused_attention_overrideable": lower_forward,
    "aten::_scaled_dot_product_fused_attention_overrideable_backward": lower_backward,
}
