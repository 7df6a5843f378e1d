"""Rotary position embedding (the half-split "rotate_half" form used by Llama/GPT-NeoX).

For x (..., S, D) and cos/sin (S, D/2): with x1 = x[..., :D/2], x2 = x[..., D/2:],
    out = cat(x1 cos - x2 sin, x2 cos + x1 sin)
which equals `x * cat(cos, cos) + rotate_half(x) * cat(sin, sin)`. The backward is the inverse
rotation, the same kernel with sin negated (`sign` is a runtime scalar: no second compile).
cos and sin are constants (no gradient), as in every model that precomputes them.

>>> import torch
>>> from eager_neuron.kernel_lib.rotary import apply_rotary
>>> x = torch.randn(1, 2, 3, 4, device="neuron")
>>> c, s = torch.ones(3, 2, device="neuron"), torch.zeros(3, 2, device="neuron")
>>> torch.equal(apply_rotary(x, c, s).cpu(), x.cpu())
True
"""

from __future__ import annotations

import torch
from numba import prange

import eager_neuron


@eager_neuron.kernel(
    "neuronlib::rotary",
    outputs=lambda x, cos, sin, sign: x,
    flops=lambda x, cos, sin, sign: 3 * x.numel())
def rotary(x, cos, sin, sign: float, out):
    B, H, S, D = x.shape
    h = D // 2
    for bh in prange(B * H):
        b = bh // H
        hh = bh - b * H
        for s in range(S):
            for j in range(h):
                c = cos[s, j]
                sn = sign * sin[s, j]
                x1 = x[b, hh, s, j]
                x2 = x[b, hh, s, j + h]
                out[b, hh, s, j] = x1 * c - x2 * sn
                out[b, hh, s, j + h] = x2 * c + x1 * sn


def _setup(ctx, inputs, output):
    _x, cos, sin, sign = inputs
    ctx.save_for_backward(cos, sin)
    ctx.sign = sign


def _backward(ctx, g):
    cos, sin = ctx.saved_tensors
    return rotary(g, cos, sin, -ctx.sign), None, None, None


rotary.register_autograd(_backward, setup_context=_setup)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (B, H, S, D) or (B, S, D) by angles whose cos/sin are (S, D/2).

    >>> import torch
    >>> apply_rotary(torch.ones(1, 1, 2), torch.zeros(1, 1), torch.ones(1, 1)).tolist()
    [[[-1.0, 1.0]]]
    """
    if x.shape[-1] % 2 or cos.shape != (x.shape[-2], x.shape[-1] // 2) or sin.shape != cos.shape:
        raise ValueError(
            f"apply_rotary: x {tuple(x.shape)} needs an even last dim D and cos/sin of shape "
            f"(S, D/2) = {(x.shape[-2], x.shape[-1] // 2)}; got cos {tuple(cos.shape)}, "
            f"sin {tuple(sin.shape)}")
    if x.dim() == 3:
        return rotary(x.unsqueeze(1), cos, sin, 1.0).squeeze(1)
    return rotary(x, cos, sin, 1.0)
