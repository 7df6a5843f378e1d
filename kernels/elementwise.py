"""Elementwise family: one loop, any number of inputs, one output, broadcasting by strides.

The spec is plain data: an expression over loaded operands `x0..xn` and scalars `c0..ck`, each
operand's kind ('flat': same shape and contiguous, 'one': a single element, 'nd': broadcast
view), the rank of the loop, the load casts and the store cast.

>>> src, name = render("x0 + c0", ("flat",), 1, ("np.float32",), ("np.float32",),
...                    "np.float32({})")
>>> "for i0 in range(out.shape[0])" in src
True
"""

from __future__ import annotations

import hashlib
import platform
import re

HEADER = '@njit(error_model="numpy", nogil=True{extra})\n'
# Streaming stores (docs/THROUGHPUT.md): a parallel flat loop whose output is at least NT_MIN_BYTES
# computes NT_BLOCK elements into an L1-resident row of scratch, then writes them with
# non-temporal stores (kernels/stream.py): no read-for-ownership of the output's lines, which
# also stay out of the caches the next op's host code runs from (add 4M: -25% time). Below the
# threshold the output is likely read again while still cached: plain stores.
NT_MIN_BYTES = 8 << 20
NT_BLOCK = 1024      # elements per scratch block (4 KiB of float32: in L1)
NT_CHUNKS = 32       # prange chunks of blocks, one scratch row each
STREAMING = platform.machine().lower() in ("x86_64", "amd64")   # kernels/stream.py's targets
# expressions whose loop is compute-bound (vmath polynomials, libm and special functions, pow,
# the float floor-division/remainder helpers): streaming measured slower there (GELU 4M: 5.7
# against 3.5 ms), the block loop's extra stores and reloads cost more than the saved traffic
_COMPUTE_BOUND = re.compile(r"math\.|np\.(exp|log|sin|cos|tan|arc|sinh|cosh|power)|"
                            r"\b_v\w+\(|_float(32|64)\(|\*\*|\b_(pow|gcd|div_floor|rem|fmod)_")
NT_IMPORT = ("from eager_neuron.kernels.stream import nt_fence as _nt_fence, nt_head as _nt_head, "
             "nt_overlap as _nt_overlap, nt_store64 as _nt_store64\n")


def kernel_name(prefix: str, *parts) -> str:
    digest = hashlib.sha1(repr(parts).encode()).hexdigest()[:12]
    return f"{prefix}_{digest}"


def render(expr: str, kinds: tuple, rank: int, loads: tuple, scalar_casts: tuple,
           store: str, parallel: bool = False, fastmath: bool = False,
           in_place: bool = False) -> tuple[str, str]:
    """Source of `k(out, a0..an, s0..sk)`; `rank == 1` with no 'nd' input is the flat loop.
    `in_place`: the op writes its first operand (`x.add_(y)`): the flat loop gets a variant for
    an output that is operand 0 (see _in_place_loop)."""
    n_in, n_sc = len(kinds), len(scalar_casts)
    parts = (expr, kinds, rank, loads, scalar_casts, store, parallel, fastmath)
    name = kernel_name("ew", *parts, *(("in_place",) if in_place else ()))
    in_place = in_place and _in_place(kinds, rank)
    extra = (", parallel=True" if parallel else "") + (", fastmath=True" if fastmath else "")
    params = ["out"] + [f"a{i}" for i in range(n_in)] + [f"s{j}" for j in range(n_sc)]
    lines = [HEADER.format(extra=extra), f"def {name}({', '.join(params)}):"]
    # 1. scalars and single-element operands are loaded once, outside the loop
    for j, cast in enumerate(scalar_casts):
        lines.append(f"    c{j} = {cast}(s{j})")
    for i, kind in enumerate(kinds):
        if kind == "one":
            lines.append(f"    x{i} = {loads[i]}(a{i}[0])")
    if parallel and streams(expr, kinds, rank):
        return NT_IMPORT + "\n".join(
            lines + _streamed(kinds, loads, store, expr, in_place)) + "\n", name
    rng = "prange" if parallel else "range"
    if in_place:
        lines += _in_place_loop("    ", rng, kinds, loads, store, expr, "")
    idx = ", ".join(f"i{d}" for d in range(rank))
    # 2. the loop nest over the output
    indent = "    "
    for d in range(rank):
        loop = rng if d == 0 else "range"
        lines.append(f"{indent}for i{d} in {loop}(out.shape[{d}]):")
        indent += "    "
    for i, kind in enumerate(kinds):
        if kind != "one":
            lines.append(f"{indent}x{i} = {loads[i]}(a{i}[{idx}])")
    lines.append(f"{indent}out[{idx}] = {store.format(expr)}")
    return "\n".join(lines) + "\n", name


