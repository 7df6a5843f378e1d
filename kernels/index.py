"""Index/gather family: take, put, gather/scatter along an axis, nonzero, masked select/scatter.

Specs are plain data (loop ranks, dtype casts); sizes, reductions and most flags are runtime
values, so one compiled kernel serves many ops and every size. Numba does not
bounds-check, so every kernel that reads an index checks it and reports the first bad one in
`err` (int64[4]: flag, value, axis, size) and returns; the lowering raises. Kernels that write
validate every index before the first write, so an in-place op leaves `self` untouched.

>>> src, name = render_take(1, 1, 1)
>>> "k0 >= src.shape[0]" in src
True
"""

from __future__ import annotations

from .elementwise import kernel_name
from .halfround import ROUND_BF16, ROUND_F16

HEADER = '@njit(error_model="numpy", nogil=True)'

# Shared helpers, prepended to every kernel of this family.
# _round_bf16 (halfround.py): x rounded to the nearest bfloat16, kept in float32, so a float32
# buffer stored through it accumulates exactly as a bfloat16 one does on the CPU
PRELUDE = ROUND_BF16 + '''
@njit(inline="always")
def _fix(k, n, wrap):
    return k + n if (wrap and k < 0) else k

@njit(inline="always")
def _bad(err, value, axis, n):
    err[0] = 1
    err[1] = value
    err[2] = axis
    err[3] = n

'''


def _ix(prefix: str, n: int, start: int = 0) -> str:
    return ", ".join(f"{prefix}{d}" for d in range(start, start + n))


class _Src:
    """A tiny source builder: lines with an indentation cursor."""

    def __init__(self, name: str, params: list) -> None:
        self.lines = [HEADER, f"def {name}({', '.join(params)}):"]
        self.depth = 1

    def add(self, *lines: str) -> None:
        self.lines.extend("    " * self.depth + ln for ln in lines)

    def loops(self, var: str, arr: str, n: int, start: int = 0) -> None:
        """Open n nested loops `var{d}` over arr.shape[start + d]."""
        for d in range(n):
            self.add(f"for {var}{d} in range({arr}.shape[{start + d}]):")
            self.depth += 1

    def close(self, n: int) -> None:
        self.depth -= n

    def text(self) -> str:
        return PRELUDE + "\n".join(self.lines) + "\n"


def _fill(s: _Src, rc: int, flag: str, value: str) -> None:
    """`if flag:` dst[c..] = value over dst's rc dims. NOTE: explicit loops, not
    `dst[...] = full`: Numba's generic array assignment costs seconds of compile time."""
    s.add(f"if {flag}:")
    s.depth += 1
    s.loops("c", "dst", rc)
    s.add(f"dst[{_ix('c', rc)}] = {value.format(_ix('c', rc))}")
    s.close(rc)
    s.depth -= 1


def _check(s: _Src, k: str, raw: str, n: str, axis: int, wrap: str = "False") -> None:
    """k = raw (negative wrapped when `wrap`, a runtime flag); out of [0, n): report and return."""
    s.add(f"{k} = _fix({raw}, {n}, {wrap})",
          f"if {k} < 0 or {k} >= {n}:",
          f"    _bad(err, {raw}, {axis}, {n})",
          "    return")


def render_take(nb: int, k: int, nr: int) -> tuple[str, str]:
    """`take(out, src, i0..i{k-1}, wrap, err)`: out[b.., r..] = src[i0[b..], .., r..].

    out has nb broadcast-index dims then nr rest dims; src has k indexed dims then nr rest dims.
    wrap: negative indices count from the end (advanced indexing; torch rejects them elsewhere).
    """
    name = kernel_name("take", nb, k, nr)
    s = _Src(name, ["out", "src"] + [f"i{j}" for j in range(k)] + ["wrap", "err"])
    b = _ix("b", nb)
    s.loops("b", "out", nb)
    for j in range(k):
        _check(s, f"k{j}", f"i{j}[{b}]", f"src.shape[{j}]", j, "wrap")
    s.loops("r", "out", nr, start=nb)
    s.add(f"out[{b}, {_ix('r', nr)}] = src[{_ix('k', k)}, {_ix('r', nr)}]")
    return s.text(), name


