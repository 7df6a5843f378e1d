"""Reduction family: reduce the trailing `kr` dims of an (outer..., inner...) view, and scans.
(Just over 500 lines: the loss and segment_reduce renderers at the end reuse this file's header,
substitution and accumulator helpers.)

The lowering permutes the reduced dims last and coalesces both groups, so a kernel sees
`a[i0..i(ko-1), j0..j(kr-1)]` and writes `out[i0..i(ko-1)]`; sizes are read from the arrays at
run time. An op is plain data: passes of (init, step) statements over the loaded element `x`
(and its linear inner index `k`), then one final expression per output. Tokens: `A(..)` the
accumulator type, `L(..)` the load cast, `cnt` the inner element count, `c0..` the scalars.

Modes (which loop nest; all read the same strided view):
- "row":   per output, loop over its inner elements (any op; prange over the outermost dim;
           with one kept and one reduced dim, rows i and i + rows/2 side by side).
- "col":   2-d only, inner dim strided and outer dim unit-stride (`x.sum(0)`): accumulators for a
           block of outputs, walking the reduced dim in the outer loop, so loads stay contiguous.
- "chunk": one output, 1-d inner: prange over chunks, then merge the partial accumulators.
- "block": float32 sum/mean to one output over a contiguous row: float64 block sums into a
           float64 total, the row's two halves read side by side, serial (at memory speed;
           the prange "chunk" mode lost to oversubscription on a busy host: measured 20x
           slower with 2 cores under load).

>>> src, name = render_reduce("sum", 1, 1, "np.float64", "np.float32", ("np.float32",), 0)
>>> "acc0 += x" in src and "acc1 += x" in src   # row mode: two rows side by side
True
"""

from __future__ import annotations

import re

from .elementwise import kernel_name
from .halfround import ROUND_BF16, ROUND_F16, ROUND_HALF

