"""Complex64/complex128 lowerings: every kernel call with a complex operand or output.

dispatch routes such calls here (`run_complex`) whatever family the op name maps to, unless that
lowering sets `handles_complex` (the FFT family does). An op is an expression over its schema
argument names (kernels/complex.py evaluates it in complex128/float64 and rounds once at the
store, so complex64 results are within one rounding of PyTorch's). Sums reduce the
`view_as_real` pairs with the reduce family; data-movement ops (SPLIT) run their own real kernel
on the real parts, then on the imaginary parts; matrix products are one complex loop kernel;
complex32 is storage only (casts). Any other complex op raises UnsupportedOpError.

    1. operands: tensors -> strided views broadcast to the output (conj/neg bits become load
       kinds), numbers -> kernel scalars; bfloat16/float16 operands go through float32
    2. one loop nest over the coalesced shape -> launch

>>> import torch, eager_neuron
>>> z = torch.tensor([1 + 2j, 3 - 1j], device="neuron")
>>> (z * z.conj()).real.tolist()
[5.0, 10.0]
"""

from __future__ import annotations

import re
import warnings

import torch

from .. import context as _context
from .. import errors
from ..adaptive import MODULE as _adaptive
from ..kernels import compile as kc
from ..kernels import complex as kcx
from ..launch import launch
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
_COPIES = {"aten::_to_copy", "aten::clone", "aten::copy", "aten::copy_", "aten::lift_fresh_copy",
           "aten::alias_copy"}
_NOT_OPERANDS = {"dim", "keepdim", "dtype", "layout", "device", "pin_memory", "memory_format",
                 "non_blocking", "rounding_mode", "out", "generator"}
_NAMES: dict = {}


def _base(plan_name: str) -> str:
    """'aten::add_.Tensor' -> 'aten::add'; '.out' and in-place forms share the functional op."""
    base = _NAMES.get(plan_name)
    if base is None:
        base = plan_name.split(".")[0]
        if base.endswith("_") and base not in OPS:
            base = base[:-1]
        _NAMES[plan_name] = base
    return base


def run_complex(func, plan, a: dict, outs: list) -> None:
    """An op with a complex operand or output (dispatch routes every such kernel call here)."""
    # NOTE: these launches are not recorded by adaptive eager: flush what is pending first
    ctx = _context.current()   # these launches run now: adaptive eager may not record them
    if ctx is not None:
        ctx.recording = False
    _adaptive.flush(f"complex op {plan.name}")
    base = _base(plan.name)
    if _has_chalf(a, outs):
        return _chalf(plan, base, a, outs)
    if base in ("aten::sum", "aten::mean"):
        return _sum(base, a, outs)
    if base in _MATMUL:
        return _matmul(base, a, outs[0])
    if base == "aten::addbmm":
        return _addbmm(a, outs[0])
    if base == "aten::put" and _is_complex(a.get("self")) and _is_complex(a.get("source")):
        return _put(a, outs[0])
    if base == "aten::linalg_vector_norm":
        # a norm depends on |z| only: the real lowering over abs(z)
        x = a["self"]
        mag = torch.empty(x.shape, dtype=outs[0].dtype)
        elementwise("aten::abs", {"self": x}, mag)
        return plan.lower(func, dict(a, self=mag), outs)
    if base in ("aten::any", "aten::all") and _is_complex(a.get("self")):
        # truthiness of z is z != 0: the real lowering over that mask
        x = a["self"]
        mask = torch.empty(x.shape, dtype=torch.bool)
        elementwise("aten::ne", {"self": x, "other": 0}, mask)
        return plan.lower(func, dict(a, self=mask), outs)
    if base in _VARIANCE and _is_complex(a.get("self")):
        return _variance(base, a, outs)
    if base in ("aten::prod", "aten::cumprod") and _is_complex(a.get("self")):
        return _prod(base, a, outs[0])
    if base not in OPS and base in SPLIT and _split(func, plan, a, outs):
        return
    if base not in OPS or (base == "aten::div" and a.get("rounding_mode") is not None):
        if _decomposes(func):
            # PyTorch's decomposition runs it as complex ops this family has (addr, cross,
            # logsumexp, ...): dispatch takes that route on NotImplementedError
            raise NotImplementedError(f"{plan.name}: complex operands, via the decomposition")
        raise errors.UnsupportedOpError(
            f"{plan.name} has no neuron kernel for complex tensors "
            f"({', '.join(_dtypes(a, outs))})\n{errors.where()}\n"
            "  fix: compute it on the CPU (x.cpu()), or on torch.view_as_real(x) pairs; "
            "complex kernels live in eager_neuron/lower/complex.py")
    out = outs[0]
    if out.dtype in HALF:
        from .cast import cast

        tmp = torch.empty(out.shape, dtype=torch.float32)
        elementwise(base, a, tmp)
        cast(tmp, out)
        return
    elementwise(base, a, out)


