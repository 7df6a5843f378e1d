"""Convolution and pooling family: 2-D kernels (1-D arrives as height 1), sizes all runtime.

Convolution is im2col + one BLAS gemm per (sample, group), in one kernel: `cols` is the
(Cg*KH*KW, OH*OW) patch matrix, the weight a (O, Cg*KH*KW) C-contiguous matrix, the output an
(N, O, OH*OW) C-contiguous array that np.dot writes in place. The backward pass is two kernels
(so a first layer, whose input needs no grad, runs only the second): grad_input via
cols = weight.T @ grad_out then col2im; grad_weight += grad_out @ cols.T, with grad_bias.
A 1x1, stride-1, unpadded convolution on contiguous arrays skips im2col: the input itself is
the patch matrix. Pooling kernels loop over (sample, channel) planes, prange above a size.

>>> src, name = render_conv_forward(True, False, False)
>>> "np.dot(w[g * og:(g + 1) * og], cols, out[n, g * og:(g + 1) * og])" in src
True
"""

from __future__ import annotations

from .elementwise import kernel_name

HEADER = '@njit(error_model="numpy", nogil=True{extra})\n'

_SIZES = """\
    n_ = x.shape[0]
    c_ = x.shape[1]
    h = x.shape[2]
    wd = x.shape[3]
    o_ = w.shape[0]
    ckk = w.shape[1]
    cg = c_ // groups
    og = o_ // groups
    ohw = oh_ * ow_
"""

# cols[r, oi * ow_ + oj] = x[n, c0 + c, ih, iw] (0 outside the input), r = (c, ki, kj)
_IM2COL = """\
for c in {rng}(cg):
    for ki in range(kh_):
        for kj in range(kw_):
            r = (c * kh_ + ki) * kw_ + kj
            for oi in range(oh_):
                ih = oi * sh - ph + ki * dh
                base = oi * ow_
                if ih < 0 or ih >= h:
                    for oj in range(ow_):
                        cols[r, base + oj] = 0
                else:
                    for oj in range(ow_):
                        iw = oj * sw - pw + kj * dw
                        if iw >= 0 and iw < wd:
                            cols[r, base + oj] = x[n, c0 + c, ih, iw]
                        else:
                            cols[r, base + oj] = 0
"""

# gi[n, c0 + c, ih, iw] += cols[r, oi * ow_ + oj]; channels are disjoint, so prange over c
_COL2IM = """\
for c in {rng}(cg):
    for ki in range(kh_):
        for kj in range(kw_):
            r = (c * kh_ + ki) * kw_ + kj
            for oi in range(oh_):
                ih = oi * sh - ph + ki * dh
                if ih >= 0 and ih < h:
                    base = oi * ow_
                    for oj in range(ow_):
                        iw = oj * sw - pw + kj * dw
                        if iw >= 0 and iw < wd:
                            gi[n, c0 + c, ih, iw] += cols[r, base + oj]
"""

_GEOMETRY = "sh, sw, ph, pw, dh, dw, groups, kh_, kw_, oh_, ow_"


def _indent(block: str, spaces: int) -> list[str]:
    pad = " " * spaces
    return [pad + line for line in block.splitlines()]


def render_conv_forward(has_bias: bool, pointwise: bool, parallel: bool) -> tuple[str, str]:
    """`k(out, x, w[, bias], geometry...)`: out (N, O, OH*OW) C, x (N, C, H, W), w (O, CKK) C."""
    name = kernel_name("conv_fwd", has_bias, pointwise, parallel)
    rng = "prange" if parallel else "range"
    params = "out, x, w, " + ("bias, " if has_bias else "") + _GEOMETRY
    lines = [HEADER.format(extra=", parallel=True" if parallel else ""),
             f"def {name}({params}):"]
    lines += _SIZES.rstrip().splitlines()
    if not pointwise:
        lines.append("    cols = np.empty((ckk, ohw), out.dtype)")
    lines += ["    for n in range(n_):",
              "        for g in range(groups):",
              "            c0 = g * cg"]
    if pointwise:
        lines.append("            cols = x[n, c0:c0 + cg].reshape((cg, h * wd))")
    else:
        lines += _indent(_IM2COL.format(rng=rng), 12)
    lines.append("            np.dot(w[g * og:(g + 1) * og], cols, out[n, g * og:(g + 1) * og])")
    if has_bias:
        # NOTE: fused epilogue: the output is still in cache from the gemm
        lines += ["        for o in range(o_):",
                  "            bo = bias[o]",
                  "            for j in range(ohw):",
                  "                out[n, o, j] += bo"]
    return "\n".join(lines) + "\n", name


