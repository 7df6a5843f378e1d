"""grid_sampler_2d bicubic kernels, forward and backward (interpolation mode 2).

PyTorch's bicubic sampling (GridSampler.cpp / GridSamplerKernel.cpp): the grid coordinate is
unnormalized without padding (bicubic reads 4x4 taps around floor(x), and each tap's coordinate
goes through the padding mode on its own: zeros reads 0 outside, border clips, reflection
reflects then clips), weighted by the cubic convolution coefficients (A = -0.75), rows first
(x), then the column (y). The backward adds gOut * cx[i] * cy[j] into each tap of grad_input
and sums -val * gOut * dcx[i] * cy[j] (and the y twin) over channels and taps into the grid
gradient, times the unnormalize factor. It follows the CPU's vectorised order: per chunk of 16
grid points, per channel, per tap, per point (which fixes the order of the half-type sums where
two points share a tap).

Half types (`rnd` "bf16"/"f16"): float32 arrays holding half values, every operation rounded to
the half type where the CPU's c10::Half / c10::BFloat16 arithmetic rounds (kernels/grid_sample.py
`_r`).

>>> src, name = render_grid_cubic(False, "np.float32", False)
>>> "def _cubic_coeffs(" in src and name in src
True
"""

from __future__ import annotations

from .elementwise import kernel_name
from .grid_sample import _HELPERS, _ROUND, HEADER

CHUNK = 16   # grid points per vector of the CPU's backward kernel (see _gi2d in grid_sample.py)

_CUBIC = """\
@njit(inline="always")
def _cubic_unnorm(coord, size, align):
    # grid_sampler_unnormalize_set_grad: (position, d position / d coord), no padding
    if align:
        return (_r(_r(_r(coord + {T}(1)) / {T}(2)) * {T}(size - 1)),
                _r({T}(size - 1) / {T}(2)))
    return (_r(_r(_r(_r(coord + {T}(1)) * {T}(size)) - {T}(1)) / {T}(2)),
            _r({T}(size) / {T}(2)))


@njit(inline="always")
def _cubic_coeffs(t, c):
    # get_cubic_upsample_coefficients (A = -0.75; 5A, 8A, 4A, A + 2, A + 3 are exact)
    x = _r(t + {T}(1))
    c[0] = _r(_r(_r(_r(_r(_r({T}(-0.75) * x) - {T}(-3.75)) * x) + {T}(-6)) * x) - {T}(-3))
    c[1] = _r(_r(_r(_r(_r({T}(1.25) * t) - {T}(2.25)) * t) * t) + {T}(1))
    x = _r({T}(1) - t)
    c[2] = _r(_r(_r(_r(_r({T}(1.25) * x) - {T}(2.25)) * x) * x) + {T}(1))
    x = {X3}
    c[3] = _r(_r(_r(_r(_r(_r({T}(-0.75) * x) - {T}(-3.75)) * x) + {T}(-6)) * x) - {T}(-3))


@njit(inline="always")
def _cubic_grads(t, c):
    # get_cubic_coefficients_grad: d coefficient / d t (-3A, 10A, 8A, ... exact)
    x = _r({T}(-1) - t)
    c[0] = _r(_r(_r(_r({T}(2.25) * x) - {T}(-7.5)) * x) - {T}(-6))
    x = -t
    c[1] = _r(_r(_r({T}(-3.75) * x) - {T}(4.5)) * x)
    x = _r({T}(1) - t)
    c[2] = _r(_r(_r({T}(3.75) * x) - {T}(4.5)) * x)
    x = _r({T}(2) - t)
    c[3] = _r(_r(_r(_r({T}(-2.25) * x) - {T}(-7.5)) * x) + {T}(-6))


@njit(inline="always")
def _cubic_tap(x, size, padding, align):
    # compute_coordinates, then the truncated index; -1 outside (zeros padding reads 0)
    if padding == 1:
        x = _clip(x, size)[0]
    elif padding == 2:
        if align:
            x = _reflect(x, 0, 2 * (size - 1))[0]
        else:
            x = _reflect(x, -1, 2 * size - 1)[0]
        x = _clip(x, size)[0]
    if x > -1 and x < size:
        return int(x)
    return -1


@njit(inline="always")
def _cubic_point(grid, n, h, w, sizes, padding, align, cx, cy, tx, ty, mult):
    # the point's coefficients (and their t derivatives' inputs) and its 4 + 4 tap indices
    x, mx = _cubic_unnorm(grid[n, h, w, 0], sizes[0], align)
    y, my = _cubic_unnorm(grid[n, h, w, 1], sizes[1], align)
    mult[0] = mx
    mult[1] = my
    fx = {T}(math.floor(x))
    fy = {T}(math.floor(y))
    _cubic_coeffs(_r(x - fx), cx)
    _cubic_coeffs(_r(y - fy), cy)
    for k in range(4):
        tx[k] = _cubic_tap(_r(fx + {T}(k - 1)), sizes[0], padding, align)
        ty[k] = _cubic_tap(_r(fy + {T}(k - 1)), sizes[1], padding, align)
    return _r(x - fx), _r(y - fy)


"""

