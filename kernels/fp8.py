"""FP8 kernels: float32 -> fp8 encoding (round to nearest even, each format's overflow rule),
fp8 -> float64 decoding through a 256-entry table, and the scaled fp8 matmul.

numpy has no fp8 dtype: fp8 tensors are handled as their uint8 bit patterns. The four formats
and their overflow rules (those of PyTorch's c10 conversions, which the CPU uses):
  e4m3fn    bias 7,  max 448,   no inf: overflow and +-inf saturate to +-448, NaN -> 0x7F|sign
  e5m2      bias 15, max 57344, IEEE-like: overflow -> +-inf, NaN -> 0x7F|sign
  e4m3fnuz  bias 8,  max 240,   one NaN (0x80), no -0: overflow, inf and NaN -> 0x80
  e5m2fnuz  bias 16, max 57344, as e4m3fnuz

>>> FORMATS["e4m3fn"].max, float(decode_table("e5m2")[0x7C])
(448.0, inf)
>>> src, name = render_encode("e4m3fn")
>>> name
'fp8_enc_e4m3fn'
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np


class Format(NamedTuple):
    exp_bits: int
    man_bits: int
    bias: int
    kind: str        # "fn" (saturating, no inf), "ieee" (has inf), "fnuz" (one NaN, no -0)
    max: float       # largest finite value


FORMATS = {
    "e4m3fn": Format(4, 3, 7, "fn", 448.0),
    "e5m2": Format(5, 2, 15, "ieee", 57344.0),
    "e4m3fnuz": Format(4, 3, 8, "fnuz", 240.0),
    "e5m2fnuz": Format(5, 2, 16, "fnuz", 57344.0),
}


def decode_table(fmt: str) -> np.ndarray:
    """The float64 value of each of the 256 bit patterns of `fmt` (exact: fp8 fits in float32)."""
    f = FORMATS[fmt]
    out = np.empty(256, np.float64)
    top = (1 << f.exp_bits) - 1
    for code in range(256):
        neg = code >> 7
        e = (code >> f.man_bits) & top
        m = code & ((1 << f.man_bits) - 1)
        if f.kind == "fnuz" and code == 0x80:
            v = math.nan
        elif f.kind == "fn" and (code & 0x7F) == 0x7F:
            v = math.nan
        elif f.kind == "ieee" and e == top:
            v = math.inf if m == 0 else math.nan
        elif e == 0:
            v = m * 2.0 ** (1 - f.bias - f.man_bits)
        else:
            v = (1 + m / (1 << f.man_bits)) * 2.0 ** (e - f.bias)
        out[code] = -v if neg and not math.isnan(v) else v
    return out


_ENCODE = """\
@njit(error_model="numpy", nogil=True)
def {name}(x, out):
    # x: float32, out: uint8 codes (both 1-d, contiguous)
    for i in range(x.size):
        v = np.float64(x[i])
        sign = 0x80 if math.copysign(1.0, v) < 0 else 0
        if v != v:
            out[i] = {nan}
            continue
        a = abs(v)
        if a == math.inf:
            out[i] = {over}
            continue
        if a < {min_normal!r}:
            q = {sub_q!r}
        else:
            k = math.frexp(a)[1]
            q = math.ldexp(1.0, k - 1 - {man})
        r = a / q                      # exact: a is a float32, q a power of two
        f = math.floor(r)
        d = r - f
        if d > 0.5 or (d == 0.5 and f % 2 == 1):
            f += 1.0                   # round half to even
        val = f * q
        if val > {max!r}:
            out[i] = {over}
        elif val == 0.0:
            out[i] = {zero}
        elif val < {min_normal!r}:
            out[i] = sign | int(f)      # subnormal: f counts quanta (2**man is the min normal)
        else:
            e = math.frexp(val)[1] - 1
            mant = int(val / math.ldexp(1.0, e - {man})) - {implicit}
            out[i] = sign | ((e + {bias}) << {man}) | mant
"""


def render_encode(fmt: str) -> tuple[str, str]:
    """Numba source of the float32 -> `fmt` encoder `(x, out_uint8)`, and its name."""
    f = FORMATS[fmt]
    name = f"fp8_enc_{fmt}"
    nan = "0x80" if f.kind == "fnuz" else "0x7F | sign"
    over = {"fn": "0x7E | sign", "ieee": f"{((1 << f.exp_bits) - 1) << f.man_bits} | sign",
            "fnuz": "0x80"}[f.kind]
    zero = "0" if f.kind == "fnuz" else "sign"
    min_normal = 2.0 ** (1 - f.bias)
    src = _ENCODE.format(name=name, nan=nan, over=over, zero=zero, max=f.max,
                         min_normal=min_normal, sub_q=2.0 ** (1 - f.bias - f.man_bits),
                         man=f.man_bits, implicit=1 << f.man_bits, bias=f.bias)
    return src, name


DECODE = """\
@njit(error_model="numpy", nogil=True)
def fp8_decode(codes, table, out):
    # codes: uint8, out: float32 (both 1-d, contiguous)
    for i in range(codes.size):
        out[i] = table[codes[i]]
"""

SCALED_MM = """\
@njit(error_model="numpy", nogil=True)
def fp8_scaled_mm(a, b, ta, tb, sa, sb, bias, out):
    # out[i, j] = sum_k (ta[a[i, k]] * sa[i]) * (tb[b[k, j]] * sb[j]) + bias[j], in float64;
    # sa/sb hold one scale per row of a / column of b (a per-tensor scale repeated)
    m, kk = a.shape
    n = b.shape[1]
    bv = np.empty((kk, n), np.float64)
    for k in range(kk):
        for j in range(n):
            bv[k, j] = tb[b[k, j]] * sb[j]
    for i in range(m):
        for j in range(n):
            acc = 0.0
            for k in range(kk):
                acc += ta[a[i, k]] * sa[i] * bv[k, j]
            out[i, j] = acc + bias[j]
"""