def render_conv_grad_input(pointwise: bool, parallel: bool) -> tuple[str, str]:
    """`k(gi, go, x, w, geometry...)`: cols = w_g.T @ go[n, g], then col2im into gi.

    go (N, O, OH*OW) C; x (N, C, H, W) only for its sizes; w (O, CKK) C; gi like x (C when
    pointwise: the gemm writes it directly).
    """
    name = kernel_name("conv_dgrad", pointwise, parallel)
    rng = "prange" if parallel else "range"
    lines = [HEADER.format(extra=", parallel=True" if parallel else ""),
             f"def {name}(gi, go, x, w, {_GEOMETRY}):"]
    lines += _SIZES.rstrip().splitlines()
    if not pointwise:
        lines.append("    cols = np.empty((ckk, ohw), go.dtype)")
        lines += _indent(f"for p in {rng}(n_ * c_):\n"
                         "    for i in range(h):\n"
                         "        for j in range(wd):\n"
                         "            gi[p // c_, p % c_, i, j] = 0", 4)
    lines += ["    for n in range(n_):",
              "        for g in range(groups):",
              "            c0 = g * cg",
              "            gon = go[n, g * og:(g + 1) * og]"]
    if pointwise:
        lines.append("            np.dot(w[g * og:(g + 1) * og].T, gon, "
                     "gi[n, c0:c0 + cg].reshape((cg, h * wd)))")
    else:
        lines.append("            np.dot(w[g * og:(g + 1) * og].T, gon, cols)")
        lines += _indent(_COL2IM.format(rng=rng), 12)
    return "\n".join(lines) + "\n", name


def render_conv_grad_weight(need_w: bool, need_b: bool, pointwise: bool,
                            parallel: bool) -> tuple[str, str]:
    """`k([gw, ][gb, ]go, x, w, geometry...)`: gw_g = sum_n go[n, g] @ cols.T; gb = sum go.

    gw (O, CKK) C; gb (O,); go (N, O, OH*OW) C; x (N, C, H, W) (C when pointwise).
    """
    name = kernel_name("conv_wgrad", need_w, need_b, pointwise, parallel)
    rng = "prange" if parallel else "range"
    outs = [nm for nm, need in (("gw", need_w), ("gb", need_b)) if need]
    lines = [HEADER.format(extra=", parallel=True" if parallel else ""),
             f"def {name}({', '.join(outs)}, go, x, w, {_GEOMETRY}):"]
    lines += _SIZES.rstrip().splitlines()
    if need_w:
        # NOTE: one np.dot call site and explicit loops: each np.dot site and every array
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
            lines.append("            cols = x[n, c0:c0 + cg].reshape((cg, h * wd))")
        else:
            lines += _indent(_IM2COL.format(rng=rng), 12)
        lines += ["            np.dot(go[n, g * og:(g + 1) * og], cols.T, tmp)",
                  "            for i in range(og):",
                  "                for j in range(ckk):",
                  "                    gw[g * og + i, j] += tmp[i, j]"]
    if need_b:
        # NOTE: accumulate in float64: N*OH*OW terms would lose digits in float32
        lines += [f"    for o in {rng}(o_):",
                  "        s = 0.0",
                  "        for n in range(n_):",
                  "            for j in range(ohw):",
                  "                s += go[n, o, j]",
                  "        gb[o] = s"]
    return "\n".join(lines) + "\n", name


