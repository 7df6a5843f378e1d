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
