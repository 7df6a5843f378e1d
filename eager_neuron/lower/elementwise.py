"""Elementwise lowerings: unary, binary, ternary ops with broadcasting and type promotion.

Each op is an expression over its schema argument names; `T(..)` is the compute type. Tensor
arguments become loaded operands, Scalar arguments become kernel scalars, so `add.Tensor` and
`add.Scalar` share one template and a new alpha value does not recompile. A one-element tensor
operand of a larger output is passed as a scalar too (one kernel for `x * t` and `x * 2.0`).

    1. template analysis (names used, compute type, casts, rendered expression): once per
       (overload, template, argument types), cached in _SPECS
    2. per call: operand kinds (flat / one / nd), numpy views, scalars -> launch
Helpers with integer and float forms (`_div_floor_i` / `_div_floor_f`, ...) are chosen by the
compute type at render time; integer division by zero raises ZeroDivisionError like the CPU.

>>> import torch, eager_neuron
>>> (torch.tensor([7, -7], device="neuron") // 2).tolist()
[3, -4]
"""

from __future__ import annotations

import functools
import hashlib
import re

import torch

from .. import errors
from ..adaptive import MODULE as _adaptive
from ..context import _TLS as _ctx_tls
from ..kernels import compile as kc
from ..kernels import elementwise as kew
from ..kernels import vmath as _vmath
from ..launch import launch
from . import cells as _cells
from . import special as _special
from .common import NP_TYPE, coalesce

PARALLEL_MIN = 1 << 18   # below this a prange launch costs more than it saves