def _in_place(kinds: tuple, rank: int) -> bool:
    """A flat loop whose output may be its first operand (an in-place op: `x.add_(y)`,
    `p.addcdiv_(g, h)`, an optimizer's updates)."""
    return rank == 1 and bool(kinds) and kinds[0] == "flat" and "nd" not in kinds


def _in_place_loop(pad: str, rng: str, kinds: tuple, loads: tuple, store: str, expr: str,
                   ret: str) -> list[str]:
    """The flat loop for an output that *is* operand 0 (same address and dtype), reading x0
    from `out` itself; a call whose output is not operand 0 runs the general loop after it.
    The general loop reads `a0` and writes `out`: LLVM cannot prove the two apart, its runtime
    overlap check finds them equal and takes the scalar loop (in-place `addcdiv_` of 64K
    floats: 47.6 against 10.5 us with a separate output; `add_` 17.4 against 7.3). Loading and
    storing through one array the loop vectorizes, with the other operands checked against it
    as before. Same arithmetic per element: the same bits."""
    body = [f"{pad}        x0 = {loads[0]}(out[i0])"]
    body += [f"{pad}        x{i} = {loads[i]}(a{i}[i0])" for i, k in enumerate(kinds)
             if i and k != "one"]
    return [f"{pad}if out.dtype == a0.dtype and out.ctypes.data == a0.ctypes.data:",
            f"{pad}    for i0 in {rng}(out.shape[0]):", *body,
            f"{pad}        out[i0] = {store.format(expr)}",
            f"{pad}    return{ret}"]


def streams(expr: str, kinds: tuple, rank: int) -> bool:
    """Whether the parallel flat kernel of `expr` writes a big output with streaming stores.

    >>> streams("x0 + c0 * x1", ("flat", "flat"), 1), streams("_vgelu_as(x0)", ("flat",), 1)
    (True, False)
    """
    return (STREAMING and rank == 1 and "nd" not in kinds
            and _COMPUTE_BOUND.search(expr) is None)


def _streamed(kinds: tuple, loads: tuple, store: str, expr: str,
              in_place: bool = False) -> list[str]:
    """The flat parallel loop with streaming stores for a big output (NT_MIN_BYTES): a serial
    head up to out's first 64-byte boundary, NT_BLOCK-element blocks computed into a scratch
    row and streamed out 64 bytes at a time, a serial tail. Same arithmetic per element as the
    plain loop (bit-identical results); an output below the threshold, one whose address
    cannot be aligned, or one sharing memory with an operand runs the plain prange loop. The
    kernel returns 1 when it streamed, else 0 (launches ignore it; tests read it)."""
    def body(pad: str, src: str, dst: str) -> list[str]:
        out = [f"{pad}x{i} = {loads[i]}({src.format(i)})" for i, k in enumerate(kinds)
               if k != "one"]
        return out + [f"{pad}{dst} = {store.format(expr)}"]

    # an output sharing memory with an operand (an in-place op, out= aliasing an input) has its
    # lines in cache already, read by the loop itself: no read-for-ownership to save, and
    # streaming them out only evicts them (add_ 4M: 2.6 against 1.3 ms; mul_(c) 2.1 against 0.7)
    shared = "".join(f" or _nt_overlap(out, a{i})" for i, k in enumerate(kinds) if k != "one")
    lines = ["    _n = out.shape[0]", "    _h = _nt_head(out)",
             f"    if _h < 0 or _n * out.itemsize < {NT_MIN_BYTES}{shared}:"]
    if in_place:
        lines += _in_place_loop("        ", "prange", kinds, loads, store, expr, " 0")
    lines += ["        for i0 in prange(_n):"]
    lines += body("            ", "a{}[i0]", "out[i0]")
    lines += ["        return 0", "    _h = min(_h, _n)", "    for i0 in range(_h):"]
    lines += body("        ", "a{}[i0]", "out[i0]")
    lines += [f"    _nb = (_n - _h) // {NT_BLOCK}", "    _step = 64 // out.itemsize",
              f"    _scratch = np.empty(({NT_CHUNKS}, {NT_BLOCK}), out.dtype)",
              f"    for _c in prange({NT_CHUNKS}):", "        _buf = _scratch[_c]",
              f"        for _b in range(_c * _nb // {NT_CHUNKS}, (_c + 1) * _nb // {NT_CHUNKS}):",
              f"            _lo = _h + _b * {NT_BLOCK}"]
    # operands as block views indexed from 0 (no negative-index wraparound in the loop)
    lines += [f"            _v{i} = a{i}[_lo:_lo + {NT_BLOCK}]" for i, k in enumerate(kinds)
              if k != "one"]
    lines.append(f"            for _j in range({NT_BLOCK}):")
    lines += body("                ", "_v{}[_j]", "_buf[_j]")
    lines += [f"            for _j in range(0, {NT_BLOCK}, _step):",
              "                _nt_store64(out, _lo + _j, _buf, _j)",
              "        _nt_fence()",
              f"    _t = _h + _nb * {NT_BLOCK}",
              "    _ot = out[_t:]"]
    lines += [f"    _v{i} = a{i}[_t:]" for i, k in enumerate(kinds) if k != "one"]
    lines.append("    for _j in range(_ot.shape[0]):")
    lines += body("        ", "_v{}[_j]", "_ot[_j]")
    return lines + ["    return 1"]


