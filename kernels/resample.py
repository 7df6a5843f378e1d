"""Resampling backward kernels: upsample (nearest, nearest-exact, linear, cubic) and
replication padding, 1/2/3-d as (N, C, D, H, W) arrays with unit leading spatial dims.

Upsampling is separable: per axis, each output coordinate reads `taps` input coordinates with
weights (1 for nearest, 2 for linear, 4 for cubic). The kernel first builds a small
(out size, taps) index and weight table per axis with PyTorch's own index arithmetic
(UpSample.h: float32 scales for nearest, the op's float type for linear and cubic), then
scatters grad_output through the tables plane by plane, in the CPU's accumulation order.

>>> src, name = render_upsample_backward("linear", "np.float32", False)
>>> "def _taps(" in src
True
"""

from __future__ import annotations

from .elementwise import kernel_name
from .grid_sample import _ROUND

HEADER = '@njit(error_model="numpy", nogil=True{extra})\n'

TAPS = {"nearest": 1, "nearest_exact": 1, "linear": 2, "cubic": 4, "aa_linear": 0, "aa_cubic": 0}

# area_pixel_compute_scale: align_corners maps corner to corner; otherwise 1 / scale_factor
# when one was given (inv > 0), else in / out
_SCALE = """\
@njit(error_model="numpy", forceinline=True)
def _scale(isize, osize, inv, align):
    if align:
        return {T}(isize - 1) / {T}(osize - 1) if osize > 1 else {T}(0)
    return {T}(inv) if inv > 0 else {T}(isize) / {T}(osize)


"""

_FORCEINLINE = '@njit(error_model="numpy", forceinline=True)\n'   # see _TABLE

