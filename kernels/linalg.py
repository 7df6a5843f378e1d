"""Linear-algebra family: batched factorizations and solves, written out as loops.

Every kernel works on float64 C-contiguous batches `(B, rows, cols)` that the lowering copied
in (so one compiled kernel serves float32 and float64 inputs of any layout, and float32 inputs
are factored with float64 accumulation), and writes float64 results that the lowering casts
into PyTorch's output layout. Flags (upper, transpose, left, ...) are runtime arguments: one
compile per kernel, not one per flag combination. The algorithms follow LAPACK's reference
routines step by step where PyTorch exposes their raw output (getrf pivots, geqrf reflectors
and tau, potrf's info), so the conventions match the CPU: 1-based int32 pivots, the first zero
pivot or non-positive leading minor in `info`, dlarfg's sign choice for Householder vectors.
Spectral kernels (eigh, svd, pinv) call Numba's np.linalg (LAPACK syevd / gesdd).

The one-matrix helpers live in kernels/linalg_helpers.py, the matrix exponential in
kernels/linalg_mexp.py (re-exported here: `render_matrix_exp`).

>>> src, name = render("lu_factor", False)
>>> "_getrf(a[b], piv[b])" in src
True
"""

from __future__ import annotations

from .elementwise import kernel_name
from .linalg_complex import KERNELS as _COMPLEX_KERNELS
from .linalg_helpers import (  # noqa: F401 - re-exported for importers of kernels.linalg
    _BF16,
    _F16,
    _FINITE,
    _GEQRF,
    _GETRF,
    _HELPER,
    _ORGQR,
    _ORMQR,
    _POTRF,
    _SWAPS,
    _SYM,
    _SYTF2,
    _SYTRS,
    _TRSM,
    HEADER,
)
from .linalg_mexp import render_matrix_exp  # noqa: F401 - re-exported