# ---------------------------------------------------------------------------------------------
# pooling: x, out, indices are (N, C, H, W) arrays of any strides; one plane per prange step
# ---------------------------------------------------------------------------------------------

_PLANE = """\
    c_ = {arr}.shape[1]
    for p in {rng}({arr}.shape[0] * c_):
        n = p // c_
        c = p % c_
"""

# PyTorch's CPU rules: a window clipped to the input, the first max wins, a NaN always wins
_MAX_WINDOW = """\
                best = {T}({lowest})
                bi = h0 * wd + w0
                for ih in range(h0, h1, {dh}):
                    for iw in range(w0, w1, {dw}):
                        v = x[n, c, ih, iw]
                        if v > best or v != v:
                            best = v
                            bi = ih * wd + iw
                out[n, c, oi, oj] = best
                ind[n, c, oi, oj] = bi
"""

_MAX_POOL = """\
def {name}(out, ind, x, kh_, kw_, sh, sw, ph, pw, dh, dw):
    h = x.shape[2]
    wd = x.shape[3]
{plane}        for oi in range(out.shape[2]):
            h0 = oi * sh - ph
            h1 = min(h0 + (kh_ - 1) * dh + 1, h)
            while h0 < 0:
                h0 += dh
            for oj in range(out.shape[3]):
                w0 = oj * sw - pw
                w1 = min(w0 + (kw_ - 1) * dw + 1, wd)
                while w0 < 0:
                    w0 += dw
{window}"""

_ADAPTIVE_MAX_POOL = """\
def {name}(out, ind, x):
    h = x.shape[2]
    wd = x.shape[3]
    oh_ = out.shape[2]
    ow_ = out.shape[3]
{plane}        for oi in range(oh_):
            h0 = (oi * h) // oh_
            h1 = ((oi + 1) * h + oh_ - 1) // oh_
            for oj in range(ow_):
                w0 = (oj * wd) // ow_
                w1 = ((oj + 1) * wd + ow_ - 1) // ow_
{window}"""

# grad_input[n, c].flat[indices] += grad_output: scatter within a plane, planes in parallel
_MAX_POOL_BACKWARD = """\
def {name}(gi, go, ind):
    wd = gi.shape[3]
{plane}        for i in range(gi.shape[2]):
            for j in range(wd):
                gi[n, c, i, j] = 0
        for oi in range(go.shape[2]):
            for oj in range(go.shape[3]):
                k = ind[n, c, oi, oj]
                if k >= 0:
                    gi[n, c, k // wd, k % wd] += go[n, c, oi, oj]
"""

# divisor: divisor_override, else the window clipped to the padded input, else to the input
_AVG_WINDOW = """\
def _window(oi, oj, h, wd, kh_, kw_, sh, sw, ph, pw, count_include_pad, divisor):
    h0 = oi * sh - ph
    w0 = oj * sw - pw
    h1 = min(h0 + kh_, h + ph)
    w1 = min(w0 + kw_, wd + pw)
    size = (h1 - h0) * (w1 - w0)
    h0 = max(h0, 0)
    w0 = max(w0, 0)
    h1 = min(h1, h)
    w1 = min(w1, wd)
    if divisor == 0:
        divisor = size if count_include_pad else (h1 - h0) * (w1 - w0)
    return h0, h1, w0, w1, divisor
"""

_AVG_POOL = """\
def {name}(out, x, kh_, kw_, sh, sw, ph, pw, count_include_pad, divisor):
    h = x.shape[2]
    wd = x.shape[3]
{plane}        for oi in range(out.shape[2]):
            for oj in range(out.shape[3]):
                h0, h1, w0, w1, d = _window(oi, oj, h, wd, kh_, kw_, sh, sw, ph, pw,
                                            count_include_pad, divisor)
                s = {T}(0)
                for ih in range(h0, h1):
                    for iw in range(w0, w1):
                        s += x[n, c, ih, iw]
                out[n, c, oi, oj] = s / {T}(d) if h0 < h1 and w0 < w1 else {T}(0)
"""