_TAPS = {
    # nearest_idx: identity and x2 special cases, else floorf(o * scale) in float32
    "nearest": """\
    if osize == isize:
        i = o
    elif osize == 2 * isize:
        i = o >> 1
    else:
        s = np.float32(inv) if inv > 0 else np.float32(isize) / np.float32(osize)
        i = min(int(math.floor(np.float32(o) * s)), isize - 1)
    idx[0] = i
    wt[0] = 1
""",
    # nearest_exact_idx: floorf((o + 0.5) * scale), the product in double
    "nearest_exact": """\
    s = np.float32(inv) if inv > 0 else np.float32(isize) / np.float32(osize)
    idx[0] = min(int(math.floor(np.float32((o + 0.5) * np.float64(s)))), isize - 1)
    wt[0] = 1
""",
    # compute_source_index_and_lambda
    "linear": """\
    if osize == isize:
        idx[0] = o
        idx[1] = o
        wt[0] = 1
        wt[1] = 0
        return
    s = _scale(isize, osize, inv, align)
    r = s * {T}(o) if align else s * ({T}(o) + {T}(0.5)) - {T}(0.5)
    if r < 0:
        r = {T}(0)
    i0 = min(int(math.floor(r)), isize - 1)
    l1 = _r(min(max(r - {T}(i0), {T}(0)), {T}(1)))
    idx[0] = i0
    idx[1] = i0 + 1 if i0 < isize - 1 else i0
    wt[0] = _r({T}(1) - l1)
    wt[1] = l1
""",
    # get_cubic_upsample_coefficients (A = -0.75), taps at floor(r) - 1 .. + 2, clamped
    "cubic": """\
    s = _scale(isize, osize, inv, align)
    r = s * {T}(o) if align else s * ({T}(o) + {T}(0.5)) - {T}(0.5)
    f = math.floor(r)
    t = r - {T}(f)
    a = {T}(-0.75)
    x1 = t + {T}(1)
    wt[0] = ((a * x1 - {T}(5) * a) * x1 + {T}(8) * a) * x1 - {T}(4) * a
    wt[1] = ((a + {T}(2)) * t - (a + {T}(3))) * t * t + {T}(1)
    x2 = {T}(1) - t
    wt[2] = ((a + {T}(2)) * x2 - (a + {T}(3))) * x2 * x2 + {T}(1)
    x3 = x2 + {T}(1)
    wt[3] = ((a * x3 - {T}(5) * a) * x3 + {T}(8) * a) * x3 - {T}(4) * a
    for k in range(4):
        idx[k] = min(max(int(f) - 1 + k, 0), isize - 1)
        wt[k] = _r(wt[k])
""",
    # antialiased linear (_compute_indices_min_size_weights_aa): a triangle filter stretched
    # by the scale when downsampling, weights normalized to sum 1; unused taps weigh 0
    "aa_linear": """\
    s = _scale(isize, osize, inv, align)
    support = s if s >= 1 else {T}(1)
    center = {T}(np.float64(s) * (o + 0.5))
    invscale = {T}(1.0 / np.float64(s)) if s >= 1 else {T}(1)
    lo = max(int(np.float64(center - support) + 0.5), 0)
    size = min(int(np.float64(center + support) + 0.5), isize) - lo
    total = {T}(0)
    for j in range(size):
        v = abs({T}(np.float64({T}(j + lo) - center) + 0.5) * np.float64(invscale))
        w = {T}(1.0 - np.float64(v)) if v < 1 else {T}(0)
        idx[j] = lo + j
        wt[j] = w
        total += w
    if total != 0:
        for j in range(size):
            wt[j] /= total
    for j in range(size, idx.shape[0]):
        idx[j] = lo
""",
    # antialiased cubic: as aa_linear with Keys' cubic filter (a = -0.5) of half-width 2,
    # stretched by the scale when downsampling
    "aa_cubic": """\
    s = _scale(isize, osize, inv, align)
    support = {T}(2) * s if s >= 1 else {T}(2)
    center = {T}(np.float64(s) * (o + 0.5))
    invscale = {T}(1.0 / np.float64(s)) if s >= 1 else {T}(1)
    lo = max(int(np.float64(center - support) + 0.5), 0)
    size = min(int(np.float64(center + support) + 0.5), isize) - lo
    total = {T}(0)
    a = {T}(-0.5)
    for j in range(size):
        v = abs({T}(np.float64({T}(j + lo) - center) + 0.5) * np.float64(invscale))
        if v < 1:
            w = ((a + {T}(2)) * v - (a + {T}(3))) * v * v + {T}(1)
        elif v < 2:
            w = ((a * v - {T}(5) * a) * v + {T}(8) * a) * v - {T}(4) * a
        else:
            w = {T}(0)
        idx[j] = lo + j
        wt[j] = w
        total += w
    if total != 0:
        for j in range(size):
            wt[j] /= total
    for j in range(size, idx.shape[0]):
        idx[j] = lo
""",
}

# table width: the fixed tap count, or for antialiasing 2 * ceil(support) + 1
_WIDTH = """\
@njit(error_model="numpy", forceinline=True)
def _width(isize, osize, inv, align):
    if {taps} > 0:
        return {taps}
    s = _scale(isize, osize, inv, align)
    return int(math.ceil(s if s >= 1 else {T}(1))) * 2 + 1


"""
# aa_cubic: the filter's half-width is 2 input pixels (times the scale when downsampling)
_WIDTH_AA_CUBIC = """\
@njit(error_model="numpy", forceinline=True)
def _width(isize, osize, inv, align):
    s = _scale(isize, osize, inv, align)
    return int(math.ceil({T}(2) * s if s >= 1 else {T}(2))) * 2 + 1


"""

# the scatter: linear modes accumulate z, h, w (w fastest) with weight wz * wh * ww * g as the
# CPU does; cubic walks x outer, y inner with g * wy * wx
_SCATTER = {
    "zhw": """\
                    for a in range(nz):
                        for b in range(nh):
                            for e in range(nw):
                                gi[n, c, zi[oz, a], hi[oi, b], wi[oj, e]] += \\
                                    zw[oz, a] * hw[oi, b] * ww[oj, e] * g
""",
    "whz": """\
                    for e in range(nw):
                        for b in range(nh):
                            for a in range(nz):
                                gi[n, c, zi[oz, a], hi[oi, b], wi[oj, e]] += \\
                                    g * zw[oz, a] * hw[oi, b] * ww[oj, e]
""",
}

