"""Rounding to the half types: each rule written once, for kernel source and for the casts.

PyTorch's CPU computes a bfloat16 or float16 operation in float32 and rounds the float32 result
to the half type after each step (c10::BFloat16 / c10::Half arithmetic). Kernels that must
round where the CPU rounds (a bfloat16 running sum, a col2im add, a cross product) paste
`ROUND_BF16` or `ROUND_F16` into their source and call `_round_bf16(x)` / `_round_f16(x)`: x
(any float) is taken to float32 first, as the CPU's arithmetic leaves it, then to the nearest
half value (ties to even, subnormals on the half type's grid), returned as a float32.

`BF16_BITS` is the bfloat16 rule on float32 bits (`x0`, an integer holding them) giving the
bfloat16 bits: the cast kernels (eager_neuron/lower/cast.py) and `_round_bf16` share it. Every
NaN becomes the quiet NaN 0x7FC0, as c10::round_to_nearest_even does.

>>> import numpy as np
>>> from numba import njit
>>> ns = {"njit": njit, "np": np, "math": __import__("math")}
>>> exec(ROUND_BF16 + ROUND_F16, ns)
>>> float(ns["_round_bf16"](np.float32(1 + 2 ** -8)))    # a tie: to even (1.0)
1.0
>>> float(ns["_round_bf16"](np.float32(1 + 3 * 2 ** -8)))  # a tie: to even (1 + 2**-6)
1.015625
>>> float(ns["_round_f16"](70000.0)), float(ns["_round_f16"](2.0 ** -25 * 3))
(inf, 1.1920928955078125e-07)
"""

from __future__ import annotations

from .shared import register

# bfloat16 = the upper half of a float32: add half an ulp of the kept part (less one, plus the
# kept part's lowest bit: ties to even) and drop the low 16 bits
BF16_BITS = ("0x7FC0 if (x0 & 0x7FFFFFFF) > 0x7F800000 else "
             "((x0 + 0x7FFF + ((x0 >> 16) & 1)) >> 16)")

# float32 bits -> float16 bits, round to nearest even (as c10's fp16_ieee_from_fp32_value): NaN
# -> sign | 0x7E00; |x| >= 65520 -> inf; normals (|x| >= 2**-14) re-biased and rounded at bit
# 13 (a carry into the exponent is the right answer); below, the subnormal grid of 2**-24:
# |x| * 2**24 (exact) rounded to an integer, ties to even (2**-25 -> 0; 1024 is the smallest
# normal's bits). Integer ops, one rint and selects: it vectorizes.
_A = "(self & 0x7FFFFFFF)"
_NORMAL = f"((({_A} - 0x38000000) + 0xFFF + ((({_A} - 0x38000000) >> 13) & 1)) >> 13)"
_SUBNORMAL = (f"np.int64(np.rint(np.uint32({_A}).view(np.float32) * "
              "np.float32(16777216.0)))")
F32_TO_F16 = (f"((self >> 16) & 0x8000) | (0x7E00 if {_A} > 0x7F800000 else (0x7C00 if "
              f"{_A} >= 0x477FF000 else ({_NORMAL} if {_A} >= 0x38800000 else {_SUBNORMAL})))")
# float16 bits -> float32 value (exact: every float16 is a float32), built as float32 bits:
# sign, exponent re-biased by 127 - 15 = 112, significand shifted up 13; infinities and NaNs
# (exponent 31) keep their significand, a NaN made quiet as the CPU's conversion does; subnormals
# (exponent 0) are significand * 2**-24, exact in float32. Integer ops and selects: it
# vectorizes (a float64 power per element took 3.5 ms per million).
_E = "((self >> 10) & 0x1F)"
_SUB = "np.float32(self & 0x3FF) * np.float32(5.9604644775390625e-08)"
F16_TO_F32 = (f"((-{_SUB} if (self & 0x8000) != 0 else {_SUB}) if {_E} == 0 else "
              f"np.uint32(((self & 0x8000) << 16) | ((0x7FC00000 if (self & 0x3FF) != 0 else "
              f"0x7F800000) if {_E} == 31 else ({_E} + 112) << 23) | ((self & 0x3FF) << 13))"
              ".view(np.float32))")

# The half route's one-kernel form (lower/elementwise.py prepare_half): an elementwise kernel
# reads a bfloat16/float16 operand as its int16 bits and loads it as the float32 it is exactly
# (what the cast up writes), computes in float32 as the float32 op does, and stores the float32
# result rounded to the half type's bits (what the cast down writes): the same bits as the three
# kernels, in one pass. Part of the elementwise prelude (kernels/elementwise_prelude.py).
HALF_IO = f'''
@njit(inline="always", error_model="numpy")
def _ld_bf16(b):
    return np.uint32((np.int64(b) & 0xFFFF) << 16).view(np.float32)


@njit(inline="always", error_model="numpy")
def _st_bf16(x):
    x0 = np.int64(np.float32(x).view(np.uint32))
    return np.int16({BF16_BITS})


@njit(inline="always", error_model="numpy")
def _ld_f16(b):
    self = np.int64(b) & 0xFFFF
    return np.float32({F16_TO_F32})


@njit(inline="always", error_model="numpy")
def _st_f16(x):
    self = np.int64(np.float32(x).view(np.uint32))
    return np.int16({F32_TO_F16})
'''

# NOTE: the scalar bit views allocate nothing (a one-element buffer per call would). The helpers
# are called, not inlined by Numba (LLVM inlines them where it pays; Numba's inlining at ~30
# sites of the grid sampler tripled its compile time). They are compiled once per process and
# linked into each kernel (kernels/shared.py): ROUND_BF16 / ROUND_F16 are the lines importing
# them, whose digests of the sources below are part of every kernel source that pastes them.
ROUND_BF16_SOURCE = f'''
@njit(error_model="numpy", nogil=True)
def _round_bf16(x):
    x0 = np.int64(np.float32(x).view(np.uint32))
    return np.uint32(({BF16_BITS}) << 16).view(np.float32)

'''

# float16: 11 significant bits; below 2**-14 the subnormal grid of 2**-24; from 65520 on, inf
ROUND_F16_SOURCE = '''
@njit(error_model="numpy", nogil=True)
def _round_f16(x):
    x = np.float32(x)
    if x == 0 or not math.isfinite(x):
        return x
    if abs(x) >= 65520.0:
        return np.float32(math.copysign(math.inf, x))
    if abs(x) < 2.0 ** -14:
        return np.float32(np.rint(x * 2.0 ** 24) / 2.0 ** 24)
    m, e = math.frexp(x)
    return np.float32(math.ldexp(np.rint(m * 2048.0), e - 11))

'''

ROUND_BF16 = register("round_bf16", ROUND_BF16_SOURCE) + "\n"
ROUND_F16 = register("round_f16", ROUND_F16_SOURCE) + "\n"

# one kernel source for both half types: kind 1 rounds to bfloat16, kind 2 to float16, any other
# kind leaves x as it is (float32 arithmetic); paste after ROUND_BF16 and ROUND_F16
ROUND_HALF = '''
@njit(inline="always")
def _round_half(x, kind):
    if kind == 1:
        return _round_bf16(x)
    if kind == 2:
        return _round_f16(x)
    return x

'''
