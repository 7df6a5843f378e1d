"""grid_sampler kernels, forward and backward: bilinear/trilinear and nearest interpolation,
zeros/border/reflection padding, align_corners; 3-d arrays, a 2-d op as depth 1.

Index arithmetic is PyTorch's (GridSampler.h: unnormalize, clip and reflect with their
gradient multipliers); corner weights are products of (i1 - x) / (x - i0) factors, x then y
then z, and corners are visited z, y, x (the CPU's tnw, tne, tsw, ... order). Interpolation
and padding modes are runtime arguments: one kernel per dtype and direction.

Half types: the CPU runs these loops with scalar_t = c10::Half / c10::BFloat16, whose every
operator computes in float32 and rounds to the half type. The `rnd` variants compute in
float32 and apply `_r` (round to nearest even in the half type) after every operation the CPU
rounds, in the CPU's order; for float32/float64 `_r` is the identity.

>>> src, name = render_grid_sample(False, "np.float32", False)
>>> "def _source(" in src
True
"""

from __future__ import annotations

from .elementwise import kernel_name
from .halfround import ROUND_BF16, ROUND_F16

# _r: round to the half type (kernels/halfround.py); applied to float32 values. The half
# forms are called, not inlined (inlining them at ~30 sites tripled the compile time); each has
# its own name, so two cached kernels never carry one helper symbol with two bodies
_ROUND = {
    None: """\
@njit(inline="always")
def _r(x):
    return x
""",
    "bf16": ROUND_BF16 + "_r = _round_bf16\n",
    "f16": ROUND_F16 + "_r = _round_f16\n",
}

_HELPERS = """\
@njit(inline="always")
def _clip(x, size):
    # clip_coordinates_set_grad: (clipped, d clipped / d x)
    if x <= 0:
        return {T}(0), {T}(0)
    if x >= size - 1:
        return {T}(size - 1), {T}(0)
    return x, {T}(1)


@njit(inline="always")
def _reflect(x, twice_low, twice_high):
    # reflect_coordinates_set_grad
    if twice_low == twice_high:
        return {T}(0), {T}(0)
    lo = {T}(twice_low) / {T}(2)
    span = {T}(twice_high - twice_low) / {T}(2)
    x = _r(x - lo)
    sign = {T}(1)
    if x < 0:
        sign = {T}(-1)
        x = -x
    extra = np.fmod(x, span)
    flips = int(math.floor(_r(x / span)))
    if flips % 2 == 0:
        return _r(extra + lo), sign
    return _r(_r(span - extra) + lo), -sign


@njit(inline="always")
def _source(coord, size, padding, align):
    # grid_sampler_compute_source_index_set_grad: (source index, d index / d coord)
    if align:
        mult = _r({T}(size - 1) / {T}(2))
        x = _r(_r(_r(coord + {T}(1)) / {T}(2)) * {T}(size - 1))
    else:
        mult = _r({T}(size) / {T}(2))
        x = _r(_r(_r(_r(coord + {T}(1)) * {T}(size)) - {T}(1)) / {T}(2))
    if padding == 1:
        x, g = _clip(x, size)
        mult = mult * g
    elif padding == 2:
        if align:
            x, g = _reflect(x, 0, 2 * (size - 1))
        else:
            x, g = _reflect(x, -1, 2 * size - 1)
        x, g2 = _clip(x, size)
        mult = mult * g * g2
    return x, mult


@njit(inline="always")
def _rint(v):
    # std::nearbyint: ties to even
    r = math.floor(v)
    d = v - r
    if d > 0.5 or (d == 0.5 and r % 2 == 1):
        r += 1
    return int(r)


@njit(inline="always")
def _at(inp, n, c, y, x, sizes):
    # an input value, 0 outside (the CPU's masked gather)
    if x >= 0 and x < sizes[0] and y >= 0 and y < sizes[1]:
        return inp[n, c, 0, y, x]
    return {T}(0)


@njit(inline="always")
def _grad2d(inp, n, c, lo, fac, sizes, g, gsum):
    # 2-d bilinear backward as the CPU's vectorised kernel (GridSamplerKernel.cpp) computes it:
    # grad_grid from differences of neighbours, gx += ((ne - nw) * s + (se - sw) * n) * gOut
    x0 = lo[0]
    y0 = lo[1]
    e, w_ = fac[0, 0], fac[0, 1]
    s, nn = fac[1, 0], fac[1, 1]
    v00 = _at(inp, n, c, y0, x0, sizes)
    v01 = _at(inp, n, c, y0, x0 + 1, sizes)
    v10 = _at(inp, n, c, y0 + 1, x0, sizes)
    v11 = _at(inp, n, c, y0 + 1, x0 + 1, sizes)
    tx = _r(_r(_r(_r(v01 - v00) * s) + _r(_r(v11 - v10) * nn)) * g)
    ty = _r(_r(_r(_r(v10 - v00) * e) + _r(_r(v11 - v01) * w_)) * g)
    gsum[0] = _r(gsum[0] + tx)
    gsum[1] = _r(gsum[1] + ty)


@njit(inline="always")
def _gi2d(gi, go, grid, n, sizes, padding, align, pos, mult):
    # 2-d bilinear grad_input in the CPU's order: its vectorised kernel takes the flattened
    # grid points 16 at a time (one float vector of AVX-512) and, per channel, scatters the nw
    # weights of all 16, then ne, sw, se; where two points share an input pixel the half-type
    # sums round in that order
    wd = grid.shape[3]
    npts = grid.shape[2] * wd
    lx = np.zeros(16, np.int64)
    ly = np.zeros(16, np.int64)
    fac = np.zeros((16, 2, 2), pos.dtype)
    for st in range(0, npts, 16):
        en = min(npts, st + 16)
        for p in range(st, en):
            _point(grid, n, 0, p // wd, p % wd, 2, sizes, padding, align, pos, mult)
            for a in range(2):
                lo = int(math.floor(pos[a]))
                fac[p - st, a, 0] = _r({T}(lo + 1) - pos[a])
                fac[p - st, a, 1] = _r(pos[a] - {T}(lo))
                if a == 0:
                    lx[p - st] = lo
                else:
                    ly[p - st] = lo
        for c in range(gi.shape[1]):
            for k in range(4):
                cy = k // 2
                cx = k % 2
                for p in range(st, en):
                    iy = ly[p - st] + cy
                    ix = lx[p - st] + cx
                    if iy < 0 or iy >= sizes[1] or ix < 0 or ix >= sizes[0]:
                        continue
                    g = go[n, c, 0, p // wd, p % wd]
                    wt = _r(_r(fac[p - st, 0, cx] * fac[p - st, 1, cy]) * g)
                    gi[n, c, 0, iy, ix] = _r(gi[n, c, 0, iy, ix] + wt)


@njit(inline="always")
def _point(grid, n, d, h, w, dims, sizes, padding, align, pos, mult):
    # source position and gradient multiplier per axis (x, y, z); a 2-d grid has z = 0
    for a in range(3):
        if a < dims:
            pos[a], mult[a] = _source(grid[n, d, h, w, a], sizes[a], padding, align)
        else:
            pos[a] = 0
            mult[a] = 0


"""