def _decomposes(func) -> bool:
    """Whether PyTorch has a decomposition for func (dispatch runs it when we decline)."""
    from ..decomps import decomposition

    try:
        return func is not None and decomposition(func) is not None
    except Exception:   # a name lookup the table does not know: no decomposition
        return False


# ops that act on the real and imaginary parts independently (data movement, sums): they run as
# the op's own real kernel twice, over the (strided) real parts and then the imaginary parts
SPLIT = frozenset({
    "aten::constant_pad_nd", "aten::cat", "aten::stack", "aten::index_select", "aten::flip",
    "aten::roll", "aten::repeat", "aten::slice_scatter", "aten::select_scatter",
    "aten::diagonal_scatter", "aten::gather", "aten::scatter",
    "aten::scatter_add", "aten::index", "aten::index_put", "aten::index_add", "aten::masked_fill",
    "aten::tril", "aten::triu", "aten::cumsum", "aten::narrow_copy", "aten::unfold_backward",
    "aten::reflection_pad1d", "aten::reflection_pad2d", "aten::replication_pad1d",
    "aten::col2im", "aten::im2col", "aten::embedding_dense_backward", "aten::_unsafe_index",
    "aten::_unsafe_index_put", "aten::expand_copy", "aten::permute_copy", "aten::view_copy",
    "aten::unfold_copy", "aten::new_zeros", "aten::zeros_like", "aten::trace",
    "aten::diag_embed", "aten::diagonal_copy", "aten::squeeze_copy", "aten::unsqueeze_copy",
    "aten::transpose_copy", "aten::t_copy", "aten::select_copy", "aten::slice_copy",
    "aten::index_copy", "aten::masked_scatter", "aten::take", "aten::put",
    # backward ops that sum gradients: linear, so real and imaginary parts separately
    "aten::replication_pad1d_backward", "aten::replication_pad2d_backward",
    "aten::replication_pad3d_backward", "aten::reflection_pad1d_backward",
    "aten::reflection_pad2d_backward", "aten::reflection_pad3d_backward",
    "aten::masked_scatter_backward", "aten::replication_pad3d", "aten::reflection_pad3d",
    "aten::replication_pad2d",
})
_SPLIT_SCALARS = ("value", "fill_value")   # Scalars that split into real and imaginary parts


def _part(v, i: int):
    """Part i (0 real, 1 imaginary) of a complex tensor as a strided real view; others kept."""
    if isinstance(v, torch.Tensor) and v.dtype in COMPLEX:
        return torch.view_as_real(v)[..., i]
    if isinstance(v, (list, tuple)) and v and isinstance(v[0], torch.Tensor):
        return type(v)(_part(t, i) for t in v)
    return v


