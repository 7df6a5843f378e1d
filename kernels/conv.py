"""Convolution family: one set of kernels for 1-, 2- and 3-d convolutions, sizes all runtime.

Every array has three spatial dims (D, H, W): a 2-d convolution arrives with D = 1, a 1-d one
with D = H = 1 (the unit loops cost nothing next to the gemm). Convolution is im2col + one gemm
per (sample, group), in one kernel: `cols` is the (Cg*KD*KH*KW, OD*OH*OW) patch matrix, the
weight an (O, Cg*KD*KH*KW) C-contiguous matrix, the output an (N, O, OD*OH*OW) C-contiguous
array that the gemm writes in place. The backward pass is two kernels (so a first layer, whose
input needs no grad, runs only the second): grad_input via cols = weight.T @ grad_out then
col2im; grad_weight += grad_out @ cols.T, with grad_bias. A transposed convolution is the
grad_input kernel forward (plus bias) and the forward/grad_weight kernels backward, with the
roles of input and output swapped. A 1x1, stride-1, unpadded convolution on contiguous arrays
skips im2col: the input itself is the patch matrix. Float types use BLAS (np.dot); integer
types a loop gemm (Numba's np.dot is BLAS only).

>>> src, name = render_conv_forward(True, False, False, False)
>>> "_gemm(w[g * og:(g + 1) * og], cols, out[n, g * og:(g + 1) * og])" in src
True
"""

from __future__ import annotations

from .elementwise import kernel_name
from .halfround import ROUND_BF16

HEADER = '@njit(error_model="numpy", nogil=True{extra})\n'

_SIZES = """\
    n_ = x.shape[0]
    c_ = x.shape[1]
    dp = x.shape[2]
    h = x.shape[3]
    wd = x.shape[4]
    o_ = w.shape[0]
    ckk = w.shape[1]
    cg = c_ // groups
    og = o_ // groups
    ohw = od_ * oh_ * ow_
"""

# The one patch walk shared by im2col and col2im: row r = (c, kz, ki, kj) of the patch matrix,
# column (oz, oi, oj); (iz, ih, iw) is the input position it reads. Per row, the columns whose
# iw falls inside the input are the range [lo, hi) (computed once, so the inner loop has no
# branch and, at stride 1, is a contiguous copy); `{inside}` runs for those, `{out}` for
# columns in the padding (im2col zero-fills them; col2im skips them).
_PATCH_WALK = """\
for c in {rng}(cg):
    for kz in range(kd_):
        for ki in range(kh_):
            for kj in range(kw_):
                r = ((c * kd_ + kz) * kh_ + ki) * kw_ + kj
                off = kj * dw - pw
                lo = min(max(0, (sw - 1 - off) // sw), ow_)
                hi = max(min(ow_, (wd - off + sw - 1) // sw), lo)
                for oz in range(od_):
                    iz = oz * sd - pd + kz * dd
                    for oi in range(oh_):
                        ih = oi * sh - ph + ki * dh
                        base = (oz * oh_ + oi) * ow_
                        if iz < 0 or iz >= dp or ih < 0 or ih >= h:
{row_out}
                        else:
{edges}                            for oj in range(lo, hi):
                                {inside}
"""

_IM2COL = {
    "row_out": " " * 28 + "for oj in range(ow_):\n" + " " * 32 + "cols[r, base + oj] = 0",
    "edges": " " * 28 + "for oj in range(lo):\n" + " " * 32 + "cols[r, base + oj] = 0\n"
             + " " * 28 + "for oj in range(hi, ow_):\n" + " " * 32 + "cols[r, base + oj] = 0\n",
    "inside": "cols[r, base + oj] = x[n, c0 + c, iz, ih, oj * sw + off]",
}
# channels are disjoint, so col2im may prange over c too
_COL2IM = {"row_out": " " * 28 + "pass", "edges": "",
           "inside": "gi[n, c0 + c, iz, ih, oj * sw + off] += cols[r, base + oj]"}

