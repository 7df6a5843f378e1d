"""Orthogonal polynomials P_n(x) as njit helpers: Chebyshev T/U/V/W and their shifted forms,
Hermite H/He, Laguerre L, Legendre P (the math of ATen's *_polynomial_*_forward, same operation
order, n truncated to int64).

The eight Chebyshev variants differ only in their values at the interval ends, the closed
trigonometric form used for large n and the first term of the recurrence, so one template renders
all eight from the table `_CHEBYSHEV`; they share `_cheb_recur_SUF`, the three-term recurrence.

>>> "_cheb_t_float32" in prelude()
True
"""

from __future__ import annotations

import re

# the recurrence P_k = 2y P_{k-1} - P_{k-2} from P_0 = 1, P_1 = q, stopped by a nan (as ATen);
# `r` is what a variant returns when the loop does not run at all
_RECUR = '''
@njit(inline="always", error_model="numpy")
def _cheb_recur_SUF(y, q, n, r):
    p = T(1.0)
    k = 2
    while k <= n and not q != q:
        r = _fms_SUF(y + y, q, p)
        p = q
        q = r
        k += 1
    return r
'''

# closed forms for n above the limit and |y| < 1, in terms of y (x, or 2x - 1 when shifted)
_TRIG = {
    "t": ["return math.cos(T(n) * math.acos(y))"],
    "u": ["if math.sin(math.acos(y)) != T(0.0):",
          "    return math.sin(T(n + 1) * math.acos(y)) / math.sin(math.acos(y))",
          "return T(n + 1) * math.cos(T(n + 1) * math.acos(y)) / y"],
    "v": ["if math.sin(math.acos(y) / T(2.0)) != T(1.0):",
          "    return math.cos((T(n) + T(0.5)) * math.acos(y)) / math.cos(math.acos(y) / T(2.0))",
          "if n % 2 == 0:", "    return T(n + n + 1)", "return T(-(n + n + 1))"],
    "w": ["if math.cos(math.acos(y) / T(2.0)) != T(1.0):",
          "    return math.sin((T(n) + T(0.5)) * math.acos(y)) / math.sin(math.acos(y) / T(2.0))",
          "if n % 2 == 0:", "    return T(1.0)", "return T(-1.0)"],
}

# kind -> (value at y = 1, at y = -1 for even n, for odd n, P_1 in y, trig limit plain,
#          trig limit shifted)
_CHEBYSHEV = {
    "t": ("T(1.0)", "T(1.0)", "T(-1.0)", "y", 6, 6),
    "u": ("T(n + 1)", "T(n + 1)", "T(-(n + 1))", "y + y", 8, 6),
    "v": ("T(1.0)", "T(n + n + 1)", "T(-(n + n + 1))", "y + y - T(1.0)", 8, 6),
    "w": ("T(n + n + 1)", "T(1.0)", "T(-1.0)", "y + y + T(1.0)", 8, 4),
}


def _chebyshev(kind: str, shifted: bool) -> str:
    top, even, odd, q1, lim_plain, lim_shifted = _CHEBYSHEV[kind]
    name = ("_scheb_" if shifted else "_cheb_") + kind
    lines = [f"def {name}_SUF(x, nf):", "    n = np.int64(nf)", "    if n < 0:",
             "        return T(0.0)"]
    # 1. the interval ends: x = +-1, or x = 1 and x = 0 for the shifted form
    if shifted:
        lines += ["    if x == T(1.0):", f"        return {top}", "    if x == T(0.0):"]
    else:
        lines += ["    if abs(x) == T(1.0):", "        if x > T(0.0):", f"            return {top}"]
    lines += ["        if n % 2 == 0:", f"            return {even}", f"        return {odd}"]
    lines.append("    y = x + x - T(1.0)" if shifted else "    y = x")
    # 2. the closed trigonometric form (the plain W also returns its y = 1 value there)
    trig = list(_TRIG[kind])
    if kind == "w" and not shifted:
        trig[2:2] = ["if y > T(0.0):", f"    return {top}"]
    lines.append(f"    if n > {lim_shifted if shifted else lim_plain} and abs(y) < T(1.0):")
    lines += ["        " + t for t in trig]
    # 3. P_0, P_1, then the recurrence (plain T starts from r = x, as ATen)
    r0 = "x" if kind == "t" and not shifted else "T(0.0)"
    lines += ["    if n == 0:", "        return T(1.0)", "    if n == 1:", f"        return {q1}",
              f"    return _cheb_recur_SUF(y, {q1}, n, {r0})"]
    return '@njit(inline="always", error_model="numpy")\n' + "\n".join(lines) + "\n"


