"""Bicubic grid_sampler_2d on neuron (was the CPU fallback in backward, a decomposition forward):
forward, grad_input and grad_grid against a float64 reference written here from the bicubic
convolution (A = -0.75), every padding mode and align_corners, in float32, float64, bfloat16 and
float16 (kernels/grid_sample_cubic.py). Bounds derive from the dtype's unit roundoff: a constant
times the sum of the magnitudes of the terms, plus the terms' derivative times the error of the
rounded source coordinate."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import eager_neuron  # noqa: F401 - registers the device

A = -0.75


def _conv(d, k):
    """The k-th derivative of the cubic convolution kernel at distance d >= 0 (k = 0, 1, 2)."""
    near = [lambda x: (A + 2) * x ** 3 - (A + 3) * x ** 2 + 1,
            lambda x: 3 * (A + 2) * x ** 2 - 2 * (A + 3) * x,
            lambda x: 6 * (A + 2) * x - 2 * (A + 3)][k]
    far = [lambda x: A * x ** 3 - 5 * A * x ** 2 + 8 * A * x - 4 * A,
           lambda x: 3 * A * x ** 2 - 10 * A * x + 8 * A,
           lambda x: 6 * A * x - 10 * A][k]
    return np.where(d <= 1, near(d), far(d))


def _coeffs(t, k):
    """d^k/dt^k of the 4 tap weights at fraction t: taps at distances t+1, t, 1-t, 2-t."""
    sign = [1, 1, (-1) ** k, (-1) ** k]
    return np.stack([s * _conv(d, k) for s, d in zip(sign, (t + 1, t, 1 - t, 2 - t))], -1)


def _tap(x, size, padding, align):
    """compute_coordinates then truncation, in float64; -1 outside (zeros padding)."""
    if padding == 1:
        x = np.clip(x, 0, size - 1)
    elif padding == 2:
        lo, hi = (0.0, size - 1.0) if align else (-0.5, size - 0.5)
        span = hi - lo
        if span == 0:
            x = np.zeros_like(x)
        else:
            d = np.abs(x - lo)
            extra, flips = np.fmod(d, span), np.floor(d / span)
            x = np.where(flips % 2 == 0, extra + lo, span - extra + lo)
        x = np.clip(x, 0, size - 1)
    ok = (x > -1) & (x < size)
    return np.where(ok, np.trunc(np.where(ok, x, 0)), -1).astype(np.int64)


def _reference(inp, grid, go, padding, align):
    """float64 (out, grad_input, grad_grid) and the magnitudes that bound their errors."""
    N, C, H, W = inp.shape
    gi, m_gi, cnt = np.zeros_like(inp), np.zeros_like(inp), np.zeros_like(inp)
    out, m_out = np.zeros(go.shape), np.zeros(go.shape)
    gg, m_gg = np.zeros(grid.shape), np.zeros(grid.shape)
    for n, h, w in itertools.product(range(N), range(grid.shape[1]), range(grid.shape[2])):
        pos, c0, c1, c2, taps, mult = [], [], [], [], [], []
        for a, size in ((0, W), (1, H)):
            g = grid[n, h, w, a]
            x = (g + 1) / 2 * (size - 1) if align else ((g + 1) * size - 1) / 2
            mult.append((size - 1) / 2 if align else size / 2)
            f = np.floor(x)
            pos.append(abs(x) + 2)
            c0.append(_coeffs(x - f, 0))
            c1.append(_coeffs(x - f, 1))
            c2.append(_coeffs(x - f, 2))
            taps.append(_tap(f + np.arange(-1, 3), size, padding, align))
        v = np.zeros((C, 4, 4))   # v[c, j (y), i (x)]
        for i, j in itertools.product(range(4), range(4)):
            if taps[0][i] >= 0 and taps[1][j] >= 0:
                v[:, j, i] = inp[n, :, taps[1][j], taps[0][i]]
        wxy = np.outer(c0[1], c0[0])                      # [j, i]
        out[n, :, h, w] = (v * wxy).sum((1, 2))
        dx = np.outer(c0[1], c1[0])
        dy = np.outer(c1[1], c0[0])
        # a weight polynomial evaluated in the dtype is off by a few roundings of its terms
        # (magnitude ~1 even where the weight is ~0): |c| + 1 stands for a weight's magnitude
        wmag = np.outer(np.abs(c0[1]) + 1, np.abs(c0[0]) + 1)
        m_out[n, :, h, w] = (np.abs(v) * (wmag + pos[0] * np.abs(dx)
                                          + pos[1] * np.abs(dy))).sum((1, 2))
        g = go[n, :, h, w]
        for i, j in itertools.product(range(4), range(4)):
            if taps[0][i] >= 0 and taps[1][j] >= 0:
                gi[n, :, taps[1][j], taps[0][i]] += g * wxy[j, i]
                cnt[n, :, taps[1][j], taps[0][i]] += 1
                m_gi[n, :, taps[1][j], taps[0][i]] += np.abs(g) * (
                    wmag[j, i] + pos[0] * abs(dx[j, i]) + pos[1] * abs(dy[j, i]))
        vg = v * g[:, None, None]
        gg[n, h, w, 0] = (vg * dx).sum() * mult[0]
        gg[n, h, w, 1] = (vg * dy).sum() * mult[1]
        d2 = (np.abs(np.outer(c0[1], c2[0])) * pos[0] + np.abs(np.outer(c1[1], c1[0])) * pos[1],
              np.abs(np.outer(c2[1], c0[0])) * pos[1] + np.abs(np.outer(c1[1], c1[0])) * pos[0])
        dmag = (np.outer(np.abs(c0[1]) + 1, np.abs(c1[0]) + 1),
                np.outer(np.abs(c1[1]) + 1, np.abs(c0[0]) + 1))
        m_gg[n, h, w, 0] = (np.abs(vg) * (dmag[0] + d2[0])).sum() * mult[0]
        m_gg[n, h, w, 1] = (np.abs(vg) * (dmag[1] + d2[1])).sum() * mult[1]
    # a sum of k rounded terms is off by up to k roundings of its magnitude: gi sums every tap
    # that lands on a pixel (border padding sends many there), gg sums 16 taps per channel
    return (out, gi, gg), (m_out, m_gi * (1 + cnt / 16), m_gg * C)


# C: how many unit roundoffs of the magnitudes the result may be off (each value passes
# through ~10 rounded steps of the coefficient polynomials and 16-term sums)
DTYPES = {torch.float32: 32, torch.float64: 32, torch.bfloat16: 48, torch.float16: 48}


@pytest.mark.parametrize("dt", list(DTYPES))
def test_bicubic_grid_sample_against_float64(dt):
    g = torch.Generator().manual_seed(3)
    u = torch.finfo(dt).eps / 2
    before = eager_neuron.stats()["fallbacks"]
    for padding, align in itertools.product((0, 1, 2), (False, True)):
        inp = (torch.rand(2, 2, 4, 5, generator=g) * 4 - 2).to(dt)
        grid = (torch.rand(2, 3, 4, 2, generator=g) * 4 - 2).to(dt)
        go = torch.randn(2, 2, 3, 4, generator=g).to(dt)
        xn = inp.to("neuron").requires_grad_()
        gn = grid.to("neuron").requires_grad_()
        out = torch.grid_sampler_2d(xn, gn, 2, padding, align)
        gi, gg = torch.autograd.grad(out, (xn, gn), go.to("neuron"))
        refs, mags = _reference(inp.double().numpy(), grid.double().numpy(),
                                go.double().numpy(), padding, align)
        for name, ours, ref, mag in zip(("out", "grad_input", "grad_grid"), (out, gi, gg),
                                        refs, mags):
            assert ours.dtype == dt
            err = np.abs(ours.detach().cpu().double().numpy() - ref)
            bound = DTYPES[dt] * u * mag + torch.finfo(dt).tiny
            assert (err <= bound).all(), (name, padding, align, float((err / bound).max()))
    assert eager_neuron.stats()["fallbacks"] == before
