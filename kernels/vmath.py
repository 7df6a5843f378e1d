'''Vectorizable float32 math for rendered Numba kernels.

The PyPI llvmlite has no SVML, so `math.exp/tanh/erf/log` in a Numba loop is one libm call per
element and the loop never vectorizes. The helpers in `VMATH_PRELUDE` are branch-free float32
polynomials (Cephes-style range reduction, selects instead of branches, bit casts through scalar
`.view`, no libm) that LLVM turns into `<8 x float>` AVX2 code inside a plain
`for i in range(n): out[i] = f(x[i])` loop.

    _vexp  _vexpm1  _vlog  _vlog1p  _vtanh  _verf  _vsigmoid   (drop-in for the math.* call)
    _vgelu(x)       0.5 x (1 + erf(x/sqrt2)), computed without the cancellation of that formula
                    for x < 0 (torch's CPU gelu returns 0 for x < -5.5; this one the true tail)
    _vgelu_tanh(x)  0.5 x (1 + tanh(u)) = x / (1 + exp(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3)
    _verf_as(x)     torch's own vectorized erf (abs. error < 6e-7), what float32 gelu_backward
                    uses (lower/elementwise_ops.py _GELU_BW_F32), as torch's CPU gelu does
    _vgelu_as(x)    float32 gelu with that erf, fused into one helper with fma (what the gelu op
                    uses: lower/elementwise_ops.py _GELU_F32), 2x the speed of x (1 + _verf_as)

Contract: float32 in, float32 out, only for a float32 compute type (a float64 argument is cast
down). Max error against the correctly rounded result, checked on all 2^32 float32 inputs
(tools/ulp_check.py): exp, log, log1p, tanh, erf 1 ulp; expm1 2 ulp (all within 2 ulp of
torch's CPU results, +-0, +-inf, nan, denormals and the overflow/underflow edges included).
sigmoid: torch's formula 1/(1 + exp(-x)), 2 ulp, 0 below -88.7 as torch (<= 4 ulp from torch).
gelu: 7 ulp (torch's own is 10 ulp off in [-1, 1] and 100% off for x < -5.5). gelu_tanh:
3 ulp for x >= -1; below, the result ~ x exp(2u) carries the absolute rounding error of 2u
(~|2u| ulp), torch cancels instead.
Vectorization: the loop's IR must hold `<8 x float>` AND no libm call; `<8 x float>` alone
proves nothing (LLVM turns a math.exp loop into llvm.exp.v8f32 = 8 scalar expf calls).

Wiring (lower/elementwise.py): for a float32 compute type, `expr = vectorize_math(expr)`; when
`needs_vmath(expr)`, prepend VMATH_PRELUDE to the kernel source and put VMATH_ID (changes with
the prelude) in the kernel key.

VMATH_PRELUDE is one line importing the helpers of SOURCE, compiled once per process with
error_model="numpy" and no fastmath, the flags of every kernel that calls them (kernels/shared.py;
they were inline="always" text per kernel, where the caller's flags applied). LLVM inlines them
into the kernel's loop, which vectorizes as before. The library imports
`_vfma` (kernels/intrinsics.py: a * b + c rounded once, vectorized to vfmadd): the exp family
(`_v_exp_reduce`, `_v_exp_poly`: exp, expm1, sigmoid, tanh, erf, the gelus, softmax's
`_v_exp_neg`) and `_vgelu_as` are spelled with it, 1.4x (exp) to 1.7x (`_v_exp_neg`) faster in
cache than the mul-and-add Cephes spelling and no less accurate (exp: max 0.89 ulp against
0.999). log, log1p and the small-|x| polynomials of tanh and erf are as they were.
`tools/ulp_check.py` checks every helper on all 2^32 float32 inputs (before/after: `--rev`).

>>> import numpy as np
>>> ns = {}
>>> exec(VMATH_PRELUDE, ns)
>>> float(ns["_vexp"](np.float32(1.0)))
2.7182817459106445
>>> vectorize_math("T(1) / (T(1) + math.exp(-self)) + math.expm1(self)")
'T(1) / (T(1) + _vexp(-self)) + _vexpm1(self)'
'''