_GEOMETRY = "sd, sh, sw, pd, ph, pw, dd, dh, dw, groups, kd_, kh_, kw_, od_, oh_, ow_"

# out = a @ b for integer types: i-k-j order keeps the inner loop on contiguous rows
_INT_GEMM = """\
@njit(inline="always")
def _gemm(a, b, out):
    for i in range(a.shape[0]):
        for j in range(b.shape[1]):
            out[i, j] = 0
        for k in range(a.shape[1]):
            aik = a[i, k]
            for j in range(b.shape[1]):
                out[i, j] += aik * b[k, j]


"""
_BLAS_GEMM = """\
@njit(inline="always")
def _gemm(a, b, out):
    np.dot(a, b, out)


"""


def _walk(rng: str, parts: dict, spaces: int) -> list[str]:
    block = _PATCH_WALK.format(rng=rng, **parts)
    pad = " " * spaces
    return [pad + line for line in block.splitlines()]


def _head(name: str, params: str, parallel: bool, integer: bool) -> list[str]:
    prelude = _INT_GEMM if integer else _BLAS_GEMM
    return [prelude + HEADER.format(extra=", parallel=True" if parallel else ""),
            f"def {name}({params}):"] + _SIZES.rstrip().splitlines()


def _bias_epilogue(arr: str, channels: str, size: str) -> list[str]:
    # NOTE: fused epilogue: the output is still in cache from the gemm
    return [f"        for o in range({channels}):",
            "            bo = bias[o]",
            f"            for j in range({size}):",
            f"                {arr}[n, o, j] += bo"]


def render_conv_forward(has_bias: bool, pointwise: bool, parallel: bool,
                        integer: bool) -> tuple[str, str]:
    """`k(out, x, w[, bias], geometry...)`: out (N, O, OD*OH*OW) C, x (N, C, D, H, W),
    w (O, CKK) C."""
    name = kernel_name("conv_fwd", has_bias, pointwise, parallel, integer)
    rng = "prange" if parallel else "range"
    params = "out, x, w, " + ("bias, " if has_bias else "") + _GEOMETRY
    lines = _head(name, params, parallel, integer)
    if not pointwise:
        lines.append("    cols = np.empty((ckk, ohw), out.dtype)")
    lines += ["    for n in range(n_):",
              "        for g in range(groups):",
              "            c0 = g * cg"]
    if pointwise:
        lines.append("            cols = x[n, c0:c0 + cg].reshape((cg, dp * h * wd))")
    else:
        lines += _walk(rng, _IM2COL, 12)
    lines.append("            _gemm(w[g * og:(g + 1) * og], cols, out[n, g * og:(g + 1) * og])")
    if has_bias:
        lines += _bias_epilogue("out", "o_", "ohw")
    return "\n".join(lines) + "\n", name