_FORWARD = """\
def {name}(out, inp, grid, interp, padding, align):
    n_ = inp.shape[0]
    c_ = inp.shape[1]
    dims = grid.shape[4]
    for n in {rng}(n_):
        pos = np.zeros(3, {T})
        mult = np.zeros(3, {T})
        lo = np.zeros(3, np.int64)
        fac = np.zeros((3, 2), {T})
        sizes = (inp.shape[4], inp.shape[3], inp.shape[2])
        for d in range(grid.shape[1]):
            for h in range(grid.shape[2]):
                for w in range(grid.shape[3]):
                    _point(grid, n, d, h, w, dims, sizes, padding, align, pos, mult)
                    if interp == 1:
                        ix = _rint(pos[0])
                        iy = _rint(pos[1])
                        iz = _rint(pos[2])
                        inside = (ix >= 0 and ix < sizes[0] and iy >= 0 and iy < sizes[1]
                                  and iz >= 0 and iz < sizes[2])
                        for c in range(c_):
                            out[n, c, d, h, w] = inp[n, c, iz, iy, ix] if inside else 0
                        continue
                    for a in range(3):
                        lo[a] = int(math.floor(pos[a]))
                        fac[a, 0] = _r({T}(lo[a] + 1) - pos[a])
                        fac[a, 1] = _r(pos[a] - {T}(lo[a]))
                    for c in range(c_):
                        acc = {T}(0)
                        for cz in range(2):
                            iz = lo[2] + cz
                            if iz < 0 or iz >= sizes[2]:
                                continue
                            for cy in range(2):
                                iy = lo[1] + cy
                                if iy < 0 or iy >= sizes[1]:
                                    continue
                                for cx in range(2):
                                    ix = lo[0] + cx
                                    if ix >= 0 and ix < sizes[0]:
                                        wt = _r(_r(fac[0, cx] * fac[1, cy]) * fac[2, cz])
                                        acc = _r(acc + _r(inp[n, c, iz, iy, ix] * wt))
                        out[n, c, d, h, w] = acc
"""

