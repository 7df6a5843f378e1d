"""Kernels for data-dependent ops that used to reach the CPU fallback: repeat_interleave's index
form and unique along a dim.

unique_rows sorts row indices of an (n, m) array lexicographically (a stable bottom-up merge
sort, as std::sort's order: equal rows keep their first index first) and numbers the groups of
equal rows; unique_rows_fill writes the distinct rows, each input row's group (the inverse) and
the group sizes.

>>> src, name = render("repeat_count")
>>> name
'repeat_count'
"""

from __future__ import annotations

HEADER = '@njit(error_model="numpy", nogil=True)\n'

_REPEAT_COUNT = """\
def repeat_count(reps, res):
    total = 0
    neg = 0
    for i in range(reps.shape[0]):
        r = reps[i]
        if r < 0:
            neg = 1
        else:
            total += r
    res[0] = total
    res[1] = neg
"""

_REPEAT_FILL = """\
def repeat_fill(out, reps):
    k = 0
    for i in range(reps.shape[0]):
        for j in range(reps[i]):
            out[k] = i
            k += 1
"""

_UNIQUE_ROWS = """\
@njit
def _row_lt(x, a, b):
    for k in range(x.shape[1]):
        va = x[a, k]
        vb = x[b, k]
        if va < vb:
            return True
        if vb < va:
            return False
    return False


@njit
def _row_eq(x, a, b):
    for k in range(x.shape[1]):
        if x[a, k] != x[b, k]:
            return False
    return True


""" + HEADER + """\
def unique_rows(x, perm, tmp, group, res):
    n = x.shape[0]
    for i in range(n):
        perm[i] = i
    width = 1
    while width < n:
        lo = 0
        while lo < n:
            mid = min(lo + width, n)
            hi = min(lo + 2 * width, n)
            i = lo
            j = mid
            k = lo
            while i < mid and j < hi:
                if _row_lt(x, perm[j], perm[i]):
                    tmp[k] = perm[j]
                    j += 1
                else:
                    tmp[k] = perm[i]
                    i += 1
                k += 1
            while i < mid:
                tmp[k] = perm[i]
                i += 1
                k += 1
            while j < hi:
                tmp[k] = perm[j]
                j += 1
                k += 1
            lo = hi
        for i in range(n):
            perm[i] = tmp[i]
        width *= 2
    g = -1
    for i in range(n):
        if i == 0 or not _row_eq(x, perm[i], perm[i - 1]):
            g += 1
        group[i] = g
    res[0] = g + 1
"""

_UNIQUE_FILL = """\
def unique_rows_fill(x, perm, group, values, inverse, counts):
    for i in range(perm.shape[0]):
        g = group[i]
        inverse[perm[i]] = g
        if i == 0 or group[i - 1] != g:
            for k in range(x.shape[1]):
                values[g, k] = x[perm[i], k]
            counts[g] = 0
        counts[g] += 1
"""

# histogramdd: per-dim min/max (NaN propagates, as aminmax), edges by linspace's formula in the
# input dtype (start + step*i below the halfway point, end - step*(n-1-i) above), and counts by
# binary search over each dim's edges (the last bin closed; a sample outside any dim's edges,
# or NaN, is not counted), accumulated in float64
_HDD_MINMAX = """\
def hdd_minmax(x, lo, hi):
    for d in range(x.shape[1]):
        mn = x[0, d]
        mx = x[0, d]
        for i in range(1, x.shape[0]):
            v = x[i, d]
            if v != v or mn != mn:
                mn = v if v != v else mn
            elif v < mn:
                mn = v
            if v != v or mx != mx:
                mx = v if v != v else mx
            elif v > mx:
                mx = v
        lo[d] = mn
        hi[d] = mx
"""

_HDD_EDGES = """\
def hdd_edges(out, left, right):
    steps = out.shape[0]
    step = (right - left) / out.dtype.type(steps - 1)
    half = steps // 2
    for i in range(steps):
        if i < half:
            out[i] = left + step * out.dtype.type(i)
        else:
            out[i] = right - step * out.dtype.type(steps - i - 1)
"""

