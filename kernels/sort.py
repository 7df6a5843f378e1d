"""Sort family: sort / top-k / order statistics per row, the CPU's own algorithms, and binning.

Indices of tied elements are part of the result (OpInfo compares them), so each op runs the
algorithm PyTorch's CPU kernel runs, step for step: `torch.sort(stable=False)` is libstdc++'s
introsort (`std::sort` on (value, index) pairs), `topk` is `std::partial_sort` or
`std::nth_element` + `std::sort`, `kthvalue` is ATen's Sedgewick quickselect, `mode` is
`std::sort` then a run scan. Stable sorts (any stable algorithm gives the same answer) are a
bottom-up merge sort of (key, index) pairs. The helpers (kernels/sort_prelude.py) move a key array
`k` and an index array `ix` together and compare through `_lt` with a runtime comparator code:

    0: ascending, NaN largest       1: descending, NaN first       2: plain `a < b` (mode)
    3: (value, index) lexicographic (median)     4: as 3 with NaN largest (nanmedian)

Kernels see rows as the last axis of (outer..., n) numpy views; the lowering moves the dim last.

>>> src, name = render_rows("sort", 1)
>>> "_introsort" in src
True
"""

from __future__ import annotations

from .elementwise import kernel_name
from .halfround import ROUND_F16, ROUND_HALF
from .index import _ix, _Src
from .sort_prelude import PRELUDE, RUN  # noqa: F401 -- RUN: the merge sort's run length

# per op: the work done on one row held in (k, ix) of length n, then what is written.
# Parameters p0, p1 are runtime ints; `vals`/`inds` are the outputs' (outer..., m) views.
_ROW = {
    # p0: descending, p1: stable
    "sort": (("cmp = 1 if p0 else 0\n"
             "if p1:\n    _msort(k, ix, tk, ti, n, cmp)\n"
             "else:\n    _introsort(k, ix, 0, n, cmp, stack)"),
             "m"),
    # p0: largest, p1: sorted (k = m, the output length)
    "topk": (("cmp = 1 if p0 else 0\n"
             "if m * 64 <= n:\n"
             "    _heap_select(k, ix, 0, m, n, cmp)\n    _sort_heap(k, ix, 0, m, cmp)\n"
             "elif m > 0:\n"
             "    _nth_element(k, ix, 0, m - 1, n, cmp)\n"
             "    if p1:\n        _introsort(k, ix, 0, m - 1, cmp, stack)"),
             "m"),
    # p0: k - 1
    "kthvalue": ("_quickselect(k, ix, p0)", "p0"),
    # p0: 1 for nanmedian. NaN (median): the first NaN; else the ((count - 1) // 2)-th in
    # (value, index) order, count = non-NaN elements (nanmedian) or n
    "median": (("nan = 0\nfirst = -1\n"
               "for j in range(n):\n    if k[j] != k[j]:\n        nan += 1\n"
               "        if first < 0:\n            first = j\n"
               "if p0 == 0 and nan > 0:\n    pos = first\n"
               "else:\n    cnt = n - nan if p0 else n\n    pos = (cnt - 1) // 2 if cnt > 0 else 0\n"
               "    _nth_element(k, ix, 0, pos, n, 4 if p0 else 3)"),
               "pos"),
    # std::sort by `<`, then the last element of the first longest run
    "mode": (("_introsort(k, ix, 0, n, 2, stack)\n"
             "pos = 0\nrun = 0\nbest = 0\n"
             "for j in range(n):\n    run += 1\n"
             "    if j == n - 1 or k[j] != k[j + 1]:\n"
             "        if run > best:\n            pos = j\n            best = run\n"
             "        run = 0"),
             "pos"),
}


