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

HEADER = '@njit(error_model="numpy", nogil=True{extra})\n'


def kernel_name(prefix: str, *parts) -> str:
    digest = hashlib.sha1(repr(parts).encode()).hexdigest()[:12]
    return f"{prefix}_{digest}"


def render(expr: str, kinds: tuple, rank: int, loads: tuple, scalar_casts: tuple,
           store: str, parallel: bool = False, fastmath: bool = False) -> tuple[str, str]:
    """Source of `k(out, a0..an, s0..sk)`; `rank == 1` with no 'nd' input is the flat loop."""
    n_in, n_sc = len(kinds), len(scalar_casts)
    name = kernel_name("ew", expr, kinds, rank, loads, scalar_casts, store, parallel, fastmath)
    extra = (", parallel=True" if parallel else "") + (", fastmath=True" if fastmath else "")
    params = ["out"] + [f"a{i}" for i in range(n_in)] + [f"s{j}" for j in range(n_sc)]
    lines = [HEADER.format(extra=extra), f"def {name}({', '.join(params)}):"]
    # 1. scalars and single-element operands are loaded once, outside the loop
    for j, cast in enumerate(scalar_casts):
        lines.append(f"    c{j} = {cast}(s{j})")
    for i, kind in enumerate(kinds):
        if kind == "one":
            lines.append(f"    x{i} = {loads[i]}(a{i}[0])")
    rng = "prange" if parallel else "range"
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
