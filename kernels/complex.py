"""Complex elementwise kernels: one loop nest over coalesced strided views.

Operands are loaded into Python-level numbers (complex128, float64 or bool: Numba's native
complex arithmetic), the op expression runs on them, and the store casts to the output dtype.
A raw operand whose tensor carries PyTorch's conjugate or negative bit is conjugated / negated on
load, so those bits never need a materializing copy first.

>>> src, name = render_map("v0 + c0 * v1", ("c", "c"), 1, 2, "np.complex64", False)
>>> "np.complex64(v0 + c0 * v1)" in src
True
"""

from __future__ import annotations

from .elementwise import kernel_name

# load kinds: how operand j's element becomes the value v<j> the expression sees
LOADS = {
    "c": "np.complex128({})",                  # complex operand
    "cc": "np.conj(np.complex128({}))",        # complex operand with the conjugate bit
    "cn": "-np.complex128({})",                # complex operand with the negative bit
    "ccn": "-np.conj(np.complex128({}))",      # both bits
    "r": "np.float64({})",                     # real operand (ints and floats)
    "b": "{}",                                 # bool operand (a condition)
}


# c10::complex division (Smith's scaling; a zero divisor gives componentwise inf/nan, as on the
# CPU) in place of Numba's, which raises ZeroDivisionError
CDIV = '''
@njit(error_model="numpy", nogil=True)
def _cdiv(x, y):
    x = np.complex128(x)
    y = np.complex128(y)
    a, b, c, d = x.real, x.imag, y.real, y.imag
    if abs(c) >= abs(d):
        if c == 0 and d == 0:
            return complex(a / abs(c), b / abs(d))
        rat = d / c
        scl = 1.0 / (c + d * rat)
        return complex((a + b * rat) * scl, (b - a * rat) * scl)
    rat = c / d
    scl = 1.0 / (d + c * rat)
    return complex((a * rat + b) * scl, (b * rat - a) * scl)
'''


def render_map(expr: str, loads: tuple, n_scalars: int, rank: int, store: str,
               parallel: bool) -> tuple[str, str]:
    """Source of `k(o, x0.., s0..)`: o[i] = store(expr(v0.., c0..)) over a rank-`rank` nest."""
    name = kernel_name("cmap", expr, loads, n_scalars, rank, store, parallel)
    params = ["o"] + [f"x{j}" for j in range(len(loads))] + [f"s{j}" for j in range(n_scalars)]
    lines = ["import cmath", CDIV if "_cdiv(" in expr else "",
             '@njit(error_model="numpy", nogil=True' + (", parallel=True" if parallel else "")
             + ")", f"def {name}({', '.join(params)}):"]
    for j in range(n_scalars):
        lines.append(f"    c{j} = s{j}")
    depth = 1
    for d in range(rank):
        rng = "prange" if (parallel and d == 0) else "range"
        lines.append("    " * depth + f"for i{d} in {rng}(o.shape[{d}]):")
        depth += 1
    idx = ", ".join(f"i{d}" for d in range(rank))
    pad = "    " * depth
    for j, kind in enumerate(loads):
        lines.append(pad + f"v{j} = " + LOADS[kind].format(f"x{j}[{idx}]"))
    lines.append(pad + f"o[{idx}] = {store}({expr})")
    return "\n".join(lines) + "\n", name


def render_bmm(load_a: str, load_b: str, with_self: bool, load_s: str, store: str,
               parallel: bool) -> tuple[str, str]:
    """Source of `k(o, a, b[, s], alpha, beta)`: o[i] = beta * s[i] + alpha * (a[i] @ b[i]) for
    o (B, M, N), a (B, M, K), b (B, K, N), accumulated in complex128."""
    name = kernel_name("cbmm", load_a, load_b, with_self, load_s, store, parallel)
    params = "o, a, b, " + ("s, " if with_self else "") + "alpha, beta"
    rng = "prange" if parallel else "range"
    la = LOADS[load_a].format("a[bb, i, k]")
    lb = LOADS[load_b].format("b[bb, k, j]")
    lines = ['@njit(error_model="numpy", nogil=True' + (", parallel=True" if parallel else "")
             + ")", f"def {name}({params}):",
             "    nb, nm, nn = o.shape",
             "    nk = a.shape[2]",
             f"    for r in {rng}(nb * nm):",
             "        bb = r // nm",
             "        i = r % nm",
             "        acc = np.zeros(nn, np.complex128)",
             "        for k in range(nk):",
             f"            x = {la}",
             "            for j in range(nn):",
             f"                acc[j] += x * {lb}",
             "        for j in range(nn):",
             "            v = alpha * acc[j]"]
    if with_self:
        lines.append("            v += beta * " + LOADS[load_s].format("s[bb, i, j]"))
    lines.append(f"            o[bb, i, j] = {store}(v)")
    return "\n".join(lines) + "\n", name


# log(exp(a) + exp(b)) of complex a, b as the CPU's _log_add_exp_helper: the larger real part
# factored out, log(1 + exp(min - max)) + max; a -inf real part adds nothing; NaN propagates
_LOG_ADD_EXP = """\
import cmath


@njit(inline="always")
def _log_add_exp(a, b):
    if a.real != a.real or a.imag != a.imag or b.real != b.real or b.imag != b.imag:
        return complex(math.nan, math.nan)
    if a.real == -math.inf:
        return b
    if b.real == -math.inf:
        return a
    mx, mn = (a, b) if a.real >= b.real else (b, a)
    if mx.real == math.inf:
        return mx
    return cmath.log(1.0 + cmath.exp(mn - mx)) + mx


"""


def render_scan(kind: str) -> tuple[str, str]:
    """Source of `k(x, o)` over x (R, N) complex128: o (R,) the product of each row ("prod"), or
    o (R, N) its running product ("cumprod") or running log-sum-exp ("logcumsumexp"), left to
    right in complex128."""
    name = kernel_name("cscan", kind)
    store = "o[r] = acc" if kind == "prod" else "o[r, j] = acc"
    if kind == "logcumsumexp":
        body = ["        acc = complex(-math.inf, 0.0)",
                "        for j in range(x.shape[1]):",
                "            acc = _log_add_exp(acc, x[r, j])",
                "            " + store]
    else:
        body = (["        acc = np.complex128(1.0)",
                 "        for j in range(x.shape[1]):",
                 "            acc = acc * x[r, j]"]
                + (["            " + store] if kind == "cumprod" else ["        " + store]))
    src = ((_LOG_ADD_EXP if kind == "logcumsumexp" else "") +
           '@njit(error_model="numpy", nogil=True)\n'
           f"def {name}(x, o):\n"
           "    for r in range(x.shape[0]):\n" + "\n".join(body) + "\n")
    return src, name