# name -> (passes [(init, step)], finals per output, merge for "chunk" (p: a partial), flags)
# flags: "index" uses k (no dim sorting, row mode only); "multi" has several passes.
OPS: dict = {
    "sum": ([("acc = A(0)", "acc += x")], ("acc",), "acc += p", ""),
    "mean": ([("acc = A(0)", "acc += x")], ("acc / cnt",), "acc += p", ""),
    "prod": ([("acc = A(1)", "acc *= x")], ("acc",), "acc *= p", ""),
    # NOTE: `x != x` keeps NaN: once acc is NaN no comparison replaces it (torch propagates).
    "max": ([("acc = INIT", "if x > acc or x != x: acc = x")], ("acc",),
            "if p > acc or p != p: acc = p", ""),
    "min": ([("acc = INIT", "if x < acc or x != x: acc = x")], ("acc",),
            "if p < acc or p != p: acc = p", ""),
    # the first NaN wins, then the first extreme value: torch's argmax/max.dim semantics
    "argmax": ([("acc = INIT\nidx = 0",
                 "if x > acc or (x != x and acc == acc):\n    acc = x\n    idx = k")],
               ("acc", "idx"), "", "index"),
    "argmin": ([("acc = INIT\nidx = 0",
                 "if x < acc or (x != x and acc == acc):\n    acc = x\n    idx = k")],
               ("acc", "idx"), "", "index"),
    "any": ([("acc = False", "acc |= x != 0")], ("acc",), "acc |= p", ""),
    "all": ([("acc = True", "acc &= x != 0")], ("acc",), "acc &= p", ""),
    "norm2": ([("acc = A(0)", "acc += x * x")], ("math.sqrt(acc)",), "acc += p", ""),
    "norm1": ([("acc = A(0)", "acc += abs(x)")], ("acc",), "acc += p", ""),
    "norm0": ([("acc = A(0)", "acc += A(x != 0)")], ("acc",), "acc += p", ""),
    "normp": ([("acc = A(0)", "acc += abs(x) ** c0")], ("acc ** (A(1) / c0)",), "acc += p", ""),
    "norminf": ([("acc = A(0)", "y = abs(x)\nif y > acc or y != y: acc = y")], ("acc",),
                "if p > acc or p != p: acc = p", ""),
    "normninf": ([("acc = A(np.inf)", "y = abs(x)\nif y < acc or y != y: acc = y")], ("acc",),
                 "if p < acc or p != p: acc = p", ""),
    # two-pass variance: the mean first, then squared deviations (c0 = max(0, cnt - correction))
    "var": ([("acc = A(0)", "acc += x"), ("mu = acc / cnt\nss = A(0)", "d = x - mu\nss += d * d")],
            ("ss / c0", "mu"), "", "multi"),
    "std": ([("acc = A(0)", "acc += x"), ("mu = acc / cnt\nss = A(0)", "d = x - mu\nss += d * d")],
            ("math.sqrt(ss / c0)", "mu"), "", "multi"),
    # torch subtracts the max unless it is infinite (then 0), so all -inf gives -inf, not NaN
    "logsumexp": ([("m = A(-np.inf)", "if x > m or x != x: m = x"),
                   ("mm = A(0) if abs(m) == np.inf else m\ns = A(0)", "s += math.exp(x - mm)")],
                  ("math.log(s) + mm",), "", "multi"),
}
def _key_extreme(bits: int, big: bool) -> tuple:
    """max (big) / min of floats as an integer max/min of order-preserving keys of their bits
    (x >= 0: the bits; x < 0: the bits with the magnitude flipped), which LLVM vectorizes (the
    float compare-and-branch with NaN propagation does not). A NaN becomes the extreme key
    (the all-ones magnitude, a NaN's bits again), so it wins and comes back as NaN, as torch's.
    Ties of -0.0 and 0.0 give 0.0 for max, -0.0 for min."""
    i, f = (f"np.int{bits}", f"np.float{bits}")
    mag, expo, sh, nan = (("0x7FFFFFFF", "0x7F800000", 31, "0x7FFFFFF0") if bits == 32 else
                          ("0x7FFFFFFFFFFFFFFF", "0x7FF0000000000000", 63,
                           "0x7FFFFFFFFFFFFFF0"))
    # NOTE: a NaN's key is beyond every number's (+-inf: +-expo) but 15 short of the type's
    # extreme, and the final moves it there first (the NaN bits the extreme key gave before;
    # arithmetic, not a conditional expression, which Numba's SSA pass rejects in the row and
    # col renderers). With the extreme itself LLVM folded max(acc, NaN ? MAX : k)
    # into a sticky select the loop vectorizer does not take: the 32-bit keys ran scalar, so
    # they ran in 64-bit lanes (Numba's int32 arithmetic is int64), 8 per vector, not 16
    # (amax 256K float32 in L2: 29.3 -> 15.9 us; its 4M is memory-bound either way)
    nan_key = f"{i}({nan})" if big else f"{i}(-{nan} - 1)"
    cmp = ">" if big else "<"
    step = (f"b = {f}(x).view({i})\n"
            f"kk = {nan_key} if (b & {i}({mag})) > {i}({expo}) else "
            f"{i}(b ^ ((b >> {i}({sh})) & {i}({mag})))\n"
            f"acc = kk if kk {cmp} acc else acc")
    init = f"acc = {i}(-{mag} - 1)" if big else f"acc = {i}({mag})"
    t = (f"{i}(acc + {i}(acc > {i}({expo})) * {i}(15))" if big else
         f"{i}(acc - {i}(acc < {i}(-{expo} - 1)) * {i}(15))")
    final = f"{i}({t} ^ (({t} >> {i}({sh})) & {i}({mag}))).view({f})"
    return [(init, step)], (final,), f"acc = p if p {cmp} acc else acc", ""


for _bits in (32, 64):
    OPS[f"kmax{_bits}"] = _key_extreme(_bits, True)
    OPS[f"kmin{_bits}"] = _key_extreme(_bits, False)



SCANS = {
    "cumsum": ("A(0)", "acc += x"),
    "cumprod": ("A(1)", "acc *= x"),
    # ATen's _log_add_exp_helper in the accumulator type (float64 on the CPU): std::min/max
    # keep a NaN accumulator; two equal infinities stay as they are
    "logcumsumexp": ("A(-np.inf)",
                     ("lo = acc if acc != acc else (acc if acc < x else x)\n"
                     "hi = acc if acc != acc else (acc if x < acc else x)\n"
                     "if lo != hi or math.isfinite(lo):\n"
                     "    acc = math.log1p(math.exp(lo - hi)) + hi\n"
                     "else:\n"
                     "    acc = x")),
}
# cummax / cummin: (values, indices); ATen takes a NaN, or x when op(x, acc) holds (ties move
# the index forward: >= and <=) while the running value is not NaN
INDEX_SCANS = {"cummax": ">=", "cummin": "<="}

