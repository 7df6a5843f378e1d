"""Elementwise lowerings: unary, binary, ternary ops with broadcasting and type promotion.

Each op is an expression over its schema argument names; `T(..)` is the compute type. Tensor
arguments become loaded operands, Scalar arguments become kernel scalars, so `add.Tensor` and
`add.Scalar` share one template and a new alpha value does not recompile.
"""

from __future__ import annotations

import re

import torch

from ..kernels import compile as kc
from ..kernels import elementwise as kew
from ..launch import launch
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
    "aten::floor": ("np.floor(self)", "out"),
    "aten::ceil": ("np.ceil(self)", "out"),
    "aten::trunc": ("np.trunc(self)", "out"),
    "aten::frac": ("self - np.trunc(self)", "out"),
    "aten::round": ("np.rint(self)", "out"),
    "aten::sign": ("T(self > 0) - T(self < 0)", "out"),
    "aten::sgn": ("T(self > 0) - T(self < 0)", "out"),
    "aten::reciprocal": ("T(1) / self", "out"),
    "aten::square": ("self * self", "out"),
    "aten::bitwise_not": ("~self", "out"),
    "aten::logical_not": ("not self", "bool"),
    "aten::isnan": ("self != self", "none"),
    "aten::signbit": ("math.copysign(T(1), self) < 0", "out_float"),
    # -- activations ------------------------------------------------------------------------------
    "aten::relu": ("self if not (self <= 0) else T(0)", "out"),
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
    "aten::gelu": (lambda a: _GELU[a["approximate"]], "out"),
    "aten::logit": (lambda a: "math.log(self / (T(1) - self))" if a["eps"] is None else
                    "math.log(_c(self, eps) / (T(1) - _c(self, eps)))", "out"),
    # -- activation backward ---------------------------------------------------------------------
    "aten::threshold_backward": ("T(0) if self <= threshold else grad_output", "out"),
    "aten::sigmoid_backward": ("grad_output * (T(1) - output) * output", "out"),
    "aten::tanh_backward": ("grad_output * (T(1) - output * output)", "out"),
    "aten::silu_backward": ("grad_output * (T(1) / (T(1) + math.exp(-self))) * (T(1) + self * "
                            "(T(1) - T(1) / (T(1) + math.exp(-self))))", "out"),
    "aten::gelu_backward": (lambda a: _GELU_BW[a["approximate"]], "out"),
    "aten::leaky_relu_backward": ("grad_output if self > 0 else grad_output * negative_slope",
                                  "out"),
    "aten::hardtanh_backward": ("T(0) if (self <= min_val or self >= max_val) else grad_output",
                                "out"),
    "aten::softplus_backward": ("grad_output if self * beta > threshold else grad_output * "
                                "(T(1) - T(1) / (T(1) + math.exp(self * beta)))", "out"),
    "aten::hardsigmoid_backward": ("grad_output / T(6) if (self > -3 and self < 3) else T(0)",
                                   "out"),
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
    "aten::remainder": ("_rem(self, other)", "out"),
    "aten::fmod": ("_fmod(self, other)", "out"),
    "aten::pow": ("_pow(self, exponent)", "out"),
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
_DIV = {
    None: "self / other",
    "true": "self / other",
    "trunc": "_div_trunc(self, other)",
    "floor": "_div_floor(self, other)",
}


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
    nan = "nan" if a.get("nan") is not None else "T(0)"
    pos = "posinf" if a.get("posinf") is not None else "_finfo_max(self)"
    neg = "neginf" if a.get("neginf") is not None else "-_finfo_max(self)"
    return (f"({nan} if self != self else ({pos} if self == math.inf else "
            f"({neg} if self == -math.inf else self)))")


# Small njit helpers every elementwise kernel may call (defined in the kernel's namespace).
PRELUDE = '''
@njit(inline="always", error_model="numpy")
def _div_trunc(a, b):
    if isinstance(a, float) or isinstance(b, float):
        return np.trunc(a / b)
    q = a // b
    if q < 0 and q * b != a:
        q += 1
    return q

@njit(inline="always", error_model="numpy")
def _div_floor(a, b):
    if isinstance(a, float) or isinstance(b, float):
        if b == 0:
            return a / b
        m = math.fmod(a, b)
        d = (a - m) / b
        if m != 0 and ((b < 0) != (m < 0)):
            d -= 1
        f = np.floor(d)
        if d - f > 0.5:
            f += 1
        return f if d != 0 else math.copysign(0.0, a / b) * 1
    return a // b

@njit(inline="always", error_model="numpy")
def _rem(a, b):
    if isinstance(a, float) or isinstance(b, float):
        if b == 0:
            return a - a / b * 0 if False else math.nan
        m = math.fmod(a, b)
        if m != 0 and ((b < 0) != (m < 0)):
            m += b
        return m
    return a % b

@njit(inline="always", error_model="numpy")
def _fmod(a, b):
    if isinstance(a, float) or isinstance(b, float):
        return math.fmod(a, b) if b != 0 else math.nan
    r = a % b
    if r != 0 and ((r < 0) != (a < 0)):
        r -= b
    return r

@njit(inline="always", error_model="numpy")
def _pow(a, b):
    return a ** b

@njit(inline="always", error_model="numpy")
def _c(x, eps):
    return eps if x < eps else (1 - eps if x > 1 - eps else x)

@njit(inline="always")
def _finfo_max(x):
    return np.finfo(type(x)).max
'''