_OTHERS = '''
@njit(inline="always", error_model="numpy")
def _fms_SUF(a, b, c):
    # a * b - c rounded once for float32, as a fused multiply-subtract: the CPU's kernels are
    # compiled with FMA contraction (AVX2/AVX-512 builds), so its Hermite recurrences round
    # there. The float32 product is exact in float64; the float64 difference differs from a
    # single rounding only if it lands exactly on a float32 tie. In float64: the plain one.
    return T(np.float64(a) * np.float64(b) - np.float64(c))

@njit(inline="always", error_model="numpy")
def _hermite_h_SUF(x, nf):
    if math.isinf(nf) or nf != nf:
        n = np.int64(-1)
    else:
        n = np.int64(nf)
    if n < 0:
        return T(0.0)
    if n == 0:
        return T(1.0)
    if n == 1:
        return x + x
    if n > HLIMIT:
        return T(math.nan)
    p = T(1.0)
    q = x + x
    r = T(0.0)
    k = 2
    while k < n + n:
        r = _fms_SUF(x + x, q, T(k) * p)
        p = q
        q = r
        k += 2
    return r

@njit(inline="always", error_model="numpy")
def _hermite_he_SUF(x, nf):
    n = np.int64(nf)
    if n < 0:
        return T(0.0)
    if n == 0:
        return T(1.0)
    if n == 1:
        return x
    if n > HLIMIT:
        return T(math.nan)
    p = T(1.0)
    q = x
    r = T(0.0)
    k = 1
    while k < n:
        r = _fms_SUF(x, q, T(k) * p)
        p = q
        q = r
        k += 1
    return r

@njit(inline="always", error_model="numpy")
def _recur_lp_SUF(x, q, n, laguerre):
    # P_{k+1} = (a_k P_k - k P_{k-1}) / (k + 1) from P_0 = 1, P_1 = q, stopped by a nan;
    # a_k = 2k + 1 - x (Laguerre) or (2k + 1) x (Legendre)
    p = T(1.0)
    r = T(0.0)
    k = 1
    while k < n and not q != q:
        if laguerre:
            a = T(k + k) + (T(1.0) - x)
        else:
            a = T(k + k + 1) * x
        r = _fms_SUF(a, q, T(k) * p) / T(k + 1)
        p = q
        q = r
        k += 1
    return r

@njit(inline="always", error_model="numpy")
def _laguerre_l_SUF(x, nf):
    n = np.int64(nf)
    if n < 0:
        return T(0.0)
    if abs(x) == T(0.0):
        return T(1.0)
    if n == 0:
        return T(1.0)
    if n == 1:
        return T(1.0) - x
    return _recur_lp_SUF(x, T(1.0) - x, n, True)

@njit(inline="always", error_model="numpy")
def _legendre_p_SUF(x, nf):
    n = np.int64(nf)
    if n < 0:
        return T(0.0)
    if abs(x) == T(1.0):
        if x > T(0.0) or n % 2 == 0:
            return T(1.0)
        return T(-1.0)
    if n == 0:
        return T(1.0)
    if n == 1:
        return x
    return _recur_lp_SUF(x, x, n, False)
'''

HELPERS = ("_cheb_t", "_cheb_u", "_cheb_v", "_cheb_w", "_scheb_t", "_scheb_u", "_scheb_v",
           "_scheb_w", "_hermite_h", "_hermite_he", "_laguerre_l", "_legendre_p")


def for_type(template: str, T: str) -> str:
    """A `T(` / `_SUF` template for one float type ("np.float32" -> `np.float32(`, `_float32`)."""
    return re.sub(r"(?<![\w.])T\(", f"{T}(", template).replace("_SUF", "_" + T.split(".")[1])


def prelude() -> str:
    """njit source of every polynomial helper, one copy per float type."""
    template = _RECUR + "\n" + "\n".join(_chebyshev(k, s) for s in (False, True)
                                         for k in "tuvw") + _OTHERS
    # ATen's n limit for Hermite: past it the recurrence overflows anyway (getHermitianLimit)
    return "\n".join(for_type(template, T).replace("HLIMIT", str(limit))
                     for T, limit in (("np.float32", 128), ("np.float64", 512)))
