"""Pooling family: max, average, adaptive and fractional pooling, 1/2/3-d, with backward.

Every array is (N, C, D, H, W) of any strides: a 2-d pool arrives with D = 1 and a 1-d one
with D = H = 1, so one kernel per pooling kind serves every rank. Kernels loop over
(sample, channel) planes, prange above a size. Max-pool indices are flat within a plane
((iz * H + ih) * W + iw), as PyTorch stores them; every max backward is one scatter kernel.

>>> src, name = render_pool("avg", "np.float32", "-np.inf", False, False)
>>> "_window(oz, dp, kz_, sz, pz)" in src
True
"""

from __future__ import annotations

from .elementwise import kernel_name
from .halfround import ROUND_BF16, ROUND_F16

HEADER = '@njit(error_model="numpy", nogil=True{extra})\n'

_PLANE = """\
    c_ = {arr}.shape[1]
    for p in {rng}({arr}.shape[0] * c_):
        n = p // c_
        c = p % c_
"""

# loops over the output positions of a plane; {win_z} etc. set (z0, z1), (h0, h1), (w0, w1)
_OUT_LOOPS = """\
        for oz in range({arr}.shape[2]):
{win_z}
            for oi in range({arr}.shape[3]):
{win_h}
                for oj in range({arr}.shape[4]):
{win_w}
"""

_ZERO_PLANE = """\
        for z in range(gi.shape[2]):
            for i in range(gi.shape[3]):
                for j in range(gi.shape[4]):
                    gi[n, c, z, i, j] = 0
"""

# PyTorch's CPU rules: a window clipped to the input, the first max wins, a NaN always wins
_MAX_BODY = """\
                    best = {T}({lowest})
                    bi = (z0 * h + h0) * wd + w0
                    for iz in range(z0, z1, {sz}):
                        for ih in range(h0, h1, {sh}):
                            for iw in range(w0, w1, {sw}):
                                v = x[n, c, iz, ih, iw]
                                if v > best or v != v:
                                    best = v
                                    bi = (iz * h + ih) * wd + iw
                    out[n, c, oz, oi, oj] = best
                    ind[n, c, oz, oi, oj] = bi
"""

_SUM_BODY = """\
                    s = {acc}(0)
                    for iz in range(z0, z1):
                        for ih in range(h0, h1):
                            for iw in range(w0, w1):
                                s += x[n, c, iz, ih, iw]
"""

_SCATTER_BODY = """\
                    delta = {delta}
                    for iz in range(z0, z1):
                        for ih in range(h0, h1):
                            for iw in range(w0, w1):
                                gi[n, c, iz, ih, iw] += delta
"""

# a dilated max window: first tap at o*s - p, stepping by the dilation, clipped to [0, size)
_MAX_WIN = """\
{pad}{a}0 = o{v} * s{a} - p{a}
{pad}{a}1 = min({a}0 + (k{a}_ - 1) * d{a} + 1, {size})
{pad}while {a}0 < 0:
{pad}    {a}0 += d{a}"""

# adaptive windows: [floor(o * in / out), ceil((o + 1) * in / out))
_ADAPTIVE_WIN = """\
{pad}{a}0 = (o{v} * {size}) // {arr}.shape[{dim}]
{pad}{a}1 = ((o{v} + 1) * {size} + {arr}.shape[{dim}] - 1) // {arr}.shape[{dim}]"""

# fractional windows: PyTorch's generate_intervals in the input's float type, then a pool
# of k from each start
_FRACTIONAL_WIN = """\
{pad}{a}0 = _interval(o{v}, rs[n, c, c{a}], {size}, out.shape[{axis}], k{a}_)
{pad}{a}1 = {a}0 + k{a}_"""

_FRACTIONAL_HELPER = """\
@njit(inline="always")
def _interval(o, sample, size, osize, k):
    if o == osize - 1:
        return size - k
    alpha = {T}(size - k) / {T}(osize - 1)
    return int(({T}(o) + sample) * alpha) - int(sample * alpha)


"""

# avg windows: (start, end, count-including-padding), clipped to the input
_AVG_HELPER = """\
@njit(inline="always")
def _window(o, size, k, s, p):
    start = o * s - p
    end = min(start + k, size + p)
    pool = end - start
    return max(start, 0), min(end, size), pool


"""
_AVG_WIN = "{pad}{a}0, {a}1, {a}n = _window(o{v}, {size}, k{a}_, s{a}, p{a})"

