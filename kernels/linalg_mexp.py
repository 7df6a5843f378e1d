"""Linear-algebra family, part three: the matrix exponential kernel (PyTorch's algorithm).

>>> src, name = render_matrix_exp("np.float64", False)
>>> name in src
True
"""

from __future__ import annotations

from .elementwise import kernel_name
from .linalg_helpers import HEADER

# -- matrix exponential: PyTorch's own algorithm (Bader, Blanes, Casas 2019: optimized Taylor
# polynomials of degree 1..18 chosen by the 1-norm, scaling and squaring above degree 18), in the
# input's precision: float32 truncation and squaring errors are the CPU's, so results match it.
_THETAS = {
    "np.float32": (1.192092800768788e-07, 5.978858893805233e-04, 5.116619363445086e-02,
                   5.800524627688768e-01, 1.461661507209034e+00, 3.010066362817634e+00),
    "np.float64": (2.220446049250313e-16, 2.580956802971767e-08, 3.397168839976962e-04,
                   4.991228871115323e-02, 2.996158913811580e-01, 1.090863719290036e+00),
}
_SQRT177 = 0.1330413469565007072504e+2
_B12 = ((9.0198e-16, 0.46932117595418237389, -0.20099424927047284052, -0.04623946134063071740),
        (5.31597895759871264183, 1.19926790417132231573, 0.01179296240992997031,
         0.01108844528519167989),
        (0.18188869982170434744, 0.05502798439925399070, 0.09351590770535414968,
         0.00610700528898058230),
        (-2.0861320e-13, -0.13181061013830184015, -0.02027855540589259079,
         -0.00675951846863086359))
_B18 = ((0.0, -1.00365581030144618291e-01, -8.02924648241156932449e-03,
         -8.92138498045729985177e-04, 0.0),
        (0.0, 3.97849749499645077844e-01, 1.36783778460411720168e+00,
         4.98289622525382669416e-01, -6.37898194594723280150e-04),
        (-1.09676396052962061844e+01, 1.68015813878906206114e+00, 5.71779846478865511061e-02,
         -6.98210122488052056106e-03, 3.34975017086070470649e-05),
        (-9.04316832390810593223e-02, -6.76404519071381882256e-02, 6.75961301770459654925e-02,
         2.95552570429315521194e-02, -1.39180257516060693404e-05),
        (0.0, 0.0, -9.23364619367118555360e-02, -1.69364939002081722752e-02,
         -1.40086798182036094347e-05))


def _t8_coeffs() -> tuple:
    s, x3 = _SQRT177, 2.0 / 3.0
    return (x3 * ((1.0 + s) / 88.0), x3 * ((1.0 + s) / 352.0), x3,
            (-271.0 + 29.0 * s) / (315.0 * x3), (-11.0 + 11.0 * s) / (1260.0 * x3),
            (-99.0 + 11.0 * s) / (5040.0 * x3), (89.0 - s) / (5040.0 * x3),
            (857.0 - 58.0 * s) / 630.0)


# The polynomials as straight-line programs over a workspace of 12 (n, n) slots: 0..4 hold
# I, x, x^2, then x^3 / x^4 / x^6 / x^8 as each degree needs; 5..10 temporaries; 11 the result.
# One interpreter loop calls each helper from one site, which keeps Numba's compile short.
# A step is (code, dst, a, b, coefficient row): MM dst = a @ b; LIN dst = sum_j c[j] * slot[a + j]
# for j < b - a (PyTorch's _compute_linear_combination order); ADD dst = a + b.
_MM, _LIN, _ADD = 0, 1, 2


def _mexp_tables() -> tuple:
    """(coefficient rows padded to 5, steps, start of each degree's program)."""
    c = _t8_coeffs()
    rows = {"C1": (1.0, 1.0), "C2": (1.0, 1.0, 0.5),
            "C4a": (1 / 2.0, 1 / 6.0, 1 / 24.0), "C4b": (1.0, 1.0, 0.0, 1.0),
            "C8a": (c[0], c[1]), "C8b": (c[2], 1.0), "C8c": (c[3], c[4], c[5], c[6]),
            "C8d": (1.0, 1.0, c[7], 0.0, 1.0)}
    rows.update({f"B12_{i}": r for i, r in enumerate(_B12)})
    rows.update({f"B18_{i}": r for i, r in enumerate(_B18)})
    r = list(rows).index
    powers2 = [(_MM, 2, 1, 1, 0)]
    powers3 = powers2 + [(_MM, 3, 1, 2, 0)]
    progs = [
        [(_LIN, 11, 0, 2, r("C1"))],
        powers2 + [(_LIN, 11, 0, 3, r("C2"))],
        powers2 + [(_LIN, 5, 0, 3, r("C4a")), (_MM, 3, 2, 5, 0), (_LIN, 11, 0, 4, r("C4b"))],
        powers2 + [(_LIN, 5, 1, 3, r("C8a")), (_MM, 3, 2, 5, 0), (_LIN, 5, 2, 4, r("C8b")),
                   (_LIN, 6, 0, 4, r("C8c")), (_MM, 4, 5, 6, 0), (_LIN, 11, 0, 5, r("C8d"))],
        powers3 + [(_LIN, 5 + i, 0, 4, r(f"B12_{i}")) for i in range(4)]
        + [(_MM, 10, 8, 8, 0), (_ADD, 7, 7, 10, 0), (_ADD, 6, 6, 7, 0), (_MM, 10, 6, 7, 0),
           (_ADD, 11, 5, 10, 0)],
        powers3 + [(_MM, 4, 3, 3, 0)] + [(_LIN, 5 + i, 0, 5, r(f"B18_{i}")) for i in range(5)]
        + [(_MM, 10, 5, 9, 0), (_ADD, 8, 8, 10, 0), (_ADD, 7, 7, 8, 0), (_MM, 10, 7, 8, 0),
           (_ADD, 11, 6, 10, 0)],
    ]
    coef = [list(v) + [0.0] * (5 - len(v)) for v in rows.values()]
    steps = [list(st) for prog in progs for st in prog]
    starts = [sum(len(p) for p in progs[:i]) for i in range(len(progs) + 1)]
    return coef, steps, starts


