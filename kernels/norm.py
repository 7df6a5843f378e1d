"""Normalization family: softmax/log_softmax, layer norm and batch norm, forward and backward.

Every kernel walks a strided view with the normalized ("row") elements last: softmax rows are
`a[i0.., j]` (ko outer dims), layer norm rows `a[i, j0..]` (one outer dim), batch norm channels
`a[c, j0..]` (the channel is the outer dim, batch and spatial dims the row). Sizes are runtime;
flags (which inputs/outputs exist, training or not) are static and change the rendered code.
Arrays an op lacks are passed as 1-element dummies so the signature never changes.
`A` is the compute type (float64 for float32 data: one rounding at the store).

>>> A = "np.float64"
>>> src, name = render_softmax(False, 1, A, "np.float32")
>>> "_v_exp_neg(r[j] - m)" in src, "math.exp(" in render_softmax(False, 1, A, A)[0]
(True, True)
"""

from __future__ import annotations

from .elementwise import kernel_name
from .vmath import VMATH_ID, VMATH_PRELUDE

_VEXP_ID = VMATH_ID   # float32 softmax source includes the vmath prelude: its version is the name

HEADER = '@njit(error_model="numpy", nogil=True{extra})\n'


class _Src:
    """Lines of source with an indentation cursor."""

    def __init__(self, name: str, params: list, parallel: bool):
        extra = ", parallel=True" if parallel else ""
        self.lines = [HEADER.format(extra=extra) + f"def {name}({', '.join(params)}):"]
        self.depth = 1

    def __call__(self, *lines: str) -> _Src:
        for line in lines:
            self.lines.append("    " * self.depth + line)
        return self

    def loops(self, dims: list, rng: str = "range") -> None:
        """Open one `for` per (index, extent) pair; the first may be a prange."""
        for n, (idx, extent) in enumerate(dims):
            self(f"for {idx} in {rng if n == 0 else 'range'}({extent}):")
            self.depth += 1

    def close(self, n: int) -> None:
        self.depth -= n

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _row(kr: int, lead: str, ko: int = 1) -> tuple[list, str]:
    """Inner loops over dims ko..ko+kr-1 of a (lead.., j0..) view, and the index string."""
    dims = [(f"j{d}", f"a.shape[{d + ko}]") for d in range(kr)]
    return dims, ", ".join([lead] + [f"j{d}" for d in range(kr)])


def _outer(ko: int) -> tuple[str, list]:
    """Layer norm's row index: `i` for one outer dim; for ko > 1 the outer dims' indices
    i0.. unravelled from the flat row number `i` (what the lines after the row loop set)."""
    if ko == 1:
        return "i", []
    lines = []
    for d in range(ko):   # NOTE: i itself is never reassigned (a prange index may not be)
        inner = " * ".join(f"a.shape[{e}]" for e in range(d + 1, ko))
        q = f"i // ({inner})" if inner else "i"
        lines.append(f"i{d} = {q}" if d == 0 else f"i{d} = ({q}) % a.shape[{d}]")
    return ", ".join(f"i{d}" for d in range(ko)), lines


