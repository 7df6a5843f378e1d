"""adaptive_avg_pool3d on float16/bfloat16: the CPU's 3-d kernel sums each window in the half type
and divides by each window extent in turn (forward), and divides grad_output the same way and
adds it in the half type (backward). References: those steps in float16/bfloat16 arithmetic
written here (numpy float16 / torch bfloat16 scalars, each operation correctly rounded), and the
float64 result within the bound the roundings allow (kernels/pool.py render_pool)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import eager_neuron  # noqa: F401 - registers the device


def _windows(isz, osz):
    return [((o * isz) // osz, -(-((o + 1) * isz) // osz)) for o in range(osz)]


def _rounder(dt):
    if dt == torch.float16:
        return lambda v: float(np.float16(v))
    return lambda v: float(torch.tensor(v, dtype=torch.float64).to(dt))


@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16])
def test_adaptive_avg_pool3d_half_steps(dt):
    r = _rounder(dt)
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(2, 5, 6, 4, generator=g) * 3).to(dt)   # (C, D, H, W), unbatched
    osz = (3, 4, 3)
    xn = x.to("neuron").requires_grad_()
    out = torch.nn.functional.adaptive_avg_pool3d(xn, osz)
    go = torch.randn(out.shape, generator=g).to(dt)
    (gi,) = torch.autograd.grad(out, xn, go.to("neuron"))
    out, gi = out.detach().cpu(), gi.cpu()
    xs, gos = x.double().tolist(), go.double().tolist()
    ref_gi = np.zeros(x.shape)
    u = torch.finfo(dt).eps / 2
    wins = [_windows(x.shape[1 + a], osz[a]) for a in range(3)]
    for c, (oz, oh, ow) in itertools.product(range(2), itertools.product(*map(range, osz))):
        (z0, z1), (h0, h1), (w0, w1) = wins[0][oz], wins[1][oh], wins[2][ow]
        s, exact, mag = 0.0, 0.0, 0.0
        for iz, ih, iw in itertools.product(range(z0, z1), range(h0, h1), range(w0, w1)):
            v = xs[c][iz][ih][iw]
            s, exact, mag = r(s + v), exact + v, mag + abs(v)
        n = (z1 - z0) * (h1 - h0) * (w1 - w0)
        want = r(r(r(s / (z1 - z0)) / (h1 - h0)) / (w1 - w0))
        assert out[c, oz, oh, ow].item() == want
        assert abs(want - exact / n) <= (n + 3) * u * mag / n
        d = r(r(r(gos[c][oz][oh][ow] / (z1 - z0)) / (h1 - h0)) / (w1 - w0))
        for iz, ih, iw in itertools.product(range(z0, z1), range(h0, h1), range(w0, w1)):
            ref_gi[c, iz, ih, iw] = r(ref_gi[c, iz, ih, iw] + d)
    np.testing.assert_array_equal(gi.double().numpy(), ref_gi)


@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("include_pad", [True, False])
def test_avg_pool2d_backward_half_steps(dt, include_pad):
    # the CPU's half kernel: delta = grad_output / divisor, then each gi += delta, in the half
    # type, outputs in row-major order
    r = _rounder(dt)
    g = torch.Generator().manual_seed(6)
    x = torch.randn(2, 7, 6, generator=g).to(dt)
    k, st, p = 3, 2, 1
    xn = x.to("neuron").requires_grad_()
    out = torch.nn.functional.avg_pool2d(xn, k, st, p, count_include_pad=include_pad)
    go = torch.randn(out.shape, generator=g).to(dt)
    (gi,) = torch.autograd.grad(out, xn, go.to("neuron"))
    H, W = x.shape[1:]
    ref = np.zeros(x.shape)
    exact = np.zeros(x.shape)
    gos = go.double().tolist()
    for c, oh, ow in itertools.product(range(2), range(out.shape[1]), range(out.shape[2])):
        h0, w0 = oh * st - p, ow * st - p
        h1, w1 = min(h0 + k, H + p), min(w0 + k, W + p)
        size = (h1 - h0) * (w1 - w0)
        h0, w0, h1, w1 = max(h0, 0), max(w0, 0), min(h1, H), min(w1, W)
        d = size if include_pad else (h1 - h0) * (w1 - w0)
        delta = r(gos[c][oh][ow] / d)
        for ih, iw in itertools.product(range(h0, h1), range(w0, w1)):
            ref[c, ih, iw] = r(ref[c, ih, iw] + delta)
            exact[c, ih, iw] += gos[c][oh][ow] / d
    np.testing.assert_array_equal(gi.cpu().double().numpy(), ref)
    u = torch.finfo(dt).eps / 2   # and within a few roundings of the exact sums
    assert (np.abs(ref - exact) <= 8 * u * np.abs(go.double().numpy()).max()).all()


@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16])
def test_replication_pad_backward_half_steps(dt):
    # every grad_output element adds into its clamped source in the half type, in row-major
    # order (negative pads crop)
    r = _rounder(dt)
    g = torch.Generator().manual_seed(8)
    x = torch.randn(2, 4, 5, generator=g).to(dt)
    pads = (3, -1, 2, 4)   # left, right, top, bottom
    xn = x.to("neuron").requires_grad_()
    out = torch.nn.functional.pad(xn, pads, mode="replicate")
    go = torch.randn(out.shape, generator=g).to(dt)
    (gi,) = torch.autograd.grad(out, xn, go.to("neuron"))
    ref, exact = np.zeros(x.shape), np.zeros(x.shape)
    gos = go.double().tolist()
    H, W = x.shape[1:]
    for c, oh, ow in itertools.product(range(2), range(out.shape[1]), range(out.shape[2])):
        ih, iw = min(max(oh - pads[2], 0), H - 1), min(max(ow - pads[0], 0), W - 1)
        ref[c, ih, iw] = r(ref[c, ih, iw] + gos[c][oh][ow])
        exact[c, ih, iw] += gos[c][oh][ow]
    np.testing.assert_array_equal(gi.cpu().double().numpy(), ref)
    n = out.shape[1] * out.shape[2]
    u = torch.finfo(dt).eps / 2
    assert (np.abs(ref - exact) <= n * u * np.abs(go.double().numpy()).sum()).all()


@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16])
def test_max_pool2d_backward_half_steps(dt):
    # overlapping windows send several grad_output elements to one argmax: the CPU adds them
    # in the half type, outputs in row-major order
    r = _rounder(dt)
    g = torch.Generator().manual_seed(9)
    x = torch.randn(2, 7, 8, generator=g).to(dt)
    xn = x.to("neuron").requires_grad_()
    out, ind = torch.nn.functional.max_pool2d(xn, 3, 1, 1, return_indices=True)
    go = (torch.randn(out.shape, generator=g) * 7).to(dt)
    (gi,) = torch.autograd.grad(out, xn, go.to("neuron"))
    W = x.shape[2]
    ref, exact = np.zeros(x.shape), np.zeros(x.shape)
    gos, inds = go.double().tolist(), ind.cpu().tolist()
    for c, oh, ow in itertools.product(range(2), range(out.shape[1]), range(out.shape[2])):
        k = inds[c][oh][ow]
        ref[c, k // W, k % W] = r(ref[c, k // W, k % W] + gos[c][oh][ow])
        exact[c, k // W, k % W] += gos[c][oh][ow]
    np.testing.assert_array_equal(gi.cpu().double().numpy(), ref)
    u = torch.finfo(dt).eps / 2
    assert (np.abs(ref - exact) <= 9 * u * 9 * np.abs(go.double().numpy()).max()).all()
