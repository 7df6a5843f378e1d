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

>>> src, name = render("lu_factor", False)
>>> "_getrf(a[b], piv[b])" in src
True
"""

from __future__ import annotations

from .elementwise import kernel_name

HEADER = '@njit(error_model="numpy", nogil=True{extra})\n'
_HELPER = '@njit(error_model="numpy", nogil=True)\n'

# -- one-matrix helpers, shared by the batch kernels below ----------------------------------------
_GETRF = _HELPER + '''\
def _getrf(x, piv):
    # LAPACK getf2 in place: partial pivoting on the first largest |x[i, j]|; returns info
    m, n = x.shape
    info = 0
    for j in range(min(m, n)):
        p = j
        best = abs(x[j, j])
        for i in range(j + 1, m):
            v = abs(x[i, j])
            if v > best:
                best = v
                p = i
        piv[j] = p + 1
        if x[p, j] != 0.0:
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

_TRSM = _HELPER + '''\
def _trsm(a, x, upper, trans, unit):
    # x <- op(T)^-1 x, T the upper or lower triangle of a, op(T) = T.T when trans
    n = a.shape[0]
    k = x.shape[1]
    if upper != trans:
        for i in range(n - 1, -1, -1):
            for j in range(i + 1, n):
                f = a[j, i] if trans else a[i, j]
                for c in range(k):
                    x[i, c] -= f * x[j, c]
            if not unit:
                d = a[i, i]
                for c in range(k):
                    x[i, c] /= d
    else:
        for i in range(n):
            for j in range(i):
                f = a[j, i] if trans else a[i, j]
                for c in range(k):
                    x[i, c] -= f * x[j, c]
            if not unit:
                d = a[i, i]
                for c in range(k):
                    x[i, c] /= d
'''

_SWAPS = _HELPER + '''\
def _swaps(x, piv, reverse):
    # apply getrf's row interchanges to x (forward: P.T x; reverse: P x); False if out of range
    n = x.shape[0]
    k = piv.shape[0]
    for t in range(k):
        i = k - 1 - t if reverse else t
        p = piv[i] - 1
        if p < 0 or p >= n:
            return False
        if p != i:
            for c in range(x.shape[1]):
                v = x[i, c]
                x[i, c] = x[p, c]
                x[p, c] = v
    return True
'''

_GEQRF = _HELPER + '''\
def _geqrf(x, tau):
    # LAPACK geqr2: Householder vectors below the diagonal, R on and above it (dlarfg's signs)
    m, n = x.shape
    for j in range(min(m, n)):
        alpha = x[j, j]
        ss = 0.0
        for i in range(j + 1, m):
            ss += x[i, j] * x[i, j]
        if ss == 0.0:
            tau[j] = 0.0
        else:
            beta = -math.copysign(math.sqrt(alpha * alpha + ss), alpha)
            tau[j] = (beta - alpha) / beta
            s = 1.0 / (alpha - beta)
            for i in range(j + 1, m):
                x[i, j] *= s
            x[j, j] = beta
        t = tau[j]
        if t != 0.0:
            for c in range(j + 1, n):
                w = x[j, c]
                for i in range(j + 1, m):
                    w += x[i, j] * x[i, c]
                w *= t
                x[j, c] -= w
                for i in range(j + 1, m):
                    x[i, c] -= w * x[i, j]
'''

_ORGQR = _HELPER + '''\
def _orgqr(a, tau, k):
    # LAPACK org2r: the first n columns of H(0) ... H(k-1) from the reflectors in a[:, :k]
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
                w = 0.0
                for r in range(i, m):
                    w += a[r, i] * a[r, c]
                w *= t
                for r in range(i, m):
                    a[r, c] -= w * a[r, i]
        for r in range(i + 1, m):
            a[r, i] *= -t
        a[i, i] = 1.0 - t
        for r in range(i):
            a[r, i] = 0.0
'''

_ORMQR = _HELPER + '''\
def _ormqr(a, tau, c, left, trans):
    # LAPACK orm2r: c <- op(Q) c (left) or c op(Q) (right), Q = H(0) ... H(k-1) from a[:, :k]
    k = tau.shape[0]
    m, n = c.shape
    forward = left == trans
    for t in range(k):
        i = t if forward else k - 1 - t
        ti = tau[i]
        if ti == 0.0:
            continue
        if left:
            for col in range(n):
                w = c[i, col]
                for r in range(i + 1, m):
                    w += a[r, i] * c[r, col]
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
                    c[row, r] -= w * a[r, i]
'''

_POTRF = _HELPER + '''\
def _potrf(x):
    # LAPACK potf2 (lower): reads the lower triangle, zeroes the strict upper one; returns info
    n = x.shape[0]
    for i in range(n):
        for j in range(i + 1, n):
            x[i, j] = 0.0
    for j in range(n):
        s = x[j, j]
        for p in range(j):
            s -= x[j, p] * x[j, p]
        if not s > 0.0:
            x[j, j] = s
            return j + 1
        d = math.sqrt(s)
        x[j, j] = d
        for i in range(j + 1, n):
            s = x[i, j]
            for p in range(j):
                s -= x[i, p] * x[j, p]
            x[i, j] = s / d
    return 0
'''

_SYTF2 = _HELPER + '''\
def _sytf2(a, piv):
    # LAPACK sytf2 (lower, Bunch-Kaufman): L D L^T in the lower triangle, 1-based pivots that
    # are negative for 2x2 blocks; returns info (the first exactly-zero pivot column)
    n = a.shape[0]
    alpha = (1.0 + math.sqrt(17.0)) / 8.0
    info = 0
    k = 0
    while k < n:
        kstep = 1
        absakk = abs(a[k, k])
        imax = min(k + 1, n - 1)
        colmax = 0.0
        for i in range(k + 1, n):
            if abs(a[i, k]) > colmax:
                colmax = abs(a[i, k])
                imax = i
        kp = k
        if max(absakk, colmax) == 0.0 or absakk != absakk:
            if info == 0:
                info = k + 1
        else:
            if absakk < alpha * colmax:
                rowmax = -1.0
                for j in range(k, imax):
                    if abs(a[imax, j]) > rowmax:
                        rowmax = abs(a[imax, j])
                jm = -1.0
                for i in range(imax + 1, n):
                    if abs(a[i, imax]) > jm:
                        jm = abs(a[i, imax])
                rowmax = max(rowmax, jm)
                if absakk >= alpha * colmax * (colmax / rowmax):
                    kp = k
                elif abs(a[imax, imax]) >= alpha * rowmax:
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
                    t = a[j, kk]
                    a[j, kk] = a[kp, j]
                    a[kp, j] = t
                t = a[kk, kk]
                a[kk, kk] = a[kp, kp]
                a[kp, kp] = t
                if kstep == 2:
                    t = a[k + 1, k]
                    a[k + 1, k] = a[kp, k]
                    a[kp, k] = t
            if kstep == 1:
                if k < n - 1:
                    d11 = 1.0 / a[k, k]
                    for j in range(k + 1, n):
                        f = d11 * a[j, k]
                        for i in range(j, n):
                            a[i, j] -= a[i, k] * f
                    for i in range(k + 1, n):
                        a[i, k] *= d11
            elif k < n - 2:
                d21 = a[k + 1, k]
                d11 = a[k + 1, k + 1] / d21
                d22 = a[k, k] / d21
                t = 1.0 / (d11 * d22 - 1.0)
                d21 = t / d21
                for j in range(k + 2, n):
                    wk = d21 * (d11 * a[j, k] - a[j, k + 1])
                    wkp1 = d21 * (d22 * a[j, k + 1] - a[j, k])
                    for i in range(j, n):
                        a[i, j] = a[i, j] - a[i, k] * wk - a[i, k + 1] * wkp1
                    a[j, k] = wk
                    a[j, k + 1] = wkp1
        if kstep == 1:
            piv[k] = kp + 1
        else:
            piv[k] = -(kp + 1)
            piv[k + 1] = -(kp + 1)
        k += kstep
    return info
'''

_SYTRS = _HELPER + '''\
def _swap_rows(x, i, p):
    for c in range(x.shape[1]):
        t = x[i, c]
        x[i, c] = x[p, c]
        x[p, c] = t


@njit(error_model="numpy", nogil=True)
def _sytrs(a, piv, x):
    # LAPACK sytrs (lower): x <- A^-1 x with A = L D L^T from _sytf2; False on a bad pivot
    n = a.shape[0]
    m = x.shape[1]
    for k in range(n):
        if piv[k] == 0 or abs(piv[k]) > n:
            return False
    k = 0
    while k < n:
        if piv[k] > 0:
            _swap_rows(x, k, piv[k] - 1)
            for i in range(k + 1, n):
                for c in range(m):
                    x[i, c] -= a[i, k] * x[k, c]
            d = 1.0 / a[k, k]
            for c in range(m):
                x[k, c] *= d
            k += 1
        else:
            if k + 1 >= n:
                return False
            _swap_rows(x, k + 1, -piv[k] - 1)
            for i in range(k + 2, n):
                for c in range(m):
                    x[i, c] -= a[i, k] * x[k, c]
            for i in range(k + 2, n):
                for c in range(m):
                    x[i, c] -= a[i, k + 1] * x[k + 1, c]
            akm1k = a[k + 1, k]
            akm1 = a[k, k] / akm1k
            ak = a[k + 1, k + 1] / akm1k
            denom = akm1 * ak - 1.0
            for c in range(m):
                bkm1 = x[k, c] / akm1k
                bk = x[k + 1, c] / akm1k
                x[k, c] = (ak * bkm1 - bk) / denom
                x[k + 1, c] = (akm1 * bk - bkm1) / denom
            k += 2
    k = n - 1
    while k >= 0:
        if piv[k] > 0:
            for c in range(m):
                s = 0.0
                for i in range(k + 1, n):
                    s += x[i, c] * a[i, k]
                x[k, c] -= s
            _swap_rows(x, k, piv[k] - 1)
            k -= 1
        else:
            if k < 1:
                return False
            for c in range(m):
                s = 0.0
                t = 0.0
                for i in range(k + 1, n):
                    s += x[i, c] * a[i, k]
                    t += x[i, c] * a[i, k - 1]
                x[k, c] -= s
                x[k - 1, c] -= t
            _swap_rows(x, k, -piv[k] - 1)
            k -= 2
    return True
'''

_SYM = _HELPER + '''\
def _symmetrize(x, lower):
    # the full symmetric matrix from one triangle (LAPACK reads only that one)
    n = x.shape[0]
    for i in range(n):
        for j in range(i + 1, n):
            if lower:
                x[i, j] = x[j, i]
            else:
                x[j, i] = x[i, j]
'''

_FINITE = _HELPER + '''\
def _finite(x):
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            if not math.isfinite(x[i, j]):
                return False
    return True
'''

_BF16 = _HELPER + '''\
def _bf16(x):
    # the nearest-even bfloat16 value of x (8 significant bits); 0, inf and nan pass through
    if x == 0.0 or not math.isfinite(x):
        return x
    m, e = math.frexp(x)
    return math.ldexp(np.rint(m * 256.0), e - 8)
'''

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
            out[b, 0, j] = _bf16(_bf16(a1 * c2) - _bf16(a2 * c1))
            out[b, 1, j] = _bf16(_bf16(a2 * c0) - _bf16(a0 * c2))
            out[b, 2, j] = _bf16(_bf16(a0 * c1) - _bf16(a1 * c0))
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
    """`k(a, out)`: a, out (B, n, n) C arrays of `np_type` (float32 or float64)."""
    thetas = _THETAS[np_type]
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
    return src, name
