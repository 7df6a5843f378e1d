"""Complex elementwise kernels: an op is an expression over its schema argument names
(kernels/complex.py evaluates it in complex128/float64 and rounds once at the store, so
complex64 results are within one rounding of PyTorch's).

    1. operands: tensors -> strided views broadcast to the output (conj/neg bits become load
       kinds), numbers -> kernel scalars; bfloat16/float16 operands go through float32
    2. one loop nest over the coalesced shape -> launch

The other complex modules (complex_parts, complex_reduce, complex_matmul) build on
`elementwise`; lower/complex.py routes each call.

>>> import torch, eager_neuron
>>> z = torch.tensor([1 + 2j, 3 - 1j], device="neuron")
>>> (z * z.conj()).real.tolist()
[5.0, 10.0]
"""

from __future__ import annotations

import re

import torch

from .. import errors
from ..kernels import compile as kc
from ..kernels import complex as kcx
from ..launch import launch
from .cast import RUN
from .common import COMPLEX, HALF, NP_TYPE, coalesce, strided_np

PARALLEL_MIN = 1 << 18   # below this a prange launch costs more than it saves

# base op name -> expression over schema argument names (tensors and Scalars alike).
# The value is complex128 for complex operands, float64 for real ones, bool for bool ones.
OPS: dict = {
    "aten::add": "self + alpha * other",
    "aten::sub": "self - alpha * other",
    "aten::rsub": "other - alpha * self",
    "aten::mul": "self * other",
    "aten::div": "_cdiv(self, other)",
    "aten::neg": "-self",
    "aten::conj_physical": "np.conj(self)",
    "aten::_conj_physical": "np.conj(self)",
    "aten::resolve_conj": "self",
    "aten::resolve_neg": "self",
    "aten::exp": "cmath.exp(self)",
    "aten::log": "cmath.log(self)",
    "aten::sqrt": "cmath.sqrt(self)",
    "aten::sin": "cmath.sin(self)",
    "aten::cos": "cmath.cos(self)",
    "aten::tanh": "cmath.tanh(self)",
    "aten::reciprocal": "_cdiv(1.0, self)",
    "aten::square": "self * self",
    "aten::sgn": "(0j if self == 0 else self / abs(self))",
    # inverse and hyperbolic functions: C99's complex branch cuts (cmath), as std::complex
    "aten::acos": "cmath.acos(self)",
    "aten::acosh": "cmath.acosh(self)",
    "aten::asin": "cmath.asin(self)",
    "aten::asinh": "cmath.asinh(self)",
    "aten::atan": "cmath.atan(self)",
    "aten::atanh": "cmath.atanh(self)",
    "aten::sinh": "cmath.sinh(self)",
    "aten::cosh": "cmath.cosh(self)",
    "aten::tan": "cmath.tan(self)",
    "aten::log10": "cmath.log10(self)",
    "aten::log2": "cmath.log(self) / math.log(2.0)",
    "aten::log1p": "cmath.log(1.0 + self)",
    "aten::expm1": "cmath.exp(self) - 1.0",
    "aten::exp2": "cmath.exp(self * math.log(2.0))",
    "aten::rsqrt": "_cdiv(1.0, cmath.sqrt(self))",
    "aten::sigmoid": "_cdiv(1.0, 1.0 + cmath.exp(-self))",
    "aten::addcmul": "self + value * tensor1 * tensor2",
    "aten::addcdiv": "self + value * _cdiv(tensor1, tensor2)",
    "aten::logical_not": "self == 0",
    "aten::logical_and": "(self != 0) and (other != 0)",
    "aten::logical_or": "(self != 0) or (other != 0)",
    "aten::logical_xor": "(self != 0) != (other != 0)",
    "aten::isreal": "self.imag == 0",
    "aten::pow": "(1 + 0j) if exponent == 0 else self ** exponent",
    "aten::silu": "self * _cdiv(1.0, 1.0 + cmath.exp(-self))",
    # the CPU's two-sided form (exact at weight 0 and 1), chosen by |weight|
    "aten::lerp": "(self + weight * (end - self)) if abs(weight) < 0.5 else "
                  "(end - (end - self) * (1.0 - weight))",
    "aten::abs": "abs(self)",
    "aten::angle": "math.atan2(self.imag, self.real)",
    "aten::isnan": "self != self",
    "aten::isinf": "cmath.isinf(self)",
    "aten::isfinite": "cmath.isfinite(self)",
    "aten::eq": "self == other",
    "aten::ne": "self != other",
    "aten::where": "self if condition else other",
    "aten::complex": "complex(real, imag)",
    "aten::polar": "complex(abs * math.cos(angle), abs * math.sin(angle))",
    "aten::fill": "value",
    "aten::zero": "0j",
    "aten::zeros_like": "0j",
    "aten::ones_like": "1 + 0j",
    "aten::full_like": "fill_value",
    # copies and casts: the store decides (complex -> real keeps the real part, as torch does)
    "aten::_to_copy": "self",
    "aten::clone": "self",
    "aten::copy": "src",
    "aten::copy_": "src",
    "aten::lift_fresh_copy": "self",
    "aten::alias_copy": "self",
}
# the expression's value is real (or bool) even for complex operands
_REAL_OUT = {"aten::abs", "aten::angle", "aten::isnan", "aten::isinf", "aten::isfinite",
             "aten::eq", "aten::ne", "aten::logical_not", "aten::logical_and",
             "aten::logical_or", "aten::logical_xor", "aten::isreal"}