def render_put(nb: int, k: int, nr: int, rc: int, freq: bool, store: str,
               scale: str = "{}") -> tuple[str, str]:
    """`put(out, vals, i0.., wrap, acc, copy, zero, pad_on, pad, alpha, err, dst, full)`:
    out[i0[b..], .., r..] (+)= vals[b.., r..] * alpha.

    Runtime flags (one kernel serves index_put, index_add and embedding backward): copy: first
    dst = full (the functional form); zero: dst starts at 0; pad_on: skip rows whose raw
    index equals `pad`. Static: freq scales each row by 1 / its index count (embedding backward
    with scale_grad_by_freq); `store` formats the stored value ("np.float32({})"), `scale` the
    scaled value before the add (a half 1-d index_add rounds `vals * alpha` first).
    """
    name = kernel_name("put", nb, k, nr, rc, freq, store, scale)
    params = ["out", "vals"] + [f"i{j}" for j in range(k)] + [
        "wrap", "acc", "copy", "zero", "pad_on", "pad", "alpha", "err", "dst", "full"]
    s = _Src(name, params)
    b, r, ks = _ix("b", nb), _ix("r", nr), _ix("k", k)
    skip = (f"if pad_on and i0[{b}] == pad:", "    continue")
    # 1. validate every index before the first write
    s.loops("b", "vals", nb)
    s.add(*skip)
    for j in range(k):
        _check(s, f"k{j}", f"i{j}[{b}]", f"out.shape[{j}]", j, "wrap")
    s.close(nb)
    _fill(s, rc, "copy", "full[{}]")
    _fill(s, rc, "zero", "0")
    if freq:
        s.add("cnt = np.zeros(out.shape[0], np.int64)")
        s.loops("b", "vals", nb)
        s.add(*skip, f"cnt[_fix(i0[{b}], out.shape[0], wrap)] += 1")
        s.close(nb)
    # 2. write (or accumulate) every row
    s.loops("b", "vals", nb)
    s.add(*skip)
    for j in range(k):
        s.add(f"k{j} = _fix(i{j}[{b}], out.shape[{j}], wrap)")
    if freq:
        s.add("w = 1.0 / cnt[k0]")
    s.loops("r", "vals", nr, start=nb)
    s.add("x = " + scale.format(f"vals[{b}, {r}] * alpha" + (" * w" if freq else "")),
          "if acc:", f"    x = out[{ks}, {r}] + x",
          f"out[{ks}, {r}] = {store.format('x')}")
    # a float16 accumulate's store rounds each add (ROUND_F16 only where used: PRELUDE's
    # digest is part of every kernel of the family)
    return (ROUND_F16 if "_round_f16" in store + scale else "") + s.text(), name


# scatter reductions, a runtime code: combine the current value `a` with the new value `v`
REDUCE = {None: 0, "sum": 1, "mean": 2, "prod": 3, "amax": 4, "amin": 5}
_COMBINE = (
    "if red == 0:\n    x = v\n"
    "elif red <= 2:\n    x = a + v\n"
    "elif red == 3:\n    x = a * v\n"
    "elif red == 4:\n    x = v if (v != v or v > a) else a\n"   # NaN propagates, as on the CPU
    "else:\n    x = v if (v != v or v < a) else a"
)


def render_gather(c: int) -> tuple[str, str]:
    """`gather(out, src, idx, err)`: out[o.., j] = src[o.., idx[o.., j]] over c outer dims."""
    name = kernel_name("gather", c)
    s = _Src(name, ["out", "src", "idx", "err"])
    o = _ix("o", c)
    s.add(f"n = src.shape[{c}]")
    s.loops("o", "idx", c)
    s.add(f"for j in range(idx.shape[{c}]):")
    s.depth += 1
    _check(s, "k", f"idx[{o}, j]", "n", 0)
    s.add(f"out[{o}, j] = src[{o}, k]")
    return s.text(), name


