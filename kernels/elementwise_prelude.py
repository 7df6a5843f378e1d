"""The elementwise kernels' njit helper library, as source prepended to each kernel (its hash,
lower/elementwise.PRELUDE_ID, is part of every elementwise kernel's key): integer and float
forms of division, remainder, pow, shifts, gcd, logit, chosen by the renderer from the compute
type.

>>> "def _div_floor_i(" in PRELUDE and "def _pow_f(" in PRELUDE
True
"""

from __future__ import annotations

from .halfround import HALF_IO

# Small njit helpers every elementwise kernel may call (defined in the kernel's namespace).
# NOTE: Numba's isinstance() does not see np.float32 as float, so each helper comes in a float
# (`_f`) and an integer (`_i`) form and the renderer picks one from the compute type (_HELPERS).
# Float helpers take `one` in the compute type: a bare literal would promote float32 to float64.
PRELUDE = '''
@njit(inline="always", error_model="numpy")
def _div_trunc_f(a, b, one):
    return np.trunc(a / b)

@njit(inline="always", error_model="numpy")
def _div_trunc_i(a, b, one):
    if b == 0:
        raise ZeroDivisionError("ZeroDivisionError")
    if b == -1:
        return -a  # two's complement: MIN // -1 wraps to MIN (LLVM's sdiv would give 0)
    q = a // b
    if q < 0 and q * b != a:
        q += 1
    return q

@njit(inline="always", error_model="numpy")
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

@njit(inline="always", error_model="numpy")
def _div_floor_i(a, b, one):
    if b == 0:
        raise ZeroDivisionError("ZeroDivisionError")
    if b == -1:
        return -a  # as the CPU: INT64_MIN // -1 == INT64_MIN (wraps), not 0
    return a // b

@njit(inline="always", error_model="numpy")
def _rem_f(a, b, one):
    m = np.fmod(a, b)
    if m != 0 and ((b < 0) != (m < 0)):
        m += b
    return m

@njit(inline="always", error_model="numpy")
def _rem_i(a, b, one):
    if b == 0:
        raise ZeroDivisionError("ZeroDivisionError")
    return a % b

@njit(inline="always", error_model="numpy")
def _fmod_f(a, b, one):
    return np.fmod(a, b)

@njit(inline="always", error_model="numpy")
def _fmod_i(a, b, one):
    if b == 0:
        raise ZeroDivisionError("ZeroDivisionError")
    r = a % b
    if r != 0 and ((r < 0) != (a < 0)):
        r -= b
    return r

@njit(inline="always", error_model="numpy")
def _pow_f(a, b, one):
    return a ** b

@njit(inline="always", error_model="numpy")
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

@njit(inline="always", error_model="numpy")
def _shl_i(a, b, width):
    if b < 0 or b >= width:
        return a - a
    return a << b

@njit(inline="always", error_model="numpy")
def _shr_i(a, b, width):
    if b < 0 or b >= width:
        return a - a - 1 if a < 0 else a - a
    return a >> b

@njit(inline="always", error_model="numpy")
def _gcd_i(a, b, one):
    a = abs(a)
    b = abs(b)
    while a != 0:
        c = a
        a = b % a
        b = c
    return b

@njit(inline="always", error_model="numpy")
def _logit_eps(x, eps, one):
    hi = one - eps
    x = eps if x < eps else (hi if x > hi else x)
    return math.log(x / (one - x))

@njit(inline="always")
def _finfo_max(x):
    return np.finfo(type(x)).max
''' + HALF_IO