def _split(func, plan, a: dict, outs: list) -> bool:
    """Run the op's real lowering on the real parts, then on the imaginary parts; False if
    the operands do not allow it (a real float operand, a complex alpha, a conj view)."""
    flat = [v for v in a.values() if isinstance(v, torch.Tensor)]
    flat += [t for v in a.values() if isinstance(v, (list, tuple)) for t in v
             if isinstance(t, torch.Tensor)]
    flat += [o for o in outs if isinstance(o, torch.Tensor)]
    if any((t.is_floating_point() and t.dtype not in COMPLEX) or t.is_conj() or t.is_neg()
           for t in flat) or not any(t.dtype in COMPLEX for t in flat):
        return False
    if isinstance(a.get("alpha"), complex):
        return False
    for i in (0, 1):
        part = {k: _part(v, i) for k, v in a.items()}
        for k in _SPLIT_SCALARS:
            if k in part and isinstance(part[k], (int, float, complex)) \
                    and not isinstance(part[k], bool):
                part[k] = complex(part[k]).real if i == 0 else complex(part[k]).imag
        part_outs = [_part(o, i) for o in outs]
        # written arguments (in-place, out=) must be the same objects in `a` and `outs`
        for j, target in enumerate(plan.ret_alias):
            if target is not None and j < len(part_outs):
                part_outs[j] = part[target]
        plan.lower(func, part, part_outs)
    return True


def _has_chalf(a: dict, outs: list) -> bool:
    return any(isinstance(v, torch.Tensor) and v.dtype == torch.complex32
               for v in list(a.values()) + list(outs))


def _chalf(plan, base: str, a: dict, outs: list) -> None:
    """complex32 is storage only: casts to and from it go through complex64 (its float16 pairs
    convert with the cast family's float16 path); any other op refuses it."""
    from .cast import cast

    if base == "aten::complex" and outs[0].dtype == torch.complex32:
        # torch.complex(half, half): the pairs themselves (float16 values, exactly)
        pair = torch.view_as_real(outs[0])
        cast(a["real"].expand(outs[0].shape), pair[..., 0])
        cast(a["imag"].expand(outs[0].shape), pair[..., 1])
        return
    name = "src" if base in ("aten::copy", "aten::copy_") else "self"
    src, out = a.get(name), outs[0]
    if base not in _COPIES or not isinstance(src, torch.Tensor) or src.is_conj() or \
            src.is_neg():
        raise errors.UnsupportedOpError(
            f"{plan.name} has no neuron kernel for complex32 tensors "
            f"({', '.join(_dtypes(a, outs))})\n{errors.where()}\n"
            "  fix: convert to complex64 first (x.to(torch.complex64)); complex32 is supported "
            "on neuron as storage only")
    if src.dtype == torch.complex32:
        up = torch.empty(src.shape, dtype=torch.complex64)
        cast(torch.view_as_real(src), torch.view_as_real(up))
        src = up
    if out.dtype != torch.complex32:
        elementwise(base, {name: src}, out)
        return
    tmp = torch.empty(out.shape, dtype=torch.complex64)
    elementwise(base, {name: src}, tmp)
    cast(torch.view_as_real(tmp), torch.view_as_real(out))


def _dtypes(a: dict, outs: list) -> list:
    seen = []
    for v in list(a.values()) + list(outs):
        if isinstance(v, torch.Tensor) and str(v.dtype) not in seen:
            seen.append(str(v.dtype))
    return seen


def _load_kind(t: torch.Tensor) -> tuple[str, torch.Tensor]:
    """(load kind, tensor whose memory holds the raw values) for an operand."""
    if t.dtype in COMPLEX:
        kind = "c"
        if t.is_conj():
            t, kind = t.conj(), "cc"     # .conj() of a conj-bit tensor is its raw memory
        if t.is_neg():
            t, kind = t._neg_view(), kind + "n" if kind == "cc" else "cn"
        return kind, t
    if t.dtype in HALF:
        from .cast import _f32

        t = _f32(t)
    return ("b" if t.dtype == torch.bool else "r"), t


def _store(out: torch.Tensor) -> str:
    if out.dtype in COMPLEX:
        return "np.complex64" if out.dtype == torch.complex64 else "np.complex128"
    return NP_TYPE[out.dtype]