# -- batch kernels: name -> (parameters, helpers, body over one batch index b) --------------------
_KERNELS = {
    # a (B, m, n) -> LU in place; piv (B, min(m, n)) int32; info (B,) int32
    "lu_factor": ("a, piv, info", (_GETRF,), """\
        info[b] = _getrf(a[b], piv[b])
"""),
    # lu (B, n, n), piv (B, n), x (B, n, k) in place: A x = b, or A.T x = b when trans;
    # identity: x starts as the identity (the inverse); status[b] = 1 for a pivot outside [1, n]
    "lu_solve": ("lu, piv, x, status, trans, identity", (_TRSM, _SWAPS), """\
        status[b] = 0
        if identity:
            for i in range(x.shape[1]):
                for j in range(x.shape[2]):
                    x[b, i, j] = 1.0 if i == j else 0.0
        if not trans:
            if not _swaps(x[b], piv[b], no):
                status[b] = 1
                continue
            _trsm(lu[b], x[b], no, no, yes)
            _trsm(lu[b], x[b], yes, no, no)
        else:
            _trsm(lu[b], x[b], yes, yes, no)
            _trsm(lu[b], x[b], no, yes, yes)
            if not _swaps(x[b], piv[b], yes):
                status[b] = 1
"""),
    # a (B, n, n) triangular, x (B, n, k) in place
    "trsm": ("a, x, upper, trans, unit", (_TRSM,), """\
        _trsm(a[b], x[b], upper, trans, unit)
"""),
    # lu (B, n, n), piv (B, n) -> det, sign, logabsdet (B,), as PyTorch forms them from LU
    "lu_det": ("lu, piv, det, sign, logabs", (), """\
        s = 1.0
        for i in range(piv.shape[1]):
            if piv[b, i] != i + 1:
                s = -s
        d = s
        g = s
        la = 0.0
        for i in range(lu.shape[1]):
            u = lu[b, i, i]
            d *= u
            g *= (u > 0.0) - (u < 0.0) if u == u else u
            la += math.log(abs(u))
        det[b] = d
        sign[b] = g
        logabs[b] = la
"""),
    # lu (B, m, n), piv (B, k) -> p (B, m, m), l (B, m, k), u (B, k, n) (A = P L U)
    "lu_unpack": ("lu, piv, p, l, u, unpack_data, unpack_pivots, status", (), """\
        m = lu.shape[1]
        n = lu.shape[2]
        k = min(m, n)
        status[b] = 0
        if unpack_data:
            for i in range(m):
                for j in range(k):
                    l[b, i, j] = lu[b, i, j] if i > j else (1.0 if i == j else 0.0)
            for i in range(k):
                for j in range(n):
                    u[b, i, j] = lu[b, i, j] if j >= i else 0.0
        if unpack_pivots:
            perm = np.arange(m)
            for i in range(piv.shape[1]):
                q = piv[b, i] - 1
                if q < 0 or q >= m:
                    status[b] = 1
                    break
                t = perm[i]
                perm[i] = perm[q]
                perm[q] = t
            for i in range(m):
                for j in range(m):
                    p[b, i, j] = 0.0
            for j in range(m):
                p[b, perm[j], j] = 1.0
"""),
    # a (B, n, n): lower Cholesky factor in place (upper triangle zeroed), info (B,)
    "cholesky": ("a, info", (_POTRF,), """\
        info[b] = _potrf(a[b])
"""),
    # l (B, n, n) lower factor -> (L L^T)^-1 in place; info = first zero diagonal (1-based)
    "cholesky_inverse": ("l, info", (), """\
        x = l[b]
        n = x.shape[0]
        info[b] = 0
        for i in range(n):
            if x[i, i] == 0.0:
                info[b] = i + 1
                break
        if info[b] != 0:
            continue
        inv = np.zeros((n, n))
        for j in range(n):
            inv[j, j] = 1.0 / x[j, j]
            for i in range(j + 1, n):
                s = 0.0
                for p in range(j, i):
                    s -= x[i, p] * inv[p, j]
                inv[i, j] = s / x[i, i]
        for i in range(n):
            for j in range(i + 1):
                s = 0.0
                for p in range(i, n):
                    s += inv[p, i] * inv[p, j]
                x[i, j] = s
                x[j, i] = s
"""),
    # l (B, n, n) lower factor, x (B, n, k) in place: L L^T x = b
    "cholesky_solve": ("l, x", (_TRSM,), """\
        _trsm(l[b], x[b], no, no, no)
        _trsm(l[b], x[b], no, yes, no)
"""),
    # a (B, m, n) -> geqrf in place, tau (B, min(m, n))
    "geqrf": ("a, tau", (_GEQRF,), """\
        _geqrf(a[b], tau[b])
"""),
    # q (B, m, n) with reflectors in the first k columns -> Q in place
    "orgqr": ("q, tau", (_ORGQR,), """\
        _orgqr(q[b], tau[b], tau.shape[1])
"""),
    # a (B, nq, k) reflectors, tau (B, k), c (B, m, n) in place
    "ormqr": ("a, tau, c, left, trans", (_ORMQR,), """\
        _ormqr(a[b], tau[b], c[b], left, trans)
"""),
    # a (B, m, n) -> geqrf; r (B, rq, n) = triu(a[:rq]); q (B, m, qc) = Q's first qc columns
    "qr": ("a, tau, q, r", (_GEQRF, _ORGQR), """\
        x = a[b]
        _geqrf(x, tau[b])
        for i in range(r.shape[1]):
            for j in range(r.shape[2]):
                r[b, i, j] = x[i, j] if (j >= i and i < x.shape[0]) else 0.0
        qc = q.shape[2]
        if qc > 0:
            for i in range(q.shape[1]):
                for j in range(qc):
                    q[b, i, j] = x[i, j] if j < x.shape[1] else 0.0
            _orgqr(q[b], tau[b], tau.shape[1])
"""),
    # a (B, n, n) symmetric (one triangle read) -> w (B, n) ascending, v (B, n, n) if want_v;
    # status[b] = 1 for non-finite input
    "eigh": ("a, w, v, lower, want_v, status", (_SYM, _FINITE), """\
        x = a[b]
        _symmetrize(x, lower)
        status[b] = 0
        if not _finite(x):
            status[b] = 1
            continue
        ev, vec = np.linalg.eigh(x)
        w[b] = ev
        if want_v:
            v[b] = vec
"""),
    # a (B, m, n) -> u (B, m, m|k), s (B, k), vt (B, n|k, n) (want_uv), full_matrices
    "svd": ("a, u, s, vt, full, want_uv, status", (_FINITE,), """\
        status[b] = 0
        if not _finite(a[b]):
            status[b] = 1
            continue
        uu, ss, vv = np.linalg.svd(a[b], full_matrices=full)
        s[b] = ss
        if want_uv:
            u[b] = uu
            vt[b] = vv
"""),
    # a (B, m, n) -> out (B, n, m) pseudo-inverse; atol, rtol (B,): cutoff max(atol, rtol*smax);
    # zero_rtol: rtol counts only where atol <= 0 (PyTorch's default when only atol is given)
    "pinv": ("a, atol, rtol, out, hermitian, zero_rtol, status", (_SYM, _FINITE), """\
        x = a[b]
        status[b] = 0
        if hermitian:
            _symmetrize(x, True)
        if not _finite(x):
            status[b] = 1
            continue
        rt = 0.0 if (zero_rtol and atol[b] > 0.0) else rtol[b]
        o = out[b]
        for i in range(o.shape[0]):
            for j in range(o.shape[1]):
                o[i, j] = 0.0
        if hermitian:
            ev, vec = np.linalg.eigh(x)
            smax = 0.0
            for i in range(ev.shape[0]):
                smax = max(smax, abs(ev[i]))
            tol = max(atol[b], rt * smax)
            for p in range(ev.shape[0]):
                if abs(ev[p]) > tol:
                    r = 1.0 / ev[p]
                    for i in range(o.shape[0]):
                        f = vec[i, p] * r
                        for j in range(o.shape[1]):
                            o[i, j] += f * vec[j, p]
        else:
            uu, ss, vv = np.linalg.svd(x, full_matrices=False)
            smax = ss[0] if ss.shape[0] > 0 else 0.0
            tol = max(atol[b], rt * smax)
            for p in range(ss.shape[0]):
                if ss[p] > tol:
                    r = 1.0 / ss[p]
                    for i in range(o.shape[0]):
                        f = vv[p, i] * r
                        for j in range(o.shape[1]):
                            o[i, j] += f * uu[j, p]
"""),
    # a (B, m, n), rhs (B, m, k) -> x (B, n, k) min-norm least squares (SVD, cutoff
    # rcond * smax), rank (B,) int64, sv (B, min(m, n)), resid (B, k) = |a x - rhs|^2 per column
    "lstsq": ("a, rhs, x, rank, sv, resid, rcond, status", (_FINITE,), """\
        status[b] = 0
        if not (_finite(a[b]) and _finite(rhs[b])):
            status[b] = 1
            continue
        m = a.shape[1]
        n = a.shape[2]
        k = rhs.shape[2]
        uu, ss, vv = np.linalg.svd(a[b], full_matrices=False)
        smax = ss[0] if ss.shape[0] > 0 else 0.0
        r = 0
        for p in range(ss.shape[0]):
            sv[b, p] = ss[p]
            if ss[p] > rcond * smax:
                r += 1
        rank[b] = r
        xb = x[b]
        for j in range(n):
            for c in range(k):
                xb[j, c] = 0.0
        for p in range(r):
            inv = 1.0 / ss[p]
            for c in range(k):
                t = 0.0
                for i in range(m):
                    t += uu[i, p] * rhs[b, i, c]
                t *= inv
                for j in range(n):
                    xb[j, c] += vv[p, j] * t
        for c in range(k):
            t = 0.0
            for i in range(m):
                e = -rhs[b, i, c]
                for j in range(n):
                    e += a[b, i, j] * xb[j, c]
                t += e * e
            resid[b, c] = t
"""),
    # a, c, out (P, 3, Q) float32 holding bfloat16 values: the cross product along axis 1 with
    # each product and the difference rounded to bfloat16, as the CPU's bfloat16 kernel does
    "cross_bf16": ("a, c, out", (_BF16,), """\
        for j in range(out.shape[2]):
            a0 = a[b, 0, j]
            a1 = a[b, 1, j]
            a2 = a[b, 2, j]
            c0 = c[b, 0, j]
            c1 = c[b, 1, j]
            c2 = c[b, 2, j]
            out[b, 0, j] = _round_bf16(_round_bf16(a1 * c2) - _round_bf16(a2 * c1))
            out[b, 1, j] = _round_bf16(_round_bf16(a2 * c0) - _round_bf16(a0 * c2))
            out[b, 2, j] = _round_bf16(_round_bf16(a0 * c1) - _round_bf16(a1 * c0))
"""),
    # the same for float16: each product and the difference rounded to float16
    "cross_f16": ("a, c, out", (_F16,), """\
        for j in range(out.shape[2]):
            a0 = a[b, 0, j]
            a1 = a[b, 1, j]
            a2 = a[b, 2, j]
            c0 = c[b, 0, j]
            c1 = c[b, 1, j]
            c2 = c[b, 2, j]
            out[b, 0, j] = _round_f16(_round_f16(a1 * c2) - _round_f16(a2 * c1))
            out[b, 1, j] = _round_f16(_round_f16(a2 * c0) - _round_f16(a0 * c2))
            out[b, 2, j] = _round_f16(_round_f16(a0 * c1) - _round_f16(a1 * c0))
"""),
    # a (B, n, n) -> L D L^T in the lower triangle (upper zeroed), piv (B, n), info (B,)
    "ldl_factor": ("a, piv, info", (_SYTF2,), """\
        x = a[b]
        for i in range(x.shape[0]):
            for j in range(i + 1, x.shape[1]):
                x[i, j] = 0.0
        info[b] = _sytf2(x, piv[b])
"""),
    # ld (B, n, n), piv (B, n), x (B, n, k) in place; status[b] = 1 for an invalid pivot
    "ldl_solve": ("ld, piv, x, status", (_SYTRS,), """\
        status[b] = 0 if _sytrs(ld[b], piv[b], x[b]) else 1
"""),
}


def render(kind: str, parallel: bool) -> tuple[str, str]:
    """`k(<params of kind>)`: the batch loop over `kind`'s body (prange when parallel)."""
    params, helpers, body = _KERNELS[kind]
    name = kernel_name(f"linalg_{kind}", params, body, helpers, parallel)
    rng = "prange" if parallel else "range"
    first = params.split(",")[0].strip()
    lines = list(dict.fromkeys(helpers))   # a helper once, in order
    # NOTE: helpers get their flags as `yes`/`no`, runtime booleans: a literal True/False
    # would make Numba compile one specialization of the helper per flag combination
    lines.append(HEADER.format(extra=", parallel=True" if parallel else "")
                 + f"def {name}({params}):\n"
                 + f"    yes = {first}.shape[0] >= 0\n"
                 + "    no = not yes\n"
                 + f"    for b in {rng}({first}.shape[0]):\n"
                 + "        if True:\n"
                 + "".join("    " + ln + "\n" for ln in body.splitlines()))
    return "\n".join(lines), name


# the complex batch kernels ("zlu_factor", ...): same render, complex128 scratch
_KERNELS.update(_COMPLEX_KERNELS)