_UPSAMPLE_BACKWARD = """\
def {name}(gi, go, inv_z, inv_h, inv_w, align):
    # 1. per-axis tap tables (an axis of equal unit sizes has one tap)
    zi, zw = _table(gi.shape[2], go.shape[2], inv_z, align)
    hi, hw = _table(gi.shape[3], go.shape[3], inv_h, align)
    wi, ww = _table(gi.shape[4], go.shape[4], inv_w, align)
    nz = 1 if gi.shape[2] == 1 and go.shape[2] == 1 else zi.shape[1]
    nh = 1 if gi.shape[3] == 1 and go.shape[3] == 1 else hi.shape[1]
    nw = wi.shape[1]
    # 2. scatter grad_output through the tables, one (n, c) plane per step
    c_ = gi.shape[1]
    for p in {rng}(gi.shape[0] * c_):
        n = p // c_
        c = p % c_
        for z in range(gi.shape[2]):
            for i in range(gi.shape[3]):
                for j in range(gi.shape[4]):
                    gi[n, c, z, i, j] = 0
        for oz in range(go.shape[2]):
            for oi in range(go.shape[3]):
                for oj in range(go.shape[4]):
                    g = go[n, c, oz, oi, oj]
{scatter}"""

# separable: rows resampled along W into a scratch plane, then along H (2-d only)
_AA_FORWARD = """\
def {name}(out, x, inv_z, inv_h, inv_w, align):
    hi, hw = _table(x.shape[3], out.shape[3], inv_h, align)
    wi, ww = _table(x.shape[4], out.shape[4], inv_w, align)
    c_ = x.shape[1]
    for p in {rng}(x.shape[0] * c_):
        n = p // c_
        c = p % c_
        tmp = np.empty((x.shape[3], out.shape[4]), {T})
        for i in range(x.shape[3]):
            for oj in range(out.shape[4]):
                s = {T}(0)
                for e in range(wi.shape[1]):
                    s += x[n, c, 0, i, wi[oj, e]] * ww[oj, e]
                tmp[i, oj] = s
        for oi in range(out.shape[3]):
            for oj in range(out.shape[4]):
                s = {T}(0)
                for b in range(hi.shape[1]):
                    s += tmp[hi[oi, b], oj] * hw[oi, b]
                out[n, c, 0, oi, oj] = s
"""

# half-type forward (upsample_linear1d / bilinear2d / trilinear3d / bicubic2d): the CPU's
# cpu_upsample_linear / generic kernels store each axis' weights in the half type, then
# interpolate in float32, the outermost axis outermost (Interpolate<n>: (sum_w x * ww) * wh ...),
# and round once
_GATHER_FORWARD = """\
def {name}(out, x, inv_z, inv_h, inv_w, align):
    zi, zw = _table(x.shape[2], out.shape[2], inv_z, align)
    hi, hw = _table(x.shape[3], out.shape[3], inv_h, align)
    wi, ww = _table(x.shape[4], out.shape[4], inv_w, align)
    nz = 1 if x.shape[2] == 1 and out.shape[2] == 1 else zi.shape[1]
    nh = 1 if x.shape[3] == 1 and out.shape[3] == 1 else hi.shape[1]
    nw = wi.shape[1]
    c_ = x.shape[1]
    for p in {rng}(x.shape[0] * c_):
        n = p // c_
        c = p % c_
        for oz in range(out.shape[2]):
            for oi in range(out.shape[3]):
                for oj in range(out.shape[4]):
                    acc = {T}(0)
                    for a in range(nz):
                        sh = {T}(0)
                        for b in range(nh):
                            sw = {T}(0)
                            for e in range(nw):
                                sw += x[n, c, zi[oz, a], hi[oi, b], wi[oj, e]] * ww[oj, e]
                            sh += sw * hw[oi, b]
                        acc += sh * zw[oz, a]
                    out[n, c, oz, oi, oj] = acc
"""