HEADER = '@njit(error_model="numpy", nogil=True{extra})\n'
COL_BLOCK = 1024    # outputs per accumulator block in "col" mode (8 KiB of float64: stays in L1)
COL_ROWS = 4        # reduced rows per sweep over a "col" block's accumulators
CHUNKS = 64         # partial accumulators in "chunk" mode (a few per thread)
BLOCK = 512         # elements per partial sum in "block" mode
# ops whose result does not depend on the order of the elements (exact in any order)
ORDER_FREE = frozenset({"kmax32", "kmin32", "kmax64", "kmin64", "any", "all"})
STREAMS = 2         # "block" mode reads the row as this many interleaved sequential streams


def _indent(block: str, depth: int) -> list[str]:
    pad = "    " * depth
    return [pad + line for line in block.split("\n")]


def _subst(code: str, acc_t: str, load_t: str, init: str) -> str:
    code = code.replace("INIT", init)
    code = re.sub(r"\bA\(", f"{acc_t}(", code)
    return re.sub(r"\bL\(", f"{load_t}(", code) if load_t else code.replace("L(", "(")


def _header(name: str, params: list, parallel: bool, fastmath: bool) -> list[str]:
    extra = (", parallel=True" if parallel else "") + \
        (", fastmath={'reassoc'}" if fastmath else "")
    return [HEADER.format(extra=extra) + f"def {name}({', '.join(params)}):"]


def render_reduce(op: str, ko: int, kr: int, acc_t: str, load_t: str, stores: tuple,
                  n_scalars: int, mode: str = "row", parallel: bool = False,
                  fastmath: bool = False, init: str = "") -> tuple[str, str]:
    """Source of `k(out0[, out1], a, s0..)`: a has rank ko + kr, each out rank ko."""
    passes, finals, merge, _flags = OPS[op]
    name = kernel_name("red", op, ko, kr, acc_t, load_t, stores, n_scalars, mode, parallel,
                       fastmath, init)
    outs = [f"out{i}" for i in range(len(stores))]
    params = outs + ["a"] + [f"s{j}" for j in range(n_scalars)]
    lines = _header(name, params, parallel, fastmath)
    # 1. runtime sizes and scalars
    cnt = " * ".join(f"a.shape[{ko + d}]" for d in range(kr))
    lines.append(f"    cnt = {cnt}")
    for j in range(n_scalars):
        lines.append(f"    c{j} = {acc_t}(s{j})")
    sub = lambda code: _subst(code, acc_t, load_t, init)
    load = f"{load_t}(a[{{}}])" if load_t else "a[{}]"
    if mode == "col":
        return _render_col(lines, passes[0], finals, outs, stores, sub, load, acc_t,
                           parallel), name
    if mode == "block":
        return _render_block(lines, finals, stores, acc_t, load_t), name
    if mode == "chunk":
        return _render_chunk(lines, passes[0], finals, merge, stores, sub, load, acc_t,
                             parallel, op in ORDER_FREE), name
    # 2. row mode: loop nest over the outputs, then one inner nest per pass
    rng = "prange" if parallel else "range"
    if ko == 1 and kr == 1 and len(passes) == 1 and not _flags and len(outs) == 1:
        return _render_row_pairs(lines, passes[0], finals[0], stores[0], sub, load, rng), name
    depth = 1
    for d in range(ko):
        lines.append("    " * depth + f"for i{d} in {rng if d == 0 else 'range'}(a.shape[{d}]):")
        depth += 1
    oidx = ", ".join(f"i{d}" for d in range(ko))
    aidx = ", ".join([f"i{d}" for d in range(ko)] + [f"j{d}" for d in range(kr)])
    uses_k = any(re.search(r"\bk\b", step) for _init, step in passes)
    for init_code, step in passes:
        lines += _indent(sub(init_code), depth)
        if uses_k:
            lines.append("    " * depth + "k = 0")
        inner = depth
        for d in range(kr):
            lines.append("    " * inner + f"for j{d} in range(a.shape[{ko + d}]):")
            inner += 1
        lines.append("    " * inner + "x = " + load.format(aidx))
        lines += _indent(sub(step), inner)
        if uses_k:
            lines.append("    " * inner + "k += 1")
    for out, store, final in zip(outs, stores, finals):
        lines.append("    " * depth + f"{out}[{oidx}] = {store}({sub(final)})")
    return "\n".join(lines) + "\n", name