# op -> (template or fn(a) -> template, compute rule, {arg: cast rule})
# compute rules: "out" cast operands to the output dtype; "common" to torch.result_type of the
# operands (comparisons); "bool" to bool (logical ops).
_CLAMP_NAN = "(x if x != x else ({lo}))"
OPS: dict = {
    # -- unary math ------------------------------------------------------------------------------
    "aten::abs": ("abs(self)", "out"),
    "aten::neg": ("-self", "out"),
    "aten::exp": ("math.exp(self)", "out"),
    "aten::exp2": ("math.pow(T(2), self)", "out"),
    "aten::expm1": ("math.expm1(self)", "out"),
    "aten::log": ("math.log(self) if self > 0 else (T(-math.inf) if self == 0 else T(math.nan))",
                  "out"),
    "aten::log2": ("math.log2(self) if self > 0 else (T(-math.inf) if self == 0 else T(math.nan))",
                   "out"),
    "aten::log10": ("math.log10(self) if self > 0 else (T(-math.inf) if self == 0 "
                    "else T(math.nan))", "out"),
    "aten::log1p": ("math.log1p(self) if self > -1 else (T(-math.inf) if self == -1 "
                    "else T(math.nan))", "out"),
    "aten::sqrt": ("math.sqrt(self) if self >= 0 else T(math.nan)", "out"),
    "aten::rsqrt": ("T(1) / math.sqrt(self) if self >= 0 else T(math.nan)", "out"),
    "aten::sin": ("math.sin(self)", "out"),
    "aten::cos": ("math.cos(self)", "out"),
    "aten::tan": ("math.tan(self)", "out"),
    "aten::asin": ("math.asin(self) if abs(self) <= 1 else T(math.nan)", "out"),
    "aten::acos": ("math.acos(self) if abs(self) <= 1 else T(math.nan)", "out"),
    "aten::atan": ("math.atan(self)", "out"),
    "aten::sinh": ("math.sinh(self)", "out"),
    "aten::cosh": ("math.cosh(self)", "out"),
    "aten::tanh": ("math.tanh(self)", "out"),
    "aten::asinh": ("math.asinh(self)", "out"),
    "aten::acosh": ("math.acosh(self) if self >= 1 else T(math.nan)", "out"),
    "aten::atanh": ("math.atanh(self) if abs(self) < 1 else (T(math.copysign(math.inf, self)) "
                    "if abs(self) == 1 else T(math.nan))", "out"),
    "aten::erf": ("math.erf(self)", "out"),
    "aten::erfc": ("math.erfc(self)", "out"),
    "aten::lgamma": ("math.lgamma(self)", "out"),
    "aten::angle": ("self if self != self else (T(math.pi) if self < 0 else T(0))", "out"),
    "aten::floor": ("np.floor(self)", "out"),
    "aten::ceil": ("np.ceil(self)", "out"),
    "aten::trunc": ("np.trunc(self)", "out"),
    "aten::frac": ("self - np.trunc(self)", "out"),
    "aten::round": (lambda a: _round(a.get("decimals") or 0), "out"),
    "aten::sign": ("T(self > 0) - T(self < 0)", "out"),
    "aten::sgn": ("T(self > 0) - T(self < 0)", "out"),
    "aten::reciprocal": ("T(1) / self", "out"),
    "aten::square": ("self * self", "out"),
    "aten::bitwise_not": ("~self", "out"),
    "aten::logical_not": ("not self", "bool"),
    "aten::isnan": ("self != self", "none"),
    "aten::signbit": ("math.copysign(T(1), self) < 0", "out_float"),
    # -- activations ------------------------------------------------------------------------------
    "aten::relu": ("self if not (self < 0) else T(0)", "out"),  # as the CPU: -0.0, NaN kept
    "aten::sigmoid": ("T(1) / (T(1) + math.exp(-self))", "out"),
    "aten::silu": ("self / (T(1) + math.exp(-self))", "out"),
    "aten::mish": ("self * math.tanh(math.log1p(math.exp(self)) if self <= 20 else self)", "out"),
    "aten::hardsigmoid": ("(T(0) if self <= -3 else (T(1) if self >= 3 else self / T(6) + "
                          "T(0.5)))", "out"),
    "aten::hardswish": ("(T(0) if self <= -3 else (self if self >= 3 else self * (self + T(3)) "
                        "/ T(6)))", "out"),
    "aten::softplus": ("self if self * beta > threshold else "
                       "math.log1p(math.exp(self * beta)) / beta", "out"),
    "aten::elu": ("self * scale if self > 0 else math.expm1(self * input_scale) * alpha * scale",
                  "out"),
    "aten::leaky_relu": ("self if self > 0 else self * negative_slope", "out"),
    "aten::hardtanh": ("self if self != self else (min_val if self < min_val else "
                       "(max_val if self > max_val else self))", "out"),
    "aten::threshold": ("value if self <= threshold else self", "out"),
    "aten::gelu": (lambda a: _gelu(a, _GELU), "out"),
    "aten::logit": (lambda a: "math.log(self / (T(1) - self))" if a["eps"] is None else
                    "_logit_eps(self, eps, T(1))", "out"),
    # -- activation backward ---------------------------------------------------------------------
    "aten::threshold_backward": ("T(0) if self <= threshold else grad_output", "out"),
    "aten::sigmoid_backward": ("grad_output * (T(1) - output) * output", "out"),
    "aten::tanh_backward": ("grad_output * (T(1) - output * output)", "out"),
    "aten::silu_backward": ("grad_output * (T(1) / (T(1) + math.exp(-self))) * (T(1) + self * "
                            "(T(1) - T(1) / (T(1) + math.exp(-self))))", "out"),
    "aten::gelu_backward": (lambda a: _gelu(a, _GELU_BW), "out"),
    "aten::leaky_relu_backward": ("grad_output if self > 0 else grad_output * negative_slope",
                                  "out"),
    "aten::hardtanh_backward": ("T(0) if (self <= min_val or self >= max_val) else grad_output",
                                "out"),
    "aten::softplus_backward": ("grad_output if self * beta > threshold else grad_output * "
                                "(T(1) - T(1) / (T(1) + math.exp(self * beta)))", "out"),
    "aten::hardsigmoid_backward": ("grad_output / T(6) if (self > -3 and self < 3) else T(0)",
                                   "out"),
    "aten::hardshrink_backward": ("T(0) if (self >= -lambd and self <= lambd) else grad_out",
                                  "out"),
    "aten::softshrink_backward": ("T(0) if (self >= -lambd and self <= lambd) else "
                                  "grad_output", "out"),
    "aten::hardswish_backward": ("T(0) if self < -3 else (grad_output if self > 3 else "
                                 "grad_output * (self / T(3) + T(0.5)))", "out"),
    # -- binary -----------------------------------------------------------------------------------
    "aten::add": ("self + alpha * other", "out"),
    "aten::sub": ("self - alpha * other", "out"),
    "aten::rsub": ("other - alpha * self", "out"),
    "aten::mul": ("self * other", "out"),
    "aten::div": (lambda a: _DIV[a.get("rounding_mode")], "out"),
    "aten::true_divide": ("self / other", "out"),
    "aten::floor_divide": (lambda a: _DIV["floor"], "out"),
    "aten::remainder": ("_rem(self, other, T(1))", "out"),
    "aten::fmod": ("_fmod(self, other, T(1))", "out"),
    "aten::pow": (lambda a: _pow(a), "out"),
    "aten::maximum": ("self if self != self else (other if other != other else "
                      "(self if self > other else other))", "out"),
    "aten::minimum": ("self if self != self else (other if other != other else "
                      "(self if self < other else other))", "out"),
    "aten::fmax": ("other if self != self else (self if other != other else "
                   "(self if self > other else other))", "out"),
    "aten::fmin": ("other if self != self else (self if other != other else "
                   "(self if self < other else other))", "out"),
    "aten::atan2": ("math.atan2(self, other)", "out"),
    "aten::hypot": ("math.hypot(self, other)", "out"),
    "aten::copysign": ("math.copysign(self, other)", "out"),
    "aten::xlogy": ("T(math.nan) if other != other else (T(0) if self == 0 else "
                    "self * math.log(other))", "out"),
    "aten::eq": ("self == other", "common"),
    "aten::ne": ("self != other", "common"),
    "aten::lt": ("self < other", "common"),
    "aten::le": ("self <= other", "common"),
    "aten::gt": ("self > other", "common"),
    "aten::ge": ("self >= other", "common"),
    "aten::logical_and": ("self and other", "bool"),
    "aten::logical_or": ("self or other", "bool"),
    "aten::logical_xor": ("self != other", "bool"),
    "aten::bitwise_and": ("self & other", "out"),
    "aten::bitwise_or": ("self | other", "out"),
    "aten::bitwise_xor": ("self ^ other", "out"),
    "aten::bitwise_left_shift": (lambda a: _shift(a, "_shl"), "out"),
    "aten::bitwise_right_shift": (lambda a: _shift(a, "_shr"), "out"),
    "aten::gcd": ("_gcd(self, other, T(1))", "out"),
    "aten::nextafter": ("np.nextafter(self, other)", "out"),
    # -- ternary and friends ---------------------------------------------------------------------
    "aten::where": ("self if condition else other", "out", {"condition": "bool"}),
    "aten::masked_fill": ("value if mask else self", "out", {"mask": "bool"}),
    "aten::lerp": ("self + weight * (end - self) if abs(weight) < 0.5 else "
                   "end - (end - self) * (T(1) - weight)", "out"),
    "aten::addcmul": ("self + value * tensor1 * tensor2", "out"),
    "aten::addcdiv": ("self + value * (tensor1 / tensor2)", "out"),
    "aten::clamp": (lambda a: _clamp(a, "min", "max"), "out"),
    "aten::clamp_min": (lambda a: _clamp(a, "min", None), "out"),
    "aten::clamp_max": (lambda a: _clamp(a, None, "max"), "out"),
    "aten::nan_to_num": (lambda a: _nan_to_num(a), "out"),
    # -- copies and casts ------------------------------------------------------------------------
    "aten::clone": ("self", "out"),
    "aten::_to_copy": ("self", "out"),
    "aten::copy": ("src", "out"),
    "aten::copy_": ("src", "out"),
    "aten::fill": ("value", "out"),
    "aten::full_like": ("fill_value", "out"),
    "aten::zeros_like": ("T(0)", "out"),
    "aten::ones_like": ("T(1)", "out"),
    "aten::fill_": ("value", "out"),
    "aten::zero_": ("T(0)", "out"),
    "aten::alias_copy": ("self", "out"),
    "aten::lift_fresh_copy": ("self", "out"),
}
OPS.update(_special.OPS)    # digamma, erfcx, Bessel, orthogonal polynomials, ...