def render_softmax(log: bool, ko: int, acc_t: str, store: str,
                   parallel: bool = False, safe: bool = False) -> tuple[str, str]:
    """`k(out, a)`: softmax or log_softmax along the last dim of rank-(ko + 1) views.

    Like torch's CPU kernel: exp(x - max) in the data's type, each computed once (softmax keeps
    it in `out` and rescales in place), the sum in `acc_t`. `safe` (_safe_softmax, attention's
    math path): a row whose every element is -inf becomes zeros (softmax makes it NaN)."""
    name = kernel_name("softmax", log, ko, acc_t, store, parallel, _VEXP_ID,
                       *(("safe",) if safe else ()))
    s = _Src(name, ["out", "a"], parallel)
    s.loops([(f"i{d}", f"a.shape[{d}]") for d in range(ko)], "prange" if parallel else "range")
    ix = ", ".join([f"i{d}" for d in range(ko)] + ["j"])
    A = acc_t
    if store == "np.float32" and A == "np.float64":
        return _softmax_f32(s, log, ko, ix, safe), name
    s(f"m = a[{', '.join([f'i{d}' for d in range(ko)] + ['0'])}]",
      f"for j in range(a.shape[{ko}]):",
      f"    x = a[{ix}]", "    if x > m or x != x:", "        m = x")
    s(f"s = {A}(0)", f"for j in range(a.shape[{ko}]):", f"    e = math.exp(a[{ix}] - m)")
    if log:
        # torch's order: (x - max) - log(sum)
        s("    s += e", "ls = math.log(s)", f"for j in range(a.shape[{ko}]):",
          f"    out[{ix}] = {store}({A}(a[{ix}] - m) - ls)")
    else:
        s(f"    out[{ix}] = {store}(e)", "    s += e", f"inv = {A}(1) / s",
          f"for j in range(a.shape[{ko}]):", f"    out[{ix}] = {store}(out[{ix}] * inv)")
    if safe:
        _safe_rows(s, f"a[{ix}]", f"out[{ix}]", f"a.shape[{ko}]")
    return s.text(), name


def _safe_rows(s: _Src, x: str, o: str, n: str) -> None:
    """_safe_softmax's rule after the row is computed: a row whose max is -inf is zeros when
    every element is -inf (a NaN among them keeps the NaN row, as torch's all(x == -inf))."""
    s("if m == -np.inf:", "    z = True", f"    for j in range({n}):",
      f"        if {x} != -np.inf:", "            z = False", "    if z:",
      f"        for j in range({n}):", f"            {o} = 0")


_ROWMAX32 = '''
from eager_neuron.kernels.stream import maxnum_nn as _sm_maxnum


@njit(error_model="numpy", nogil=True)
def _sm_max32(r):
    # the row max, vectorized (vmaxps); unspecified if the row holds a NaN, whose exp then
    # makes the row's sum, and so every output of the row, NaN (as torch's NaN max does)
    m = np.float32(-np.inf)
    for j in range(r.shape[0]):
        m = _sm_maxnum(m, r[j])
    return m
'''


_ROWSUM64 = '''
@njit(error_model="numpy", nogil=True, fastmath={"reassoc"})
def _sm_sum64(o):
    # the float64 sum of a float32 row; reassoc lets LLVM split it into vector lanes (scalar
    # partial sums written out in the source were not SLP-vectorized: 4 lanes cost more than
    # the whole rest of the row). NOT inline="always": Numba inlines at its IR level, where the
    # caller's flags would apply (the exp polynomial must not be reassociated)
    s = np.float64(0)
    for j in range(o.shape[0]):
        s += np.float64(o[j])
    return s
'''


def _softmax_f32(s: _Src, log: bool, ko: int, ix: str, safe: bool = False) -> str:
    """float32 rows: the max by vmaxps (`_sm_max32`), exp(x - max) by the vectorizable _vexp
    (kernels/vmath.py `_v_exp_neg`: 1 ulp, as torch's vectorized expf) into `out` in its own
    loop, then
    summed in float64 (`_sm_sum64`, vectorized under reassoc in its own function); softmax
    rescales by the float32 reciprocal, as torch's CPU kernel. Every loop vectorizes; rows are
    views indexed from 0, so no loop keeps Numba's negative-index wraparound."""
    rows = ", ".join(f"i{d}" for d in range(ko))
    # the row max by vmaxps (_sm_max32): 0.74 of the row's 2.3 ms per 4096 rows of 1024 in
    # cache went to the earlier integer-key max with its NaN flag; a NaN needs no flag here
    s(f"r = a[{rows}]", f"o = out[{rows}]", "m = _sm_max32(r)")
    # x - max <= 0 (or NaN): _v_exp_neg, bit for bit _vexp there, with fewer ops
    s("for j in range(r.shape[0]):", "    o[j] = _v_exp_neg(r[j] - m)", "t = _sm_sum64(o)")
    if log:
        # torch's order: (x - max) - log(sum)
        s("ls = math.log(t)", "for j in range(r.shape[0]):",
          "    o[j] = np.float32(np.float64(r[j] - m) - ls)")
    else:
        s("inv = np.float32(np.float64(1) / t)", "for j in range(r.shape[0]):",
          "    o[j] = o[j] * inv")
    if safe:
        _safe_rows(s, "r[j]", "o[j]", "r.shape[0]")
    return VMATH_PRELUDE + "\n\n" + _ROWMAX32 + "\n\n" + _ROWSUM64 + "\n\n" + s.text()