def _render_row_pairs(lines, pass0, final, store, sub, load, rng) -> str:
    """Row mode for one kept and one reduced dim: rows i and i + rows/2 walked side by side,
    two sequential streams as in "block" mode (sum(1) of 2048^2 float32: 3-7% faster on one
    thread), each row in its own accumulator. The odd row out runs alone."""
    init_code, step = pass0
    ren = lambda code, u: re.sub(r"\bacc\b", f"acc{u}", sub(code))
    lines += ["    h = a.shape[0] // 2", f"    for i0 in {rng}(h):",
              "        r0 = a[i0]", "        r1 = a[i0 + h]"]
    for u in (0, 1):
        lines += _indent(ren(init_code, u), 2)
    lines.append("        for j0 in range(a.shape[1]):")
    for u in (0, 1):
        lines.append("            x = " + load.format("j0").replace("a[", f"r{u}["))
        lines += _indent(ren(step, u), 3)
    lines += [f"        out0[i0] = {store}({ren(final, 0)})",
              f"        out0[i0 + h] = {store}({ren(final, 1)})",
              "    if a.shape[0] % 2:", "        r0 = a[a.shape[0] - 1]"]
    lines += _indent(ren(init_code, 0), 2)
    lines += ["        for j0 in range(a.shape[1]):",
              "            x = " + load.format("j0").replace("a[", "r0[")]
    lines += _indent(ren(step, 0), 3)
    lines.append(f"        out0[a.shape[0] - 1] = {store}({ren(final, 0)})")
    return "\n".join(lines) + "\n"


def _render_col(lines, pass0, finals, outs, stores, sub, load, acc_t, parallel) -> str:
    init_code, step = pass0
    rng = "prange" if parallel else "range"
    acc = lambda code: re.sub(r"\bacc\b", "accs[i]", sub(code))
    # NOTE: the reduced dim is walked through the transposed view, whose rows `at[j, lo:hi]`
    # Numba types as contiguous when `a` is F-ordered (the usual x.sum(0)), so the inner loop
    # vectorizes; loops index from 0 (an index LLVM cannot prove non-negative, like i - lo,
    # keeps Numba's negative-index wraparound select in the loop: measured 2x slower)
    lines += [
        "    n_out = a.shape[0]",
        "    at = a.T",
        f"    for blk in {rng}((n_out + {COL_BLOCK - 1}) // {COL_BLOCK}):",
        f"        lo = blk * {COL_BLOCK}",
        f"        hi = min(n_out, lo + {COL_BLOCK})",
    ]
    lines += _indent(sub(init_code), 2)
    lines += [f"        accs = np.empty(hi - lo, {acc_t})",
              "        for i in range(hi - lo):", "            accs[i] = acc",
              "        m = at.shape[0]", f"        m4 = m - m % {COL_ROWS}",
              f"        for j in range(0, m4, {COL_ROWS}):"]
    # COL_ROWS reduced rows per sweep over the block's accumulators (a quarter of their loads
    # and stores); a sum adds the rows' values pairwise in the accumulator type first, any other
    # op steps through them in order
    lines += [f"            r{u} = at[j + {u}, lo:hi]" for u in range(COL_ROWS)]
    lines.append("            for i in range(hi - lo):")
    rload = lambda u: load.format("i").replace("a[", f"r{u}[")
    if step == "acc += x":
        vals = [f"{acc_t}({rload(u)})" for u in range(COL_ROWS)]
        while len(vals) > 1:
            vals = [f"({vals[k]} + {vals[k + 1]})" for k in range(0, len(vals), 2)]
        lines.append(f"                accs[i] += {vals[0]}")
    else:
        for u in range(COL_ROWS):
            lines.append(f"                x = {rload(u)}")
            lines += _indent(acc(step), 4)
    lines += ["        for j in range(m4, m):", "            r = at[j, lo:hi]",
              "            for i in range(hi - lo):",
              "                x = " + load.format("i").replace("a[", "r[")]
    lines += _indent(acc(step), 4)
    for n_o, (out, store, final) in enumerate(zip(outs, stores, finals)):
        lines += [f"        so{n_o} = {out}[lo:hi]", "        for i in range(hi - lo):",
                  f"            so{n_o}[i] = {store}({acc(final)})"]
    return "\n".join(lines) + "\n"