_NAME_RE: dict = {}


def _render_expr(template: str, names: list, subst: dict) -> str:
    key = tuple(names)
    pattern = _NAME_RE.get(key)
    if pattern is None:
        pattern = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b")
        _NAME_RE[key] = pattern
    return pattern.sub(lambda m: subst[m.group(1)], template)


def _is_tensor(v) -> bool:
    return isinstance(v, torch.Tensor)


def lower_elementwise(func, a: dict, outs: list, op_name: str) -> None:
    out = outs[0]
    n = out.numel()
    if n == 0:
        return
    entry = OPS[op_name]
    template, rule = entry[0], entry[1]
    arg_casts = entry[2] if len(entry) > 2 else {}
    if callable(template):
        template = template(a)
    # 1. operands named in the template, in schema order
    names = [name for name in a if re.search(r"\b%s\b" % name, template)] if template else []
    tensors = [nm for nm in names if _is_tensor(a[nm])]
    scalars = [nm for nm in names if not _is_tensor(a[nm])]
    # 2. compute type
    if rule == "out":
        ctype = out.dtype
    elif rule == "out_float":
        ctype = torch.promote_types(a["self"].dtype, torch.float32) \
            if not a["self"].is_floating_point() else a["self"].dtype
    elif rule == "common":
        vals = [a[nm] for nm in names]
        ctype = torch.result_type(*vals) if len(vals) == 2 else vals[0].dtype
    elif rule == "bool":
        ctype = torch.bool
    else:
        ctype = None
    T = NP_TYPE[ctype] if ctype is not None else ""

    def load_type(nm: str, dtype) -> str:
        cast = arg_casts.get(nm)
        if cast == "bool":
            return "np.bool_"
        return T if T else ""

    # 3. operand kinds: flat (same shape, contiguous), one (single element), nd (broadcast)
    shape = tuple(out.shape)
    out_contig = out.is_contiguous()
    kinds = []
    for nm in tensors:
        t = a[nm]
        if t.numel() == 1 and n != 1:
            kinds.append("one")
        elif out_contig and tuple(t.shape) == shape and t.is_contiguous():
            kinds.append("flat")
        else:
            kinds.append("nd")
    if "nd" not in kinds and out_contig:
        rank = 1
        arrays = [out.view(-1).numpy()] + [a[nm].reshape(-1).numpy() for nm in tensors]
    else:
        kinds = ["one" if k == "one" else "nd" for k in kinds]
        expanded = [a[nm].expand(shape) if kinds[i] == "nd" else None
                    for i, nm in enumerate(tensors)]
        strides = [out.stride()] + [e.stride() for e in expanded if e is not None]
        cshape, cstrides = coalesce(shape, strides)
        rank = len(cshape)
        arrays = [out.as_strided(cshape, cstrides[0], out.storage_offset()).numpy()]
        j = 1
        for i, nm in enumerate(tensors):
            if kinds[i] == "nd":
                e = expanded[i]
                arrays.append(e.as_strided(cshape, cstrides[j], e.storage_offset()).numpy())
                j += 1
            else:
                arrays.append(a[nm].reshape(-1).numpy())
    # 4. scalars: runtime arguments, cast to the compute type inside the kernel
    scalar_vals = []
    scalar_casts = []
    for nm in scalars:
        v = a[nm]
        if isinstance(v, bool) or v is None:
            v = bool(v)
        scalar_vals.append(v)
        cast = arg_casts.get(nm)
        scalar_casts.append("np.bool_" if cast == "bool" else (T or _py_cast(v)))
    subst = {nm: f"x{i}" for i, nm in enumerate(tensors)}
    subst.update({nm: f"c{j}" for j, nm in enumerate(scalars)})
    expr = _render_expr(template, names, subst) if names else template
    expr = expr.replace("T(", f"{T or 'np.float64'}(")
    store_t = NP_TYPE[out.dtype]
    store = "({}) != 0" if out.dtype == torch.bool else f"{store_t}({{}})"
    loads = tuple(load_type(nm, a[nm].dtype) for nm in tensors)
    parallel = n >= PARALLEL_MIN and kc.parallel_allowed()
    key = ("elementwise", op_name, expr, tuple(kinds), rank, loads, tuple(scalar_casts), store,
           parallel)

    def render():
        src, name = kew.render(expr, tuple(kinds), rank, loads, tuple(scalar_casts), store,
                               parallel)
        return PRELUDE + src, name

    itemsize = out.element_size()
    bytes_moved = n * itemsize + sum(
        (a[nm].numel() if kinds[i] != "one" else 1) * a[nm].element_size()
        for i, nm in enumerate(tensors))
    launch(key, render, tuple(arrays) + tuple(scalar_vals), flops=n * max(1, expr.count("(")),
           bytes_moved=bytes_moved, engine="scalar" if "math." in expr else "vector")


def _py_cast(v) -> str:
    if isinstance(v, bool):
        return "np.bool_"
    if isinstance(v, int):
        return "np.int64"
    return "np.float64"


def _make(op_name: str):
    def lower(func, a, outs):
        lower_elementwise(func, a, outs, op_name)
    lower.__name__ = f"lower_{op_name.split('::')[1]}"
    return lower


LOWERINGS = {name: _make(name) for name in OPS}
