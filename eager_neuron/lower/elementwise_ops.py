"""The elementwise op table: each aten op as an expression template over its schema argument
names (`T(..)` is the compute type), its compute rule and argument casts, and the helpers that
choose a template from the call's arguments (gelu's approximation, pow's special exponents,
clamp's bounds, ...). lower/elementwise.py renders and launches them; the integer/float njit
helpers the templates call (`_div_floor`, `_pow`, ...) are kernels/elementwise_prelude.py.

>>> OPS["aten::sqrt"]
('math.sqrt(self) if self >= 0 else T(math.nan)', 'out')
>>> _pow({"self": 2.0, "exponent": 0.5})
'math.sqrt(self) if self >= 0 else T(math.nan)'
"""

from __future__ import annotations

import torch

from . import special as _special

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
    # (an integer's round is itself: through np.rint an int64 beyond 2**53 lost its low bits)
    "aten::round": (lambda a: "self" if _is_integral(a["self"]) else
                    _round(a.get("decimals") or 0), "out"),
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
    # ATen's dropout backward: grad * mask * scale, left to right (0 * inf is NaN, as there)
    "aten::native_dropout_backward": ("grad_output * T(mask) * scale", "out", {"mask": "bool"}),
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
    # the CPU's boundaries: 0 from x <= -3, grad_output from x >= 3 (bf16/fp16 inputs hit them)
    "aten::hardswish_backward": ("T(0) if self <= -3 else (grad_output if self >= 3 else "
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
    # ATen's logaddexp kernels: equal infinities pass through, else max + log1p(exp(-|a - b|))
    # (max propagating NaN); lower/elementwise.py refuses integer operands as the CPU does
    "aten::logaddexp": ("self if (self == other and abs(self) == math.inf) else "
                        "(self if self != self else (other if other != other else "
                        "(self if self > other else other))) + "
                        "math.log1p(math.exp(-abs(self - other)))", "out"),
    "aten::logaddexp2": ("self if (self == other and abs(self) == math.inf) else "
                         "(self if self != self else (other if other != other else "
                         "(self if self > other else other))) + "
                         "math.log1p(math.pow(T(2), -abs(self - other))) * "
                         "T(1.4426950408889634)", "out"),
    # self == 0 takes the values, else (self > 0); NaN gives 0, as the CPU's kernel
    "aten::heaviside": ("values if self == 0 else T(self > 0)", "out"),
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
# float32: gelu fused into one fma-spelled helper (kernels/vmath.py _vgelu_as: 2 ulp for x >= 0,
# 4x faster than x (1 + _verf_as)), the backward with the erf torch's own CPU gelu uses
# (_verf_as), and x / (1 + exp(-2u)) for tanh (no tanh call); measured in tools/bench.py
_GELU_F32 = {
    "none": "_vgelu_as(self)",
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
        if integral and isinstance(base, torch.Tensor) and exp >= 2 ** 63:
            # ATen reads an integer pow's Scalar exponent as int64, with c10's range check
            raise RuntimeError("value cannot be converted to type int64_t without overflow")
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
