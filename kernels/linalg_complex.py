"""Linear-algebra family, complex part: the batch kernels of kernels/linalg.py for complex128
scratch (complex64 and complex128 inputs), LAPACK's complex routines step by step.

(Over 500 lines on purpose: each complex routine mirrors its real counterpart in kernels/linalg.py
step for step, and reads best next to the others it calls: getrf/getrs, potrf, trsm, sytrf.)

Same shape as the real kernels (a body over one batch index `b`, flags as runtime arguments);
kernels/linalg.py merges `KERNELS` into its table, so `render("zlu_factor", ...)` works like any
other kind. Where the complex routines differ from the real ones:
- zgetf2 pivots on |re| + |im| (izamax's cabs1), not on the modulus, so pivots match the CPU's;
- solves take a `conj` flag besides `trans`: A^H x = b is the transposed solve with conjugated
  entries (torch.linalg.lu_solve(adjoint=True), and the backward of linalg.solve);
- potf2 factors a Hermitian matrix: L L^H, real positive diagonal, the diagonal's imaginary
  part ignored as LAPACK does;
- zlarfg's reflectors: beta = -sign(re alpha) * |(alpha, x)|, tau = ((beta - re alpha) / beta,
  -im alpha / beta), applied as H^H = I - conj(tau) v v^H by geqr2 and as H by ung2r;
- eigh and SVD call Numba's np.linalg on complex128 (LAPACK zheevd / zgesdd), after filling the
  Hermitian matrix from the triangle PyTorch reads.

>>> "def _zgetrf(x, piv):" in KERNELS["zlu_factor"][1][0]
True
"""

from __future__ import annotations

from .linalg_helpers import _HELPER, _SWAPS, _SYTF2, _SYTRS

# LAPACK zsytf2 / zsytrs (complex symmetric, not Hermitian: no conjugation): the real
# Bunch-Kaufman code with zsytf2's pivot measure CABS1(z) = |re z| + |im z| (so pivots equal the
# CPU's) and complex accumulators
_CABS1 = _HELPER + """\
def _cabs1(z):
    return abs(z.real) + abs(z.imag)
"""
_ZSYTF2 = _SYTF2.replace("def _sytf2(", "def _zsytf2(").replace("abs(a[", "_cabs1(a[")
_ZSYTRS = _SYTRS.replace("def _sytrs(", "def _zsytrs(").replace("s = 0.0", "s = 0j") \
    .replace("t = 0.0", "t = 0j").replace("def _swap_rows(", "def _zswap_rows(") \
    .replace("_swap_rows(x,", "_zswap_rows(x,")

