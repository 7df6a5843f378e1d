"""Distance kernels: pdist and cdist (p-norm of row differences), forward and backward.

The norm is rendered per class of p, as PyTorch's CPU Dist<> structs split it: 0 (count of
differing coordinates), 1, 2, inf, and general p. Forward sums run in float64 and round once;
backward terms follow PyTorch's formulas (sign(0) = 0, zero where the distance is 0).

>>> src, name = render_cdist("two", "np.float32", False)
>>> "math.sqrt" in src
True
"""

from __future__ import annotations

from .elementwise import kernel_name

HEADER = '@njit(error_model="numpy", nogil=True{extra})\n'

# (accumulate one difference d into acc, finish acc into the distance)
_NORM = {
    "zero": ("acc += 1.0 if d != 0 else 0.0", "acc"),
    "one": ("acc += abs(d)", "acc"),
    "two": ("acc += d * d", "math.sqrt(acc)"),
    "inf": ("acc = max(acc, abs(d))", "acc"),
    "general": ("acc += abs(d) ** p", "acc ** (1.0 / p)"),
}

# d/dx1 of the distance times its incoming gradient g, for one coordinate difference d
_GRAD = {
    "zero": "0.0",
    "one": "g * _sign(d)",
    "lt_two": "0.0 if dist == 0 or (d == 0 and p < 1) else "
              "_sign(d) * abs(d) ** (p - 1) * g / dist ** (p - 1)",
    "two": "0.0 if dist == 0 else g * d / dist",
    "inf": "g * _sign(d) * (1.0 if abs(d) == dist else 0.0)",
    "general": "0.0 if dist == 0 else d * abs(d) ** (p - 2) * g / dist ** (p - 1)",
}

_SIGN = """\
@njit(inline="always")
def _sign(v):
    return (v > 0) - (v < 0)


"""

_CDIST = """\
def {name}(out, x1, x2, p):
    nb = out.shape[1]
    np_ = out.shape[2]
    nr = out.shape[3]
    m = x1.shape[3]
    for q in {rng}(out.shape[0] * nb * np_):
        a = q // (nb * np_)
        b = (q // np_) % nb
        i = q % np_
        for j in range(nr):
            acc = 0.0
            for k in range(m):
                d = np.float64(x1[a, b, i, k]) - np.float64(x2[a, b, j, k])
                {acc}
            out[a, b, i, j] = {final}
"""

_CDIST_BACKWARD = """\
def {name}(gi, grad, x1, x2, dist, p):
    nb = gi.shape[1]
    np_ = gi.shape[2]
    nr = x2.shape[2]
    m = gi.shape[3]
{zero}    for q in {rng}(gi.shape[0] * nb * np_):
        a = q // (nb * np_)
        b = (q // np_) % nb
        i = q % np_
        for k in range(m):
            s = {T}(0)
            for j in range(nr):
                d = x1[a, b, i, k] - x2[a, b, j, k]
                g = grad[a, b, i, j]
                dist_ = dist[a, b, i, j]
                s += {term}
            gi[a, b, i, k] {assign} s
"""

# a broadcast gi (stride-0 batch dims) is zeroed through the same view before summing into it
_ZERO = """\
    for q in range(gi.shape[0] * nb * np_):
        for k in range(m):
            gi[q // (nb * np_), (q // np_) % nb, q % np_, k] = 0
"""

_PDIST = """\
def {name}(out, x, p):
    n = x.shape[0]
    m = x.shape[1]
    for i in {rng}(n):
        base = i * n - i * (i + 1) // 2 - i - 1
        for j in range(i + 1, n):
            acc = 0.0
            for k in range(m):
                d = np.float64(x[i, k]) - np.float64(x[j, k])
                {acc}
            out[base + j] = {final}
"""

# pairs (i < j) in row-major order; gi[i] += term, gi[j] -= term, as the CPU loop does
_PDIST_BACKWARD = """\
def {name}(gi, grad, x, dist, p):
    n = x.shape[0]
    m = x.shape[1]
    for k in {rng}(m):
        for i in range(n):
            gi[i, k] = 0
        for i in range(n):
            base = i * n - i * (i + 1) // 2 - i - 1
            for j in range(i + 1, n):
                d = x[i, k] - x[j, k]
                g = grad[base + j]
                dist_ = dist[base + j]
                t = {term}
                gi[i, k] += t
                gi[j, k] -= t
"""


def _render(template: str, prefix: str, norm: str, T: str, parallel: bool,
            accumulate: bool = False) -> tuple[str, str]:
    name = kernel_name(prefix, norm, T, parallel, accumulate)
    acc, final = _NORM.get(norm, ("", ""))
    term = _GRAD.get(norm, "").replace("dist", "dist_")
    term = f"{T}({term})"
    src = template.format(name=name, rng="prange" if parallel else "range", acc=acc,
                          final=final, term=term, T=T, assign="+=" if accumulate else "=",
                          zero=_ZERO if accumulate else "")
    head = HEADER.format(extra=", parallel=True" if parallel else "")
    return _SIGN + head + src, name


def render_cdist(norm: str, T: str, parallel: bool) -> tuple[str, str]:
    """`k(out, x1, x2, p)`: out (B1, B2, P, R), x1 (B1, B2, P, M), x2 (B1, B2, R, M)."""
    return _render(_CDIST, "cdist", norm, T, parallel)


def render_cdist_backward(norm: str, T: str, parallel: bool,
                          accumulate: bool) -> tuple[str, str]:
    """`k(gi, grad, x1, x2, dist, p)`: gi like x1; grad, dist (B1, B2, P, R). `norm` here also
    takes "lt_two" (0 < p < 2, p != 1). With `accumulate` gi is
    broadcast over batch dims (stride 0) and sums them (zeroed first): run it serially."""
    return _render(_CDIST_BACKWARD, "cdist_bw", norm, T, parallel, accumulate)


def render_pdist(norm: str, T: str, parallel: bool) -> tuple[str, str]:
    """`k(out, x, p)`: out (N*(N-1)/2,), x (N, M)."""
    return _render(_PDIST, "pdist", norm, T, parallel)


def render_pdist_backward(norm: str, T: str, parallel: bool) -> tuple[str, str]:
    """`k(gi, grad, x, dist, p)`: gi like x, grad and dist (N*(N-1)/2,)."""
    return _render(_PDIST_BACKWARD, "pdist_bw", norm, T, parallel)