_AXES = (("z", "z", "dp", 2), ("h", "i", "h", 3), ("w", "j", "wd", 4))
_SIZES_OF = """\
    dp = {arr}.shape[2]
    h = {arr}.shape[3]
    wd = {arr}.shape[4]
"""

_WINDOW_ARGS = "kz_, kh_, kw_, sz, sh, sw, pz, ph, pw"
_SIGNATURES = {
    "max": ("out, ind, x, " + _WINDOW_ARGS + ", dz, dh, dw", "out", "x"),
    "adaptive_max": ("out, ind, x", "out", "x"),
    "fractional_max": ("out, ind, x, rs, kz_, kh_, kw_, cz, ch, cw", "out", "x"),
    "avg": ("out, x, " + _WINDOW_ARGS + ", count_include_pad, divisor", "out", "x"),
    "avg_backward": ("gi, go, " + _WINDOW_ARGS + ", count_include_pad, divisor", "go", "gi"),
    "adaptive_avg": ("out, x", "out", "x"),
    "adaptive_avg_backward": ("gi, go", "go", "gi"),
}

# gi[n, c].flat[ind] += go: a scatter within a plane, planes in parallel
_MAX_BACKWARD = """\
def {name}(gi, go, ind):
    h = gi.shape[3]
    wd = gi.shape[4]
{plane}{zero}        for oz in range(go.shape[2]):
            for oi in range(go.shape[3]):
                for oj in range(go.shape[4]):
                    k = ind[n, c, oz, oi, oj]
                    if k >= 0:
                        gi[n, c, k // (h * wd), (k // wd) % h, k % wd] += go[n, c, oz, oi, oj]
"""


def _windows(kind: str, arr: str, T: str) -> dict:
    out = {}
    for depth, (a, v, size, dim) in enumerate(_AXES):
        pad = " " * (12 + 4 * depth)
        if kind == "max":
            text = _MAX_WIN.format(pad=pad, a=a, v=v, size=size)
        elif kind.startswith("adaptive"):
            text = _ADAPTIVE_WIN.format(pad=pad, a=a, v=v, size=size, arr=arr, dim=dim)
        elif kind == "fractional_max":
            text = _FRACTIONAL_WIN.format(pad=pad, a=a, v=v, size=size, axis=dim)
        else:
            text = _AVG_WIN.format(pad=pad, a=a, v=v, size=size)
        out["win_" + v.replace("i", "h").replace("j", "w")] = text
    return out


def _avg_divisor() -> str:
    """The divisor line: divisor_override, else the padded window, else the clipped one."""
    return ("                    d = divisor if divisor != 0 else (zn * hn * wn if "
            "count_include_pad else (z1 - z0) * (h1 - h0) * (w1 - w0))")