# LAPACK zhetf2 / zhetrs (Hermitian, lower): Bunch-Kaufman on L D L^H. The pivot measure is
# CABS1 off the diagonal and |re| on it (the diagonal of a Hermitian matrix is real: its
# imaginary part is ignored and written as 0); rank-1 and rank-2 updates conjugate the second
# factor, and 2x2 blocks of D are Hermitian [[d11, conj(d21)], [d21, d22]]
_ZHETF2 = _HELPER + '''\
def _zhetf2(a, piv):
    # returns info (the first exactly-zero pivot column); 1-based pivots, negative for 2x2
    n = a.shape[0]
    alpha = (1.0 + math.sqrt(17.0)) / 8.0
    info = 0
    k = 0
    while k < n:
        kstep = 1
        absakk = abs(a[k, k].real)
        imax = k
        colmax = 0.0
        if k < n - 1:
            imax = k + 1
            colmax = -1.0
            for i in range(k + 1, n):
                v = abs(a[i, k].real) + abs(a[i, k].imag)
                if v > colmax:
                    colmax = v
                    imax = i
        kp = k
        if max(absakk, colmax) == 0.0 or absakk != absakk:
            if info == 0:
                info = k + 1
            a[k, k] = a[k, k].real
        else:
            if absakk < alpha * colmax:
                rowmax = -1.0
                for j in range(k, imax):
                    v = abs(a[imax, j].real) + abs(a[imax, j].imag)
                    if v > rowmax:
                        rowmax = v
                jm = -1.0
                for i in range(imax + 1, n):
                    v = abs(a[i, imax].real) + abs(a[i, imax].imag)
                    if v > jm:
                        jm = v
                rowmax = max(rowmax, jm)
                if absakk >= alpha * colmax * (colmax / rowmax):
                    kp = k
                elif abs(a[imax, imax].real) >= alpha * rowmax:
                    kp = imax
                else:
                    kp = imax
                    kstep = 2
            kk = k + kstep - 1
            if kp != kk:
                for i in range(kp + 1, n):
                    t = a[i, kk]
                    a[i, kk] = a[i, kp]
                    a[i, kp] = t
                for j in range(kk + 1, kp):
                    t = a[j, kk].conjugate()
                    a[j, kk] = a[kp, j].conjugate()
                    a[kp, j] = t
                a[kp, kk] = a[kp, kk].conjugate()
                r1 = a[kk, kk].real
                a[kk, kk] = a[kp, kp].real
                a[kp, kp] = r1
                if kstep == 2:
                    a[k, k] = a[k, k].real
                    t = a[k + 1, k]
                    a[k + 1, k] = a[kp, k]
                    a[kp, k] = t
            else:
                a[k, k] = a[k, k].real
                if kstep == 2:
                    a[k + 1, k + 1] = a[k + 1, k + 1].real
            if kstep == 1:
                if k < n - 1:
                    r1 = 1.0 / a[k, k].real
                    # zher: A22 -= r1 x x^H (lower triangle, real diagonal)
                    for j in range(k + 1, n):
                        xj = a[j, k]
                        if xj != 0:
                            t = -r1 * xj.conjugate()
                            a[j, j] = a[j, j].real + (t * xj).real
                            for i in range(j + 1, n):
                                a[i, j] += a[i, k] * t
                        else:
                            a[j, j] = a[j, j].real
                    for i in range(k + 1, n):
                        a[i, k] *= r1
            elif k < n - 2:
                d = abs(a[k + 1, k])
                d11 = a[k + 1, k + 1].real / d
                d22 = a[k, k].real / d
                tt = 1.0 / (d11 * d22 - 1.0)
                d21 = a[k + 1, k] / d
                d = tt / d
                for j in range(k + 2, n):
                    wk = d * (d11 * a[j, k] - d21 * a[j, k + 1])
                    wkp1 = d * (d22 * a[j, k + 1] - d21.conjugate() * a[j, k])
                    for i in range(j, n):
                        a[i, j] = a[i, j] - a[i, k] * wk.conjugate() \\
                            - a[i, k + 1] * wkp1.conjugate()
                    a[j, k] = wk
                    a[j, k + 1] = wkp1
                    a[j, j] = a[j, j].real
        if kstep == 1:
            piv[k] = kp + 1
        else:
            piv[k] = -(kp + 1)
            piv[k + 1] = -(kp + 1)
        k += kstep
    return info
'''

_ZHETRS = _HELPER + '''\
def _zhswap_rows(x, i, p):
    for c in range(x.shape[1]):
        t = x[i, c]
        x[i, c] = x[p, c]
        x[p, c] = t


@njit(error_model="numpy", nogil=True)
def _zhetrs(a, piv, x):
    # LAPACK zhetrs (lower): x <- A^-1 x with A = L D L^H from _zhetf2; False on a bad pivot
    n = a.shape[0]
    m = x.shape[1]
    for k in range(n):
        if piv[k] == 0 or abs(piv[k]) > n:
            return False
    k = 0
    while k < n:
        if piv[k] > 0:
            _zhswap_rows(x, k, piv[k] - 1)
            for i in range(k + 1, n):
                for c in range(m):
                    x[i, c] -= a[i, k] * x[k, c]
            s = 1.0 / a[k, k].real
            for c in range(m):
                x[k, c] *= s
            k += 1
        else:
            if k + 1 >= n:
                return False
            _zhswap_rows(x, k + 1, -piv[k] - 1)
            for i in range(k + 2, n):
                for c in range(m):
                    x[i, c] -= a[i, k] * x[k, c]
            for i in range(k + 2, n):
                for c in range(m):
                    x[i, c] -= a[i, k + 1] * x[k + 1, c]
            akm1k = a[k + 1, k]
            akm1 = a[k, k] / akm1k.conjugate()
            ak = a[k + 1, k + 1] / akm1k
            denom = akm1 * ak - 1.0
            for c in range(m):
                bkm1 = x[k, c] / akm1k.conjugate()
                bk = x[k + 1, c] / akm1k
                x[k, c] = (ak * bkm1 - bk) / denom
                x[k + 1, c] = (akm1 * bk - bkm1) / denom
            k += 2
    k = n - 1
    while k >= 0:
        if piv[k] > 0:
            for c in range(m):
                s = 0j
                for i in range(k + 1, n):
                    s += x[i, c] * a[i, k].conjugate()
                x[k, c] -= s
            _zhswap_rows(x, k, piv[k] - 1)
            k -= 1
        else:
            if k < 1:
                return False
            for c in range(m):
                s = 0j
                t = 0j
                for i in range(k + 1, n):
                    s += x[i, c] * a[i, k].conjugate()
                    t += x[i, c] * a[i, k - 1].conjugate()
                x[k, c] -= s
                x[k - 1, c] -= t
            _zhswap_rows(x, k, -piv[k] - 1)
            k -= 2
    return True
'''

