"""Numba intrinsics for rendered kernels (imported by kernel source only: it imports Numba).

`fma(a, b, c)`: a * b + c rounded once (llvm.fma), for two floats of one type. LLVM never fuses
a multiply and an add on its own here (kernels are compiled without `contract`, so fused
adaptive kernels round as eager ones do); the vmath helpers spell their polynomials with it,
which LLVM vectorizes to vfmadd (half the instructions of mul + add, and one rounding).

>>> import numpy as np
>>> from numba import njit
>>> from eager_neuron.kernels.intrinsics import fma
>>> f = njit(lambda a, b, c: fma(a, b, c))
>>> x = np.float32(1 + 2 ** -12)
>>> float(f(x, x, np.float32(-1 - 2 ** -11)))   # the 2^-24 a separate multiply rounds away
5.960464477539063e-08
"""

from __future__ import annotations

from numba import types
from numba.extending import intrinsic


@intrinsic
def fma(typingctx, a, b, c):
    if not (a == b == c and isinstance(a, types.Float)):
        return None

    def codegen(context, builder, signature, args):
        return builder.fma(*args)

    return a(a, b, c), codegen