from __future__ import annotations

import hashlib
import re

from .shared import register

# NOTE: every constant is np.float32(..): a bare Python float would promote the whole expression
# to float64. Conditional expressions become selects (LLVM if-converts them); the integer parts
# stay in i32 lanes (1.5*2^23 magic-number tricks instead of float<->int conversions).
SOURCE = '''
from eager_neuron.kernels.intrinsics import fma as _vfma


@njit(error_model="numpy", forceinline=True)
def _v_bits(x):
    return np.float32(x).view(np.int32)


@njit(error_model="numpy", forceinline=True)
def _v_float(i):
    return np.int32(i).view(np.float32)


@njit(error_model="numpy", forceinline=True)
def _v_i2f(i):
    # float32(i) for |i| < 2^22 without a conversion instruction
    return _v_float(i + np.int32(0x4B400000)) - np.float32(12582912.0)


@njit(error_model="numpy", forceinline=True)
def _v_exp_p(r):
    # Cephes expf's P: exp(r) = 1 + r + r^2 P(r) for |r| <= ln2/2 (and the few ulps more that
    # the rounding of k gives), by Horner in fused multiply-adds (one rounding per step)
    p = _vfma(np.float32(1.9875691500e-4), r, np.float32(1.3981999507e-3))
    p = _vfma(p, r, np.float32(8.3334519073e-3))
    p = _vfma(p, r, np.float32(4.1665795894e-2))
    p = _vfma(p, r, np.float32(1.6666665459e-1))
    return _vfma(p, r, np.float32(5.0000001201e-1))


@njit(error_model="numpy", forceinline=True)
def _v_exp_poly(r):
    # exp(r) = 1 + r (1 + r P(r)): Horner to the end, 7 fmas. The inner 1 + r P is in
    # [0.85, 1.19] and its rounding reaches the result times |r| <= 0.35: max error 0.89 ulp
    # of exp over all float32 x (the Cephes order 1 + (r + r^2 P), non-fused, had 1.0)
    q = _vfma(_v_exp_p(r), r, np.float32(1.0))
    return _vfma(q, r, np.float32(1.0))


@njit(error_model="numpy", forceinline=True)
def _v_exp_reduce(xc):
    # (r, k): xc = k ln2 + r, k = rint(xc/ln2) by adding 1.5*2^23 (the low mantissa bits of t
    # are k). ln2 = C1 + C2 with C1 = float32(ln2): the fma forms xc - k C1 exactly and it is
    # representable (a multiple of 2^-24 below ln2/2 in magnitude: xc and k C1 are such
    # multiples for |xc| >= 1/2, and k = 0 below), so r has one rounding, from k C2.
    t = _vfma(xc, np.float32(1.44269504088896341), np.float32(12582912.0))
    kf = t - np.float32(12582912.0)
    k = _v_bits(t) - np.int32(0x4B400000)
    r = _vfma(kf, np.float32(-0.693147182464599609375), xc)
    r = _vfma(kf, np.float32(1.904654323148236e-09), r)
    return r, k


@njit(error_model="numpy", forceinline=True)
def _v_exp_core(x):
    # exp(x), no nan fix-up. Clamp to [-104, 89]; exp(r) 2^k scaled in two exact halves, so a
    # denormal result rounds once and k = 128 overflows to inf.
    xc = x if x < np.float32(89.0) else np.float32(89.0)
    xc = xc if xc > np.float32(-104.0) else np.float32(-104.0)
    r, k = _v_exp_reduce(xc)
    y = _v_exp_poly(r)
    k1 = k >> 1
    s1 = _v_float((k1 + 127) << 23)
    s2 = _v_float((k - k1 + 127) << 23)
    return (y * s1) * s2


@njit(error_model="numpy", forceinline=True)
def _vexp(x):
    y = _v_exp_core(x)
    return y if x == x else x


@njit(error_model="numpy", forceinline=True)
def _v_exp_neg(x):
    # _vexp for x <= 0 or NaN (softmax's exp(x - max)), bit for bit: no upper clamp, and the
    # scale as 2^(k + 64) (k >= -150: normal, exact) then 2^-64, so a denormal result still
    # rounds once, with 3 integer ops fewer than the two half scales
    xc = x if x > np.float32(-104.0) else np.float32(-104.0)
    r, k = _v_exp_reduce(xc)
    y = _v_exp_poly(r)
    y = (y * _v_float((k + (127 + 64)) << 23)) * np.float32(5.421010862427522e-20)
    return y if x == x else x


@njit(error_model="numpy", forceinline=True)
def _v_expm1_core(x):
    # expm1(x), no nan/zero fix-up: 2 (s expm1(r) + (s - 1/2)) with s = 2^(k-1), the last add
    # fused (one rounding), and k = 0 gives expm1(r) = expm1(x) itself, so small x keep their
    # relative precision. x is clamped to [-18, 89] (expm1 rounds to -1 below -17.33).
    xc = x if x < np.float32(89.0) else np.float32(89.0)
    xc = xc if xc > np.float32(-18.0) else np.float32(-18.0)
    r, k = _v_exp_reduce(xc)
    em = _vfma(_v_exp_p(r), r * r, r)
    s = _v_float((k + 126) << 23)
    return _vfma(s, em, s - np.float32(0.5)) * np.float32(2.0)


@njit(error_model="numpy", forceinline=True)
def _vexpm1(x):
    y = _v_expm1_core(x)
    y = x if x == np.float32(0.0) else y
    return y if x == x else x


@njit(error_model="numpy", forceinline=True)
def _v_log_core(f, fe):
    # log(1 + f) + fe ln2 for f in [sqrt(1/2) - 1, sqrt(2) - 1]: Cephes logf, ln2 = C1 + C2
    z = f * f
    z2 = z * z
    pa = np.float32(-2.4999993993e-1) * f + np.float32(3.3333331174e-1)
    pb = np.float32(-1.6668057665e-1) * f + np.float32(2.0000714765e-1)
    pc = np.float32(-1.2420140846e-1) * f + np.float32(1.4249322787e-1)
    pd = np.float32(-1.1514610310e-1) * f + np.float32(1.1676998740e-1)
    p = (pa + z * pb) + z2 * ((pc + z * pd) + z2 * np.float32(7.0376836292e-2))
    y = p * f * z
    y = y + fe * np.float32(-2.12194440e-4)
    y = y - np.float32(0.5) * z
    return (f + y) + fe * np.float32(0.693359375)


@njit(error_model="numpy", forceinline=True)
def _vlog(x):
    # x = 2^e m, m in [sqrt(1/2), sqrt(2)): adding 1 - 0x3F3504F3 to the bits makes the exponent
    # field round at sqrt(2); log(x) = log1p(m - 1) + e ln2. Denormals are scaled by 2^23 first.
    sub = x < np.float32(1.17549435e-38)
    xs = x * np.float32(8388608.0) if sub else x
    ix = np.int32(_v_bits(xs) + np.int32(0x3F800000 - 0x3F3504F3))
    fe = _v_i2f(ix >> 23) - (np.float32(150.0) if sub else np.float32(127.0))
    m = _v_float((ix & np.int32(0x007FFFFF)) + np.int32(0x3F3504F3))
    y = _v_log_core(m - np.float32(1.0), fe)
    y = y if x < np.float32(np.inf) else x
    return y if x > np.float32(0.0) else (
        np.float32(-np.inf) if x == np.float32(0.0) else np.float32(np.nan))


@njit(error_model="numpy", forceinline=True)
def _vlog1p(x):
    # u = 1 + x rounded; log1p(x) = log(u) + (1 + x - u)/u (musl's correction term). Where u's
    # exponent is 0 the reduction is skipped and x itself is the argument (exact, no correction).
    u = np.float32(1.0) + x
    iu = np.int32(_v_bits(u) + np.int32(0x3F800000 - 0x3F3504F3))
    kf = _v_i2f(iu >> 23) - np.float32(127.0)
    m = _v_float((iu & np.int32(0x007FFFFF)) + np.int32(0x3F3504F3))
    c = (np.float32(1.0) - (u - x)) if kf >= np.float32(2.0) else (x - (u - np.float32(1.0)))
    c = c / u
    k0 = kf == np.float32(0.0)
    f = x if k0 else m - np.float32(1.0)
    c = np.float32(0.0) if k0 else c
    y = _v_log_core(f, kf) + c
    y = y if x < np.float32(np.inf) else x
    y = y if x > np.float32(-1.0) else (
        np.float32(-np.inf) if x == np.float32(-1.0) else np.float32(np.nan))
    y = x if x == np.float32(0.0) else y
    return y if x == x else x


@njit(error_model="numpy", forceinline=True)
def _vtanh(x):
    # |x| < 0.625: x + x^3 P(x^2) (Cephes tanhf); else 1 - 2/(exp(2|x|) + 1) with |x| clamped
    # at 9.1 (tanh rounds to 1 beyond 9.011) and the sign put back by a select
    a = abs(x)
    s = x * x
    p = np.float32(-5.70498872745e-3) * s + np.float32(2.06390887954e-2)
    p = p * s - np.float32(5.37397155531e-2)
    p = p * s + np.float32(1.33314422036e-1)
    p = p * s - np.float32(3.33332819422e-1)
    small = x + x * (s * p)
    ac = a if a < np.float32(9.1) else np.float32(9.1)
    big = np.float32(1.0) - np.float32(2.0) / (_v_exp_core(ac + ac) + np.float32(1.0))
    big = big if x > np.float32(0.0) else -big
    y = small if a < np.float32(0.625) else big
    y = x if a < np.float32(2.44140625e-4) else y    # tanh(x) rounds to x; keeps -0
    return y if x == x else x


@njit(error_model="numpy", forceinline=True)
def _v_erf_q(z):
    # erf(x) = x + x Q(x^2) for |x| <= 1, z = x^2 (relative error 1.2e-9)
    z2 = z * z
    qa = np.float32(-0.3761262595653534) * z + np.float32(0.12837916612625122)
    qb = np.float32(-0.026853812858462334) * z + np.float32(0.1128358542919159)
    qc = np.float32(-0.0008010193705558777) * z + np.float32(0.005188327748328447)
    return (qa + z2 * qb) + z2 * z2 * (qc + z2 * np.float32(7.853860734030604e-05))


@njit(error_model="numpy", forceinline=True)
def _verf(x):
    # |x| < 1: x + x Q(x^2); else 1 - exp(-x^2) g(|x|), g(a) = erfcx(a) fitted on [1, 4] in
    # a - 2.5 to an absolute erfc error < 0.01 * 2^-24 (erf rounds to 1 beyond 3.92: |x| <= 4)
    z = x * x
    small = x + x * _v_erf_q(z)
    a = abs(x)
    ac = a if a < np.float32(4.0) else np.float32(4.0)
    u = ac - np.float32(2.5)
    u2 = u * u
    u4 = u2 * u2
    ga = np.float32(-0.07434938102960587) * u + np.float32(0.21080633997917175)
    gb = np.float32(-0.008000192232429981) * u + np.float32(0.024929532781243324)
    gc = np.float32(-0.000649164489004761) * u + np.float32(0.002520708367228508)
    gd = np.float32(-0.00013620882236864418) * u + np.float32(0.00022367281781043857)
    ge = np.float32(-2.7994539777864702e-05) * u - np.float32(5.778032209491357e-05)
    g = (ga + u2 * gb) + u4 * ((gc + u2 * gd) + u4 * ge)
    big = np.float32(1.0) - _v_exp_core(-(ac * ac)) * g
    big = big if x > np.float32(0.0) else -big
    y = small if a < np.float32(1.0) else big
    return y if x == x else x


@njit(error_model="numpy", forceinline=True)
def _vsigmoid(x):
    # torch's formula, 1 / (1 + exp(-x)): x < -88.7 gives 0 as torch does, not a denormal
    y = np.float32(1.0) / (np.float32(1.0) + _v_exp_core(-x))
    return y if x == x else x


@njit(error_model="numpy", forceinline=True)
def _vgelu(x):
    # 0.5 x phi2, phi2 = 1 + erf(v), v = x/sqrt2, without cancellation:
    #   |v| < 1:  (1 + v) + v Q(v^2)
    #   v >= 1:   2 - exp(-x^2/2) G(|x|);   v <= -1: exp(-x^2/2) G(|x|)
    # G(y) = erfcx(y/sqrt2) = H(t)/(y + 2), H fitted in t = 1/(y + 2) on [sqrt2, 15.5] to
    # relative accuracy (H is flat, so the rounding of t hardly matters), and x^2 is split
    # exactly (Dekker) so exp(-x^2/2) keeps its relative precision deep in the tail.
    xc = x if x < np.float32(15.0) else np.float32(15.0)
    xc = xc if xc > np.float32(-15.0) else np.float32(-15.0)
    v = xc * np.float32(0.70710678118654752)
    mid = (np.float32(1.0) + v) + v * _v_erf_q(v * v)
    a = abs(xc)
    hi = xc * xc
    cs = xc * np.float32(4097.0)
    xh = cs - (cs - xc)
    xl = xc - xh
    lo = ((xh * xh - hi) + np.float32(2.0) * xh * xl) + xl * xl
    e = _v_exp_core(hi * np.float32(-0.5))
    e = e - e * (lo * np.float32(0.5))
    d = a + np.float32(2.0)
    t = np.float32(1.0) / d
    t2 = t * t
    ha = np.float32(1.594496488571167) * t + np.float32(0.7979027628898621)
    hb = np.float32(0.9869661331176758) * t + np.float32(2.4311609268188477)
    hc = np.float32(-49.34434509277344) * t + np.float32(1.940714955329895)
    hd = np.float32(-74.08521270751953) * t + np.float32(106.69638061523438)
    h = (ha + t2 * hb) + t2 * t2 * (hc + t2 * hd)
    tail = (e * h) / d
    big = tail if xc < np.float32(0.0) else np.float32(2.0) - tail
    phi2 = mid if a < np.float32(1.4142135623730951) else big
    return (np.float32(0.5) * x) * phi2


@njit(error_model="numpy", forceinline=True)
def _verf_as(x):
    # torch's own vectorized erf (ATen vec256 Vectorized<float>::erf: Abramowitz-Stegun 7.1.26,
    # absolute error < 1.5e-7, < 6e-7 after float32 rounding near 0, as torch's), which torch's
    # CPU gelu and gelu_backward use: ~0.7 the cost of _verf (one exp, one division, a degree-4
    # polynomial). Only for gelu, where 1 + erf keeps that absolute error at a few ulp of the
    # result for x >= 0 (x < 0: absolute, as torch's).
    a = abs(x)
    t = np.float32(1.0) / (np.float32(0.3275911) * a + np.float32(1.0))
    r = (((np.float32(1.061405429) * t + np.float32(-1.453152027)) * t
          + np.float32(1.421413741)) * t + np.float32(-0.284496736)) * t + np.float32(0.254829592)
    y = np.float32(1.0) - (_v_exp_core(-(x * x)) * t) * r
    y = y if x >= np.float32(0.0) else -y
    return y if x == x else x


@njit(error_model="numpy", forceinline=True)
def _vgelu_as(x):
    # float32 gelu = 0.5 x phi2, phi2 = 1 + erf(v), v = x/sqrt2, fused and spelled with fma.
    # |v| < 1: phi2 = (1 + v) + v Q(v^2) (_v_erf_q's polynomial, 1-2 ulp). Else torch's erf
    # (Abramowitz-Stegun 7.1.26, as _verf_as): q = t R(t) exp(-v^2) ~ erfc(|v|), t = 1/(1 + p|v|),
    # phi2 = 2 - q for x > 0, q for x < 0 (torch computes 1 + erf(v) there and cancels to 0
    # below -5.5; q keeps the tail, with A&S's absolute error). exp(-v^2) as _v_exp_core (v^2
    # clamped at 104, where it rounds to 0; scaled by 2^(k + 64) and 2^-64, so the denormal
    # tail of x in (-14.4, -13.2) rounds once). NaN reaches q through t; +-inf give inf and nan
    # as 0.5 x (1 + erf(x/sqrt2)) does.
    v = x * np.float32(0.70710678118654752)
    a = abs(v)
    vv = v * v
    m = _vfma(np.float32(7.853860734030604e-05), vv, np.float32(-0.0008010193705558777))
    m = _vfma(m, vv, np.float32(0.005188327748328447))
    m = _vfma(m, vv, np.float32(-0.026853812858462334))
    m = _vfma(m, vv, np.float32(0.1128358542919159))
    m = _vfma(m, vv, np.float32(-0.3761262595653534))
    m = _vfma(m, vv, np.float32(0.12837916612625122))
    mid = _vfma(v, m, np.float32(1.0) + v)
    t = np.float32(1.0) / _vfma(np.float32(0.3275911), a, np.float32(1.0))
    # A&S's R(t) 2^-64, its coefficients scaled exactly (see q below)
    r = _vfma(np.float32(1.061405429 * 2.0 ** -64), t, np.float32(-1.453152027 * 2.0 ** -64))
    r = _vfma(r, t, np.float32(1.421413741 * 2.0 ** -64))
    r = _vfma(r, t, np.float32(-0.284496736 * 2.0 ** -64))
    r = _vfma(r, t, np.float32(0.254829592 * 2.0 ** -64))
    w = vv if vv < np.float32(104.0) else np.float32(104.0)
    s = _vfma(w, np.float32(-1.44269504088896341), np.float32(12582912.0))
    kf = s - np.float32(12582912.0)
    k = _v_bits(s) - np.int32(0x4B400000)
    z = _vfma(kf, np.float32(-0.693115234375), -w)
    z = _vfma(kf, np.float32(-3.19461832987e-05), z)
    # e = exp(-w) 2^64 (k + 64 >= -86: a normal scale, exact; exp(z) as _v_exp_poly) and 2^-64
    # on r t, in R's coefficients (exact unless r t < 2^-62, where q is 0 anyway): a denormal q
    # is rounded once, by its last multiply, with 3 integer ops and a multiply fewer than two
    # half scales (GELU is compute-bound in cache)
    e = _v_exp_poly(z) * _v_float((k + (127 + 64)) << 23)
    q = (r * t) * e
    phi2 = np.float32(2.0) - q if x >= np.float32(0.0) else q
    phi2 = mid if a < np.float32(1.0) else phi2
    return (np.float32(0.5) * x) * phi2


@njit(error_model="numpy", forceinline=True)
def _vgelu_tanh(x):
    # 0.5 x (1 + tanh(u)) = x / (1 + exp(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3)
    u2 = (x + np.float32(0.044715) * (x * x * x)) * np.float32(1.5957691216057308)
    y = x / (np.float32(1.0) + _v_exp_core(-u2))
    return y if x == x else x'''