# nearest / nearest-exact forward: one source tap per axis, the element copied as it is (any
# dtype; half types as their int16 bits), so -0.0 and NaN payloads survive as on the CPU
_NEAREST_FORWARD = """\
def {name}(out, x, inv_z, inv_h, inv_w, align):
    zi, _zw = _table(x.shape[2], out.shape[2], inv_z, align)
    hi, _hw = _table(x.shape[3], out.shape[3], inv_h, align)
    wi, _ww = _table(x.shape[4], out.shape[4], inv_w, align)
    c_ = x.shape[1]
    for p in {rng}(x.shape[0] * c_):
        n = p // c_
        c = p % c_
        for oz in range(out.shape[2]):
            z = zi[oz, 0]
            for oi in range(out.shape[3]):
                h = hi[oi, 0]
                for oj in range(out.shape[4]):
                    out[n, c, oz, oi, oj] = x[n, c, z, h, wi[oj, 0]]
"""

# NOTE: the helpers are compiled functions that LLVM always inlines (forceinline), with the
# kernel's flags (error_model="numpy"), not Numba-inlined (inline="always"): Numba's IR inlining
# deep-copied and re-typed _table, _taps, _width and _scale at every call site, 30-60% of a
# resampling kernel's compile (docs/KERNELS.md). A helper's symbol carries Numba's per-process
# counter, which starts at a random 40-bit offset in each process (kernels/compile.py
# _unique_function_ids): two cached kernels' `_table`s from different processes no longer meet
# (they once did: nearest float64's table read by bicubic float32)
_TABLE = """\
@njit(error_model="numpy", forceinline=True)
def _table(isize, osize, inv, align):
    width = _width(isize, osize, inv, align)
    idx = np.zeros((osize, width), np.int64)
    wt = np.zeros((osize, width), {T})
    if isize == 1 and osize == 1:      # a unit axis added for a lower rank: tap 0, weight 1
        wt[0, 0] = 1
        return idx, wt
    for o in range(osize):
        _taps(o, isize, osize, inv, align, idx[o], wt[o])
    return idx, wt


"""


def render_upsample_backward(mode: str, T: str, parallel: bool,
                             forward: bool | str = False,
                             rnd: str | None = None) -> tuple[str, str]:
    """`k(gi, go, inv_z, inv_h, inv_w, align)`: gi (N, C, D, H, W) = the upsample's input
    gradient; inv_* is 1 / scale_factor per axis, or 0 when the sizes define the scale.
    With `forward` (antialiased modes, whose forward has no decomposition): `k(out, x, ...)`
    the same tables gathered, width pass then height pass as the CPU does. forward="gather":
    the linear/cubic forward of half tensors (float32 arrays holding half values), weights
    rounded to `rnd` ("bf16"/"f16") as the CPU stores them. forward="nearest": the nearest /
    nearest-exact forward, each element copied from its one tap (T types the unused weights)."""
    name = kernel_name("upsample_bw", mode, T, parallel, forward) + (f"_{rnd}" if rnd else "")
    taps = TAPS[mode]
    head = HEADER.format(extra=", parallel=True" if parallel else "")
    helpers = _ROUND[rnd] + "\n\n" + _SCALE.format(T=T) + _FORCEINLINE + \
        "def _taps(o, isize, osize, inv, align, idx, wt):\n" + \
        _TAPS[mode].format(T=T) + "\n\n" + \
        (_WIDTH_AA_CUBIC if mode == "aa_cubic" else _WIDTH).format(taps=taps, T=T) + \
        _TABLE.format(T=T)
    if forward == "nearest":
        body = _NEAREST_FORWARD.format(name=name, rng="prange" if parallel else "range")
    elif forward == "gather":
        body = _GATHER_FORWARD.format(name=name, T=T, rng="prange" if parallel else "range")
    elif forward:
        body = _AA_FORWARD.format(name=name, T=T, rng="prange" if parallel else "range")
    else:
        body = _UPSAMPLE_BACKWARD.format(name=name, rng="prange" if parallel else "range",
                                         scatter=_SCATTER["whz" if mode == "cubic" else "zhw"])
    return helpers + head + body, name