def _render_block(lines, finals, stores, acc_t, load_t) -> str:
    """sum/mean of one contiguous float32 row, serially: BLOCK-element partial sums (LLVM
    vectorizes them under reassoc) added up in the accumulator type. NOTE: float32 partials ran
    1.5x faster but their per-block rounding left ~5x torch's cascade-sum error on 4M randn
    (4e-4 on a sum of 146, over the OpInfo tolerance): the partials stay in float64.
    The row is read as STREAMS interleaved streams (block b of each of its STREAMS parts per
    step): two sequential streams keep more cache-line fills in flight than one, 12-15% faster
    on 4M (A/B on the same buffers; 4 and 8 streams were slower than 2)."""
    final = re.sub(r"\bA\(", f"{acc_t}(", finals[0])
    step = STREAMS * BLOCK
    # blocks are slice views indexed from 0 (see _render_col: no wraparound select)
    lines += ["    n = a.shape[1]", f"    q = n // {step}", f"    acc = {acc_t}(0)",
              "    for b in range(q):"]
    lines += [f"        s{u} = a[0, ({u} * q + b) * {BLOCK}:({u} * q + b) * {BLOCK} + {BLOCK}]"
              for u in range(STREAMS)]
    loads = " + ".join(f"{acc_t}(s{u}[j])" for u in range(STREAMS))
    lines += [f"        part = {acc_t}(0)", f"        for j in range({BLOCK}):",
              f"            part += {loads}", "        acc += part",
              f"    part = {acc_t}(0)", f"    s = a[0, q * {step}:]",
              "    for j in range(s.shape[0]):",
              f"        part += {acc_t}(s[j])", "    acc += part",
              f"    out0[0] = {stores[0]}({final})"]
    return "\n".join(lines) + "\n"


def _render_chunk(lines, pass0, finals, merge, stores, sub, load, acc_t, parallel,
                  paired: bool = False) -> str:
    """One output over a long row: prange over CHUNKS slices, their partials merged in order.
    `paired` (an order-free op: the integer-key extremes, any/all): each iteration walks slices
    c and c + CHUNKS/2 side by side, two sequential streams as in "block" mode (amax 4M 15-20%
    faster on one thread); ops whose result depends on the order keep one slice per step."""
    init_code, step = pass0
    rng = "prange" if parallel else "range"
    lines += _indent(sub(init_code), 1)
    half = CHUNKS // 2
    lines += ["    n = a.shape[1]", f"    parts = np.empty({half if paired else CHUNKS}, {acc_t})",
              f"    for c in {rng}({half if paired else CHUNKS}):"]
    lines += _indent(sub(init_code), 2)
    # each chunk is a slice view indexed from 0 (see _render_col: no wraparound select)
    lines += [f"        seg = a[0, c * n // {CHUNKS}:(c + 1) * n // {CHUNKS}]"]
    if paired:
        lines += [f"        seg2 = a[0, (c + {half}) * n // {CHUNKS}:(c + {half + 1}) * n // "
                  f"{CHUNKS}]", "        m = min(seg.shape[0], seg2.shape[0])",
                  "        for j in range(m):",
                  "            x = " + load.format("j").replace("a[", "seg[")]
        lines += _indent(sub(step), 3)
        lines += ["            x = " + load.format("j").replace("a[", "seg2[")]
        lines += _indent(sub(step), 3)
        # the slices differ in length by at most one element
        for sg in ("seg", "seg2"):
            lines += [f"        for j in range(m, {sg}.shape[0]):",
                      "            x = " + load.format("j").replace("a[", f"{sg}[")]
            lines += _indent(sub(step), 3)
    else:
        lines += ["        for j in range(seg.shape[0]):",
                  "            x = " + load.format("j").replace("a[", "seg[")]
        lines += _indent(sub(step), 3)
    lines += ["        parts[c] = acc"]
    lines += _indent(sub(init_code), 1)
    lines += [f"    for c in range({half if paired else CHUNKS}):", "        p = parts[c]"]
    lines += _indent(sub(merge), 2)
    lines.append(f"    out0[0] = {stores[0]}({sub(finals[0])})")
    return "\n".join(lines) + "\n"