_MEXP = """\
@njit(error_model="numpy", nogil=True)
def _mm_into(out, a, b):
    # sequential k-sums (no BLAS blocking): the CPU's small-matrix products round the same way
    n = a.shape[0]
    for i in range(n):
        for j in range(n):
            acc = T(0.0)
            for k in range(n):
                acc += a[i, k] * b[k, j]
            out[i, j] = acc


@njit(error_model="numpy", nogil=True)
def _mexp_poly(w, lo, hi):
    n = w.shape[1]
    for s in range(lo, hi):
        code = STEPS[s, 0]
        dst = STEPS[s, 1]
        a = STEPS[s, 2]
        b = STEPS[s, 3]
        if code == 0:
            _mm_into(w[dst], w[a], w[b])
        elif code == 1:
            row = STEPS[s, 4]
            for r in range(n):
                for q in range(n):
                    w[dst, r, q] = 0
            for j in range(a, b):
                c = T(COEF[row, j - a])
                if c != 0:
                    for r in range(n):
                        for q in range(n):
                            w[dst, r, q] += c * w[j, r, q]
        else:
            for r in range(n):
                for q in range(n):
                    w[dst, r, q] = w[a, r, q] + w[b, r, q]
"""


def render_matrix_exp(np_type: str, parallel: bool) -> tuple[str, str]:
    """`k(a, out)`: a, out (B, n, n) C arrays of `np_type` ("np.float32", "np.float64",
    "np.complex64" or "np.complex128": complex matrices use their real type's degree table and
    a real 1-norm, as PyTorch does)."""
    real = {"np.complex64": "np.float32", "np.complex128": "np.float64"}.get(np_type, np_type)
    thetas = _THETAS[real]
    coef, steps, starts = _mexp_tables()
    name = kernel_name("linalg_matrix_exp", np_type, thetas, coef, steps, _MEXP, parallel)
    rng = "prange" if parallel else "range"
    src = (f"T = {np_type}\nCOEF = np.array({coef!r})\n"
           f"STEPS = np.array({steps!r}, dtype=np.int64)\nSTARTS = {tuple(starts)!r}\n\n"
           + _MEXP + "\n" + HEADER.format(extra=", parallel=True" if parallel else "") + f'''\
def {name}(a, out):
    n = a.shape[1]
    for b in {rng}(a.shape[0]):
        x = a[b]
        if n == 1:
            out[b, 0, 0] = np.exp(x[0, 0])   # PyTorch: self.exp() for 1x1 matrices
            continue
        norm = 0.0
        for j in range(n):
            s = T(0.0)
            for i in range(n):
                s += abs(x[i, j])
            norm = max(norm, s)
        th = {thetas!r}
        deg = 5
        for d in range(5):
            if norm <= th[d]:
                deg = d
                break
        sq = 0
        if deg == 5 and norm > th[5]:
            sq = int(math.ceil(math.log2(T(norm) / T(th[5]))))
        scale = T(2.0 ** sq)
        w = np.zeros((12, n, n), dtype=T)
        for i in range(n):
            w[0, i, i] = 1
            for j in range(n):
                w[1, i, j] = x[i, j] / scale
        _mexp_poly(w, STARTS[deg], STARTS[deg + 1])
        for _ in range(sq):
            _mm_into(w[10], w[11], w[11])
            for i in range(n):
                for j in range(n):
                    w[11, i, j] = w[10, i, j]
        for i in range(n):
            for j in range(n):
                out[b, i, j] = w[11, i, j]
''')
    if real != np_type:   # the norm and the squaring count are real numbers
        src = (src.replace("            s = T(0.0)\n", "            s = R(0.0)\n")
               .replace("math.log2(T(norm) / T(th[5]))", "math.log2(R(norm) / R(th[5]))")
               .replace(f"T = {np_type}\n", f"T = {np_type}\nR = {real}\n"))
    return src, name
