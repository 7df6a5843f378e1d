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
The same door serves the eval-mode fast path of nn.MultiheadAttention and
nn.TransformerEncoderLayer (`_native_multi_head_attention`, `_transformer_encoder_layer_fwd`:
fused CPU/CUDA ops with no decomposition), composed from linear, layer norm and this kernel.

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
        if not _broadcastable(mask.shape, (B, H, L, k.shape[2])):
            return False
    return True


def _broadcastable(a, b) -> bool:
    """Would torch.broadcast_shapes(a, b) succeed? (Its Python reference costs ~12 us a call.)"""
    return all(x == y or x == 1 or y == 1 for x, y in zip(reversed(a), reversed(b)))


def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
         enable_gqa=False):
    """AutogradPrivateUse1 kernel of aten::scaled_dot_product_attention."""
    if not _fusable(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa):
        if attn_mask is not None and attn_mask.dtype == torch.bool:
            # the math op adds its mask: ATen's sdpa turns a boolean one into 0 / -inf first
            # (convert_boolean_attn_mask); passed as is, True added 1.0 to every kept score and
            # nothing was masked (dropout in training, float64, 3-d inputs: silently wrong)
            attn_mask = torch.where(attn_mask, 0.0, torch.scalar_tensor(
                -math.inf, dtype=query.dtype, device=attn_mask.device))
        return aten._scaled_dot_product_attention_math(
            query, key, value, attn_mask, dropout_p, is_causal, None, scale=scale,
            enable_gqa=enable_gqa)[0]
    return aten._scaled_dot_product_fused_attention_overrideable(
        query, key, value, attn_mask, 0.0, is_causal, False, scale=scale)[0]


# ---------------------------------------------------------------------------------------------
# the inference fast path of nn.MultiheadAttention / nn.TransformerEncoderLayer (eval, no grad):
# two fused ops with no decomposition in PyTorch, composed here from ops that have kernels
# ---------------------------------------------------------------------------------------------

def _keep_mask(mask, mask_type, B, L, S):
    """The fast path's mask (nonzero = masked out, as ATen's masked_softmax reads it) as a
    (B or 1, 1, L, S) bool `keep` mask for sdpa; mask_type 1 is a (B, S) key padding mask."""
    if mask is None:
        return None
    drop = mask if mask.dtype == torch.bool else mask != 0
    if mask_type == 1 or (mask_type is None and drop.dim() == 2 and drop.shape == (B, S)
                          and L != B):
        drop = drop.view(B, 1, 1, S)
    elif drop.dim() == 2:
        drop = drop.view(1, 1, L, S)
    return torch.logical_not(drop)


def native_mha(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight,
               proj_bias, mask=None, need_weights=True, average_attn_weights=True,
               mask_type=None):
    """aten::_native_multi_head_attention (batch-first (B, T, D) inputs)."""
    B, L, D = query.shape
    S, dh = key.shape[1], embed_dim // num_head
    wq, wk, wv = qkv_weight.chunk(3)
    bq, bk, bv = qkv_bias.chunk(3)
    q, k, v = (torch.nn.functional.linear(x, w, b).view(B, -1, num_head, dh).transpose(1, 2)
               for x, w, b in ((query, wq, bq), (key, wk, bk), (value, wv, bv)))
    keep = _keep_mask(mask, mask_type, B, L, S)
    if need_weights:
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(dh))
        if keep is not None:
            scores = scores.masked_fill(torch.logical_not(keep), float("-inf"))
        weights = torch.softmax(scores, -1)
        if keep is not None:   # a row with nothing to attend to is 0, as masked_softmax
            weights = weights.masked_fill(torch.logical_not(keep.any(-1, keepdim=True)), 0.0)
        ctx = torch.matmul(weights, v)
        weights = weights.mean(1) if average_attn_weights else weights
    else:
        ctx = sdpa(q, k, v, keep)
        weights = query.new_empty(0)
    out = torch.nn.functional.linear(ctx.transpose(1, 2).reshape(B, L, D), proj_weight,
                                     proj_bias)
    return out, weights


def encoder_layer(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias,
                  use_gelu, norm_first, eps, norm_weight_1, norm_bias_1, norm_weight_2,
                  norm_bias_2, ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2, mask=None,
                  mask_type=None):
    """aten::_transformer_encoder_layer_fwd: ATen's order of norms, residuals and activation."""
    F = torch.nn.functional
    x = F.layer_norm(src, (embed_dim,), norm_weight_1, norm_bias_1, eps) if norm_first else src
    x = native_mha(x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias,
                   mask, False, True, mask_type)[0] + src
    if not norm_first:
        x = F.layer_norm(x, (embed_dim,), norm_weight_1, norm_bias_1, eps)
    y = F.layer_norm(x, (embed_dim,), norm_weight_2, norm_bias_2, eps) if norm_first else x
    y = F.linear(y, ffn_weight_1, ffn_bias_1)
    y = F.linear(F.gelu(y) if use_gelu else F.relu(y), ffn_weight_2, ffn_bias_2)
    x = x + y
    if not norm_first:
        x = F.layer_norm(x, (embed_dim,), norm_weight_2, norm_bias_2, eps)
    return x


_LIB = torch.library.Library("aten", "IMPL")
_LIB.impl("scaled_dot_product_attention", sdpa, "AutogradPrivateUse1")
_LIB.impl("_native_multi_head_attention", native_mha, "AutogradPrivateUse1")
_LIB.impl("_transformer_encoder_layer_fwd", encoder_layer, "AutogradPrivateUse1")


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