def render_conv_grad_input(pointwise: bool, parallel: bool, integer: bool,
                           has_bias: bool = False, bf16: bool = False) -> tuple[str, str]:
    """`k(gi, go, x, w[, bias], geometry...)`: cols = w_g.T @ go[n, g], then col2im into gi.

    go (N, O, OD*OH*OW) C; x (N, C, D, H, W) only for its sizes; w (O, CKK) C; gi like x (C
    when pointwise: the gemm writes it directly). With a bias (transposed convolution forward)
    gi is (N, C, D*H*W) C and bias[c] is added to every element of channel c. With `bf16`
    (serial, not pointwise) every step rounds to bfloat16 as PyTorch's CPU transposed
    convolution does in that dtype: the gemm result, each col2im add, the bias add.
    """
    assert not (bf16 and (parallel or pointwise))
    name = kernel_name("conv_dgrad", pointwise, parallel, integer, has_bias, bf16)
    rng = "prange" if parallel else "range"
    params = "gi, go, x, w, " + ("bias, " if has_bias else "") + _GEOMETRY
    lines = _head(name, params, parallel, integer)
    if bf16:
        lines[0] = ROUND_BF16 + lines[0]
    if has_bias:
        lines.append("    gi5 = gi.reshape((n_, c_, dp, h, wd))")
        target, flat = "gi5", "gi"
    else:
        target, flat = "gi", None
    if not pointwise:
        lines.append("    cols = np.empty((ckk, ohw), go.dtype)")
        lines += [f"    for p in {rng}(n_ * c_):",
                  "        for z in range(dp):",
                  "            for i in range(h):",
                  "                for j in range(wd):",
                  f"                    {target}[p // c_, p % c_, z, i, j] = 0"]
    lines += ["    for n in range(n_):",
              "        for g in range(groups):",
              "            c0 = g * cg",
              "            gon = go[n, g * og:(g + 1) * og]"]
    if pointwise:
        dst = f"{flat}[n, c0:c0 + cg]" if flat else \
            "gi[n, c0:c0 + cg].reshape((cg, dp * h * wd))"
        lines.append(f"            _gemm(w[g * og:(g + 1) * og].T, gon, {dst})")
    else:
        lines.append("            _gemm(w[g * og:(g + 1) * og].T, gon, cols)")
        inside = _COL2IM["inside"].replace("gi[", target + "[")
        if bf16:
            lines += ["            for r in range(ckk):",
                      "                for j in range(ohw):",
                      "                    cols[r, j] = _round_bf16(cols[r, j])"]
            dst = inside.split(" += ")[0]
            inside = f"{dst} = _round_bf16({dst} + cols[r, base + oj])"
        lines += _walk(rng, {**_COL2IM, "inside": inside}, 12)
    if has_bias:
        epilogue = _bias_epilogue("gi", "c_", "dp * h * wd")
        if bf16:
            epilogue[-1] = "                gi[n, o, j] = _round_bf16(gi[n, o, j] + bo)"
        lines += epilogue
    return "\n".join(lines) + "\n", name


def render_conv_grad_weight(need_w: bool, need_b: bool, pointwise: bool,
                            parallel: bool) -> tuple[str, str]:
    """`k([gw, ][gb, ]go, x, w, geometry...)`: gw_g = sum_n go[n, g] @ cols.T; gb = sum go.

    gw (O, CKK) C; gb (O,); go (N, O, OD*OH*OW) C; x (N, C, D, H, W) (C when pointwise).
    """
    name = kernel_name("conv_wgrad", need_w, need_b, pointwise, parallel)
    rng = "prange" if parallel else "range"
    outs = [nm for nm, need in (("gw", need_w), ("gb", need_b)) if need]
    lines = _head(name, f"{', '.join(outs)}, go, x, w, {_GEOMETRY}", parallel, False)
    if need_w:
        # NOTE: one gemm call site and explicit loops: each np.dot site and every array
        # expression (gw[...] += tmp) adds seconds of Numba compile time.
        lines += ["    tmp = np.empty((og, ckk), go.dtype)",
                  "    for i in range(o_):",
                  "        for j in range(ckk):",
                  "            gw[i, j] = 0"]
        if not pointwise:
            lines.append("    cols = np.empty((ckk, ohw), go.dtype)")
        lines += ["    for n in range(n_):",
                  "        for g in range(groups):",
                  "            c0 = g * cg"]
        if pointwise:
            lines.append("            cols = x[n, c0:c0 + cg].reshape((cg, dp * h * wd))")
        else:
            lines += _walk(rng, _IM2COL, 12)
        lines += ["            _gemm(go[n, g * og:(g + 1) * og], cols.T, tmp)",
                  "            for i in range(og):",
                  "                for j in range(ckk):",
                  "                    gw[g * og + i, j] += tmp[i, j]"]
    if need_b:
        # NOTE: accumulate in float64: N*OD*OH*OW terms would lose digits in float32
        lines += [f"    for o in {rng}(gb.shape[0]):",
                  "        s = 0.0",
                  "        for n in range(n_):",
                  "            for j in range(go.shape[2]):",
                  "                s += go[n, o, j]",
                  "        gb[o] = s"]
    return "\n".join(lines) + "\n", name