# uint8 bilinear / bicubic, with and without antialiasing: the CPU's integer path
# (UpSampleKernel.cpp's separable kernel; the AVX kernel that avx2 and avx512 builds run for
# C <= 4 gives the same bytes, measured under each ATEN_CPU_CAPABILITY). Per axis
# the weights are computed in float64, scaled by 2**prec (prec: the largest shift that keeps
# round(max weight * 2**(prec + 1)) below 2**15, at most 22) and rounded half away from zero to
# integers; each output is (2**(prec - 1) + sum(pixel * weight)) >> prec clamped to 0..255.
# Width pass first (rounded to uint8), then height; an axis whose size does not change is not
# resampled. Without antialiasing the taps are the float kernel's (2 or 4 around
# floorf(source index), A = -0.75 for cubic), taps past an edge folded onto the edge pixel;
# with it, the triangle / Keys (A = -0.5) filter stretched by the scale when downsampling.
_U8_FILTER = {
    2: """\
@njit(error_model="numpy", forceinline=True)
def _filter(x):
    x = abs(x)
    return 1.0 - x if x < 1.0 else 0.0


""",
    4: """\
@njit(error_model="numpy", forceinline=True)
def _filter(x):
    a = {a}
    x = abs(x)
    if x < 1.0:
        return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    if x < 2.0:
        return ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a
    return 0.0


""",
}

_U8_TABLE = """\
@njit(error_model="numpy", forceinline=True)
def _u8_table(isize, osize, inv, align):
    # (first tap, tap count, integer weights, precision) per output coordinate of one axis
    s = _scale(isize, osize, inv, align)
    if {aa}:
        support = {interp} * 0.5 * s if s >= 1.0 else {interp} * 0.5
        width = int(math.ceil(support)) * 2 + 1
    else:
        support = {interp} * 0.5
        width = {interp}
    wt = np.zeros((osize, width), np.float64)
    lo = np.zeros(osize, np.int64)
    cnt = np.zeros(osize, np.int64)
    wmax = 0.0
    for o in range(osize):
        if {aa}:
            center = s * (o + 0.5)
            invscale = 1.0 / s if s >= 1.0 else 1.0
            xmin = max(int(center - support + 0.5), 0)
            xs = min(max(min(int(center + support + 0.5), isize) - xmin, 0), width)
            total = 0.0
            for j in range(xs):
                w = _filter((float(j + xmin) - center + 0.5) * invscale)
                wt[o, j] = w
                total += w
            if total != 0.0:
                for j in range(xs):
                    wt[o, j] /= total
                    wmax = max(wmax, wt[o, j])
        else:
            r = s * o if align else s * (o + 0.5) - 0.5
            if not align and {interp} == 2 and r < 0.0:
                r = 0.0
            i0 = min(int(math.floor(np.float32(r))), isize - 1)   # floorf: float32 first
            lam = min(max(r - i0, 0.0), 1.0)
            half = {interp} // 2
            umin = i0 - half + 1
            xmin = max(umin, 0)
            xs = min(max(min(i0 + half + 1, isize) - xmin, 0), width)
            k = 0
            for j in range(width):
                w = _filter(float(j + 1 - half) - lam)
                if umin + j <= 0:
                    k = 0
                elif umin + j >= isize - 1:
                    k = xs - 1
                wt[o, k] += w
                wmax = max(wmax, wt[o, k])
                k += 1
        lo[o] = xmin
        cnt[o] = xs
    prec = 0
    while prec < 22 and int(0.5 + wmax * (1 << (prec + 1))) < (1 << 15):
        prec += 1
    q = np.zeros((osize, width), np.int64)
    for o in range(osize):
        for j in range(width):
            v = wt[o, j] * (1 << prec)
            q[o, j] = int(v - 0.5) if v < 0 else int(v + 0.5)
    return lo, cnt, q, prec


"""