_ZGETRF = _HELPER + '''\
def _zgetrf(x, piv):
    # LAPACK zgetf2 in place: the pivot is the first largest |re| + |im|; returns info
    m, n = x.shape
    info = 0
    for j in range(min(m, n)):
        p = j
        best = abs(x[j, j].real) + abs(x[j, j].imag)
        for i in range(j + 1, m):
            v = abs(x[i, j].real) + abs(x[i, j].imag)
            if v > best:
                best = v
                p = i
        piv[j] = p + 1
        if x[p, j] != 0:
            if p != j:
                for c in range(n):
                    t = x[j, c]
                    x[j, c] = x[p, c]
                    x[p, c] = t
            d = x[j, j]
            for i in range(j + 1, m):
                x[i, j] /= d
        elif info == 0:
            info = j + 1
        for i in range(j + 1, m):
            f = x[i, j]
            for c in range(j + 1, n):
                x[i, c] -= f * x[j, c]
    return info
'''

_ZTRSM = _HELPER + '''\
def _ztrsm(a, x, upper, trans, conj, unit):
    # x <- op(T)^-1 x, T the upper or lower triangle of a; op(T) = T, T.T, conj(T) or T^H
    n = a.shape[0]
    k = x.shape[1]
    if upper != trans:
        for i in range(n - 1, -1, -1):
            for j in range(i + 1, n):
                f = a[j, i] if trans else a[i, j]
                if conj:
                    f = f.conjugate()
                for c in range(k):
                    x[i, c] -= f * x[j, c]
            if not unit:
                d = a[i, i].conjugate() if conj else a[i, i]
                for c in range(k):
                    x[i, c] /= d
    else:
        for i in range(n):
            for j in range(i):
                f = a[j, i] if trans else a[i, j]
                if conj:
                    f = f.conjugate()
                for c in range(k):
                    x[i, c] -= f * x[j, c]
            if not unit:
                d = a[i, i].conjugate() if conj else a[i, i]
                for c in range(k):
                    x[i, c] /= d
'''

_ZPOTRF = _HELPER + '''\
def _zpotrf(x):
    # LAPACK zpotf2 (lower): Hermitian from the lower triangle, strict upper zeroed; info
    n = x.shape[0]
    for i in range(n):
        for j in range(i + 1, n):
            x[i, j] = 0.0
    for j in range(n):
        s = x[j, j].real
        for p in range(j):
            v = x[j, p]
            s -= v.real * v.real + v.imag * v.imag
        if not s > 0.0:
            x[j, j] = s
            return j + 1
        d = math.sqrt(s)
        x[j, j] = d
        for i in range(j + 1, n):
            t = x[i, j]
            for p in range(j):
                t -= x[i, p] * x[j, p].conjugate()
            x[i, j] = t / d
    return 0
'''

