"""Shape family: remap (flip, roll, repeat, constant pad, tril/triu) and stable sort/top-k.

A remap reads each output element from a source coordinate computed per dimension; each
dimension's mode and parameter are runtime values, so flip, roll, repeat and pad share one kernel
per rank and dtype, and a new shift, pad width or size never recompiles.

>>> src, name = render_remap(2)
>>> "j0 = p[0] - i0" in src
True
"""

from __future__ import annotations

from .elementwise import kernel_name
from .index import _ix, _Src

# per-dimension modes (runtime codes): source coordinate j of output coordinate i, n = src size
MODES = {
    "i": 0,   # identity
    "f": 1,   # flip: j = p - i with p = n - 1
    "r": 2,   # roll: j = i - p (+ n), p = shift in [0, n)
    "m": 3,   # modulo (repeat): j = i % n
    "p": 4,   # pad: j = i - p with p = pad before; out of range reads `value`
}
_J = ("j{d} = i{d}\n"
      "if m[{d}] == 1:\n    j{d} = p[{d}] - i{d}\n"
      "elif m[{d}] == 2:\n    j{d} = i{d} - p[{d}]\n"
      "    if j{d} < 0:\n        j{d} += src.shape[{d}]\n"
      "elif m[{d}] == 3:\n    j{d} = i{d} % src.shape[{d}]\n"
      "elif m[{d}] == 4:\n    j{d} = i{d} - p[{d}]\n"
      "ok{d} = {prev}j{d} >= 0 and j{d} < src.shape[{d}]")
# triangular masks over the last two dims (runtime code p[rank + 1]; the diagonal is p[rank])
TRI = {None: 0, "tril": 1, "triu": 2}
_TRI = ("(p[{t}] == 0 or (p[{t}] == 1 and i{b} - i{a} <= p[{r}])"
        " or (p[{t}] == 2 and i{b} - i{a} >= p[{r}]))")


def render_remap(rank: int, cast: str = "np.float32") -> tuple[str, str]:
    """`remap(out, src, m, p, value)`: out[i..] = src[j..], or `value` where padded/masked out;
    m[d] is dimension d's mode (MODES) and p[d] its parameter, both runtime, so flip, roll,
    repeat, pad and tril/triu share one kernel per rank and dtype. `cast` converts `value`.
    """
    name = kernel_name("remap", rank, cast)
    s = _Src(name, ["out", "src", "m", "p", "value"])
    s.add(f"fill = {cast}(value)")
    for d in range(rank):
        s.add(f"for i{d} in range(out.shape[{d}]):")
        s.depth += 1
        s.add(*_J.format(d=d, prev=f"ok{d - 1} and " if d else "").split("\n"))
    test = f"ok{rank - 1}"
    if rank >= 2:
        test += " and " + _TRI.format(a=rank - 2, b=rank - 1, r=rank, t=rank + 1)
    s.add(f"out[{_ix('i', rank)}] = src[{_ix('j', rank)}] if {test} else fill")
    return s.text(), name


# stable bottom-up merge sort of a permutation by key; NaN is the largest value, as in torch
SORT_PRELUDE = '''
@njit(inline="always")
def _before(a, b, desc):
    if desc:
        return a > b or (a != a and b == b)
    return a < b or (b != b and a == a)

@njit
def _msort(keys, perm, tmp, desc):
    n = perm.size
    src = perm
    dst = tmp
    width = 1
    while width < n:
        for lo in range(0, n, 2 * width):
            mid = min(lo + width, n)
            hi = min(lo + 2 * width, n)
            i = lo
            j = mid
            t = lo
            while i < mid and j < hi:
                if _before(keys[src[j]], keys[src[i]], desc):
                    dst[t] = src[j]
                    j += 1
                else:
                    dst[t] = src[i]
                    i += 1
                t += 1
            while i < mid:
                dst[t] = src[i]
                i += 1
                t += 1
            while j < hi:
                dst[t] = src[j]
                j += 1
                t += 1
        src, dst = dst, src
        width *= 2
    return src

'''


def render_sort(c: int) -> tuple[str, str]:
    """`sort(vals, inds, src, desc)`: the first vals.shape[-1] of each row of src, sorted
    (stable) along the last axis, over c outer dims; top-k is the same kernel with fewer columns.
    """
    name = kernel_name("sort", c)
    s = _Src(name, ["vals", "inds", "src", "desc"])
    o = _ix("o", c)
    s.add(f"n = src.shape[{c}]", "keys = np.empty(n, src.dtype)", "perm = np.empty(n, np.int64)",
          "tmp = np.empty(n, np.int64)")
    s.loops("o", "src", c)
    s.add("for j in range(n):", f"    keys[j] = src[{o}, j]", "    perm[j] = j",
          "res = _msort(keys, perm, tmp, desc)",
          f"for j in range(vals.shape[{c}]):", f"    vals[{o}, j] = keys[res[j]]",
          f"    inds[{o}, j] = res[j]")
    return SORT_PRELUDE + s.text(), name


def render_xor_rows() -> tuple[str, str]:
    """`k(out, a)`: out[i] = a[i, 0] ^ a[i, 1] ^ ... over int64 bits (hash_tensor's xor_sum)."""
    name = kernel_name("xor_rows")
    src = (f"@njit(nogil=True)\ndef {name}(out, a):\n"
           "    for i in range(a.shape[0]):\n"
           "        h = np.int64(0)\n"
           "        for j in range(a.shape[1]):\n"
           "            h ^= a[i, j]\n"
           "        out[i] = h\n")
    return src, name
