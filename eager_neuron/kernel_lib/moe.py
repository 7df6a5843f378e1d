"""Top-k mixture-of-experts: router, expert dispatch and combine as kernels; experts as matmuls.

1. `topk_router(logits (T, E), k)`: softmax over experts, the k most probable (ties: lowest
   expert index first), weights renormalised to sum to 1 -> weights (T, k) float32, idx (T, k).
2. `moe_dispatch(x (T, D), idx, n_experts)`: a counting sort of the T*k (token, slot) pairs by
   expert -> xs (T*k, D) the gathered token rows grouped by expert, src (T*k,) which pair each
   row came from (t*k + slot, stable within an expert), offsets (E+1,) each expert's row range.
   An expert index outside [0, n_experts) raises ValueError (checked in the kernel).
3. the experts: any function of their row block (here `act(xs[a:b] @ w1[e]) @ w2[e]`), the
   row ranges read once from `offsets` on the host.
4. `moe_combine(ys (T*k, Dout), src, weights)`: out[t] = sum_slot weights[t, slot] * ys[row].

Forward only (inference / routing experiments): no autograd is registered.

>>> import torch
>>> from eager_neuron.kernel_lib.moe import topk_router
>>> w, i = topk_router(torch.tensor([[0.0, 5.0, 1.0]], device="neuron"), 1)
>>> i.tolist(), w.tolist()
([[1]], [[1.0]])
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numba import prange

import eager_neuron


@eager_neuron.kernel(
    "neuronlib::topk_router",
    outputs=lambda logits, k: [((logits.shape[0], k), torch.float32),
                               ((logits.shape[0], k), torch.int64)],
    flops=lambda logits, k: (3 + k) * logits.numel())
def topk_router(logits, k: int, weights, idx):
    T, E = logits.shape
    if k > E or k < 1:
        raise ValueError("topk_router: k must be between 1 and the number of experts")
    for t in prange(T):
        mx = -np.inf
        for e in range(E):
            if logits[t, e] > mx:
                mx = logits[t, e]
        p = np.empty(E)
        s = 0.0
        for e in range(E):
            p[e] = math.exp(logits[t, e] - mx)
            s += p[e]
        taken = np.zeros(E, np.bool_)
        tot = 0.0
        for r in range(k):
            best = -1
            for e in range(E):
                if not taken[e] and (best < 0 or p[e] > p[best]):
                    best = e
            taken[best] = True
            idx[t, r] = best
            tot += p[best]
        for r in range(k):
            weights[t, r] = p[idx[t, r]] / tot


@eager_neuron.kernel(
    "neuronlib::moe_dispatch",
    outputs=lambda x, idx, n_experts: [((idx.numel(), x.shape[1]), x.dtype),
                                       ((idx.numel(),), torch.int64),
                                       ((n_experts + 1,), torch.int64)])
def moe_dispatch(x, idx, n_experts: int, xs, src, offsets):
    T, K = idx.shape
    D = x.shape[1]
    counts = np.zeros(n_experts, np.int64)
    for t in range(T):
        for r in range(K):
            e = idx[t, r]
            if e < 0 or e >= n_experts:
                raise ValueError("moe_dispatch: an expert index is outside [0, n_experts)")
            counts[e] += 1
    offsets[0] = 0
    for e in range(n_experts):
        offsets[e + 1] = offsets[e] + counts[e]
    pos = offsets[:n_experts].copy()
    for t in range(T):
        for r in range(K):
            e = idx[t, r]
            src[pos[e]] = t * K + r
            pos[e] += 1
    for row in prange(T * K):
        t = src[row] // K
        for d in range(D):
            xs[row, d] = x[t, d]


@eager_neuron.kernel(
    "neuronlib::moe_combine",
    outputs=lambda ys, src, weights: ((weights.shape[0], ys.shape[1]), ys.dtype),
    flops=lambda ys, src, weights: 2 * ys.numel())
def moe_combine(ys, src, weights, out):
    T, K = weights.shape
    D = ys.shape[1]
    row_of = np.empty(T * K, np.int64)
    for row in range(T * K):
        row_of[src[row]] = row
    for t in prange(T):
        acc = np.zeros(D)
        for r in range(K):
            w = np.float64(weights[t, r])
            row = row_of[t * K + r]
            for d in range(D):
                acc[d] += w * ys[row, d]
        for d in range(D):
            out[t, d] = acc[d]


def moe_forward(x: torch.Tensor, router_logits: torch.Tensor, w1: torch.Tensor,
                w2: torch.Tensor, k: int, act=torch.nn.functional.silu) -> torch.Tensor:
    """sum over the k routed experts e of weight * act(x @ w1[e]) @ w2[e], per token.

    x (T, D), router_logits (T, E), w1 (E, D, F), w2 (E, F, D).

    >>> import torch
    >>> x = torch.ones(2, 3); w1 = torch.ones(4, 3, 5); w2 = torch.ones(4, 5, 3)
    >>> moe_forward(x, torch.zeros(2, 4), w1, w2, 2, act=lambda h: h).tolist()
    [[15.0, 15.0, 15.0], [15.0, 15.0, 15.0]]
    """
    n_experts = w1.shape[0]
    weights, idx = topk_router(router_logits, int(k))
    xs, src, offsets = moe_dispatch(x, idx, n_experts)
    bounds = offsets.tolist()      # one host read: each expert's row range
    ys = torch.empty((xs.shape[0], w2.shape[2]), dtype=x.dtype, device=x.device)
    for e in range(n_experts):
        a, b = bounds[e], bounds[e + 1]
        if b > a:
            ys[a:b] = act(xs[a:b] @ w1[e]) @ w2[e]
    return moe_combine(ys, src, weights)