_ZGEQRF = _HELPER + '''\
def _zgeqrf(x, tau):
    # LAPACK zgeqr2: zlarfg reflectors below the diagonal, R on and above it; each H(j)^H
    # = I - conj(tau) v v^H applied to the trailing columns
    m, n = x.shape
    for j in range(min(m, n)):
        alpha = x[j, j]
        ss = 0.0
        for i in range(j + 1, m):
            v = x[i, j]
            ss += v.real * v.real + v.imag * v.imag
        ar = alpha.real
        ai = alpha.imag
        if ss == 0.0 and ai == 0.0:
            tau[j] = 0.0
        else:
            beta = -math.copysign(math.sqrt(ar * ar + ai * ai + ss), ar)
            tau[j] = complex((beta - ar) / beta, -ai / beta)
            s = 1.0 / (alpha - beta)
            for i in range(j + 1, m):
                x[i, j] *= s
            x[j, j] = beta
        t = tau[j].conjugate()
        if t != 0:
            for c in range(j + 1, n):
                w = x[j, c]
                for i in range(j + 1, m):
                    w += x[i, j].conjugate() * x[i, c]
                w *= t
                x[j, c] -= w
                for i in range(j + 1, m):
                    x[i, c] -= w * x[i, j]
'''

_ZUNGQR = _HELPER + '''\
def _zungqr(a, tau, k):
    # LAPACK zung2r: the first n columns of H(0) ... H(k-1), H(i) = I - tau v v^H
    m, n = a.shape
    for j in range(k, n):
        for i in range(m):
            a[i, j] = 0.0
        a[j, j] = 1.0
    for i in range(k - 1, -1, -1):
        t = tau[i]
        if i < n - 1:
            a[i, i] = 1.0
            for c in range(i + 1, n):
                w = 0j
                for r in range(i, m):
                    w += a[r, i].conjugate() * a[r, c]
                w *= t
                for r in range(i, m):
                    a[r, c] -= w * a[r, i]
        for r in range(i + 1, m):
            a[r, i] *= -t
        a[i, i] = 1.0 - t
        for r in range(i):
            a[r, i] = 0.0
'''

_ZUNMQR = _HELPER + '''\
def _zunmqr(a, tau, c, left, trans):
    # LAPACK zunm2r: c <- op(Q) c (left) or c op(Q), op(Q) = Q or Q^H (trans), Q = H(0) ...
    # H(k-1), H(i) = I - tau v v^H (H(i)^H takes conj(tau))
    k = tau.shape[0]
    m, n = c.shape
    forward = left == trans
    for t in range(k):
        i = t if forward else k - 1 - t
        ti = tau[i].conjugate() if trans else tau[i]
        if ti == 0:
            continue
        if left:
            for col in range(n):
                w = c[i, col]
                for r in range(i + 1, m):
                    w += a[r, i].conjugate() * c[r, col]
                w *= ti
                c[i, col] -= w
                for r in range(i + 1, m):
                    c[r, col] -= w * a[r, i]
        else:
            for row in range(m):
                w = c[row, i]
                for r in range(i + 1, n):
                    w += c[row, r] * a[r, i]
                w *= ti
                c[row, i] -= w
                for r in range(i + 1, n):
                    c[row, r] -= w * a[r, i].conjugate()
'''

_HERM = _HELPER + '''\
def _hermitize(x, lower):
    # the Hermitian matrix from one triangle (LAPACK reads that one; the diagonal is real)
    n = x.shape[0]
    for i in range(n):
        x[i, i] = x[i, i].real
        for j in range(i + 1, n):
            if lower:
                x[i, j] = x[j, i].conjugate()
            else:
                x[j, i] = x[i, j].conjugate()
'''

_ZFINITE = _HELPER + '''\
def _zfinite(x):
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            if not (math.isfinite(x[i, j].real) and math.isfinite(x[i, j].imag)):
                return False
    return True
'''