# ---------------------------------------------------------------------------------------------
# fused recurrent cells: the ops PyTorch calls for nn.LSTM / nn.GRU on an accelerator
# (aten::_thnn_fused_{lstm,gru}_cell and their backward; the math of ATen's cuda/RNN.cu)
# ---------------------------------------------------------------------------------------------

_CELL_HEADER = '@njit(error_model="numpy", nogil=True)\n'


def render_lstm_cell(has_bias: bool, T: str) -> tuple[str, str]:
    """k(hy, cy, ws, ig, hg, cx, b1, b2): gates i,f,g,o; ws holds the activated gates [B, 4H]."""
    name = kernel_name("lstm_cell", has_bias, T)
    bias = lambda k: f" + b1[{k} * H + j] + b2[{k} * H + j]" if has_bias else ""
    src = f'''{_CELL_HEADER}def {name}(hy, cy, ws, ig, hg, cx, b1, b2):
    one = {T}(1)
    H = cx.shape[1]
    for b in range(cx.shape[0]):
        for j in range(H):
            gi = one / (one + math.exp(-(ig[b, j] + hg[b, j]{bias(0)})))
            gf = one / (one + math.exp(-(ig[b, H + j] + hg[b, H + j]{bias(1)})))
            gc = math.tanh(ig[b, 2 * H + j] + hg[b, 2 * H + j]{bias(2)})
            go = one / (one + math.exp(-(ig[b, 3 * H + j] + hg[b, 3 * H + j]{bias(3)})))
            ws[b, j] = gi
            ws[b, H + j] = gf
            ws[b, 2 * H + j] = gc
            ws[b, 3 * H + j] = go
            c = gf * cx[b, j] + gi * gc
            cy[b, j] = c
            hy[b, j] = go * math.tanh(c)
'''
    return src, name


def render_lstm_cell_backward(has_ghy: bool, has_gcy: bool, has_bias: bool,
                              T: str) -> tuple[str, str]:
    """k(gg, gcx, gb, ghy, gcy, cx, cy, ws): grads of the gates, cx and (summed) the bias."""
    name = kernel_name("lstm_cell_bw", has_ghy, has_gcy, has_bias, T)
    ghy = "ghy[b, j]" if has_ghy else "zero"
    gcy = "gcy[b, j]" if has_gcy else "zero"
    bias = '''
    for j in range(4 * H):
        s = zero
        for b in range(cx.shape[0]):
            s += gg[b, j]
        gb[j] = s
''' if has_bias else ""
    src = f'''{_CELL_HEADER}def {name}(gg, gcx, gb, ghy, gcy, cx, cy, ws):
    one = {T}(1)
    zero = {T}(0)
    H = cx.shape[1]
    for b in range(cx.shape[0]):
        for j in range(H):
            gi = ws[b, j]
            gf = ws[b, H + j]
            gc = ws[b, 2 * H + j]
            go = ws[b, 3 * H + j]
            dh = {ghy}
            t = math.tanh(cy[b, j])
            dgo = dh * t
            dc = dh * go * (one - t * t) + {gcy}
            dgi = dc * gc
            dgf = dc * cx[b, j]
            dgc = dc * gi
            gcx[b, j] = dc * gf
            gg[b, j] = dgi * (one - gi) * gi
            gg[b, H + j] = dgf * (one - gf) * gf
            gg[b, 2 * H + j] = dgc * (one - gc * gc)
            gg[b, 3 * H + j] = dgo * (one - go) * go
{bias}'''
    return src, name