def render_rows(op: str, c: int) -> tuple[str, str]:
    """`k(vals, inds, src, p0, p1)`: op of _ROW on each row (last axis) of src over c outer
    dims; "sort"/"topk" write vals.shape[-1] sorted elements per row, the others one element
    (vals/inds have a last axis of length 1)."""
    work, pick = _ROW[op]
    name = kernel_name("rows", op, c)
    s = _Src(name, ["vals", "inds", "src", "p0", "p1"])
    o = _ix("o", c)
    s.add(f"n = src.shape[{c}]", f"m = vals.shape[{c}]",
          "k = np.empty(n, src.dtype)", "ix = np.empty(n, np.int64)",
          "tk = np.empty(n, src.dtype)", "ti = np.empty(n, np.int64)",
          "stack = np.empty(3 * 2 * 66, np.int64)")
    s.loops("o", "src", c)
    s.add("for j in range(n):", f"    k[j] = src[{o}, j]", "    ix[j] = j")
    s.add(*work.split("\n"))
    if pick == "m":
        s.add("for j in range(m):", f"    vals[{o}, j] = k[j]", f"    inds[{o}, j] = ix[j]")
    else:
        s.add(f"vals[{o}, 0] = k[{pick}]", f"inds[{o}, 0] = ix[{pick}]")
    return PRELUDE + s.text(), name


def render_unique(consecutive: bool) -> tuple[str, str]:
    """`k(x, sk, perm, tk, ti, cnt)`: x (1-D) into (sk, perm), sorted as torch.sort does
    (introsort: the order of the NaNs, each its own value, decides their inverse indices)
    unless `consecutive`; cnt[0] = number of runs of equal values."""
    name = kernel_name("unique_count", consecutive)
    s = _Src(name, ["x", "sk", "perm", "tk", "ti", "cnt"])
    s.add("n = x.shape[0]", "for j in range(n):", "    sk[j] = x[j]", "    perm[j] = j")
    if not consecutive:
        s.add("stack = np.empty(3 * 2 * 66, np.int64)", "_introsort(sk, perm, 0, n, 0, stack)")
    s.add("m = 0", "for j in range(n):", "    if j == 0 or sk[j] != sk[j - 1]:",
          "        m += 1", "cnt[0] = m")
    return PRELUDE + s.text(), name


def render_unique_fill() -> tuple[str, str]:
    """`k(sk, perm, out, inv, counts, want_inv, want_counts)`: one output per run of sk; inv at
    each element's original position (perm) is its run, counts the run lengths."""
    name = kernel_name("unique_fill")
    s = _Src(name, ["sk", "perm", "out", "inv", "counts", "want_inv", "want_counts"])
    s.add("g = -1", "for j in range(sk.shape[0]):", "    if j == 0 or sk[j] != sk[j - 1]:",
          "        g += 1", "        out[g] = sk[j]", "        if want_counts:",
          "            counts[g] = 0", "    if want_inv:", "        inv[perm[j]] = g",
          "    if want_counts:", "        counts[g] += 1")
    return s.text(), name


def render_search(c: int, store: str) -> tuple[str, str]:
    """`k(out, vals, bd, srt, right, use_sorter)`: ATen's lower/upper bound of each element of
    vals in its row of bd (through the row's sorter when use_sorter), over c outer dims."""
    name = kernel_name("search", c, store)
    s = _Src(name, ["out", "vals", "bd", "srt", "right", "use_sorter"])
    o = _ix("o", c)
    s.add(f"nb = bd.shape[{c}]")
    s.loops("o", "vals", c)
    s.add(f"for j in range(vals.shape[{c}]):", f"    v = vals[{o}, j]", "    lo = 0",
          "    hi = nb", "    while lo < hi:", "        mid = lo + ((hi - lo) >> 1)",
          f"        mv = bd[{o}, srt[{o}, mid]] if use_sorter else bd[{o}, mid]",
          "        if (not mv > v) if right else (not mv >= v):", "            lo = mid + 1",
          "        else:", "            hi = mid", f"    out[{o}, j] = {store}(lo)")
    return s.text(), name