def elementwise(base: str, a: dict, out: torch.Tensor) -> None:
    """out[...] = OPS[base] over a's operands broadcast to out's shape."""
    expr = OPS[base]
    names = [n for n in a if n not in _NOT_OPERANDS and re.search(rf"\b{n}\b", expr)]
    loads, views, scalars = [], [], []
    for n in names:
        v = a[n]
        if isinstance(v, torch.Tensor) and (v.dim() > 0 or out.dim() == 0 or v.numel() != 1):
            kind, raw = _load_kind(v)
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
    store = _store(out)
    if value_complex and out.dtype not in COMPLEX:
        if base in _COPIES:
            warnings.warn("Casting complex values to real discards the imaginary part",
                          UserWarning, stacklevel=2)
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

    launch(key, render, (o,) + xs + tuple(scalars), flops=float(out.numel() * 6),
           bytes_moved=float(out.numel() * out.element_size()
                             + sum(t.numel() * t.element_size() for t in views)))


def _sum(base: str, a: dict, outs: list) -> None:
    """sum/mean of a complex tensor: the reduce family over its (real, imag) pairs."""
    from .reduce import LOWERINGS as RED
    from .reduce import red_dims

    x, out = a["self"], outs[0]
    if x.dtype not in COMPLEX or out.dtype not in COMPLEX:
        raise errors.UnsupportedOpError(
            f"{base} of {x.dtype} into {out.dtype} has no neuron kernel\n{errors.where()}\n"
            "  fix: sum the complex tensor into a complex dtype")
    if x.dim() == 0:   # the sum (and mean) of one number is that number
        return elementwise("aten::_to_copy", {"self": x}, out)
    conj = x.is_conj()
    raw = x.conj() if conj else x
    if raw.is_neg():
        raise NotImplementedError("complex sum of a negative-bit view")
    if raw.dtype != out.dtype:
        tmp = torch.empty(raw.shape, dtype=out.dtype)
        elementwise("aten::_to_copy", {"self": raw}, tmp)
        raw = tmp
    dims = red_dims(x, a.get("dim"))
    func = torch.ops.aten.sum.dim_IntList if base == "aten::sum" else torch.ops.aten.mean.dim
    lower = RED.get(f"{base}.dim_IntList" if base == "aten::sum" else "aten::mean.dim")
    if lower is None:
        raise errors.UnsupportedOpError(f"{base}: no real reduction kernel to pair with")
    lower(func, {"self": torch.view_as_real(raw), "dim": dims, "keepdim": bool(a.get("keepdim")),
                 "dtype": None}, [torch.view_as_real(out)])
    if conj:
        elementwise("aten::conj_physical", {"self": out}, out)


def _is_complex(t) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype in COMPLEX and t.dtype != torch.complex32


_VARIANCE = frozenset({"aten::var", "aten::std", "aten::var_mean", "aten::std_mean"})


def _variance(base: str, a: dict, outs: list) -> None:
    """var/std(_mean) of a complex tensor: var(z) = var(re z) + var(im z) (the real lowering on
    each part; a conj or neg view changes signs only, not variances); std is its square root;
    the mean is the complex mean."""
    from .elementwise import LOWERINGS as EW
    from .reduce import LOWERINGS as RED

    x = a["self"]
    raw = x.conj() if x.is_conj() else x
    if raw.is_neg():
        raise NotImplementedError(f"complex {base} of a negative-bit view")
    pair = torch.view_as_real(raw)
    var_lower = RED.get("aten::var.correction")
    if var_lower is None:
        raise errors.UnsupportedOpError(f"{base}: no real variance kernel to pair with")
    out = outs[0]
    parts = []
    for i in (0, 1):
        tmp = torch.empty(out.shape, dtype=out.dtype)
        var_lower(torch.ops.aten.var.correction,
                  {"self": pair[..., i], "dim": a.get("dim"), "correction": a.get("correction"),
                   "keepdim": bool(a.get("keepdim"))}, [tmp])
        parts.append(tmp)
    add = EW["aten::add"]
    if base.startswith("aten::std"):
        total = torch.empty(out.shape, dtype=out.dtype)
        add(torch.ops.aten.add.Tensor, {"self": parts[0], "other": parts[1], "alpha": 1}, [total])
        EW["aten::sqrt"](torch.ops.aten.sqrt.default, {"self": total}, [out])
    else:
        add(torch.ops.aten.add.Tensor, {"self": parts[0], "other": parts[1], "alpha": 1}, [out])
    if base.endswith("_mean"):
        _sum("aten::mean", {"self": x, "dim": a.get("dim"), "keepdim": a.get("keepdim")},
             [outs[1]])