_HDD_COUNT = """\
def hdd_count(x, edges, eoff, nbins, w, use_w, density, acc, hist):
    n = x.shape[0]
    nd = x.shape[1]
    for i in range(n):
        flat = 0
        ok = True
        for d in range(nd):
            v = x[i, d]
            e0 = eoff[d]
            nb = nbins[d]
            lo = edges[e0]
            hi = edges[e0 + nb]
            if not (v >= lo and v <= hi):
                ok = False
                break
            # largest b with edges[b] <= v, the last bin closed
            a = 0
            b = nb
            while b - a > 1:
                m = (a + b) // 2
                if edges[e0 + m] <= v:
                    a = m
                else:
                    b = m
            flat = flat * nb + a
        if ok:
            acc[flat] += np.float64(w[i]) if use_w else 1.0
    if density:
        total = 0.0
        for k in range(acc.shape[0]):
            total += acc[k]
        for k in range(acc.shape[0]):
            r = k
            vol = 1.0
            for d in range(nd - 1, -1, -1):
                nb = nbins[d]
                b = r % nb
                r = r // nb
                vol *= np.float64(edges[eoff[d] + b + 1]) - np.float64(edges[eoff[d] + b])
            acc[k] = acc[k] / total / vol
    for k in range(acc.shape[0]):
        hist[k] = acc[k]
"""

# linalg_eig of real matrices: LAPACK ?geev (Numba's binding to SciPy's LAPACK), as PyTorch's
# CPU does, then eigenvalue pairs and their vectors assembled as complex (column i + i*column
# i+1 and its conjugate); complex matrices: Numba's np.linalg.eig (?geev too). status[b] > 0:
# no convergence; the last status slot keeps the LAPACK work arrays alive past the call.
_EIG_REAL = """\
from numba.np.linalg import _LAPACK as _LP
from numba import types as _nbt
_rgeev = _LP().numba_ez_rgeev(_nbt.{ftype})


@njit(error_model="numpy", nogil=True)
def eig_real(a, w, v, status):
    n = a.shape[1]
    keep = 0
    for b in range(a.shape[0]):
        at = np.ascontiguousarray(a[b].T)
        wr = np.empty(n, a.dtype)
        wi = np.empty(n, a.dtype)
        vl = np.empty((n, 1), a.dtype)
        vr = np.empty((n, n), a.dtype)
        r = _rgeev({kind}, 78, 86, n, at.ctypes, n, wr.ctypes, wi.ctypes, vl.ctypes, 1,
                   vr.ctypes, n)
        status[b] = r
        i = 0
        while i < n:
            if wi[i] == 0.0:
                w[b, i] = complex(wr[i], 0.0)
                for j in range(n):
                    v[b, j, i] = complex(vr[i, j], 0.0)
                i += 1
            else:
                w[b, i] = complex(wr[i], wi[i])
                w[b, i + 1] = complex(wr[i + 1], wi[i + 1])
                for j in range(n):
                    v[b, j, i] = complex(vr[i, j], vr[i + 1, j])
                    v[b, j, i + 1] = complex(vr[i, j], -vr[i + 1, j])
                i += 2
        keep += at.size + wr.size + wi.size + vl.size + vr.size
    status[a.shape[0]] = keep
"""

_EIG_COMPLEX = """\
@njit(error_model="numpy", nogil=True)
def eig_complex(a, w, v, status):
    for b in range(a.shape[0]):
        ev, vec = np.linalg.eig(np.ascontiguousarray(a[b]))
        w[b, :] = ev
        v[b, :, :] = vec
        status[b] = 0
"""

# unique_consecutive along a dim: rows keep their order, a group starts where a row differs
# from the one before it (NaN never equals: as the CPU's slice comparison)
_UNIQUE_ROWS_CONSECUTIVE = """\
def unique_rows_consecutive(x, perm, group, res):
    n = x.shape[0]
    g = -1
    for i in range(n):
        perm[i] = i
        new = i == 0
        if not new:
            for k in range(x.shape[1]):
                if x[i, k] != x[i - 1, k]:
                    new = True
                    break
        if new:
            g += 1
        group[i] = g
    res[0] = g + 1
"""

_SOURCES = {"repeat_count": _REPEAT_COUNT, "repeat_fill": _REPEAT_FILL,
            "unique_rows": _UNIQUE_ROWS, "unique_rows_fill": _UNIQUE_FILL,
            "unique_rows_consecutive": _UNIQUE_ROWS_CONSECUTIVE,
            "hdd_minmax": _HDD_MINMAX, "hdd_edges": _HDD_EDGES, "hdd_count": _HDD_COUNT}


def render_eig(real: bool, double: bool) -> tuple[str, str]:
    """(source, name) of the batched eigen-solver for real or complex matrices."""
    if not real:
        return _EIG_COMPLEX, "eig_complex"
    return (_EIG_REAL.replace("{ftype}", "float64" if double else "float32")
            .replace("{kind}", str(ord("d" if double else "s"))), "eig_real")


def render(which: str) -> tuple[str, str]:
    """(source, function name) of one kernel."""
    body = _SOURCES[which]
    if which == "unique_rows":   # carries its own decorators (two helpers)
        return body, which
    return HEADER + body, which