def render_histc() -> tuple[str, str]:
    """`k(hist, x, info, lo, hi, bins, auto, bf, chunk)`: ATen's histc (linear interpolation,
    no local search) in the input's type: float32, float64, or a half type emulated (`bf` 1:
    bfloat16, 2: float16; every operation rounded as c10 half arithmetic does, bins included).
    Counts accumulate per `chunk` of x (the CPU's per-thread histograms, half ones rounding
    every add), summed in hist's type (float32 for the half types, rounded once by the caller).
    `auto` (min == max given): the range is x's min/max.
    info = [lo, hi, bad]: bad = 1 when the range is not finite or empty (the lowering raises)."""
    name = kernel_name("histc")
    s = _Src(name, ["hist", "x", "info", "lo", "hi", "bins", "auto", "bf", "chunk"])
    s.add("n = x.shape[0]",
          "if auto and n > 0:", "    mn = x[0]", "    mx = x[0]", "    for j in range(n):",
          "        v = x[j]", "        if v != v:", "            mn = v", "            mx = v",
          "            break", "        mn = min(mn, v)", "        mx = max(mx, v)",
          "    lo = np.float64(mn)", "    hi = np.float64(mx)",
          "if lo == hi:", "    lo -= 1.0", "    hi += 1.0",
          "info[0] = lo", "info[1] = hi",
          "if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):", "    info[2] = 1",
          "    return",
          # the input's type (float32 for the half types, which arrive upcast)
          "left = hist.dtype.type(lo)", "right = hist.dtype.type(hi)",
          "nb = hist.dtype.type(bins)",
          "if bf:", "    left = _round_half(left, bf)", "    right = _round_half(right, bf)",
          "    nb = _round_half(nb, bf)",
          "for b in range(bins):", "    hist[b] = 0",
          "part = np.zeros(bins, hist.dtype)",
          "for start in range(0, n, chunk):",
          "    for b in range(bins):", "        part[b] = 0",
          "    for j in range(start, min(n, start + chunk)):", "        v = x[j]",
          "        if not (v >= left and v <= right):", "            continue",
          "        if bf:",
          "            t = _round_half(_round_half(_round_half(v - left, bf) * nb, bf)",
          "                            / _round_half(right - left, bf), bf)",
          "        else:", "            t = (v - left) * nb / (right - left)",
          "        pos = int(t)", "        if pos == bins:", "            pos -= 1",
          "        part[pos] = _round_half(part[pos] + np.float32(1), bf) if bf else "
          "part[pos] + 1",
          "    for b in range(bins):", "        hist[b] += part[b]")
    return ROUND_F16 + ROUND_HALF + s.text(), name


def render_histc_int() -> tuple[str, str]:
    """`k(hist, x, info, lo, hi, bins, auto)`: histc of an integer tensor as CUDA computes it
    (the CPU has no integer histc): bounds truncated to int64, bin = (v - lo) * bins // (hi - lo)
    in integer arithmetic, the last bin closed; `auto` (min == max given): x's min/max. An empty
    range widens by 1 each side. info = [lo, hi, bad]: bad = 1 when lo >= hi (the lowering
    raises)."""
    name = kernel_name("histc_int")
    s = _Src(name, ["hist", "x", "info", "lo", "hi", "bins", "auto"])
    s.add("n = x.shape[0]",
          "if auto and n > 0:", "    lo = np.int64(x[0])", "    hi = np.int64(x[0])",
          "    for j in range(n):", "        lo = min(lo, np.int64(x[j]))",
          "        hi = max(hi, np.int64(x[j]))",
          "if lo == hi:", "    lo -= 1", "    hi += 1",
          "info[0] = lo", "info[1] = hi",
          "if not lo < hi:", "    info[2] = 1", "    return",
          "for b in range(bins):", "    hist[b] = 0",
          "for j in range(n):", "    v = np.int64(x[j])",
          "    if v >= lo and v <= hi:", "        pos = (v - lo) * bins // (hi - lo)",
          "        if pos == bins:", "            pos -= 1",
          "        hist[pos] += 1")
    return s.text(), name


