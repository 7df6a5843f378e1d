"""Flash attention: tiled online softmax, forward and backward, O(sequence) extra memory.

q (B, H, L, D), k (B, Hk, S, D), v (B, Hk, S, Dv), H a multiple of Hk (grouped-query attention:
query head h reads key/value head h // (H // Hk)); `causal` keeps key j <= query i (upper-left,
as `scaled_dot_product_attention(is_causal=True)`).

Forward, per (batch, head, block of BR query rows) in parallel: for each block of BC keys, the
BR x BC score tile, its row maxima, the running max m, sum l and output accumulator rescaled by
exp(m_old - m_new) (the online softmax). Only out (B, H, L, Dv) and the row logsumexp
lse (B, H, L) reach HBM: no L x S matrix exists anywhere.

Backward, per (batch, key/value head) in parallel (so dk/dv of a shared head need no atomics):
delta_i = sum(dO_i * O_i); for each key block and query row, p = exp(q k^T scale - lse) is
recomputed, dv += p dO, ds = p (dO v^T - delta), dq += scale ds k, dk += scale ds q.
Accumulators are float64 (the score tile float32, as a GPU kernel's).

>>> import torch
>>> from eager_neuron.kernel_lib.flash_attention import flash_attention
>>> q = torch.randn(1, 2, 8, 4, device="neuron")
>>> flash_attention(q, q, q).shape
torch.Size([1, 2, 8, 4])
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numba import prange

import eager_neuron

BR = 32   # query rows per tile
BC = 64   # keys per tile


def _lse_dtype(q):
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _flops(q, k, v, scale, causal):
    B, H, L, D = q.shape
    return 2.0 * B * H * L * k.shape[2] * (D + v.shape[3]) / (2 if causal else 1)


@eager_neuron.kernel(
    "neuronlib::flash_attn_fwd",
    outputs=lambda q, k, v, scale, causal: [
        (tuple(q.shape[:3]) + (v.shape[3],), q.dtype), (tuple(q.shape[:3]), _lse_dtype(q))],
    flops=_flops, engine="tensor", fastmath={"reassoc", "contract"})
def flash_attn_fwd(q, k, v, scale: float, causal: bool, out, lse):
    B, H, L, D = q.shape
    Hk, S, Dv = k.shape[1], k.shape[2], v.shape[3]
    G = H // Hk
    nq = (L + BR - 1) // BR
    for task in prange(B * H * nq):
        bh = task // nq
        i0 = (task - bh * nq) * BR
        b = bh // H
        h = bh - b * H
        hk = h // G
        nr = min(L, i0 + BR) - i0
        qt = np.empty((BR, D), np.float32)
        st = np.empty((BR, BC), np.float32)
        acc = np.zeros((BR, Dv), np.float64)
        m = np.full(BR, -np.inf)
        den = np.zeros(BR)
        for r in range(nr):
            for e in range(D):
                qt[r, e] = q[b, h, i0 + r, e] * scale
        jend = min(S, i0 + nr) if causal else S
        for j0 in range(0, jend, BC):
            nc = min(jend, j0 + BC) - j0
            for c in range(nc):
                kj = k[b, hk, j0 + c]
                for r in range(nr):
                    a = np.float32(0.0)
                    for e in range(D):
                        a += qt[r, e] * kj[e]
                    st[r, c] = a
            for r in range(nr):
                cend = nc
                if causal:
                    cend = min(nc, i0 + r + 1 - j0)
                if cend <= 0:
                    continue
                mx = m[r]
                for c in range(cend):
                    if st[r, c] > mx:
                        mx = st[r, c]
                if mx == -np.inf:
                    continue
                alpha = math.exp(m[r] - mx)
                m[r] = mx
                psum = 0.0
                for e in range(Dv):
                    acc[r, e] *= alpha
                for c in range(cend):
                    p = math.exp(st[r, c] - mx)
                    psum += p
                    vj = v[b, hk, j0 + c]
                    for e in range(Dv):
                        acc[r, e] += p * vj[e]
                den[r] = den[r] * alpha + psum
        for r in range(nr):
            if den[r] == 0.0:
                for e in range(Dv):
                    out[b, h, i0 + r, e] = 0
                lse[b, h, i0 + r] = -np.inf
            else:
                inv = 1.0 / den[r]
                for e in range(Dv):
                    out[b, h, i0 + r, e] = acc[r, e] * inv
                lse[b, h, i0 + r] = m[r] + math.log(den[r])


@eager_neuron.kernel(
    "neuronlib::flash_attn_bwd",
    outputs=lambda go, q, k, v, out, lse, scale, causal: [q, k, v],
    flops=lambda go, q, k, v, out, lse, scale, causal: 2.5 * _flops(q, k, v, scale, causal),
    engine="tensor", fastmath={"reassoc", "contract"})
def flash_attn_bwd(go, q, k, v, out, lse, scale: float, causal: bool, dq, dk, dv):
    B, H, L, D = q.shape
    Hk, S, Dv = k.shape[1], k.shape[2], v.shape[3]
    G = H // Hk
    for task in prange(B * Hk):
        b = task // Hk
        hk = task - b * Hk
        dkt = np.zeros((BC, D))
        dvt = np.zeros((BC, Dv))
        p = np.empty(BC)
        ds = np.empty(BC)
        dqr = np.empty(D)
        delta = np.empty(L)
        for j0 in range(0, S, BC):
            nc = min(S, j0 + BC) - j0
            dkt[:nc] = 0.0
            dvt[:nc] = 0.0
            for g in range(G):
                h = hk * G + g
                if j0 == 0:
                    for i in range(L):
                        acc = 0.0
                        for e in range(Dv):
                            acc += np.float64(go[b, h, i, e]) * out[b, h, i, e]
                        delta[i] = acc
                        for e in range(D):
                            dq[b, h, i, e] = 0
                istart = j0 if causal else 0
                for i in range(istart, L):
                    li = lse[b, h, i]
                    if li == -np.inf:
                        continue
                    if j0 > 0:
                        acc = 0.0
                        for e in range(Dv):
                            acc += np.float64(go[b, h, i, e]) * out[b, h, i, e]
                        delta[i] = acc
                    cend = nc
                    if causal:
                        cend = min(nc, i + 1 - j0)
                    qi = q[b, h, i]
                    goi = go[b, h, i]
                    for c in range(cend):
                        kj = k[b, hk, j0 + c]
                        a = np.float32(0.0)
                        for e in range(D):
                            a += qi[e] * kj[e]
                        p[c] = math.exp(a * scale - li)
                        vj = v[b, hk, j0 + c]
                        dp = 0.0
                        for e in range(Dv):
                            dp += np.float64(goi[e]) * vj[e]
                        ds[c] = p[c] * (dp - delta[i]) * scale
                    for c in range(cend):
                        pc = p[c]
                        for e in range(Dv):
                            dvt[c, e] += pc * goi[e]
                        dc = ds[c]
                        for e in range(D):
                            dkt[c, e] += dc * qi[e]
                    for e in range(D):
                        dqr[e] = 0.0
                    for c in range(cend):
                        dc = ds[c]
                        kj = k[b, hk, j0 + c]
                        for e in range(D):
                            dqr[e] += dc * kj[e]
                    for e in range(D):
                        dq[b, h, i, e] += dqr[e]
            for c in range(nc):
                for e in range(D):
                    dk[b, hk, j0 + c, e] = dkt[c, e]
                for e in range(Dv):
                    dv[b, hk, j0 + c, e] = dvt[c, e]
        if S == 0:
            for g in range(G):
                for i in range(L):
                    for e in range(D):
                        dq[b, hk * G + g, i, e] = 0


def _setup(ctx, inputs, output):
    q, k, v, scale, causal = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.scale, ctx.causal = scale, causal


def _backward(ctx, gout, _glse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = flash_attn_bwd(gout, q, k, v, out, lse, ctx.scale, ctx.causal)
    return dq, dk, dv, None, None


flash_attn_fwd.register_autograd(_backward, setup_context=_setup)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    scale: float | None = None) -> torch.Tensor:
    """softmax(q k^T * scale [+ causal mask]) v without the (L, S) matrix.

    Same arguments and result as `F.scaled_dot_product_attention(q, k, v, is_causal=causal,
    scale=scale, enable_gqa=True)` for 4-d inputs.

    >>> import torch
    >>> q = torch.zeros(1, 1, 2, 2)
    >>> flash_attention(q, q, torch.eye(2).view(1, 1, 2, 2)).tolist()
    [[[[0.5, 0.5], [0.5, 0.5]]]]
    """
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"flash_attention: q, k, v must be 4-d (B, H, L, D); got "
                         f"{q.dim()}, {k.dim()}, {v.dim()} dims")
    if q.shape[1] % k.shape[1] or k.shape[:3] != v.shape[:3] or q.shape[3] != k.shape[3]:
        raise ValueError(f"flash_attention: shapes q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)} do not fit (B, H, L, D), (B, Hk, S, D), "
                         "(B, Hk, S, Dv) with H a multiple of Hk")
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    out, _ = flash_attn_fwd(q, k, v, float(scale), bool(causal))
    return out