# name -> (parameters, helpers, body over one batch index b): the complex batch kernels
KERNELS = {
    # complex symmetric LDL^T (linalg.ldl_factor/ldl_solve with hermitian=False)
    "zldl_factor": ("a, piv, info", (_CABS1, _ZSYTF2), """\
        x = a[b]
        for i in range(x.shape[0]):
            for j in range(i + 1, x.shape[1]):
                x[i, j] = 0.0
        info[b] = _zsytf2(x, piv[b])
"""),
    "zldl_solve": ("ld, piv, x, status", (_ZSYTRS,), """\
        status[b] = 0 if _zsytrs(ld[b], piv[b], x[b]) else 1
"""),
    # Hermitian LDL^H (linalg.ldl_factor/ldl_solve with hermitian=True)
    "zhldl_factor": ("a, piv, info", (_ZHETF2,), """\
        x = a[b]
        for i in range(x.shape[0]):
            for j in range(i + 1, x.shape[1]):
                x[i, j] = 0.0
        info[b] = _zhetf2(x, piv[b])
"""),
    "zhldl_solve": ("ld, piv, x, status", (_ZHETRS,), """\
        status[b] = 0 if _zhetrs(ld[b], piv[b], x[b]) else 1
"""),
    # a (B, m, n) -> LU in place; piv (B, min(m, n)) int32; info (B,) int32
    "zlu_factor": ("a, piv, info", (_ZGETRF,), """\
        info[b] = _zgetrf(a[b], piv[b])
"""),
    # lu (B, n, n), piv (B, n), x (B, n, k) in place: op(A) x = b with op(A) = A, A.T (trans),
    # conj(A) (conj) or A^H (both); identity: x starts as the identity (the inverse)
    "zlu_solve": ("lu, piv, x, status, trans, conj, identity", (_ZTRSM, _SWAPS), """\
        status[b] = 0
        if identity:
            for i in range(x.shape[1]):
                for j in range(x.shape[2]):
                    x[b, i, j] = 1.0 if i == j else 0.0
        if not trans:
            if not _swaps(x[b], piv[b], no):
                status[b] = 1
                continue
            _ztrsm(lu[b], x[b], no, no, conj, yes)
            _ztrsm(lu[b], x[b], yes, no, conj, no)
        else:
            _ztrsm(lu[b], x[b], yes, yes, conj, no)
            _ztrsm(lu[b], x[b], no, yes, conj, yes)
            if not _swaps(x[b], piv[b], yes):
                status[b] = 1
"""),
    # a (B, n, n) triangular, x (B, n, k) in place
    "ztrsm": ("a, x, upper, trans, conj, unit", (_ZTRSM,), """\
        _ztrsm(a[b], x[b], upper, trans, conj, unit)
"""),
    # lu (B, n, n), piv (B, n) -> det, sign (complex), logabs (real) (B,), as PyTorch forms them
    # from LU: det = perm * prod(diag), sign = perm * prod(sgn(diag)), logabs = sum log|diag|
    "zlu_det": ("lu, piv, det, sign, logabs", (), """\
        s = 1.0
        for i in range(piv.shape[1]):
            if piv[b, i] != i + 1:
                s = -s
        d = complex(s, 0.0)
        g = complex(s, 0.0)
        la = 0.0
        for i in range(lu.shape[1]):
            u = lu[b, i, i]
            au = abs(u)
            d *= u
            g = g * (u / au) if au != 0.0 else 0j
            la += math.log(au)
        det[b] = d
        sign[b] = g
        logabs[b] = la
"""),
    # a (B, n, n): lower Cholesky factor (L L^H) in place, upper triangle zeroed; info (B,)
    "zcholesky": ("a, info", (_ZPOTRF,), """\
        info[b] = _zpotrf(a[b])
"""),
    # l (B, n, n) lower factor, x (B, n, k) in place: L L^H x = b; identity: x starts as I
    "zcholesky_solve": ("l, x, identity", (_ZTRSM,), """\
        if identity:
            for i in range(x.shape[1]):
                for j in range(x.shape[2]):
                    x[b, i, j] = 1.0 if i == j else 0.0
        _ztrsm(l[b], x[b], no, no, no, no)
        _ztrsm(l[b], x[b], no, yes, yes, no)
"""),
    # a (B, m, n) -> zgeqrf in place, tau (B, min(m, n))
    "zgeqrf": ("a, tau", (_ZGEQRF,), """\
        _zgeqrf(a[b], tau[b])
"""),
    # q (B, m, n) with reflectors in the first k columns -> Q in place
    "zungqr": ("q, tau", (_ZUNGQR,), """\
        _zungqr(q[b], tau[b], tau.shape[1])
"""),
    # a (B, nq, k) reflectors, tau (B, k), c (B, m, n) in place
    "zormqr": ("a, tau, c, left, trans", (_ZUNMQR,), """\
        _zunmqr(a[b], tau[b], c[b], left, trans)
"""),
    # a (B, m, n), rhs (B, m, k) -> x (B, n, k) = V diag(1/s) U^H rhs over s > rcond * smax,
    # rank (B,), sv (B, min(m, n)) real, resid (B, k) = |a x - rhs|^2 per column (real)
    "zlstsq": ("a, rhs, x, rank, sv, resid, rcond, status", (_ZFINITE,), """\
        status[b] = 0
        if not (_zfinite(a[b]) and _zfinite(rhs[b])):
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
                t = 0j
                for i in range(m):
                    t += uu[i, p].conjugate() * rhs[b, i, c]
                t *= inv
                for j in range(n):
                    xb[j, c] += vv[p, j].conjugate() * t
        for c in range(k):
            t = 0.0
            for i in range(m):
                e = -rhs[b, i, c]
                for j in range(n):
                    e += a[b, i, j] * xb[j, c]
                t += e.real * e.real + e.imag * e.imag
            resid[b, c] = t
"""),
    # a (B, m, n) -> zgeqrf; r (B, rq, n) = triu(a[:rq]); q (B, m, qc) = Q's first qc columns
    "zqr": ("a, tau, q, r", (_ZGEQRF, _ZUNGQR), """\
        x = a[b]
        _zgeqrf(x, tau[b])
        for i in range(r.shape[1]):
            for j in range(r.shape[2]):
                r[b, i, j] = x[i, j] if (j >= i and i < x.shape[0]) else 0.0
        qc = q.shape[2]
        if qc > 0:
            for i in range(q.shape[1]):
                for j in range(qc):
                    q[b, i, j] = x[i, j] if j < x.shape[1] else 0.0
            _zungqr(q[b], tau[b], tau.shape[1])
"""),
    # a (B, n, n) Hermitian (one triangle read) -> w (B, n) real ascending, v (B, n, n)
    "zeigh": ("a, w, v, lower, want_v, status", (_HERM, _ZFINITE), """\
        x = a[b]
        _hermitize(x, lower)
        status[b] = 0
        if not _zfinite(x):
            status[b] = 1
            continue
        ev, vec = np.linalg.eigh(x)
        w[b] = ev
        if want_v:
            v[b] = vec
"""),
    # a (B, m, n) -> u (B, m, m|k), s (B, k) real, vt (B, n|k, n) (want_uv), full_matrices
    "zsvd": ("a, u, s, vt, full, want_uv, status", (_ZFINITE,), """\
        status[b] = 0
        if not _zfinite(a[b]):
            status[b] = 1
            continue
        uu, ss, vv = np.linalg.svd(a[b], full_matrices=full)
        s[b] = ss
        if want_uv:
            u[b] = uu
            vt[b] = vv
"""),
    # a (B, m, n) -> out (B, n, m) pseudo-inverse V diag(1/s) U^H over s > max(atol, rtol*smax)
    # (hermitian: V diag(1/w) V^H over |w| > tol)
    "zpinv": ("a, atol, rtol, out, hermitian, zero_rtol, status", (_HERM, _ZFINITE), """\
        x = a[b]
        status[b] = 0
        if hermitian:
            _hermitize(x, True)
        if not _zfinite(x):
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
                            o[i, j] += f * vec[j, p].conjugate()
        else:
            uu, ss, vv = np.linalg.svd(x, full_matrices=False)
            smax = ss[0] if ss.shape[0] > 0 else 0.0
            tol = max(atol[b], rt * smax)
            for p in range(ss.shape[0]):
                if ss[p] > tol:
                    r = 1.0 / ss[p]
                    for i in range(o.shape[0]):
                        f = vv[p, i].conjugate() * r
                        for j in range(o.shape[1]):
                            o[i, j] += f * uu[j, p].conjugate()
"""),
}