# ... and complex even for real operands
_COMPLEX_OUT = {"aten::complex", "aten::polar", "aten::zero", "aten::zeros_like",
                "aten::ones_like"}
COPIES = {"aten::_to_copy", "aten::clone", "aten::copy", "aten::copy_", "aten::lift_fresh_copy",
          "aten::alias_copy"}
_NOT_OPERANDS = {"dim", "keepdim", "dtype", "layout", "device", "pin_memory", "memory_format",
                 "non_blocking", "rounding_mode", "out", "generator"}


def dtypes(a: dict, outs: list) -> list:
    seen = []
    for v in list(a.values()) + list(outs):
        if isinstance(v, torch.Tensor) and str(v.dtype) not in seen:
            seen.append(str(v.dtype))
    return seen


def load_kind(t: torch.Tensor):
    """(load kind, tensor whose memory holds the raw values) for an operand; a generator of
    the launches that stage it (a half operand's float32 copy), returning that pair."""
    if t.dtype in COMPLEX:
        kind = "c"
        if t.is_conj():
            t, kind = t.conj(), "cc"     # .conj() of a conj-bit tensor is its raw memory
        if t.is_neg():
            t, kind = t._neg_view(), kind + "n" if kind == "cc" else "cn"
        return kind, t
    if t.dtype in HALF:
        from .cast import _f32_buf, cast_steps

        buf = _f32_buf(t)
        yield from cast_steps(t, buf)
        t = buf
    return ("b" if t.dtype == torch.bool else "r"), t


def store_type(out: torch.Tensor) -> str:
    if out.dtype in COMPLEX:
        return "np.complex64" if out.dtype == torch.complex64 else "np.complex128"
    return NP_TYPE[out.dtype]


def elementwise(base: str, a: dict, out: torch.Tensor) -> None:
    """out[...] = OPS[base] over a's operands broadcast to out's shape."""
    for req in elementwise_steps(base, a, out):   # only launch requests (no RUN steps)
        launch(*req)


def elementwise_steps(base: str, a: dict, out: torch.Tensor):
    """elementwise's launches as steps (launch()'s positional arguments, each built when the
    one before has run): a half operand's float32 copy, then the complex kernel. A composite
    launches them itself (`for req in elementwise_steps(...): launch(*req)`)."""
    expr = OPS[base]
    names = [n for n in a if n not in _NOT_OPERANDS and re.search(rf"\b{n}\b", expr)]
    loads, views, scalars = [], [], []
    for n in names:
        v = a[n]
        if isinstance(v, torch.Tensor) and (v.dim() > 0 or out.dim() == 0 or v.numel() != 1):
            kind, raw = yield from load_kind(v)
            loads.append(kind)
            views.append(raw.expand(out.shape))
            expr = re.sub(rf"\b{n}\b", f"v{len(loads) - 1}", expr)
        else:
            if isinstance(v, torch.Tensor):   # a 0-dim operand of a larger output
                v = v.item() if not v.is_conj() else v.resolve_conj().item()
            if v is None:
                v = 1   # alpha default
            scalars.append(v if isinstance(v, (bool, complex)) else float(v))
            expr = re.sub(rf"\b{n}\b", f"c{len(scalars) - 1}", expr)
    value_complex = base not in _REAL_OUT and (
        any(k.startswith("c") for k in loads) or any(isinstance(c, complex) for c in scalars)
        or base in _COMPLEX_OUT)
    store = store_type(out)
    if value_complex and out.dtype not in COMPLEX:
        if base in COPIES:
            errors.warn("Casting complex values to real discards the imaginary part", once=True)
        # torch's complex -> real cast keeps the real part; -> bool tests for nonzero
        expr = f"({expr}) != 0" if out.dtype == torch.bool else f"({expr}).real"
    if out.numel() == 0:
        return
    if out.is_conj():   # writing through a conj view (x.conj().mul_(2)): store the raw values
        out, expr = out.conj(), f"np.conj({expr})"
    if out.is_neg():
        out, expr = out._neg_view(), f"-({expr})"
    shape, strides = coalesce(tuple(out.shape), [out.stride()] + [t.stride() for t in views])
    rank = len(shape)
    o = strided_np(out, shape, strides[0])
    xs = tuple(strided_np(t, shape, s) for t, s in zip(views, strides[1:]))
    parallel = out.numel() >= PARALLEL_MIN and kc.parallel_allowed()
    key = ("complex", expr, tuple(loads), len(scalars), rank, store, parallel)

    def render():
        return kcx.render_map(expr, tuple(loads), len(scalars), rank, store, parallel)

    yield (key, render, (o,) + xs + tuple(scalars), float(out.numel() * 6),
           float(out.numel() * out.element_size()
                 + sum(t.numel() * t.element_size() for t in views)))


def real_steps(lower, func, a: dict, outs: list):
    """A real family's lowering as a step: its launch request when the family builds one (the
    elementwise lowerings' `prepare`), else a RUN step."""
    prepare = getattr(lower, "prepare", None)
    if prepare is None:
        yield (RUN, lower, func, a, outs)
        return
    req = prepare(func, a, outs)
    if req is not None:
        yield req


def is_complex(t) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype in COMPLEX and t.dtype != torch.complex32
