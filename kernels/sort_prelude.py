"""The sort family's Numba helper library (compiled once per process: kernels/shared.py): the
CPU's own algorithms over a key array `k` and an index array `ix` moved together, compared
through `_lt` with a runtime comparator code (see kernels/sort.py for the codes):

- `_introsort` / `_insertion` / `_partition_pivot`: libstdc++'s `std::sort` (introsort),
- `_heap_select` / `_sort_heap` / `_nth_element`: `std::partial_sort` and `std::nth_element`,
- `_msort`: the bottom-up merge sort of (key, index) pairs used for stable sorts,
- `_quickselect`: ATen's Sedgewick quickselect (kthvalue).

>>> "def _introsort(" in SOURCE and "_introsort" in PRELUDE and "_quickselect" in PRELUDE
True
"""

from __future__ import annotations

from .shared import register

RUN = 16   # insertion-sorted run length before merging (stable sort)

# NOTE: plain @njit helpers, not inline="always": Numba-level inlining of _lt/_swap into every
# call site doubled compile time (48 s -> 25 s for a top-k kernel) and ran 20% slower; LLVM
# still inlines them where it pays.
SOURCE = '''
@njit
def _lt(ka, ia, kb, ib, cmp):
    if cmp == 0:
        return ka < kb or (kb != kb and ka == ka)
    if cmp == 1:
        return ka > kb or (ka != ka and kb == kb)
    if cmp == 2:
        return ka < kb
    if cmp == 3:
        return ka < kb or (ka == kb and ia < ib)
    return ka < kb or (ka == kb and ia < ib) or (kb != kb and ka == ka)

@njit
def _swap(k, ix, a, b):
    t = k[a]
    k[a] = k[b]
    k[b] = t
    u = ix[a]
    ix[a] = ix[b]
    ix[b] = u

@njit(error_model="numpy", forceinline=True)   # as it was inlined into the kernels
def _lg(n):
    r = 0
    while n > 1:
        n >>= 1
        r += 1
    return r

@njit
def _adjust_heap(k, ix, first, hole, ln, vk, vi, cmp):
    top = hole
    sc = hole
    while sc < (ln - 1) // 2:
        sc = 2 * (sc + 1)
        if _lt(k[first + sc], ix[first + sc], k[first + sc - 1], ix[first + sc - 1], cmp):
            sc -= 1
        k[first + hole] = k[first + sc]
        ix[first + hole] = ix[first + sc]
        hole = sc
    if (ln & 1) == 0 and sc == (ln - 2) // 2:
        sc = 2 * (sc + 1)
        k[first + hole] = k[first + sc - 1]
        ix[first + hole] = ix[first + sc - 1]
        hole = sc - 1
    parent = (hole - 1) // 2
    while hole > top and _lt(k[first + parent], ix[first + parent], vk, vi, cmp):
        k[first + hole] = k[first + parent]
        ix[first + hole] = ix[first + parent]
        hole = parent
        parent = (hole - 1) // 2
    k[first + hole] = vk
    ix[first + hole] = vi

@njit
def _heap_select(k, ix, first, middle, last, cmp):
    ln = middle - first
    if ln >= 2:
        parent = (ln - 2) // 2
        while True:
            _adjust_heap(k, ix, first, parent, ln, k[first + parent], ix[first + parent], cmp)
            if parent == 0:
                break
            parent -= 1
    for i in range(middle, last):
        if _lt(k[i], ix[i], k[first], ix[first], cmp):
            vk = k[i]
            vi = ix[i]
            k[i] = k[first]
            ix[i] = ix[first]
            _adjust_heap(k, ix, first, 0, ln, vk, vi, cmp)

@njit
def _sort_heap(k, ix, first, last, cmp):
    while last - first > 1:
        last -= 1
        vk = k[last]
        vi = ix[last]
        k[last] = k[first]
        ix[last] = ix[first]
        _adjust_heap(k, ix, first, 0, last - first, vk, vi, cmp)

@njit
def _partition_pivot(k, ix, first, last, cmp):
    # median of (first + 1, mid, last - 1) moved to first, then Hoare's unguarded partition
    a = first + 1
    b = first + (last - first) // 2
    c = last - 1
    if _lt(k[a], ix[a], k[b], ix[b], cmp):
        if _lt(k[b], ix[b], k[c], ix[c], cmp):
            _swap(k, ix, first, b)
        elif _lt(k[a], ix[a], k[c], ix[c], cmp):
            _swap(k, ix, first, c)
        else:
            _swap(k, ix, first, a)
    elif _lt(k[a], ix[a], k[c], ix[c], cmp):
        _swap(k, ix, first, a)
    elif _lt(k[b], ix[b], k[c], ix[c], cmp):
        _swap(k, ix, first, c)
    else:
        _swap(k, ix, first, b)
    lo = first + 1
    hi = last
    pk = k[first]
    pi = ix[first]
    while True:
        # NOTE: the bounds tests never fire for a strict weak order (libstdc++ omits them);
        # they keep a NaN under the plain comparator (mode) inside the row
        while lo < last - 1 and _lt(k[lo], ix[lo], pk, pi, cmp):
            lo += 1
        hi -= 1
        while hi > first and _lt(pk, pi, k[hi], ix[hi], cmp):
            hi -= 1
        if not lo < hi:
            return lo
        _swap(k, ix, lo, hi)
        lo += 1

@njit
def _linear_insert(k, ix, first, i, cmp):
    vk = k[i]
    vi = ix[i]
    if _lt(vk, vi, k[first], ix[first], cmp):
        for j in range(i, first, -1):
            k[j] = k[j - 1]
            ix[j] = ix[j - 1]
        k[first] = vk
        ix[first] = vi
        return
    j = i
    while j > first and _lt(vk, vi, k[j - 1], ix[j - 1], cmp):
        k[j] = k[j - 1]
        ix[j] = ix[j - 1]
        j -= 1
    k[j] = vk
    ix[j] = vi

@njit
def _insertion(k, ix, first, last, cmp):
    for i in range(first + 1, last):
        _linear_insert(k, ix, first, i, cmp)

@njit
def _introsort(k, ix, first, last, cmp, stack):
    # std::sort: introsort to runs of <= 16 (right parts on an explicit stack: disjoint ranges,
    # so the order they are done in does not matter), then one insertion pass
    n = last - first
    if n < 2:
        return
    sp = 0
    stack[0] = first
    stack[1] = last
    stack[2] = 2 * _lg(n)
    sp = 1
    while sp > 0:
        sp -= 1
        lo = stack[3 * sp]
        hi = stack[3 * sp + 1]
        depth = stack[3 * sp + 2]
        while hi - lo > 16:
            if depth == 0:
                _heap_select(k, ix, lo, hi, hi, cmp)
                _sort_heap(k, ix, lo, hi, cmp)
                break
            depth -= 1
            cut = _partition_pivot(k, ix, lo, hi, cmp)
            stack[3 * sp] = cut
            stack[3 * sp + 1] = hi
            stack[3 * sp + 2] = depth
            sp += 1
            hi = cut
    # libstdc++'s final pass: guarded on the first 16, unguarded after (same result: the row
    # minimum lies in the first 16 after the introsort loop)
    _insertion(k, ix, first, last, cmp)

@njit
def _nth_element(k, ix, first, nth, last, cmp):
    if first == last or nth == last:
        return
    depth = 2 * _lg(last - first)
    while last - first > 3:
        if depth == 0:
            _heap_select(k, ix, first, nth + 1, last, cmp)
            _swap(k, ix, first, nth)
            return
        depth -= 1
        cut = _partition_pivot(k, ix, first, last, cmp)
        if cut <= nth:
            first = cut
        else:
            last = cut
    _insertion(k, ix, first, last, cmp)

@njit
def _msort(k, ix, tk, ti, n, cmp):
    # stable: insertion-sorted runs, then bottom-up merges ping-ponging with (tk, ti)
    for lo in range(0, n, RUN):
        hi = min(lo + RUN, n)
        for i in range(lo + 1, hi):
            vk = k[i]
            vi = ix[i]
            j = i
            while j > lo and _lt(vk, vi, k[j - 1], ix[j - 1], cmp):
                k[j] = k[j - 1]
                ix[j] = ix[j - 1]
                j -= 1
            k[j] = vk
            ix[j] = vi
    width = RUN
    src_k, src_i, dst_k, dst_i = k, ix, tk, ti
    flipped = False
    while width < n:
        for lo in range(0, n, 2 * width):
            mid = min(lo + width, n)
            hi = min(lo + 2 * width, n)
            i = lo
            j = mid
            t = lo
            while i < mid and j < hi:
                if _lt(src_k[j], src_i[j], src_k[i], src_i[i], cmp):
                    dst_k[t] = src_k[j]
                    dst_i[t] = src_i[j]
                    j += 1
                else:
                    dst_k[t] = src_k[i]
                    dst_i[t] = src_i[i]
                    i += 1
                t += 1
            while i < mid:
                dst_k[t] = src_k[i]
                dst_i[t] = src_i[i]
                i += 1
                t += 1
            while j < hi:
                dst_k[t] = src_k[j]
                dst_i[t] = src_i[j]
                j += 1
                t += 1
        src_k, src_i, dst_k, dst_i = dst_k, dst_i, src_k, src_i
        flipped = not flipped
        width *= 2
    if flipped:
        for t in range(n):
            k[t] = tk[t]
            ix[t] = ti[t]

@njit
def _quickselect(k, ix, kk):
    # ATen's quick_select_template (Sedgewick), gt_or_nan: NaN largest
    L = 0
    R = k.size - 1
    while True:
        if R <= L:
            return
        if R == L + 1:
            if _lt(k[R], 0, k[L], 0, 0):
                _swap(k, ix, L, R)
            return
        P = (L + R) >> 1
        _swap(k, ix, P, L + 1)
        if _lt(k[R], 0, k[L + 1], 0, 0):
            _swap(k, ix, L + 1, R)
        if _lt(k[R], 0, k[L], 0, 0):
            _swap(k, ix, L, R)
        if _lt(k[L], 0, k[L + 1], 0, 0):
            _swap(k, ix, L + 1, L)
        i = L + 1
        j = R
        piv = k[L]
        while True:
            i += 1
            while i < R and _lt(k[i], 0, piv, 0, 0):
                i += 1
            j -= 1
            while j > L and _lt(piv, 0, k[j], 0, 0):
                j -= 1
            if j < i:
                break
            _swap(k, ix, i, j)
        _swap(k, ix, L, j)
        if j <= kk:
            L = i
        if j >= kk:
            R = j - 1

'''.replace("RUN", str(RUN))

# what a kernel's source starts with: the import of this process's compiled helpers, shared by
# every sort kernel of the process (kernels/shared.py); its digest of SOURCE is in the source
PRELUDE = register("sort", SOURCE)