def _prod(base: str, a: dict, out: torch.Tensor) -> None:
    """prod / cumprod of a complex tensor along one dim (or all of it), in complex128."""
    x = a["self"]
    dim = a.get("dim")
    if out.numel() == 0:
        return
    if x.dim() == 0:
        return elementwise("aten::_to_copy", {"self": x}, out)
    if dim is None:   # prod of everything
        x, d = x.reshape(-1), 0
    else:
        d = dim % x.dim()
    moved = x.movedim(d, -1)
    rows = torch.empty(moved.shape, dtype=torch.complex128)
    elementwise("aten::_to_copy", {"self": moved}, rows)
    n = rows.shape[-1] if rows.dim() else 1
    x2 = rows.reshape(-1, n)
    if base == "aten::prod":
        res = torch.empty(x2.shape[0], dtype=torch.complex128)
        view = res.reshape(moved.shape[:-1])
        if a.get("keepdim") and dim is not None:
            view = view.unsqueeze(d)
    else:
        res = torch.empty(x2.shape, dtype=torch.complex128)
        view = res.reshape(moved.shape).movedim(-1, d)
    launch(("cscan", base, 1), lambda: kcx.render_scan(base.split("::")[1]),
           (x2.numpy(), res.numpy()), flops=float(6 * x2.numel()),
           bytes_moved=float(32 * x2.numel()))
    elementwise("aten::_to_copy", {"self": view.reshape(out.shape)}, out)


# products: base op -> (left, right, added tensor or None); all become (B, M, K) @ (B, K, N)
_MATMUL = {
    "aten::mm": ("self", "mat2", None), "aten::bmm": ("self", "mat2", None),
    "aten::addmm": ("mat1", "mat2", "self"), "aten::baddbmm": ("batch1", "batch2", "self"),
    "aten::mv": ("self", "vec", None), "aten::addmv": ("mat", "vec", "self"),
    "aten::dot": ("self", "tensor", None), "aten::vdot": ("self", "other", None),
}


def _as3(t: torch.Tensor, role: str) -> torch.Tensor:
    """A 1-/2-/3-d operand as a (B, rows, cols) view: vectors are rows on the left, columns on
    the right."""
    if t.dim() == 3:
        return t
    if t.dim() == 2:
        return t.unsqueeze(0)
    return t.view(1, 1, -1) if role == "left" else t.view(1, -1, 1)