def render_softmax_backward(log: bool, ko: int, acc_t: str, store: str,
                            parallel: bool = False) -> tuple[str, str]:
    """`k(gi, g, y)`: y is the forward output; gi = y * (g - sum(g * y)) or g - exp(y) sum(g)."""
    name = kernel_name("softmax_bw", log, ko, acc_t, store, parallel)
    s = _Src(name, ["gi", "g", "y"], parallel)
    s.loops([(f"i{d}", f"g.shape[{d}]") for d in range(ko)], "prange" if parallel else "range")
    ix = ", ".join([f"i{d}" for d in range(ko)] + ["j"])
    A = acc_t
    term = f"{A}(g[{ix}])" if log else f"{A}(g[{ix}]) * {A}(y[{ix}])"
    s(f"s = {A}(0)", f"for j in range(g.shape[{ko}]):", f"    s += {term}",
      f"for j in range(g.shape[{ko}]):")
    if log:
        s(f"    gi[{ix}] = {store}({A}(g[{ix}]) - math.exp({A}(y[{ix}])) * s)")
    else:
        s(f"    gi[{ix}] = {store}({A}(y[{ix}]) * ({A}(g[{ix}]) - s))")
    return s.text(), name


def render_layer_norm(kr: int, acc_t: str, store: str, stat_store: str,
                      parallel: bool = False, ko: int = 1) -> tuple[str, str]:
    """`k(out, mean, rstd, a, w, b, ws, bs, eps)`: rows a[i, j0..] (ko outer dims: a[i0.., j0..],
    the rows of a transposed input that do not coalesce into one dim); w/b flat, read at k * ws
    (ws = 0 and a one-element [1] stand in for no weight: one kernel with or without affine)."""
    name = kernel_name("layer_norm", kr, acc_t, store, stat_store, parallel, *(
        (ko,) if ko != 1 else ()))
    s = _Src(name, ["out", "mean", "rstd", "a", "w", "b", "ws", "bs", "eps"], parallel)
    A = acc_t
    lead, unravel = _outer(ko)
    dims, ix = _row(kr, lead, ko)
    s("cnt = " + " * ".join(f"a.shape[{d + ko}]" for d in range(kr)))
    rows = " * ".join(f"a.shape[{d}]" for d in range(ko))
    s.loops([("i", rows)], "prange" if parallel else "range")
    s(*unravel)
    # 1. two-pass moments
    s(f"t = {A}(0)")
    s.loops(dims)
    s(f"t += {A}(a[{ix}])")
    s.close(kr)
    s("mu = t / cnt", f"ss = {A}(0)")
    s.loops(dims)
    s(f"d = {A}(a[{ix}]) - mu", "ss += d * d")
    s.close(kr)
    s(f"r = {A}(1) / math.sqrt(ss / cnt + eps)", f"mean[{lead}] = {stat_store}(mu)",
      f"rstd[{lead}] = {stat_store}(r)", "k = 0")
    # 2. normalize, scale, shift
    s.loops(dims)
    s(f"out[{ix}] = {store}(({A}(a[{ix}]) - mu) * r * {A}(w[k * ws]) + {A}(b[k * bs]))",
      "k += 1")
    return s.text(), name