def render_scan(op: str, ko: int, acc_t: str, load_t: str, store: str,
                parallel: bool = False) -> tuple[str, str]:
    """Source of `k(out, a)`: inclusive scan along the last dim of rank-(ko + 1) views."""
    init, step = SCANS[op]
    name = kernel_name("scan", op, ko, acc_t, load_t, store, parallel)
    lines = _header(name, ["out", "a"], parallel, False)
    rng = "prange" if parallel else "range"
    depth = 1
    for d in range(ko):
        lines.append("    " * depth + f"for i{d} in {rng if d == 0 else 'range'}(a.shape[{d}]):")
        depth += 1
    idx = ", ".join([f"i{d}" for d in range(ko)] + ["j"])
    pad = "    " * depth
    lines += [pad + f"acc = {_subst(init, acc_t, load_t, '')}",
              pad + f"for j in range(a.shape[{ko}]):",
              pad + f"    x = {load_t}(a[{idx}])"]
    lines += _indent(step, depth + 1)
    lines.append(pad + f"    out[{idx}] = {store}(acc)")
    return "\n".join(lines) + "\n", name


def render_scan_index(op: str, ko: int, parallel: bool = False) -> tuple[str, str]:
    """Source of `k(vals, inds, a)`: running max/min and its index along the last dim."""
    cmp = INDEX_SCANS[op]
    name = kernel_name("scanidx", op, ko, parallel)
    lines = _header(name, ["vals", "inds", "a"], parallel, False)
    rng = "prange" if parallel else "range"
    depth = 1
    for d in range(ko):
        lines.append("    " * depth + f"for i{d} in {rng if d == 0 else 'range'}(a.shape[{d}]):")
        depth += 1
    idx = ", ".join([f"i{d}" for d in range(ko)] + ["j"])
    first = ", ".join([f"i{d}" for d in range(ko)] + ["0"])
    pad = "    " * depth
    lines += [pad + f"acc = a[{first}]", pad + "best = 0",
              pad + f"for j in range(a.shape[{ko}]):",
              pad + f"    x = a[{idx}]",
              pad + f"    if x != x or (acc == acc and x {cmp} acc):",
              pad + "        acc = x", pad + "        best = j",
              pad + f"    vals[{idx}] = acc", pad + f"    inds[{idx}] = best"]
    return "\n".join(lines) + "\n", name


# -- losses: gathers and map-reduces over several operands ----------------------------------------

def render_nll(acc_t: str, store: str) -> tuple[str, str]:
    """`k(out, tw, err, x, t, w, ws, reduction, ignore)`: x (N, C, S), t (N, S); out (N, S) for
    reduction 0 (none), else out[0, 0] = mean or sum. Class weights are read at c * ws (ws = 0
    with [1] for none). An out-of-range target stops the kernel; err says which (the lowering
    raises). The reduction is a runtime value: one kernel for all three."""
    name = kernel_name("nll", acc_t, store)
    A = acc_t
    lines = _header(name, ["out", "tw", "err", "x", "t", "w", "ws", "reduction", "ignore"],
                    False, False) + [
        f"    acc = {A}(0)", f"    wsum = {A}(0)",
        "    for n in range(x.shape[0]):", "        for s in range(x.shape[2]):",
        "            c = t[n, s]", "            if c == ignore:",
        "                if reduction == 0:", f"                    out[n, s] = {store}(0)",
        "                continue",
        "            if c < 0 or c >= x.shape[1]:",
        "                err[0] = c", "                err[1] = 1", "                return",
        f"            wc = {A}(w[c * ws])", f"            v = -wc * {A}(x[n, c, s])",
        "            if reduction == 0:", f"                out[n, s] = {store}(v)",
        "            acc += v", "            wsum += wc",
        "    if reduction == 1:", f"        out[0, 0] = {store}(acc / wsum)",
        "    elif reduction == 2:", f"        out[0, 0] = {store}(acc)",
        f"    tw[0] = {store}(wsum)",
    ]
    return "\n".join(lines) + "\n", name