def render_gru_cell(has_bias: bool, T: str) -> tuple[str, str]:
    """k(hy, ws, ig, hg, hx, b1, b2): gates r,z,n; ws [B, 5H] = r, z, n, hx, hn + b2n."""
    name = kernel_name("gru_cell", has_bias, T)
    b1 = lambda k: f" + b1[{k} * H + j]" if has_bias else ""
    b2 = lambda k: f" + b2[{k} * H + j]" if has_bias else ""
    src = f'''{_CELL_HEADER}def {name}(hy, ws, ig, hg, hx, b1, b2):
    one = {T}(1)
    H = hx.shape[1]
    for b in range(hx.shape[0]):
        for j in range(H):
            r = one / (one + math.exp(-(ig[b, j] + hg[b, j]{b1(0)}{b2(0)})))
            z = one / (one + math.exp(-(ig[b, H + j] + hg[b, H + j]{b1(1)}{b2(1)})))
            hn = hg[b, 2 * H + j]{b2(2)}
            n = math.tanh(ig[b, 2 * H + j]{b1(2)} + r * hn)
            h = hx[b, j]
            ws[b, j] = r
            ws[b, H + j] = z
            ws[b, 2 * H + j] = n
            ws[b, 3 * H + j] = h
            ws[b, 4 * H + j] = hn
            hy[b, j] = n + z * (h - n)
'''
    return src, name


def render_gru_cell_backward(has_bias: bool, T: str) -> tuple[str, str]:
    """k(gig, ghg, ghx, gib, ghb, ghy, ws): grads of both gate inputs, hx and the biases."""
    name = kernel_name("gru_cell_bw", has_bias, T)
    bias = '''
    for j in range(3 * H):
        s1 = zero
        s2 = zero
        for b in range(ghy.shape[0]):
            s1 += gig[b, j]
            s2 += ghg[b, j]
        gib[j] = s1
        ghb[j] = s2
''' if has_bias else ""
    src = f'''{_CELL_HEADER}def {name}(gig, ghg, ghx, gib, ghb, ghy, ws):
    one = {T}(1)
    zero = {T}(0)
    H = ghy.shape[1]
    for b in range(ghy.shape[0]):
        for j in range(H):
            r = ws[b, j]
            z = ws[b, H + j]
            n = ws[b, 2 * H + j]
            h = ws[b, 3 * H + j]
            hn = ws[b, 4 * H + j]
            go = ghy[b, j]
            dz = go * (h - n) * (one - z) * z
            dh = go * z
            dn = go * (one - z) * (one - n * n)
            dhn = dn * r
            dr = dn * hn * (one - r) * r
            gig[b, j] = dr
            gig[b, H + j] = dz
            gig[b, 2 * H + j] = dn
            ghg[b, j] = dr
            ghg[b, H + j] = dz
            ghg[b, 2 * H + j] = dhn
            ghx[b, j] = dh
{bias}'''
    return src, name


def render_frexp(T: str) -> tuple[str, str]:
    """k(mantissa, exponent, x) over flat arrays: x = mantissa * 2**exponent, |mantissa| in
    [0.5, 1) (0, inf and nan keep exponent 0, as glibc's frexp)."""
    name = kernel_name("frexp", T)
    src = f'''{_CELL_HEADER}def {name}(m, e, x):
    for i in range(x.shape[0]):
        mi, ei = math.frexp(x[i])
        m[i] = {T}(mi)
        e[i] = ei
'''
    return src, name


def render_dropout(T: str) -> tuple[str, str]:
    """k(out, keep, x, m, scale) over flat arrays: ATen's CPU dropout after its draw, out =
    (x * m) * scale left to right (m the drawn 0/1 mask in x's dtype: 0 * inf is NaN, -0.0
    stays, as there) and keep = m != 0, both outputs in one pass."""
    name = kernel_name("dropout", T)
    src = f'''{_CELL_HEADER}def {name}(out, keep, x, m, scale):
    for i in range(x.shape[0]):
        mi = m[i]
        out[i] = x[i] * mi * scale
        keep[i] = mi != 0
'''
    return src, name