_SQRT_2_PI = "T(0.7978845608028654)"
_GELU = {
    "none": "T(0.5) * self * (T(1) + math.erf(self * T(0.7071067811865476)))",
    "tanh": f"T(0.5) * self * (T(1) + math.tanh({_SQRT_2_PI} * (self + T(0.044715) * self * self "
            "* self)))",
}
_GELU_BW = {
    "none": "grad_output * (T(0.5) * (T(1) + math.erf(self * T(0.7071067811865476))) + self * "
            "T(0.3989422804014327) * math.exp(T(-0.5) * self * self))",
    "tanh": f"grad_output * (T(0.5) * (T(1) + math.tanh({_SQRT_2_PI} * (self + T(0.044715) * "
            f"self * self * self))) + T(0.5) * self * (T(1) - math.tanh({_SQRT_2_PI} * (self + "
            f"T(0.044715) * self * self * self)) ** 2) * {_SQRT_2_PI} * (T(1) + T(0.134145) * "
            "self * self))",
}
# float32: the erf torch's own CPU gelu uses (kernels/vmath.py _verf_as, half the cost of
# _verf) and x / (1 + exp(-2u)) for tanh (no tanh call); measured in tools/bench.py "gelu 4M"
_GELU_F32 = {
    "none": "T(0.5) * self * (T(1) + _verf_as(self * T(0.7071067811865476)))",
    "tanh": "_vgelu_tanh(self)",
}
_GELU_BW_F32 = {
    "none": _GELU_BW["none"].replace("math.erf(", "_verf_as("),
    "tanh": _GELU_BW["tanh"],
}


