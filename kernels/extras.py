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

_SOURCES = {"repeat_count": _REPEAT_COUNT, "repeat_fill": _REPEAT_FILL,
            "unique_rows": _UNIQUE_ROWS, "unique_rows_fill": _UNIQUE_FILL}


def render(which: str) -> tuple[str, str]:
    """(source, function name) of one kernel."""
    body = _SOURCES[which]
    if which == "unique_rows":   # carries its own decorators (two helpers)
        return body, which
    return HEADER + body, which