# gi (N, C, D, H, W) and gg (N, D, H, W, dims) are written only when their flag is set (a dummy
# array otherwise); samples of one n scatter into the same gi plane, so prange runs over n
_BACKWARD = """\
def {name}(gi, gg, go, inp, grid, interp, padding, align, need_i, need_g):
    n_ = inp.shape[0]
    c_ = inp.shape[1]
    dims = grid.shape[4]
    for n in {rng}(n_):
        if need_i:
            for c in range(c_):
                for z in range(gi.shape[2]):
                    for i in range(gi.shape[3]):
                        for j in range(gi.shape[4]):
                            gi[n, c, z, i, j] = 0
        pos = np.zeros(3, {T})
        mult = np.zeros(3, {T})
        lo = np.zeros(3, np.int64)
        fac = np.zeros((3, 2), {T})
        gsum = np.zeros(3, {T})
        sizes = (inp.shape[4], inp.shape[3], inp.shape[2])
        for d in range(grid.shape[1]):
            for h in range(grid.shape[2]):
                for w in range(grid.shape[3]):
                    _point(grid, n, d, h, w, dims, sizes, padding, align, pos, mult)
                    gsum[:] = 0
                    if interp == 1:
                        ix = _rint(pos[0])
                        iy = _rint(pos[1])
                        iz = _rint(pos[2])
                        if need_i and ix >= 0 and ix < sizes[0] and iy >= 0 and \\
                                iy < sizes[1] and iz >= 0 and iz < sizes[2]:
                            for c in range(c_):
                                gi[n, c, iz, iy, ix] = _r(gi[n, c, iz, iy, ix] +
                                                          go[n, c, d, h, w])
                    else:
                        for a in range(3):
                            lo[a] = int(math.floor(pos[a]))
                            fac[a, 0] = _r({T}(lo[a] + 1) - pos[a])
                            fac[a, 1] = _r(pos[a] - {T}(lo[a]))
                        for c in range(c_):
                            g = go[n, c, d, h, w]
                            if dims == 2:
                                _grad2d(inp, n, c, lo, fac, sizes, g, gsum)
                                continue
                            for cz in range(2):
                                iz = lo[2] + cz
                                if iz < 0 or iz >= sizes[2]:
                                    continue
                                for cy in range(2):
                                    iy = lo[1] + cy
                                    if iy < 0 or iy >= sizes[1]:
                                        continue
                                    for cx in range(2):
                                        ix = lo[0] + cx
                                        if ix < 0 or ix >= sizes[0]:
                                            continue
                                        fx = fac[0, cx]
                                        fy = fac[1, cy]
                                        fz = fac[2, cz]
                                        if need_i:
                                            wt = _r(_r(_r(fx * fy) * fz) * g)
                                            gi[n, c, iz, iy, ix] = _r(gi[n, c, iz, iy, ix] + wt)
                                        v = inp[n, c, iz, iy, ix]
                                        sx = {T}(1) if cx == 1 else {T}(-1)
                                        sy = {T}(1) if cy == 1 else {T}(-1)
                                        sz = {T}(1) if cz == 1 else {T}(-1)
                                        gsum[0] = _r(gsum[0] + sx * _r(_r(_r(v * fy) * fz) * g))
                                        gsum[1] = _r(gsum[1] + sy * _r(_r(_r(v * fx) * fz) * g))
                                        gsum[2] = _r(gsum[2] + sz * _r(_r(_r(v * fx) * fy) * g))
                    if need_g:
                        for a in range(dims):
                            gg[n, d, h, w, a] = _r(mult[a] * gsum[a])
        if need_i and dims == 2 and interp == 0:
            _gi2d(gi, go, grid, n, sizes, padding, align, pos, mult)
"""

HEADER = '@njit(error_model="numpy", nogil=True{extra})\n'


def render_grid_sample(backward: bool, T: str, parallel: bool,
                       rnd: str | None = None) -> tuple[str, str]:
    """Forward `k(out, inp, grid, interp, padding, align)` or backward
    `k(gi, gg, go, inp, grid, interp, padding, align, need_i, need_g)`; inp (N, C, D, H, W),
    grid (N, D, H, W, dims) with dims 3 (or 2: a 2-d op with D = 1); interp 0 = bilinear,
    1 = nearest; padding 0 = zeros, 1 = border, 2 = reflection. `rnd` "bf16"/"f16": float32
    arrays holding half values, every step rounded to that type as the CPU's half kernel."""
    name = kernel_name("grid_sample", backward, T, parallel) + (f"_{rnd}" if rnd else "")
    body = (_BACKWARD if backward else _FORWARD).format(
        name=name, T=T, rng="prange" if parallel else "range")
    head = HEADER.format(extra=", parallel=True" if parallel else "")
    return _ROUND[rnd] + "\n\n" + _HELPERS.format(T=T) + head + body, name