def render_layer_norm_backward(kr: int, acc_t: str, stores: tuple,
                               parallel: bool = False, ko: int = 1) -> tuple[str, str]:
    """`k(gi, gw, gb, g, a, mean, rstd, w, ws, m0, m1, m2, nch)`: m0..m2 say which grads to
    write; rows split in nch chunks with their own partial sums for gw/gb (so the chunks can run
    in parallel), merged at the end. ko outer dims as render_layer_norm's."""
    name = kernel_name("layer_norm_bw", kr, acc_t, stores, parallel, *(
        (ko,) if ko != 1 else ()))
    s = _Src(name, ["gi", "gw", "gb", "g", "a", "mean", "rstd", "w", "ws", "m0", "m1", "m2",
                    "nch"], parallel)
    A = acc_t
    lead, unravel = _outer(ko)
    dims, ix = _row(kr, lead, ko)
    s("rows = " + " * ".join(f"a.shape[{d}]" for d in range(ko)),
      "cnt = " + " * ".join(f"a.shape[{d + ko}]" for d in range(kr)),
      f"pw = np.zeros((nch, cnt if m1 else 1), {A})",
      f"pb = np.zeros((nch, cnt if m2 else 1), {A})")
    s.loops([("c", "nch")], "prange" if parallel else "range")
    s("for i in range(c * rows // nch, (c + 1) * rows // nch):")
    s.depth += 1
    s(*unravel)
    s(f"mu = {A}(mean[{lead}])", f"r = {A}(rstd[{lead}])", f"s1 = {A}(0)", f"s2 = {A}(0)",
      "k = 0")
    s("if m0:")
    s.depth += 1
    s.loops(dims)
    s(f"wdy = {A}(g[{ix}]) * {A}(w[k * ws])", "s1 += wdy",
      f"s2 += wdy * ({A}(a[{ix}]) - mu) * r", "k += 1")
    s.close(kr)
    s("s1 /= cnt", "s2 /= cnt")
    s.depth -= 1
    s("k = 0")
    s.loops(dims)
    s(f"dy = {A}(g[{ix}])", f"xh = ({A}(a[{ix}]) - mu) * r", "if m0:",
      f"    gi[{ix}] = {stores[0]}((dy * {A}(w[k * ws]) - s1 - xh * s2) * r)",
      "if m1:", "    pw[c, k] += dy * xh", "if m2:", "    pb[c, k] += dy", "k += 1")
    s.depth = 1
    for flag, part, out, st in (("m1", "pw", "gw", stores[1]), ("m2", "pb", "gb", stores[2])):
        s(f"if {flag}:", "    for k in range(cnt):", f"        t = {A}(0)",
          "        for c in range(nch):", f"            t += {part}[c, k]",
          f"        {out}[k] = {st}(t)")
    return s.text(), name