_AVG_POOL_BACKWARD = """\
def {name}(gi, go, kh_, kw_, sh, sw, ph, pw, count_include_pad, divisor):
    h = gi.shape[2]
    wd = gi.shape[3]
{plane}        for i in range(h):
            for j in range(wd):
                gi[n, c, i, j] = 0
        for oi in range(go.shape[2]):
            for oj in range(go.shape[3]):
                h0, h1, w0, w1, d = _window(oi, oj, h, wd, kh_, kw_, sh, sw, ph, pw,
                                            count_include_pad, divisor)
                delta = go[n, c, oi, oj] / {T}(d)
                for ih in range(h0, h1):
                    for iw in range(w0, w1):
                        gi[n, c, ih, iw] += delta
"""

# PyTorch divides by kh, then by kw (not by kh * kw): same rounding as the CPU
_ADAPTIVE_AVG_POOL = """\
def {name}(out, x):
    h = x.shape[2]
    wd = x.shape[3]
    oh_ = out.shape[2]
    ow_ = out.shape[3]
{plane}        for oi in range(oh_):
            h0 = (oi * h) // oh_
            h1 = ((oi + 1) * h + oh_ - 1) // oh_
            for oj in range(ow_):
                w0 = (oj * wd) // ow_
                w1 = ((oj + 1) * wd + ow_ - 1) // ow_
                s = {T}(0)
                for ih in range(h0, h1):
                    for iw in range(w0, w1):
                        s += x[n, c, ih, iw]
                out[n, c, oi, oj] = s / {T}(h1 - h0) / {T}(w1 - w0)
"""

_ADAPTIVE_AVG_POOL_BACKWARD = """\
def {name}(gi, go):
    h = gi.shape[2]
    wd = gi.shape[3]
    oh_ = go.shape[2]
    ow_ = go.shape[3]
{plane}        for i in range(h):
            for j in range(wd):
                gi[n, c, i, j] = 0
        for oi in range(oh_):
            h0 = (oi * h) // oh_
            h1 = ((oi + 1) * h + oh_ - 1) // oh_
            for oj in range(ow_):
                w0 = (oj * wd) // ow_
                w1 = ((oj + 1) * wd + ow_ - 1) // ow_
                delta = go[n, c, oi, oj] / {T}(h1 - h0) / {T}(w1 - w0)
                for ih in range(h0, h1):
                    for iw in range(w0, w1):
                        gi[n, c, ih, iw] += delta
"""

POOLS = {
    "max_pool2d": (_MAX_POOL, "out"),
    "adaptive_max_pool2d": (_ADAPTIVE_MAX_POOL, "out"),
    "max_pool2d_backward": (_MAX_POOL_BACKWARD, "gi"),
    "avg_pool2d": (_AVG_POOL, "out"),
    "avg_pool2d_backward": (_AVG_POOL_BACKWARD, "gi"),
    "adaptive_avg_pool2d": (_ADAPTIVE_AVG_POOL, "out"),
    "adaptive_avg_pool2d_backward": (_ADAPTIVE_AVG_POOL_BACKWARD, "gi"),
}


def render_pool(kind: str, T: str, lowest: str, parallel: bool) -> tuple[str, str]:
    """One pooling kernel; `T` is the array's numpy type name, `lowest` the max-pool start."""
    template, arr = POOLS[kind]
    name = kernel_name("pool", kind, T, lowest, parallel)
    rng = "prange" if parallel else "range"
    plane = _PLANE.format(arr=arr, rng=rng)
    # adaptive windows are contiguous (step 1); max_pool2d steps by the dilation
    step = ("1", "1") if kind.startswith("adaptive") else ("dh", "dw")
    window = _MAX_WINDOW.format(T=T, lowest=lowest, dh=step[0], dw=step[1])
    body = template.format(name=name, plane=plane, window=window, T=T)
    head = HEADER.format(extra=", parallel=True" if parallel else "")
    helper = ""
    if kind.startswith("avg"):
        helper = '@njit(inline="always")\n' + _AVG_WINDOW + "\n\n"
    return helper + head + body, name