def _gelu(a: dict, table: dict) -> str:
    x = a["self"]
    if isinstance(x, torch.Tensor) and x.dtype == torch.float32:
        table = _GELU_F32 if table is _GELU else _GELU_BW_F32
    return table[a["approximate"]]


_DIV = {
    None: "self / other",
    "true": "self / other",
    "trunc": "_div_trunc(self, other, T(1))",
    "floor": "_div_floor(self, other, T(1))",
}


def _shift(a: dict, helper: str) -> str:
    # a shift by a negative amount or by the bit width or more is 0 (-1 for a negative value
    # shifted right), as in ATen's c10 left_shift/right_shift
    width = torch.empty(0, dtype=torch.result_type(a["self"], a["other"])).element_size() * 8
    return f"{helper}(self, other, T({width}))"


def _round(decimals: int) -> str:
    # torch: nearbyint(x * 10^d) / 10^d, or nearbyint(x / 10^-d) * 10^-d for d < 0
    if decimals == 0:
        return "np.rint(self)"
    p = f"T({float(10 ** abs(decimals))!r})"
    return f"np.rint(self * {p}) / {p}" if decimals > 0 else f"np.rint(self / {p}) * {p}"


def _is_integral(v) -> bool:
    if isinstance(v, torch.Tensor):
        return not (v.dtype.is_floating_point or v.dtype.is_complex)
    return isinstance(v, (bool, int))


# torch's CPU pow for a floating result special-cases these scalar exponents (PowKernel.cpp)
# (0.5 is sqrt_kernel, so pow(-inf, 0.5) is nan there, not C's inf)
_POW_SPECIAL = {0.5: "math.sqrt(self) if self >= 0 else T(math.nan)",
                -0.5: "T(1) / math.sqrt(self) if self >= 0 else T(math.nan)",
                -1.0: "T(1) / self", 2.0: "self * self", 3.0: "self * self * self",
                -2.0: "T(1) / (self * self)", 0.0: "T(1)", 1.0: "self"}


def _pow(a: dict) -> str:
    base, exp = a["self"], a["exponent"]
    integral = _is_integral(base) and _is_integral(exp)
    if not isinstance(exp, torch.Tensor):
        if integral and isinstance(base, torch.Tensor) and exp < 0:
            raise RuntimeError("Integers to negative integer powers are not allowed.")
        special = _POW_SPECIAL.get(float(exp)) if not integral or exp in (0, 1, 2, 3) else None
        if special is not None:
            return special
    return "_pow(self, exponent, T(1))"