def render_batch_norm(kr: int, acc_t: str, store: str, stat_store: str, run_store: str,
                      parallel: bool = False) -> tuple[str, str]:
    """`k(out, smean, sinv, rm_out, rv_out, a, w, b, rm, rv, ws, bs, train, run, save, rnd, mom,
    eps)`
    over channels a[c, j..]. train=1: batch moments, and with `run` the running stats updated
    with the unbiased variance (torch's rule); train=0 (eval): the running stats normalize;
    train=2: smean/sinv as given normalize (the CPU's bfloat16 path rounds its statistics
    before it normalizes; rnd=1 also rounds the variance sum and the variance to bfloat16 on
    the way to inv, as its bfloat16 kernel does). rm_out may be rm itself (in place). Flags are
    runtime values: one kernel for every module option."""
    name = kernel_name("batch_norm", kr, acc_t, store, stat_store, run_store, parallel)
    s = _Src(name, ["out", "smean", "sinv", "rm_out", "rv_out", "a", "w", "b", "rm", "rv", "ws",
                    "bs", "train", "run", "save", "rnd", "mom", "eps"], parallel)
    A = acc_t
    dims, ix = _row(kr, "c")
    s("cnt = " + " * ".join(f"a.shape[{d + 1}]" for d in range(kr)))
    s.loops([("c", "a.shape[0]")], "prange" if parallel else "range")
    s("if train == 1:")
    s.depth += 1
    s(f"t = {A}(0)")
    s.loops(dims)
    s(f"t += {A}(a[{ix}])")
    s.close(kr)
    s("mu = t / cnt", f"ss = {A}(0)")
    s.loops(dims)
    s(f"d = {A}(a[{ix}]) - mu", "ss += d * d")
    s.close(kr)
    # round to nearest even bfloat16 through the float32 bits (tb/tu: one scratch per channel)
    bf16 = ("    tu[0] = (tu[0] + np.uint32(32767) + ((tu[0] >> np.uint32(16)) & np.uint32(1)))"
            " & np.uint32(4294901760)")
    s("var = ss / cnt", "if rnd:", "    tb = np.empty(1, np.float32)",
      "    tu = tb.view(np.uint32)", "    tb[0] = np.float32(ss)", bf16,
      f"    tb[0] = np.float32({A}(tb[0]) / cnt)", bf16, f"    var = {A}(tb[0])")
    s(f"inv = {A}(1) / math.sqrt(var + eps)", "if run:",
      f"    rm_out[c] = {run_store}(({A}(1) - mom) * {A}(rm[c]) + mom * mu)",
      f"    rv_out[c] = {run_store}(({A}(1) - mom) * {A}(rv[c]) + mom * (ss / (cnt - 1)))")
    s.depth -= 1
    s("elif train == 2:", f"    mu = {A}(smean[c])", f"    inv = {A}(sinv[c])",
      "else:", f"    mu = {A}(rm[c])", f"    inv = {A}(1) / math.sqrt({A}(rv[c]) + eps)",
      "if save:", f"    smean[c] = {stat_store}(mu)", f"    sinv[c] = {stat_store}(inv)",
      f"wc = {A}(w[c * ws])", f"bc = {A}(b[c * bs])")
    s.loops(dims)
    s(f"out[{ix}] = {store}(({A}(a[{ix}]) - mu) * inv * wc + bc)")
    return s.text(), name


def render_batch_norm_backward(kr: int, acc_t: str, stores: tuple,
                               parallel: bool = False) -> tuple[str, str]:
    """`k(gi, gw, gb, g, a, w, ws, rm, rv, smean, sinv, train, m0, m1, m2, eps)` over
    channels a[c, j..]; m0..m2 say which grads to write."""
    name = kernel_name("batch_norm_bw", kr, acc_t, stores, parallel)
    s = _Src(name, ["gi", "gw", "gb", "g", "a", "w", "ws", "rm", "rv", "smean", "sinv", "train",
                    "m0", "m1", "m2", "eps"], parallel)
    A = acc_t
    dims, ix = _row(kr, "c")
    s("cnt = " + " * ".join(f"a.shape[{d + 1}]" for d in range(kr)))
    s.loops([("c", "a.shape[0]")], "prange" if parallel else "range")
    s("if train:", f"    mu = {A}(smean[c])", f"    inv = {A}(sinv[c])",
      "else:", f"    mu = {A}(rm[c])", f"    inv = {A}(1) / math.sqrt({A}(rv[c]) + eps)",
      f"wc = {A}(w[c * ws])", f"sdy = {A}(0)", f"sdyx = {A}(0)")
    s.loops(dims)
    s(f"dy = {A}(g[{ix}])", "sdy += dy", f"sdyx += dy * ({A}(a[{ix}]) - mu)")
    s.close(kr)
    s("k1 = sdy / cnt if train else 0.0", "k2 = sdyx * inv * inv / cnt if train else 0.0",
      "if m0:")
    s.depth += 1
    s.loops(dims)
    s(f"gi[{ix}] = {stores[0]}(({A}(g[{ix}]) - k1 - ({A}(a[{ix}]) - mu) * k2) * inv * wc)")
    s.close(kr)
    s.depth -= 1
    s("if m1:", f"    gw[c] = {stores[1]}(sdyx * inv)", "if m2:",
      f"    gb[c] = {stores[2]}(sdy)")
    return s.text(), name