_FORWARD = """\
def {name}(out, inp, grid, padding, align):
    sizes = (inp.shape[3], inp.shape[2])
    for n in {rng}(inp.shape[0]):
        cx = np.zeros(4, {T})
        cy = np.zeros(4, {T})
        tx = np.zeros(4, np.int64)
        ty = np.zeros(4, np.int64)
        mult = np.zeros(2, {T})
        for h in range(grid.shape[1]):
            for w in range(grid.shape[2]):
                _cubic_point(grid, n, h, w, sizes, padding, align, cx, cy, tx, ty, mult)
                for c in range(inp.shape[1]):
                    acc = {T}(0)
                    for i in range(4):
                        row = {T}(0)
                        for k in range(4):
                            v = {T}(0)
                            if tx[k] >= 0 and ty[i] >= 0:
                                v = inp[n, c, ty[i], tx[k]]
                            term = _r(v * cx[k])
                            row = term if k == 0 else _r(row + term)
                        term = _r(row * cy[i])
                        acc = term if i == 0 else _r(acc + term)
                    out[n, c, h, w] = acc
"""

# gi (N, C, H, W) and gg (N, Ho, Wo, 2) are written only when their flag is set (a dummy array
# otherwise); the points of one n scatter into the same gi plane, so prange runs over n
_BACKWARD = """\
def {name}(gi, gg, go, inp, grid, padding, align, need_i, need_g):
    sizes = (inp.shape[3], inp.shape[2])
    wo = grid.shape[2]
    npts = grid.shape[1] * wo
    for n in {rng}(inp.shape[0]):
        if need_i:
            for c in range(inp.shape[1]):
                for i in range(inp.shape[2]):
                    for j in range(inp.shape[3]):
                        gi[n, c, i, j] = 0
        cx = np.zeros(({CHUNK}, 4), {T})
        cy = np.zeros(({CHUNK}, 4), {T})
        dx = np.zeros(({CHUNK}, 4), {T})
        dy = np.zeros(({CHUNK}, 4), {T})
        tx = np.zeros(({CHUNK}, 4), np.int64)
        ty = np.zeros(({CHUNK}, 4), np.int64)
        mult = np.zeros(({CHUNK}, 2), {T})
        gsum = np.zeros(({CHUNK}, 2), {T})
        for st in range(0, npts, {CHUNK}):
            en = min(npts, st + {CHUNK})
            for p in range(st, en):
                q = p - st
                fx, fy = _cubic_point(grid, n, p // wo, p % wo, sizes, padding, align, cx[q],
                                      cy[q], tx[q], ty[q], mult[q])
                _cubic_grads(fx, dx[q])
                _cubic_grads(fy, dy[q])
                gsum[q, 0] = 0
                gsum[q, 1] = 0
            for c in range(inp.shape[1]):
                for i in range(4):
                    for j in range(4):
                        for p in range(st, en):
                            q = p - st
                            ix = tx[q, i]
                            iy = ty[q, j]
                            g = go[n, c, p // wo, p % wo]
                            v = {T}(0)
                            if ix >= 0 and iy >= 0:
                                v = inp[n, c, iy, ix]
                                if need_i:
                                    d = _r(_r(g * cx[q, i]) * cy[q, j])
                                    gi[n, c, iy, ix] = _r(gi[n, c, iy, ix] + d)
                            vg = _r(v * g)
                            gsum[q, 0] = _r(gsum[q, 0] - _r(_r(vg * dx[q, i]) * cy[q, j]))
                            gsum[q, 1] = _r(gsum[q, 1] - _r(_r(vg * dy[q, j]) * cx[q, i]))
            if need_g:
                for p in range(st, en):
                    q = p - st
                    gg[n, p // wo, p % wo, 0] = _r(gsum[q, 0] * mult[q, 0])
                    gg[n, p // wo, p % wo, 1] = _r(gsum[q, 1] * mult[q, 1])
"""


def render_grid_cubic(backward: bool, T: str, parallel: bool,
                      rnd: str | None = None) -> tuple[str, str]:
    """Forward `k(out, inp, grid, padding, align)` or backward
    `k(gi, gg, go, inp, grid, padding, align, need_i, need_g)`: inp (N, C, H, W), grid
    (N, Ho, Wo, 2); padding 0 = zeros, 1 = border, 2 = reflection. `rnd` "bf16"/"f16": float32
    arrays holding half values, every step rounded as the CPU's half kernel rounds it."""
    name = kernel_name("grid_cubic", backward, T, parallel, CHUNK) + (f"_{rnd}" if rnd else "")
    # the last coefficient's argument: the vectorised float kernel's 2 - t; the half (scalar)
    # kernel's (1 - t) + 1, rounded twice
    x3 = f"{T}(2) - t" if rnd is None else f"_r(_r({T}(1) - t) + {T}(1))"
    body = (_BACKWARD if backward else _FORWARD).format(
        name=name, T=T, rng="prange" if parallel else "range", CHUNK=CHUNK)
    head = HEADER.format(extra=", parallel=True" if parallel else "")
    return (_ROUND[rnd] + "\n\n" + _HELPERS.format(T=T) + _CUBIC.format(T=T, X3=x3) + head
            + body, name)