# what a kernel's source starts with: the import of this process's compiled helpers (its digest
# of SOURCE changes VMATH_ID)
VMATH_PRELUDE = register("vmath", SOURCE)
VMATH_ID = hashlib.sha1(VMATH_PRELUDE.encode()).hexdigest()[:10]

# math.* calls with a vectorizable float32 replacement (same argument, same special values)
MATH_TO_VMATH = {
    "exp": "_vexp",
    "expm1": "_vexpm1",
    "log": "_vlog",
    "log1p": "_vlog1p",
    "tanh": "_vtanh",
    "erf": "_verf",
}
_MATH_RE = re.compile(r"\bmath\.(" + "|".join(MATH_TO_VMATH) + r")\(")


def vectorize_math(expr: str) -> str:
    """`expr` with every math.exp/expm1/log/log1p/tanh/erf call replaced by its helper.

    Only for a float32 compute type; the kernel source must start with VMATH_PRELUDE.
    """
    return _MATH_RE.sub(lambda m: MATH_TO_VMATH[m.group(1)] + "(", expr)


_HELPER_RE = re.compile(
    r"(?<![\w.])_v(exp|expm1|log|log1p|tanh|erf|erf_as|sigmoid|gelu|gelu_as|gelu_tanh)\(")


def needs_vmath(expr: str) -> bool:
    """Whether `expr` (after vectorize_math, or a template naming a helper) calls a helper.

    The prelude is ~17 lazy dispatchers (~5 ms to exec, which a disk-cache load also pays), so
    prepend it only to the kernels that use it.
    """
    return _HELPER_RE.search(expr) is not None