_U8_FORWARD = """\
def {name}(out, x, inv_h, inv_w, align):
    h, w = x.shape[3], x.shape[4]
    oh, ow = out.shape[3], out.shape[4]
    do_w = w != ow
    do_h = h != oh
    wlo, wcnt, wq, wp = _u8_table(w, ow, inv_w, align)
    hlo, hcnt, hq, hp = _u8_table(h, oh, inv_h, align)
    c_ = x.shape[1]
    for p in {rng}(x.shape[0] * c_):
        n = p // c_
        c = p % c_
        # 1. width pass into a plane of uint8 values (a copy when the width is kept)
        tmp = np.empty((h, ow), np.int64)
        for i in range(h):
            for oj in range(ow):
                if do_w:
                    acc = np.int64(1) << (wp - 1)
                    for e in range(wcnt[oj]):
                        acc += np.int64(x[n, c, 0, i, wlo[oj] + e]) * wq[oj, e]
                    tmp[i, oj] = min(max(acc >> wp, 0), 255)
                else:
                    tmp[i, oj] = x[n, c, 0, i, oj]
        # 2. height pass
        for oi in range(oh):
            for oj in range(ow):
                if do_h:
                    acc = np.int64(1) << (hp - 1)
                    for b in range(hcnt[oi]):
                        acc += tmp[hlo[oi] + b, oj] * hq[oi, b]
                    out[n, c, 0, oi, oj] = min(max(acc >> hp, 0), 255)
                else:
                    out[n, c, 0, oi, oj] = tmp[oi, oj]
"""


def render_upsample_u8(mode: str, antialias: bool, parallel: bool) -> tuple[str, str]:
    """`k(out, x, inv_h, inv_w, align)`: uint8 (N, C, 1, H, W) bilinear (`mode` "linear") or
    bicubic ("cubic") resampling, antialiased or not, with the CPU's integer arithmetic;
    inv_* is 1 / scale_factor per axis, or 0 when the sizes define the scale.

    >>> src, name = render_upsample_u8("cubic", True, False)
    >>> "def _u8_table(" in src and "a = -0.5" in src
    True
    """
    interp = {"linear": 2, "cubic": 4}[mode]
    name = kernel_name("upsample_u8", mode, antialias, parallel)
    head = HEADER.format(extra=", parallel=True" if parallel else "")
    helpers = _SCALE.format(T="np.float64") + \
        _U8_FILTER[interp].format(a="-0.5" if antialias else "-0.75") + \
        _U8_TABLE.format(aa=bool(antialias), interp=interp)
    return helpers + head + _U8_FORWARD.format(name=name, rng="prange" if parallel else "range"), \
        name


_REPLICATION_PAD_BACKWARD = """\
def {name}(gi, go, pz, ph, pw):
    dp = gi.shape[2]
    h = gi.shape[3]
    wd = gi.shape[4]
    c_ = gi.shape[1]
    for p in {rng}(gi.shape[0] * c_):
        n = p // c_
        c = p % c_
        for z in range(dp):
            for i in range(h):
                for j in range(wd):
                    gi[n, c, z, i, j] = 0
        for oz in range(go.shape[2]):
            iz = min(max(oz - pz, 0), dp - 1)
            for oi in range(go.shape[3]):
                ih = min(max(oi - ph, 0), h - 1)
                for oj in range(go.shape[4]):
                    iw = min(max(oj - pw, 0), wd - 1)
                    gi[n, c, iz, ih, iw] = _r(gi[n, c, iz, ih, iw] + go[n, c, oz, oi, oj])
"""


def render_replication_pad_backward(parallel: bool, rnd: str | None = None) -> tuple[str, str]:
    """`k(gi, go, pz, ph, pw)`: gi[clamp(o - pad)] += go; p* are the leading pads (may be
    negative: a crop). `rnd` "bf16"/"f16": float32 arrays of half values, each add rounded to
    the half type as the CPU's half kernel adds."""
    name = kernel_name("replpad_bw", parallel) + (f"_{rnd}" if rnd else "")
    head = HEADER.format(extra=", parallel=True" if parallel else "")
    return _ROUND[rnd] + "\n\n" + head + _REPLICATION_PAD_BACKWARD.format(
        name=name, rng="prange" if parallel else "range"), name