def render_nll_backward(acc_t: str, store: str) -> tuple[str, str]:
    """`k(gi, err, g, t, w, ws, tw, reduction, ignore)`: gi (N, C, S) is zero except
    -w[t] * g at the targets (g per element for reduction none, else g[0, 0], / tw for mean)."""
    name = kernel_name("nll_bw", acc_t, store)
    A = acc_t
    lines = _header(name, ["gi", "err", "g", "t", "w", "ws", "tw", "reduction", "ignore"],
                    False, False) + [
        f"    scale = {A}(1) / {A}(tw[0]) if reduction == 1 else {A}(1)",
        "    for n in range(gi.shape[0]):", "        for s in range(gi.shape[2]):",
        "            for cc in range(gi.shape[1]):", f"                gi[n, cc, s] = {store}(0)",
        "            c = t[n, s]", "            if c == ignore:", "                continue",
        "            if c < 0 or c >= gi.shape[1]:",
        "                err[0] = c", "                err[1] = 1", "                return",
        f"            gv = {A}(g[n, s]) if reduction == 0 else {A}(g[0, 0]) * scale",
        f"            gi[n, c, s] = {store}(-{A}(w[c * ws]) * gv)",
    ]
    return "\n".join(lines) + "\n", name


def render_pointwise(expr: str, rank: int, n_in: int, acc_t: str, store: str,
                     check: str | tuple = "") -> tuple[str, str]:
    """`k(out, err, a0.., reduce, div)`: v = expr(x0..) per element of rank-`rank` views;
    out[idx] = v, or with `reduce` out[0..] = sum(v) / div (out is then a one-element view of
    the same rank, so both are one kernel). A failed `check` sets err[1] and stops; a tuple of
    checks is tried in order at each element, err[0] = the index of the one that failed."""
    name = kernel_name("pointwise", expr, rank, n_in, acc_t, store, check)
    A = acc_t
    params = ["out", "err"] + [f"a{i}" for i in range(n_in)] + ["reduce", "div"]
    lines = _header(name, params, False, False) + [f"    acc = {A}(0)"]
    depth = 1
    for d in range(rank):
        lines.append("    " * depth + f"for i{d} in range(a0.shape[{d}]):")
        depth += 1
    idx = ", ".join(f"i{d}" for d in range(rank))
    pad = "    " * depth
    lines += [pad + f"x{i} = {A}(a{i}[{idx}])" for i in range(n_in)]
    if isinstance(check, tuple):
        for j, c in enumerate(check):
            lines += [pad + f"if not ({c}):", pad + f"    err[0] = {j}", pad + "    err[1] = 1",
                      pad + "    return"]
    elif check:
        lines += [pad + f"if not ({check}):", pad + "    err[1] = 1", pad + "    return"]
    lines += [pad + f"v = {_subst(expr, A, '', '')}", pad + "if reduce:", pad + "    acc += v",
              pad + "else:", pad + f"    out[{idx}] = {store}(v)"]
    zeros = ", ".join("0" for _ in range(rank))
    lines += ["    if reduce:", f"        out[{zeros}] = {store}(acc / {A}(div))"]
    return "\n".join(lines) + "\n", name


# -- segment_reduce: runs of a dim, sized by lengths or offsets -----------------------------------

SEGMENT = {"sum": 0, "mean": 1, "max": 2, "min": 3, "prod": 4}