def render_group_norm(acc_t: str, store: str, stat_store: str,
                      parallel: bool = False) -> tuple[str, str]:
    """`k(out, mean, rstd, a, w, b, ws, bs, eps)`: a[n, g, j, s] (batch, group, channel in the
    group, spatial), moments per (n, g) row; w/b flat per channel, read at (g * D + j) * ws."""
    name = kernel_name("group_norm", acc_t, store, stat_store, parallel)
    s = _Src(name, ["out", "mean", "rstd", "a", "w", "b", "ws", "bs", "eps"], parallel)
    A = acc_t
    s("G = a.shape[1]", "D = a.shape[2]", "S = a.shape[3]", "cnt = D * S")
    s.loops([("r", "a.shape[0] * G")], "prange" if parallel else "range")
    s("n = r // G", "g = r - n * G", f"t = {A}(0)")
    s.loops([("j", "D"), ("q", "S")])
    s(f"t += {A}(a[n, g, j, q])")
    s.close(2)
    s("mu = t / cnt", f"ss = {A}(0)")
    s.loops([("j", "D"), ("q", "S")])
    s(f"d = {A}(a[n, g, j, q]) - mu", "ss += d * d")
    s.close(2)
    s(f"rs = {A}(1) / math.sqrt(ss / cnt + eps)", f"mean[n, g] = {stat_store}(mu)",
      f"rstd[n, g] = {stat_store}(rs)")
    s.loops([("j", "D")])
    s("c = g * D + j", f"sc = rs * {A}(w[c * ws])", f"sh = {A}(b[c * bs])")
    s.loops([("q", "S")])
    s(f"out[n, g, j, q] = {store}(({A}(a[n, g, j, q]) - mu) * sc + sh)")
    return s.text(), name


def render_group_norm_backward(acc_t: str, stores: tuple,
                               parallel: bool = False) -> tuple[str, str]:
    """`k(gi, gw, gb, g, a, mean, rstd, w, ws, m0, m1, m2)` over a[n, g, j, s]; m0..m2 say
    which grads to write. Per-(n, channel) sums of dy * xhat and dy are kept apart so the rows
    run in parallel, then summed over the batch for gw/gb."""
    name = kernel_name("group_norm_bw", acc_t, stores, parallel)
    s = _Src(name, ["gi", "gw", "gb", "g", "a", "mean", "rstd", "w", "ws", "m0", "m1", "m2"],
             parallel)
    A = acc_t
    s("N = a.shape[0]", "G = a.shape[1]", "D = a.shape[2]", "S = a.shape[3]", "cnt = D * S",
      f"pw = np.zeros((N, G, D), {A})", f"pb = np.zeros((N, G, D), {A})")
    s.loops([("r", "N * G")], "prange" if parallel else "range")
    s("n = r // G", "k = r - n * G", f"mu = {A}(mean[n, k])", f"rs = {A}(rstd[n, k])",
      f"s1 = {A}(0)", f"s2 = {A}(0)")
    s.loops([("j", "D")])
    s(f"wc = {A}(w[(k * D + j) * ws])", f"dsum = {A}(0)", f"xsum = {A}(0)")
    s.loops([("q", "S")])
    s(f"dy = {A}(g[n, k, j, q])", f"xh = ({A}(a[n, k, j, q]) - mu) * rs", "dsum += dy",
      "xsum += dy * xh")
    s.close(1)
    s("pw[n, k, j] = xsum", "pb[n, k, j] = dsum", "s1 += dsum * wc", "s2 += xsum * wc")
    s.close(1)
    s("if m0:")
    s.depth += 1
    s("s1 /= cnt", "s2 /= cnt")
    s.loops([("j", "D")])
    s(f"wc = {A}(w[(k * D + j) * ws])")
    s.loops([("q", "S")])
    s(f"xh = ({A}(a[n, k, j, q]) - mu) * rs",
      f"gi[n, k, j, q] = {stores[0]}(({A}(g[n, k, j, q]) * wc - s1 - xh * s2) * rs)")
    s.depth = 1
    for flag, part, out, st in (("m1", "pw", "gw", stores[1]), ("m2", "pb", "gb", stores[2])):
        s(f"if {flag}:", "    for k in range(G):", "        for j in range(D):",
          f"            t = {A}(0)", "            for n in range(N):",
          f"                t += {part}[n, k, j]", f"            {out}[k * D + j] = {st}(t)")
    return s.text(), name