def render_bincount(weighted: bool) -> tuple[str, str]:
    """`k(out, x, w, info, phase)`: phase 0: info = [min, max] of x; phase 1: out[x[j]] +=
    w[j] (or 1), sequentially as the CPU adds."""
    name = kernel_name("bincount", weighted)
    s = _Src(name, ["out", "x", "w", "info", "phase"])
    s.add("n = x.shape[0]", "if phase == 0:", "    mn = x[0]", "    mx = x[0]",
          "    for j in range(n):", "        mn = min(mn, x[j])", "        mx = max(mx, x[j])",
          "    info[0] = mn", "    info[1] = mx", "    return",
          "for b in range(out.shape[0]):", "    out[b] = 0", "for j in range(n):")
    s.add("    out[x[j]] += out.dtype.type(w[j])" if weighted else "    out[x[j]] += 1")
    return s.text(), name


def render_histogram() -> tuple[str, str]:
    """`k(hist, edges, x, w, info, lo, hi, auto, weighted, density, chunk)`: ATen's
    histogram.bin_ct in the input's type (float32 or float64): edges = linspace(lo, hi) (ATen's
    two-sided formula; `auto`: x's min/max, an empty range widened by 0.5), then linear
    interpolation with a local search against the edges, per-`chunk` partial counts (the CPU's
    threads), optional density.
    info[2] = 1 for a non-finite or reversed range (the lowering raises). `given`: edges hold
    the caller's bins (histogram.bins_tensor: a binary search over all of them)."""
    name = kernel_name("histogram")
    s = _Src(name, ["hist", "edges", "x", "w", "info", "lo", "hi", "auto", "weighted",
                    "density", "chunk", "given"])
    s.add("n = x.shape[0]", "bins = hist.shape[0]", "steps = bins + 1",
          "if given:", "    lo = np.float64(edges[0])", "    hi = np.float64(edges[bins])",
          "elif auto and n > 0:", "    mn = x[0]", "    mx = x[0]", "    for j in range(n):",
          "        v = x[j]", "        if v != v:", "            mn = v", "            mx = v",
          "            break", "        mn = min(mn, v)", "        mx = max(mx, v)",
          "    lo = np.float64(mn)", "    hi = np.float64(mx)",
          "info[0] = lo", "info[1] = hi",
          "if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):", "    info[2] = 1",
          "    return",
          "if lo == hi and not given:", "    lo -= 0.5", "    hi += 0.5",
          "start = hist.dtype.type(lo)", "end = hist.dtype.type(hi)",
          "step = (end - start) / hist.dtype.type(steps - 1)", "half = steps // 2",
          # NOTE: ATen's scalar linspace formula; its vectorized loop can differ by an ulp
          "for idx in range(0 if not given else steps, steps):", "    if idx < half:",
          "        edges[idx] = start + step * hist.dtype.type(idx)", "    else:",
          "        edges[idx] = end - step * hist.dtype.type(steps - idx - 1)",
          "left = edges[0]", "right = edges[bins]", "nb = hist.dtype.type(bins)",
          "for b in range(bins):", "    hist[b] = 0",
          "part = np.zeros(bins, hist.dtype)",
          "for c0 in range(0, n, chunk):",
          "    for b in range(bins):", "        part[b] = 0",
          "    for j in range(c0, min(n, c0 + chunk)):", "        v = x[j]",
          "        if not (v >= left and v <= right):", "            continue",
          "        pos = 0 if given else int((v - left) * nb / (right - left))",
          "        lo_i = 0 if given else max(0, pos - 1)",
          "        hi_i = steps if given else min(pos + 2, steps)",
          "        while lo_i < hi_i:", "            mid = (lo_i + hi_i) >> 1",
          "            if edges[mid] > v:", "                hi_i = mid", "            else:",
          "                lo_i = mid + 1",
          "        pos = lo_i - 1", "        if pos == bins:", "            pos -= 1",
          "        part[pos] += w[j] if weighted else hist.dtype.type(1)",
          "    for b in range(bins):", "        hist[b] += part[b]",
          "if density:", "    tot = hist.dtype.type(0)", "    for b in range(bins):",
          "        tot += hist[b]", "    for b in range(bins):",
          "        hist[b] = hist[b] / tot / (edges[b + 1] - edges[b])")
    return s.text(), name