def render_segment() -> tuple[str, str]:
    """`k(out, data, lens, red, offsets, has_init, init, bf)`: ATen's segment reduce: data
    (outer, size, inner), lens (outer, L) lengths or offsets, out (outer, segments, inner); the
    running value is in data's type (`bf` 1: bfloat16, 2: float16, every operation rounded as
    on the CPU);
    max/min take a NaN; an empty mean without `initial` is NaN."""
    name = kernel_name("segment")
    lines = _header(name, ["out", "data", "lens", "red", "offsets", "has_init", "init", "bf"],
                    False, False)
    lines += [
        "    for o in range(out.shape[0]):",
        "        end = lens[o, 0] if offsets else 0",
        "        for s in range(out.shape[1]):",
        "            start = end",
        "            if offsets:",
        "                end = lens[o, s + 1]",
        "            else:",
        "                end = start + lens[o, s]",
        "            for i in range(out.shape[2]):",
        "                if has_init:",
        "                    v = init",
        "                elif red == 2:",
        "                    v = -np.inf",
        "                elif red == 3:",
        "                    v = np.inf",
        "                elif red == 4:",
        "                    v = 1.0",
        "                else:",
        "                    v = 0.0",
        "                v = data.dtype.type(v)",
        "                for j in range(start, end):",
        "                    x = data[o, j, i]",
        "                    if red == 2:",
        "                        v = x if x != x else (x if v < x else v)",
        "                    elif red == 3:",
        "                        v = x if x != x else (x if x < v else v)",
        "                    elif red == 4:",
        "                        v = v * x",
        "                    else:",
        "                        v = v + x",
        "                    if bf:",
        "                        v = _round_half(v, bf)",
        "                if red == 1:",
        "                    if end - start == 0 and not has_init:",
        "                        v = np.nan",
        "                    elif end - start > 0 and v == v:",
        "                        d = data.dtype.type(end - start)",
        "                        v = _round_half(v / _round_half(d, bf), bf) if bf else v / d",
        "                out[o, s, i] = v",
    ]
    return ROUND_BF16 + ROUND_F16 + ROUND_HALF + "\n".join(lines) + "\n", name


def render_segment_backward() -> tuple[str, str]:
    """`k(gi, grad, out, data, lens, red, offsets, init)`: ATen's segment reduce backward,
    literally (max/min: the gradient goes to every NaN or extreme element, positive ones then
    divided by their count; prod: grad * out / x, or the exclusive product where x is 0 or
    NaN), over (outer, size, inner) views; gi starts at zero."""
    name = kernel_name("segment_bw")
    lines = _header(name, ["gi", "grad", "out", "data", "lens", "red", "offsets", "init"],
                    False, False)
    lines += [
        "    for o in range(gi.shape[0]):",
        "        for j in range(gi.shape[1]):",
        "            for i in range(gi.shape[2]):",
        "                gi[o, j, i] = 0",
        "        end = lens[o, 0] if offsets else 0",
        "        for s in range(out.shape[1]):",
        "            start = end",
        "            if offsets:",
        "                end = lens[o, s + 1]",
        "            else:",
        "                end = start + lens[o, s]",
        "            n = end - start",
        "            if n == 0:",
        "                continue",
        "            for i in range(out.shape[2]):",
        "                g = grad[o, s, i]",
        "                r = out[o, s, i]",
        "                if red == 2 or red == 3:",
        "                    cnt = 0",
        "                    for j in range(start, end):",
        "                        x = data[o, j, i]",
        "                        if x != x or x == r:",
        "                            gi[o, j, i] = g",
        "                            cnt += 1",
        "                    if cnt >= 2:",
        "                        for j in range(start, end):",
        "                            if gi[o, j, i] > 0:",
        "                                gi[o, j, i] = gi[o, j, i] / cnt",
        "                elif red == 1:",
        "                    gv = g / gi.dtype.type(n)",
        "                    for j in range(start, end):",
        "                        gi[o, j, i] = gv",
        "                elif red == 0:",
        "                    for j in range(start, end):",
        "                        gi[o, j, i] = g",
        "                else:",
        "                    gv = g * r",
        "                    for j in range(start, end):",
        "                        x = data[o, j, i]",
        "                        if x != x or x == 0:",
        "                            p = gi.dtype.type(init)",
        "                            for k in range(start, end):",
        "                                if k != j:",
        "                                    p *= data[o, k, i]",
        "                            gi[o, j, i] = g * p",
        "                        else:",
        "                            gi[o, j, i] = gv / x",
    ]
    return "\n".join(lines) + "\n", name