def render_pool(kind: str, T: str, lowest: str, parallel: bool,
                integer: bool, bf16: bool | str = False) -> tuple[str, str]:
    """One pooling kernel; `T` is the array's numpy type name, `lowest` the max-pool start,
    `integer` selects truncating division for average pooling of integer types; `bf16`
    (adaptive_avg on float32 copies of half data: True for bfloat16, "f16" for float16) rounds
    each add and each division to that type, as PyTorch's CPU adaptive_avg_pool3d computes in
    it."""
    name = kernel_name("pool3", kind, T, lowest, parallel, integer, bf16)
    rng = "prange" if parallel else "range"
    head = HEADER.format(extra=", parallel=True" if parallel else "")
    if kind == "max_backward":
        body = _MAX_BACKWARD.format(name=name, plane=_PLANE.format(arr="gi", rng=rng),
                                    zero=_ZERO_PLANE)
        if bf16:   # the CPU's half kernels add in the half type (True: bfloat16, "f16")
            r = "_round_f16" if bf16 == "f16" else "_round_bf16"
            body = body.replace(
                "gi[n, c, k // (h * wd), (k // wd) % h, k % wd] += go[n, c, oz, oi, oj]",
                f"gi[n, c, k // (h * wd), (k // wd) % h, k % wd] = {r}(\n"
                "                            gi[n, c, k // (h * wd), (k // wd) % h, k % wd] + "
                "go[n, c, oz, oi, oj])")
            return (ROUND_F16 if bf16 == "f16" else ROUND_BF16) + head + body, name
        return head + body, name
    params, loop_arr, size_arr = _SIGNATURES[kind]
    lines = [f"def {name}({params}):", _SIZES_OF.format(arr=size_arr).rstrip(),
             _PLANE.format(arr=loop_arr, rng=rng).rstrip()]
    if kind.endswith("backward"):
        lines.append(_ZERO_PLANE.rstrip())
    lines.append(_OUT_LOOPS.format(arr=loop_arr, **_windows(kind, loop_arr, T)).rstrip())
    helper = ""
    if kind in ("max", "adaptive_max", "fractional_max"):
        step = ("dz", "dh", "dw") if kind == "max" else ("1", "1", "1")
        lines.append(_MAX_BODY.format(T=T, lowest=lowest, sz=step[0], sh=step[1],
                                      sw=step[2]).rstrip())
        if kind == "fractional_max":
            helper = _FRACTIONAL_HELPER.format(T=T)
    elif kind == "avg":
        helper = _AVG_HELPER
        acc = T
        lines += [_SUM_BODY.format(acc=acc).rstrip(), _avg_divisor()]
        div = "_tdiv(s, d)" if integer else f"s / {T}(d)"
        lines.append(f"                    out[n, c, oz, oi, oj] = {div} if z0 < z1 and "
                     f"h0 < h1 and w0 < w1 else {T}(0)")
        if integer:
            helper += _TDIV
    elif kind == "avg_backward" and bf16:
        # the CPU's half kernels: grad_output / divisor and each += in the half type
        r = "_round_f16" if bf16 == "f16" else "_round_bf16"
        helper = _AVG_HELPER + (ROUND_F16 if bf16 == "f16" else ROUND_BF16)
        lines.append(_avg_divisor())
        lines.append(_SCATTER_BODY.format(delta=f"{r}(go[n, c, oz, oi, oj] / {T}(d))").rstrip()
                     .replace("gi[n, c, iz, ih, iw] += delta",
                              f"gi[n, c, iz, ih, iw] = {r}(gi[n, c, iz, ih, iw] + delta)"))
    elif kind == "avg_backward":
        helper = _AVG_HELPER
        lines.append(_avg_divisor())
        lines.append(_SCATTER_BODY.format(delta=f"go[n, c, oz, oi, oj] / {T}(d)").rstrip())
    elif kind == "adaptive_avg" and bf16:
        # bf16 True: bfloat16; "f16": float16 (the CPU's 3-d kernel adds and divides in either)
        helper, r = (ROUND_F16, "_round_f16") if bf16 == "f16" else (ROUND_BF16, "_round_bf16")
        body = _SUM_BODY.format(acc=T).rstrip().replace(
            "s += x[n, c, iz, ih, iw]", f"s = {r}(s + x[n, c, iz, ih, iw])")
        mean = f"{r}({r}({r}(s / {T}(z1 - z0)) / {T}(h1 - h0)) / {T}(w1 - w0))"
        lines += [body, f"                    out[n, c, oz, oi, oj] = {mean}"]
    elif kind == "adaptive_avg":
        # PyTorch divides by each window extent in turn (not by their product): same rounding
        mean = f"s / {T}(z1 - z0) / {T}(h1 - h0) / {T}(w1 - w0)"
        lines += [_SUM_BODY.format(acc=T).rstrip(),
                  f"                    out[n, c, oz, oi, oj] = {mean}"]
    elif kind == "adaptive_avg_backward" and bf16:
        # the CPU's 3-d half kernel: grad_output / kT / kH / kW and each += in the half type
        helper, r = (ROUND_F16, "_round_f16") if bf16 == "f16" else (ROUND_BF16, "_round_bf16")
        lines.append(_SCATTER_BODY.format(
            delta=f"{r}({r}({r}(go[n, c, oz, oi, oj] / {T}(z1 - z0)) / {T}(h1 - h0)) / "
                  f"{T}(w1 - w0))").rstrip().replace(
            "gi[n, c, iz, ih, iw] += delta",
            f"gi[n, c, iz, ih, iw] = {r}(gi[n, c, iz, ih, iw] + delta)"))
    elif kind == "adaptive_avg_backward":
        lines.append(_SCATTER_BODY.format(
            delta=f"go[n, c, oz, oi, oj] / {T}(z1 - z0) / {T}(h1 - h0) / {T}(w1 - w0)"
        ).rstrip())
    else:
        raise ValueError(f"unknown pooling kernel {kind}")
    return helper + head + "\n".join(lines) + "\n", name


# integer average: C division truncates toward zero (Python's // floors); the divisor is
# negative under a negative divisor_override
_TDIV = """\
@njit(inline="always")
def _tdiv(s, d):
    q = abs(s) // abs(d)
    return q if (s >= 0) == (d > 0) else -q


"""
