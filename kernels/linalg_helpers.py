"""Linear-algebra family, part one: the one-matrix helpers (LAPACK getf2/trsm/geqr2/org2r/orm2r/
potf2/sytf2 step by step, as Numba source strings) that the batch kernels in kernels/linalg.py
inline. Each constant is the source of one `@njit` helper; kernels/linalg.py lists which kernel
needs which. Moved out of kernels/linalg.py unchanged (the rendered source, and so every cache key,
is the same).

>>> from eager_neuron.kernels.linalg_helpers import _GETRF
>>> "def _getrf(x, piv):" in _GETRF
True
"""

from __future__ import annotations

from .halfround import ROUND_BF16, ROUND_F16

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

# the half types' rounding (kernels/halfround.py): bfloat16 / float16 kernels round each step
_BF16 = ROUND_BF16
_F16 = ROUND_F16
