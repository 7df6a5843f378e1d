"""grid_sample on bfloat16/float16: the device rounds every step to the half type, the way the
CPU's half kernels do (kernels/grid_sample.py `rnd`), and stays within a float64 reference's
dtype-derived bound, forward and backward, 2-d and 3-d, every padding mode.

The exact check is against a Python emulation of the documented rounding points (each
operation computed in float32 and rounded to nearest even in the half type), not against
torch's CPU kernels.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

import eager_neuron  # noqa: F401 - registers the device

F = torch.nn.functional
EPS = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}
PADS = ("zeros", "border", "reflection")


def _case(dt, dim, seed=0):
    g = torch.Generator().manual_seed(seed)
    shp = (2, 3, 5, 7) if dim == 2 else (2, 2, 4, 5, 6)
    gshp = (2, 4, 6, 2) if dim == 2 else (2, 3, 4, 5, 3)
    inp = torch.randn(shp, generator=g).to(dt)
    grid = (torch.rand(gshp, generator=g) * 2.4 - 1.2).to(dt)   # some points outside
    go = torch.randn(shp[:2] + gshp[1:-1], generator=g).to(dt)
    return inp, grid, go


def _run(inp, grid, go, device, **kw):
    i = inp.to(device).requires_grad_()
    g = grid.to(device).requires_grad_()
    out = F.grid_sample(i, g, **kw)
    gi, gg = torch.autograd.grad(out, (i, g), go.to(device).to(out.dtype))
    return out.cpu(), gi.cpu(), gg.cpu()


def _bound(ref, inp, grid, dt, size):
    # coordinates carry ~4 roundings of a value up to `size` (weights then err by ~4 eps size),
    # each of <= 8 corner terms and sums one more: generous constant, still far below the
    # error of a wrong formula or of rounding in the wrong type
    scale = inp.double().abs().max() * (1 + grid.double().abs().max())
    return 16 * EPS[dt] * (size + 1) * scale + 4 * EPS[dt] * ref.abs()


@pytest.mark.parametrize("dt,dim", list(itertools.product(EPS, (2, 3))))
def test_half_grid_sample_within_float64_bound(dt, dim):
    inp, grid, go = _case(dt, dim)
    size = max(inp.shape[2:])
    for pad, align, mode in itertools.product(PADS, (False, True), ("bilinear", "nearest")):
        kw = dict(mode=mode, padding_mode=pad, align_corners=align)
        out, gi, gg = _run(inp, grid, go, "neuron", **kw)
        assert out.dtype == dt and gi.dtype == dt and gg.dtype == dt
        r_out, r_gi, r_gg = _run(inp.double(), grid.double(), go.double(), "cpu", **kw)
        for name, ours, ref in (("out", out, r_out), ("grad_input", gi, r_gi)):
            err = (ours.double() - ref).abs()
            bound = _bound(ref, inp, grid, dt, size)
            assert (err <= bound).all(), (name, kw, err.max().item())
        if mode == "bilinear":
            # grad_grid is a difference of neighbours: bound it by the values it combines
            err = (gg.double() - r_gg).abs()
            bound = 64 * EPS[dt] * (size + 1) * inp.double().abs().max() * \
                go.double().abs().max() * inp.shape[1] * size
            assert (err <= bound).all(), ("grad_grid", kw, err.max().item())
        else:
            assert (gg == 0).all()


def _r(x: float, dt) -> float:
    return float(torch.tensor(x, dtype=torch.float32).to(dt))


def _emulate_2d(inp, grid, dt, align):
    """Bilinear, zeros padding, every operation rounded to dt (the CPU's scalar_t = Half)."""
    n_, c_, h_, w_ = inp.shape
    out = torch.zeros(n_, c_, grid.shape[1], grid.shape[2], dtype=torch.float32)
    v = inp.float()
    for n, i, j in itertools.product(range(n_), range(grid.shape[1]), range(grid.shape[2])):
        src = []
        for a, size in ((0, w_), (1, h_)):
            c = float(grid[n, i, j, a])
            if align:
                src.append(_r(_r(_r(c + 1, dt) / 2, dt) * (size - 1), dt))
            else:
                src.append(_r(_r(_r(_r(c + 1, dt) * size, dt) - 1, dt) / 2, dt))
        x, y = src
        x0, y0 = math.floor(x), math.floor(y)
        fx = (_r(x0 + 1 - x, dt), _r(x - x0, dt))
        fy = (_r(y0 + 1 - y, dt), _r(y - y0, dt))
        for c in range(c_):
            acc = 0.0
            for cy, cx in ((0, 0), (0, 1), (1, 0), (1, 1)):
                yy, xx = y0 + cy, x0 + cx
                if 0 <= yy < h_ and 0 <= xx < w_:
                    wt = _r(fx[cx] * fy[cy], dt)
                    acc = _r(acc + _r(float(v[n, c, yy, xx]) * wt, dt), dt)
            out[n, c, i, j] = acc
    return out.to(dt)


@pytest.mark.parametrize("dt", list(EPS))
def test_half_grid_sample_rounds_each_step(dt):
    inp, grid, _ = _case(dt, 2, seed=1)
    for align in (False, True):
        ours = F.grid_sample(inp.to("neuron"), grid.to("neuron"), align_corners=align).cpu()
        assert torch.equal(ours, _emulate_2d(inp, grid, dt, align)), align