def _clamp(a: dict, lo: str | None, hi: str | None) -> str:
    expr = "self"
    if lo is not None and a.get(lo) is None:
        lo = None
    if hi is not None and a.get(hi) is None:
        hi = None
    # NOTE: torch applies min first, then max: clamp(x, 3, 1) is 1 everywhere.
    if lo is not None:
        expr = f"({lo} if {expr} < {lo} else {expr})"
    if hi is not None:
        expr = f"({hi} if {expr} > {hi} else {expr})"
    nan_bound = " or ".join(f"{b} != {b}" for b in (lo, hi) if b is not None)
    fallback = f"T(math.nan) if ({nan_bound}) else " if nan_bound else ""
    return f"(self if self != self else ({fallback}{expr}))"


def _nan_to_num(a: dict) -> str:
    if not a["self"].dtype.is_floating_point:   # integers and bools have no nan/inf: a copy
        return "self"
    nan = "nan" if a.get("nan") is not None else "T(0)"
    pos = "posinf" if a.get("posinf") is not None else "_finfo_max(self)"
    neg = "neginf" if a.get("neginf") is not None else "-_finfo_max(self)"
    return (f"({nan} if self != self else ({pos} if self == math.inf else "
            f"({neg} if self == -math.inf else self)))")


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
'''

_HELPERS = ("_div_trunc", "_div_floor", "_rem", "_fmod", "_pow", "_shl", "_shr", "_gcd")
_HELPER_RE = re.compile(r"\b(" + "|".join(_HELPERS) + r")\(")
# the integer helpers that raise (division by zero): such a kernel can fail after some stores
_FAULTS_RE = re.compile(r"\b_(div_trunc|div_floor|rem|fmod)_i\(")
# special functions (lower/special.py, kernels/special.py): their source is added to a kernel
# only when its expression calls one
SPECIAL_PRELUDE = _special.PRELUDE
_SPECIAL_RE = _special.HELPER_RE
# the preludes are part of the kernels' source: their hash is part of every kernel's key
PRELUDE_ID = hashlib.sha1((PRELUDE + SPECIAL_PRELUDE + _vmath.VMATH_PRELUDE).encode()
                          ).hexdigest()[:10]
_FLOATS = frozenset({torch.float32, torch.float64})


# ---------------------------------------------------------------------------------------------
# template analysis, once per (op, template, argument types)
# ---------------------------------------------------------------------------------------------

class _Spec:
    """What a call's argument types fix: operands, the rendered expression, casts, the store."""

    __slots__ = ("tensors", "scalars", "expr", "loads", "scalar_casts", "store", "T", "flops",
                 "engine", "special", "faults")

    def __init__(self, tensors, scalars, expr, loads, scalar_casts, store, T, flops, engine,
                 special=False):
        self.tensors = tensors            # schema names loaded from arrays, in order x0, x1, ..
        self.scalars = scalars            # schema names passed as kernel scalars c0, c1, ..
        self.expr = expr
        self.loads = loads                # per tensor: numpy cast applied on load
        self.scalar_casts = scalar_casts  # per scalar
        self.store = store
        self.T = T
        self.flops = flops
        self.engine = engine
        self.special = special            # calls a special-function helper (SPECIAL_PRELUDE)
        self.faults = bool(_FAULTS_RE.search(expr))   # may raise inside the kernel


_NAMES: dict = {}   # (id(overload), template) -> the names the template uses, schema order
_SPECS: dict = {}   # (id(overload), op, template, out dtype, per-name type, as-scalar) -> _Spec


def _template_names(template: str, arg_names: tuple) -> tuple:
    key = (template, arg_names)
    names = _NAMES.get(key)
    if names is None:
        # NOTE: a name after '.' is an attribute (math.exp), never an argument
        names = tuple(nm for nm in arg_names
                      if re.search(r"(?<![\w.])%s\b" % re.escape(nm), template))
        _NAMES[key] = names
    return names


def _render_expr(template: str, subst: dict) -> str:
    if not subst:
        return template
    pattern = re.compile(r"(?<![\w.])(" + "|".join(map(re.escape, subst)) + r")\b")
    return pattern.sub(lambda m: subst[m.group(1)], template)


def _np(t: torch.Tensor):
    return t.numpy(force=True)


def _type_of(v):
    return v.dtype if isinstance(v, torch.Tensor) else type(v)


# Integer-only ops: the CPU refuses other dtypes by name ("bitwise_and_cpu" not implemented for
# 'Float'); decided here, before a compile (a float `&` used to fail inside Numba's typing).
# op -> (the CPU kernel's name, bool allowed)
_INT_ONLY = {"aten::bitwise_and": ("bitwise_and_cpu", True),
             "aten::bitwise_or": ("bitwise_or_cpu", True),
             "aten::bitwise_xor": ("bitwise_xor_cpu", True),
             "aten::bitwise_left_shift": ("lshift_cpu", False),
             "aten::bitwise_right_shift": ("rshift_cpu", False),
             "aten::gcd": ("gcd_cpu", False), "aten::lcm": ("lcm_cpu", False)}


def _check_int_only(op_name: str, dtype) -> None:
    kernel, bool_ok = _INT_ONLY[op_name]
    if dtype.is_floating_point or dtype.is_complex or (dtype == torch.bool and not bool_ok):
        raise errors.NotImplementedForDtype(kernel, dtype)


def _build_spec(op_name: str, template: str, rule: str, arg_casts: dict, a: dict, names: tuple,
                as_scalar: tuple, out_dtype) -> _Spec:
    if op_name in _INT_ONLY:
        _check_int_only(op_name, out_dtype)
    bad = [v.dtype for v in (*(a[nm] for nm in names), torch.empty(0, dtype=out_dtype))
           if isinstance(v, torch.Tensor) and v.dtype not in NP_TYPE]
    if bad:
        raise NotImplementedError(f"no elementwise kernel for {bad[0]}")
    # 1. compute type, from the original operands (a (1,)-shaped tensor still promotes fully)
    if rule == "out":
        ctype = out_dtype
    elif rule == "out_float":
        self_t = a["self"].dtype
        ctype = self_t if self_t.is_floating_point else torch.float32
    elif rule == "common":
        vals = [a[nm] for nm in names]
        ctype = torch.result_type(*vals) if len(vals) == 2 else vals[0].dtype
    elif rule == "bool":
        ctype = torch.bool
    else:
        ctype = None
    T = NP_TYPE[ctype] if ctype is not None else ""
    # 2. operands: tensors are loaded from arrays, scalars (and one-element tensors) are not
    tensors = tuple(nm for i, nm in enumerate(names)
                    if isinstance(a[nm], torch.Tensor) and not as_scalar[i])
    scalars = tuple(nm for nm in names if nm not in tensors)
    loads = tuple("np.bool_" if arg_casts.get(nm) == "bool" else T for nm in tensors)
    scalar_casts = []
    for nm in names:
        if nm in tensors:
            continue
        v = a[nm]
        if arg_casts.get(nm) == "bool":
            scalar_casts.append("np.bool_")
        elif T:
            scalar_casts.append(T)
        elif isinstance(v, torch.Tensor):
            scalar_casts.append(NP_TYPE[v.dtype])
        else:
            scalar_casts.append(_py_cast(v))
    # 3. the expression: names -> x_i / c_j, T(..) -> the compute type, helpers by kind
    subst = {nm: f"x{i}" for i, nm in enumerate(tensors)}
    subst.update({nm: f"c{j}" for j, nm in enumerate(scalars)})
    expr = _render_expr(template, subst)
    kind = "_f" if ctype in _FLOATS else "_i"
    expr = _HELPER_RE.sub(lambda m: f"{m.group(1)}{kind}(", expr)
    special = bool(_SPECIAL_RE.search(expr))
    if special:
        if ctype not in _FLOATS:
            raise NotImplementedError(f"{op_name}: special functions compute in float32/64")
        expr = _SPECIAL_RE.sub(lambda m: f"{m.group(1)}_{T.split('.')[1]}(", expr)
    expr = re.sub(r"(?<![\w.])T\(", f"{T or 'np.float64'}(", expr)
    engine = "scalar" if "math." in expr else "vector"
    if T == "np.float32":
        # no SVML in PyPI llvmlite: libm calls never vectorize; these polynomials do (1-2 ulp)
        expr = _vmath.vectorize_math(expr)
    store = "({}) != 0" if out_dtype == torch.bool else f"{NP_TYPE[out_dtype]}({{}})"
    return _Spec(tensors, scalars, expr, loads, tuple(scalar_casts), store, T,
                 max(1, expr.count("(")), engine, special)


def _spec_for(func, a: dict, n: int, out_dtype, op_name: str, armed: bool):
    """The call's _Spec (cached per argument types) and the numpy views of its tensor operands."""
    entry = OPS[op_name]
    template, rule = entry[0], entry[1]
    if callable(template):
        template = template(a)
    # id(func), not func: OpOverload.__hash__ is Python code
    names = _NAMES.get((id(func), template))
    if names is None:
        names = _NAMES[(id(func), template)] = _template_names(template, tuple(a))
    # A one-element tensor operand of a larger output is read once, as a kernel scalar, so
    # `x * t` (t of one element) shares the kernel of `x * 2.0`. Not while adaptive eager
    # records: the element may be the pending output of a recorded op.
    one_ok = n != 1 and rule not in ("none", "common") and not armed
    types, as_scalar, nps = [], [], {}
    for nm in names:
        v = a[nm]
        if isinstance(v, torch.Tensor):
            arr = nps[nm] = v.numpy(force=True)
            types.append(arr.dtype)
            as_scalar.append(one_ok and arr.size == 1)
        else:
            types.append(type(v))
            as_scalar.append(False)
    key = (id(func), op_name, template, out_dtype, tuple(types), tuple(as_scalar))
    spec = _SPECS.get(key)
    if spec is None:
        spec = _SPECS[key] = _build_spec(op_name, template, rule, entry[2] if len(entry) > 2
                                         else {}, a, names, tuple(as_scalar), out_dtype)
    return spec, nps


def lower_elementwise(func, a: dict, outs: list, op_name: str, defer: bool = False):
    """Run (or record) one elementwise op. defer=True returns the launch instead, as
    launch()'s positional arguments (dispatch launches it: one call less on the hot path);
    None when there is nothing left to launch (empty, or recorded by adaptive eager)."""
    # NOTE: the per-call work reads numpy attributes (shape, size, flags): much cheaper than
    # torch's Python bindings. numpy(force=True): under NeuronMode an operand may be a CPU
    # tensor that requires grad; force only detaches here (a CPU buffer, never conj/neg).
    out = outs[0]
    out_np = out.numpy(force=True)
    n = out_np.size
    if n == 0:
        return
    # 1. the spec, per argument types
    ctx = getattr(_ctx_tls, "ctx", None)
    armed = ctx is not None and ctx.recording
    spec, nps = _spec_for(func, a, n, out.dtype, op_name, armed)
    tensors = spec.tensors
    # 2. operand kinds: flat (same shape, contiguous), one (single element), nd (broadcast)
    shape = out_np.shape
    out_contig = out_np.flags.c_contiguous
    kinds = []
    flat = out_contig
    in_bytes = 0
    for nm in tensors:
        arr = nps[nm]
        in_bytes += arr.nbytes
        if arr.size == 1 and n != 1:
            kinds.append("one")
        elif out_contig and arr.shape == shape and arr.flags.c_contiguous:
            kinds.append("flat")
        else:
            kinds.append("nd")
            flat = False
    if flat:
        rank = 1
        arrays = [out_np.reshape(-1)] + [nps[nm].reshape(-1) for nm in tensors]
    else:
        kinds = ["one" if k == "one" else "nd" for k in kinds]
        shape = out.shape
        expanded = [a[nm].expand(shape) if kinds[i] == "nd" else None
                    for i, nm in enumerate(tensors)]
        strides = [out.stride()] + [e.stride() for e in expanded if e is not None]
        cshape, cstrides = coalesce(tuple(shape), strides)
        rank = len(cshape)
        arrays = [_np(out.as_strided(cshape, cstrides[0], out.storage_offset()))]
        j = 1
        for i, nm in enumerate(tensors):
            if kinds[i] == "nd":
                e = expanded[i]
                arrays.append(_np(e.as_strided(cshape, cstrides[j], e.storage_offset())))
                j += 1
            else:
                arrays.append(nps[nm].reshape(-1))
    kinds = tuple(kinds)
    # 3. scalars: runtime arguments (a new alpha never recompiles), cast inside the kernel
    scalar_vals = []
    for nm in spec.scalars:
        v = a[nm]
        if isinstance(v, torch.Tensor):
            v = nps[nm].reshape(-1)[0].item()
        elif isinstance(v, bool) or v is None:
            v = bool(v)
        scalar_vals.append(v)
    expr, loads, scalar_casts, store = spec.expr, spec.loads, spec.scalar_casts, spec.store
    parallel = n >= PARALLEL_MIN and kc.parallel_allowed()
    if armed:
        if spec.faults:
            # an op that can raise mid-kernel (integer division by zero) is never recorded:
            # what is pending launches first, then this op alone, so its error comes from its
            # own line with nothing half-written (see docs/ARCHITECTURE.md, adaptive eager)
            _adaptive.flush("op that can fault")
        elif rank == 1 and not spec.special:
            # adaptive eager: append to the pending fused group instead of launching
            operands = [(arrays[1 + i], a[nm]) for i, nm in enumerate(tensors)]
            if _adaptive.record(op_name, expr, kinds, loads, scalar_casts, store,
                                (arrays[0], out), operands, tuple(scalar_vals), n,
                                blocks=ctx.blocks, core=ctx.core):
                return
        else:
            _adaptive.flush("special function" if spec.special else
                            "strided or broadcast operand")

    special = spec.special

    def render():
        src, name = kew.render(expr, kinds, rank, loads, scalar_casts, store, parallel)
        vm = _vmath.VMATH_PRELUDE if _vmath.needs_vmath(expr) else ""
        return vm + PRELUDE + (SPECIAL_PRELUDE if special else "") + src, name

    req = (("elementwise", op_name, expr, kinds, rank, loads, scalar_casts, store, parallel,
            PRELUDE_ID), render, (*arrays, *scalar_vals), n * spec.flops,
           out_np.nbytes + in_bytes, spec.engine)
    if defer:
        return req
    launch(*req)


def fast_facts(func, a: dict, outs: list, op_name: str):
    """For eager_neuron.fastpath, after a plain-eager call was prepared: (tensor operand names
    in kernel order, kernel scalar names, scalar values change the kernel) or None when a
    repeat must come back here (an op that can fault inside the kernel)."""
    out = outs[0]
    spec, _ = _spec_for(func, a, out.numel(), out.dtype, op_name, False)
    if spec.faults:
        return None
    return spec.tensors, spec.scalars, op_name in _VALUE_KEYED


# ops whose kernel depends on a number's value (pow's special exponents, round's decimals);
# every other template reads only argument types and None-ness
_VALUE_KEYED = frozenset({"aten::pow", "aten::round"})


def _py_cast(v) -> str:
    if isinstance(v, bool) or v is None:
        return "np.bool_"
    if isinstance(v, int):
        return "np.int64"
    return "np.float64"


def _make(op_name: str):
    # NOTE: a functools.partial, not a closure: no Python frame between dispatch and
    # lower_elementwise (the hot path)
    lower = functools.partial(lower_elementwise, op_name=op_name)
    lower.__name__ = f"lower_{op_name.split('::')[1]}"
    lower.prepare = functools.partial(lower_elementwise, op_name=op_name, defer=True)
    lower.fast_facts = functools.partial(fast_facts, op_name=op_name)
    return lower


LOWERINGS = {name: _make(name) for name in OPS}

LOWERINGS.update(_cells.LOWERINGS)   # LSTM/GRU cells, frexp (several outputs)
