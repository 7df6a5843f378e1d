"""Orthogonal-polynomial recurrences in float32 round where the CPU's kernels round: each step's
multiply-subtract once (a fused multiply-add; ATen's kernels are compiled with FMA contraction
on AVX2/AVX-512), checked bit for bit against an exact model of those rounding points (Python
Fractions, rounded once per step), not against torch's CPU kernel.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch

import eager_neuron  # noqa: F401 -- registers the device

f32 = np.float32


def _round32(v: Fraction) -> float:
    """v rounded once to float32 (nearest, ties to the even significand)."""
    c = f32(float(v))
    best = None
    for cand in (np.nextafter(c, f32(-np.inf)), c, np.nextafter(c, f32(np.inf))):
        key = (abs(Fraction(float(cand)) - v), int(cand.view(np.int32)) & 1)
        if best is None or key < best[0]:
            best = (key, cand)
    return float(best[1])


def _fms(a: float, b: float, c: float) -> float:
    """a * b - c rounded once to float32."""
    return _round32(Fraction(a) * Fraction(b) - Fraction(c))


def _hermite(x: float, n: int, phys: bool) -> float:
    x = float(f32(x))
    a = float(f32(x) + f32(x)) if phys else x
    p, q = 1.0, a
    for k in (range(2, 2 * n, 2) if phys else range(1, n)):
        p, q = q, _fms(a, q, float(f32(k) * f32(p)))
    return q


def _chebyshev_t(x: float, n: int) -> float:
    y = float(f32(x))
    p, q = 1.0, y
    for _ in range(2, n + 1):
        p, q = q, _fms(float(f32(y) + f32(y)), q, p)
    return q


CASES = {
    "hermite_polynomial_he": (torch.special.hermite_polynomial_he,
                              lambda x, n: _hermite(x, n, False), 3.0),
    "hermite_polynomial_h": (torch.special.hermite_polynomial_h,
                             lambda x, n: _hermite(x, n, True), 3.0),
    # |x| < 1 with n <= 6 stays on the recurrence (ATen's trigonometric form starts above)
    "chebyshev_polynomial_t": (torch.special.chebyshev_polynomial_t, _chebyshev_t, 0.99),
}


@pytest.mark.parametrize("name", list(CASES))
def test_recurrence_rounds_once_per_step(name):
    fn, model, scale = CASES[name]
    torch.manual_seed(1)
    n_max = 6 if name.startswith("chebyshev") else 11
    x = (torch.rand(300) * 2 - 1) * scale if scale < 1 else torch.randn(300) * scale
    n = torch.randint(2, n_max + 1, (300,)).float()
    got = fn(x.to("neuron"), n.to("neuron")).cpu()
    want = torch.tensor([model(a, int(k)) for a, k in zip(x.tolist(), n.tolist())],
                        dtype=torch.float32)
    assert torch.equal(got, want)
