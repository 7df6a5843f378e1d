"""The elementwise kernels' njit helper library: integer and float forms of division,
remainder, pow, shifts, gcd, logit, chosen by the renderer from the compute type. Compiled once
per process (kernels/shared.py); each kernel's source starts with PRELUDE, the line importing
them, whose digest of SOURCE (through lower/elementwise.PRELUDE_ID) is in every kernel's key.

>>> "def _div_floor_i(" in SOURCE and "_div_floor_i" in PRELUDE and "_pow_f" in PRELUDE
True
"""

from __future__ import annotations

from .shared import register

# Small njit helpers every elementwise kernel may call. Plain @njit with the flags of every caller
# (error_model="numpy", no fastmath), not inline="always": see kernels/shared.py.
# NOTE: Numba's isinstance() does not see np.float32 as float, so each helper comes in a float
# (`_f`) and an integer (`_i`) form and the renderer picks one from the compute type (_HELPERS).
# Float helpers take `one` in the compute type: a bare literal would promote float32 to float64.
SOURCE = '''
@njit(error_model="numpy", forceinline=True)
def _div_trunc_f(a, b, one):
    return np.trunc(a / b)

@njit(error_model="numpy", forceinline=True)
def _div_trunc_i(a, b, one):
    if b == 0:
        raise ZeroDivisionError("ZeroDivisionError")
    if b == -1:
        return -a  # two's complement: MIN // -1 wraps to MIN (LLVM's sdiv would give 0)
    q = a // b
    if q < 0 and q * b != a:
        q += 1
    return q

@njit(error_model="numpy", forceinline=True)
def _div_floor_f(a, b, one):
    if b == 0:
        return a / b
    m = np.fmod(a, b)
    d = (a - m) / b
    if m != 0 and ((b < 0) != (m < 0)):
        d -= one
    if d != 0:
        f = np.floor(d)
        if d - f > one / (one + one):
            f += one
        return f
    return np.copysign(one - one, a / b)

@njit(error_model="numpy", forceinline=True)
def _div_floor_i(a, b, one):
    if b == 0:
        raise ZeroDivisionError("ZeroDivisionError")
    if b == -1:
        return -a  # as the CPU: INT64_MIN // -1 == INT64_MIN (wraps), not 0
    return a // b

@njit(error_model="numpy", forceinline=True)
def _rem_f(a, b, one):
    m = np.fmod(a, b)
    if m != 0 and ((b < 0) != (m < 0)):
        m += b
    return m

@njit(error_model="numpy", forceinline=True)
def _rem_i(a, b, one):
    if b == 0:
        raise ZeroDivisionError("ZeroDivisionError")
    return a % b

@njit(error_model="numpy", forceinline=True)
def _fmod_f(a, b, one):
    return np.fmod(a, b)

@njit(error_model="numpy", forceinline=True)
def _fmod_i(a, b, one):
    if b == 0:
        raise ZeroDivisionError("ZeroDivisionError")
    r = a % b
    if r != 0 and ((r < 0) != (a < 0)):
        r -= b
    return r

@njit(error_model="numpy", forceinline=True)
def _pow_f(a, b, one):
    return a ** b

@njit(error_model="numpy", forceinline=True)
def _pow_i(a, b, one):
    # torch: an integer to a negative power is 1, -1 or 0 (never a division by zero)
    if b < 0:
        if a == 1:
            return one
        if a == -1:
            return -one if b & 1 else one
        return one - one
    r = one
    base = a
    while b:
        if b & 1:
            r = r * base
        base = base * base
        b >>= 1
    return r

@njit(error_model="numpy", forceinline=True)
def _shl_i(a, b, width):
    if b < 0 or b >= width:
        return a - a
    return a << b

@njit(error_model="numpy", forceinline=True)
def _shr_i(a, b, width):
    if b < 0 or b >= width:
        return a - a - 1 if a < 0 else a - a
    return a >> b

@njit(error_model="numpy", forceinline=True)
def _gcd_i(a, b, one):
    a = abs(a)
    b = abs(b)
    while a != 0:
        c = a
        a = b % a
        b = c
    return b

@njit(error_model="numpy", forceinline=True)
def _logit_eps(x, eps, one):
    hi = one - eps
    x = eps if x < eps else (hi if x > hi else x)
    return math.log(x / (one - x))

@njit(error_model="numpy", forceinline=True)
def _finfo_max(x):
    return np.finfo(type(x)).max
'''

# what each kernel's source starts with: the import of this process's compiled helpers
PRELUDE = register("elementwise", SOURCE)