def _matmul(base: str, a: dict, out: torch.Tensor) -> None:
    """Complex matrix products, one loop kernel (no complex GEMM engine on the device)."""
    left, right, added = _MATMUL[base]
    x, y = a[left], a[right]
    if base == "aten::vdot":
        x = x.conj()
    if out.dtype not in COMPLEX or any(t.dtype != out.dtype for t in (x, y)):
        raise errors.UnsupportedOpError(
            f"{base} with operands {x.dtype}, {y.dtype} into {out.dtype} has no neuron kernel"
            f"\n{errors.where()}\n  fix: cast both operands to {out.dtype} first")
    if out.numel() == 0:
        return
    role = "right" if base in ("aten::mv", "aten::addmv") else "left"   # a vector output
    o3 = out.view(1, 1, 1) if out.dim() == 0 else _as3(out, role)
    kx, x3 = _load_kind(_as3(x, "left"))
    ky, y3 = _load_kind(_as3(y, "right"))
    alpha = complex(a.get("alpha", 1) if a.get("alpha") is not None else 1)
    beta = complex(a.get("beta", 1) if a.get("beta") is not None else 1)
    args = [strided_np(o3, tuple(o3.shape), o3.stride()),
            strided_np(x3, tuple(x3.shape), x3.stride()),
            strided_np(y3, tuple(y3.shape), y3.stride())]
    ks = ""
    if added is not None and beta != 0:
        s = a[added]
        ks, s = _load_kind(s)
        s3 = s.expand(out.shape)
        s3 = s3.view(1, 1, 1) if out.dim() == 0 else _as3(s3, role)
        args.append(strided_np(s3, tuple(s3.shape), s3.stride()))
    store = _store(out)
    nb, nm, _nn = o3.shape
    parallel = nb * nm > 1 and out.numel() * x3.shape[2] >= PARALLEL_MIN and \
        kc.parallel_allowed()
    key = ("cbmm", kx, ky, bool(ks), ks, store, parallel)

    def render():
        return kcx.render_bmm(kx, ky, bool(ks), ks or "c", store, parallel)

    launch(key, render, tuple(args) + (alpha, beta),
           flops=float(8 * out.numel() * x3.shape[2]),
           bytes_moved=float(x3.numel() * x3.element_size() + y3.numel() * y3.element_size()
                             + out.numel() * out.element_size()), engine="tensor")


def _addbmm(a: dict, out: torch.Tensor) -> None:
    """addbmm: beta * self + alpha * sum_b batch1[b] @ batch2[b], as one (M, B*K) @ (B*K, N)
    product of the batches laid side by side (the same sum, accumulated in complex128)."""
    b1, b2 = a["batch1"], a["batch2"]
    nb, m, k = b1.shape
    n = b2.shape[2]
    left = torch.empty((m, nb, k), dtype=out.dtype)
    elementwise("aten::_to_copy", {"self": b1.permute(1, 0, 2)}, left)
    right = torch.empty((nb, k, n), dtype=out.dtype)
    elementwise("aten::_to_copy", {"self": b2}, right)
    _matmul("aten::addmm", {"self": a["self"], "mat1": left.reshape(m, nb * k),
                            "mat2": right.reshape(nb * k, n), "beta": a.get("beta", 1),
                            "alpha": a.get("alpha", 1)}, out)


def _put(a: dict, out: torch.Tensor) -> None:
    """put on complex: index_put of (real, imag) rows into the flattened pairs of the result
    (negative indices wrap in both; accumulate adds both parts)."""
    from .index import lower_index_put  # the family, not ops.py (which imports this module)

    if out is not a["self"]:
        elementwise("aten::_to_copy", {"self": a["self"]}, out)
    if not out.is_contiguous() or out.is_conj() or out.is_neg():
        raise NotImplementedError("complex put into a strided or conj/neg view")
    src = a["source"]
    pairs = torch.empty(tuple(src.shape) + (2,), dtype=out.dtype.to_real())
    elementwise("aten::_to_copy", {"self": src}, torch.view_as_complex(pairs))
    rows = torch.view_as_real(out).view(-1, 2)
    index = a["index"].reshape(-1)
    lower_index_put(torch.ops.aten.index_put_.default,
                    {"self": rows, "indices": [index], "values": pairs.view(-1, 2),
                     "accumulate": bool(a["accumulate"])}, [rows])


class _Named:
    """What run_complex reads off a dispatch Plan, for the ops registered below."""
    __slots__ = ("lower", "name", "ret_alias")

    def __init__(self, func):
        schema = func._schema
        self.name = f"{schema.name}.{schema.overload_name}" if schema.overload_name \
            else schema.name
        self.ret_alias = (None,) * len(schema.returns)
        self.lower = None


def lower_complex_only(func, a, outs) -> None:
    """Ops that only make sense with complex numbers (complex, polar, conj_physical)."""
    run_complex(func, _Named(func), a, outs)


# ops no other family has; the rest reach run_complex through dispatch's dtype check
LOWERINGS: dict = {name: lower_complex_only for name in (
    "aten::complex", "aten::polar", "aten::conj_physical", "aten::_conj_physical")}