def render_scatter(c: int, rc: int, value: bool, cast: str, store: str,
                   total: str = "{}") -> tuple[str, str]:
    """`scatter(out, src, idx, red, include_self, copy, ident, err, dst, full)`:
    out[o.., idx[o.., j]] op= src[o.., j] over c outer dims, op from REDUCE[red].

    Static: value (`src` is a scalar), the output's load/store casts and `total`, the format of
    a mean's sum before its division (a half mean rounds the sum to the half type first);
    runtime: the reduction, include_self (else touched slots restart from `ident`) and copy
    (first dst = full, both with rc dims).
    """
    name = kernel_name("scatter", c, rc, value, cast, store, total)
    s = _Src(name, ["out", "src", "idx", "red", "include_self", "copy", "ident", "err", "dst",
                    "full"])
    o = _ix("o", c)
    s.add(f"n = out.shape[{c}]")

    def each_index(*body) -> None:
        s.loops("o", "idx", c)
        s.add(f"for j in range(idx.shape[{c}]):")
        s.depth += 1
        for item in body:
            item() if callable(item) else s.add(*item.split("\n"))
        s.close(c + 1)

    # 1. validate; 2. copy; 3. restart touched slots from the identity (not include_self)
    each_index(lambda: _check(s, "k", f"idx[{o}, j]", "n", 0))
    _fill(s, rc, "copy", "full[{}]")
    s.add("if red != 0 and not include_self:")
    s.depth += 1
    each_index(f"out[{o}, idx[{o}, j]] = {cast}(ident)")
    s.depth -= 1
    zeros = "(" + "0, " * (c + 1) + ")"
    s.add(f"cnt = np.zeros(out.shape if red == 2 else {zeros}, np.int64)")
    # 4. combine
    load = f"{cast}(src)" if value else f"{cast}(src[{o}, j])"
    each_index(f"k = idx[{o}, j]", f"v = {load}", f"a = out[{o}, k]", _COMBINE,
               f"out[{o}, k] = {store.format('x')}",
               f"if red == 2:\n    cnt[{o}, k] += 1")
    # 5. mean: divide by the count (+1 for self); floor division for integers, as on the CPU
    div = "/" if "float" in cast else "//"
    s.add("if red == 2:")
    s.depth += 1
    s.loops("o", "out", c)
    s.add("for k in range(n):", f"    m = cnt[{o}, k]", "    if m > 0:",
          f"        out[{o}, k] = "
          f"{store.format(total.format(f'out[{o}, k]') + f' {div} (m + include_self)')}")
    return (ROUND_F16 if "_round_f16" in store + total else "") + s.text(), name


def _test(expr: str, bits: bool) -> str:
    # NOTE: half floats arrive as int16 bit patterns; +0.0 and -0.0 are the zeros.
    return f"({expr} & 0x7FFF) != 0" if bits else f"{expr} != 0"


def render_count(rank: int, bits: bool) -> tuple[str, str]:
    """`count(x, out)`: out[0] = number of non-zero elements of x."""
    name = kernel_name("count", rank, bits)
    s = _Src(name, ["x", "out"])
    s.add("c = 0")
    s.loops("i", "x", rank)
    s.add(f"if {_test('x[' + _ix('i', rank) + ']', bits)}:", "    c += 1")
    s.close(rank)
    s.add("out[0] = c")
    return s.text(), name


def render_nonzero(rank: int, bits: bool) -> tuple[str, str]:
    """`nonzero(out, x, fill)`: the coordinates of x's non-zero elements, in C order, as rows of
    out; rows past out's end are dropped and rows left over take `fill` (nonzero_static)."""
    name = kernel_name("nonzero", rank, bits)
    s = _Src(name, ["out", "x", "fill"])
    s.add("p = 0")
    s.loops("i", "x", rank)
    s.add(f"if p < out.shape[0] and {_test('x[' + _ix('i', rank) + ']', bits)}:")
    s.depth += 1
    s.add(*(f"out[p, {d}] = i{d}" for d in range(rank)), "p += 1")
    s.depth -= rank + 1
    s.add("for q in range(p, out.shape[0]):",
          *(f"    out[q, {d}] = fill" for d in range(rank)))
    return s.text(), name


def render_masked_select(rank: int) -> tuple[str, str]:
    """`masked_select(out, x, m)`: x's elements where m is true, in C order; the rest of out (if
    longer, as in masked_scatter_backward) is zeroed."""
    name = kernel_name("masked_select", rank)
    s = _Src(name, ["out", "x", "m"])
    i = _ix("i", rank)
    s.add("p = 0")
    s.loops("i", "x", rank)
    s.add(f"if m[{i}]:", f"    out[p] = x[{i}]", "    p += 1")
    s.close(rank)
    s.add("for q in range(p, out.shape[0]):", "    out[q] = 0")
    return s.text(), name


def render_masked_scatter(rank: int) -> tuple[str, str]:
    """`masked_scatter(out, m, src, copy, full, err)`: out's masked slots take src's elements in
    C order; copy (runtime): out starts as `full` (the functional form)."""
    name = kernel_name("masked_scatter", rank)
    s = _Src(name, ["out", "m", "src", "copy", "full", "err"])
    i = _ix("i", rank)
    s.add("p = 0")
    s.loops("i", "m", rank)
    s.add(f"if m[{i}]:", "    p += 1")
    s.close(rank)
    s.add("if p > src.size:", "    _bad(err, p, 0, src.size)", "    return", "dst = out")
    _fill(s, rank, "copy", "full[{}]")
    s.add("p = 0")
    s.loops("i", "m", rank)
    s.add(f"if m[{i}]:", f"    out[{i}] = src.flat[p]", "    p += 1")
    return s.text(), name
