"""bfloat16 / float16: stored as such, computed in float32, rounded to nearest even.

Every half operand is cast up to float32 on the device, the float32 lowering runs, and half
outputs are cast back (round to nearest even, as PyTorch's CPU kernels do).
"""

from __future__ import annotations

import torch

from . import elementwise as ew
from .common import HALF

# -- float16 <-> float32 in kernels (bit arithmetic, as bfloat16 in lower/cast.py) -------------
# float32 bits -> float16 bits, round to nearest even (c10's fp16_ieee_from_fp32_value): NaN ->
# sign | 0x7E00; |x| >= 65520 -> inf; normals re-biased and rounded at bit 13 (a carry into the
# exponent is the right answer); subnormals: the 24-bit significand shifted right by 126 - e,
# rounded to even; |x| <= 2**-25 -> signed zero.
_A = "(self & 0x7FFFFFFF)"
_M = f"(({_A} & 0x7FFFFF) | 0x800000)"
_SH = f"(126 - ({_A} >> 23))"
_Q = f"({_M} >> {_SH})"
_R = f"({_M} & ((1 << {_SH}) - 1))"
_HALFWAY = f"(1 << ({_SH} - 1))"
_SUBNORMAL = (f"({_Q} + (1 if ({_R} > {_HALFWAY} or ({_R} == {_HALFWAY} and ({_Q} & 1) == 1)) "
              "else 0))")
_NORMAL = f"((({_A} - 0x38000000) + 0xFFF + ((({_A} - 0x38000000) >> 13) & 1)) >> 13)"
F32_TO_F16 = (f"((self >> 16) & 0x8000) | (0x7E00 if {_A} > 0x7F800000 else (0x7C00 if "
              f"{_A} >= 0x477FF000 else ({_NORMAL} if {_A} >= 0x38800000 else (0 if "
              f"{_A} <= 0x33000000 else {_SUBNORMAL}))))")
# float16 bits -> float32 value (exact: every float16 is a float32)
_E = "((self >> 10) & 0x1F)"
F16_TO_F32 = (f"(-1.0 if (self & 0x8000) != 0 else 1.0) * ((math.inf if (self & 0x3FF) == 0 "
              f"else math.nan) if {_E} == 31 else ((1.0 + (self & 0x3FF) / 1024.0) * "
              f"2.0 ** ({_E} - 15) if {_E} > 0 else (self & 0x3FF) * 2.0 ** -24))")
ew.OPS["cast::f32_to_f16"] = (F32_TO_F16.replace("self", "(self & 0xFFFFFFFF)"), "none")
ew.OPS["cast::f16_to_f32"] = (F16_TO_F32.replace("self", "(self & 0xFFFF)"), "none")


def cast_f16(src: torch.Tensor, dst: torch.Tensor) -> None:
    """dst[...] = src where either is float16: bit-exact kernels, rounding as the CPU does
    (other dtypes pass through float32, as c10::Half's conversions do).

    >>> s = torch.tensor([1.0, 65520.0, 1e-8, float("nan")])
    >>> d = torch.empty(4, dtype=torch.float16)
    >>> cast_f16(s, d); d.tolist()
    [1.0, inf, 0.0, nan]
    """
    from .cast import _bits, _f32, cast

    if src.dtype == torch.float16 and dst.dtype == torch.float16:
        _bits("cast::bits", src.expand(dst.shape), dst, torch.int16, torch.int16)
    elif src.dtype == torch.float16:
        if dst.dtype == torch.float32:
            bits = src.expand(dst.shape).view(torch.int16)
            ew.lower_elementwise(None, {"self": bits}, [dst], "cast::f16_to_f32")
        else:
            cast(_f32(src), dst)
    else:
        if src.dtype != torch.float32:
            src = _f32(src)
        _bits("cast::f32_to_f16", src.expand(dst.shape), dst, torch.int32, torch.int16)


def _dense(t: torch.Tensor) -> bool:
    """Strides that cover the elements exactly once (torch 2.13 has no Python method for it)."""
    return torch._prims_common.is_non_overlapping_and_dense_or_false(t)


def _non_overlapping(t: torch.Tensor) -> bool:
    """No two indices of t reach the same element (each stride clears the previous dims' span)."""
    span = 1   # elements reachable by the dims taken so far (smaller strides first)
    for stride, size in sorted((abs(st), sz) for sz, st in zip(t.shape, t.stride()) if sz > 1):
        if stride < span:
            return False
        span += stride * (size - 1)
    return True


def _up(t: torch.Tensor, index_like: torch.Tensor = None) -> torch.Tensor:
    """t as float32 (exact): same strides where they are non-overlapping; an expanded operand
    (stride 0, e.g. from expand/meshgrid) is cast once per distinct element and expanded back,
    never written through an overlapping float32 view (ATen refuses such a write)."""
    from .. import ops

    if t.dtype not in HALF:
        return t
    if _dense(t):
        out = alloc_like(t, torch.float32)
    elif _non_overlapping(t):
        out = torch.empty_strided(t.shape, t.stride(), dtype=torch.float32)
    else:
        idx = tuple(slice(0, 1) if st == 0 and sz > 1 else slice(None)
                    for sz, st in zip(t.shape, t.stride()))
        base = t[idx]
        if _non_overlapping(base):
            up = torch.empty_strided(base.shape, base.stride(), dtype=torch.float32)
            ops.KERNELS["aten::_to_copy"](torch.ops.aten._to_copy.default, {"self": base}, [up])
            return up.expand(t.shape)
        out = torch.empty(t.shape, dtype=torch.float32)
    ops.KERNELS["aten::_to_copy"](torch.ops.aten._to_copy.default, {"self": t}, [out])
    return out


def alloc_like(t: torch.Tensor, dtype) -> torch.Tensor:
    return torch.empty_strided(t.shape, t.stride(), dtype=dtype)


# Where PyTorch's CPU kernels round a number operand to the half type before computing in float32:
# a Python number or 0-d tensor bound to a Tensor parameter is a "wrapped number" that
# TensorIterator casts to the common (half) dtype, and the .Scalar overloads below wrap theirs the
# same way. mul/div/floor_divide read the original value instead (original_scalar_value in
# BinaryOpsKernel.cpp), as do Scalar parameters such as lerp's weight or elu's alpha; add/sub's
# alpha is cast to the half type (checked against the CPU: bf16 `x - 0.3` differed in 349/1000).
_RAW_WRAPPED = frozenset({"aten::mul", "aten::div", "aten::floor_divide", "aten::true_divide",
                          "aten::mul_", "aten::div_", "aten::floor_divide_", "aten::true_divide_"})
_ROUND_SCALAR = {
    "aten::add": ("other", "alpha"), "aten::sub": ("other", "alpha"),
    "aten::rsub": ("other", "alpha"), "aten::subtract": ("other", "alpha"),
    "aten::pow": ("self", "exponent"), "aten::remainder": ("self", "other"),
    "aten::fmod": ("other",), "aten::xlogy": ("self", "other"),
    "aten::eq": ("other",), "aten::ne": ("other",), "aten::lt": ("other",),
    "aten::le": ("other",), "aten::gt": ("other",), "aten::ge": ("other",),
}


def _half_round(v: float, dtype) -> float:
    """v rounded to nearest even in the half dtype, as a Python float (exact in float32)."""
    return float(torch.tensor(v, dtype=torch.float64).to(dtype))


def _compute_half(a: dict):
    """The dtype the CPU computes in when it is a half type (the common dtype of the tensor
    operands and numbers, as torch.result_type), else None."""
    tensors = [v for v in a.values() if isinstance(v, torch.Tensor)]
    dims = [v for v in tensors if v.dim() > 0] or tensors
    if not dims:
        return None
    ctype = dims[0].dtype
    for v in dims[1:]:
        ctype = torch.promote_types(ctype, v.dtype)
    probe = torch.empty(1, dtype=ctype)
    for v in a.values():
        if (isinstance(v, (int, float)) and not isinstance(v, bool)) or \
                (isinstance(v, torch.Tensor) and v.dim() == 0 and dims is not tensors):
            ctype = torch.result_type(probe, v)
            probe = torch.empty(1, dtype=ctype)
    return ctype if ctype in HALF else None


def _round_numbers(func, a: dict, outs: list) -> dict:
    """Number operands rounded to the half type where the CPU rounds them (see _ROUND_SCALAR)."""
    name = func._schema.name
    base = name[:-1] if name.endswith("_") else name
    wrapped = name not in _RAW_WRAPPED
    round_names = _ROUND_SCALAR.get(base, ())
    todo = []
    for arg in func._schema.arguments:
        v = a.get(arg.name)
        if v is None or isinstance(v, bool):
            continue
        is_tensor_param = isinstance(arg.type, torch.TensorType)
        if isinstance(v, (int, float)):
            if (is_tensor_param and wrapped) or arg.name in round_names:
                todo.append(arg.name)
        elif (isinstance(v, torch.Tensor) and v.dim() == 0 and v.dtype not in HALF
              and v.dtype.is_floating_point and is_tensor_param and wrapped):
            todo.append(arg.name)
    if not todo:
        return a
    ctype = _compute_half(a)
    if ctype is None:
        return a
    a = dict(a)
    for nm in todo:
        v = a[nm]
        if isinstance(v, torch.Tensor):
            a[nm] = _round_tensor(v, ctype)
        else:
            r = _half_round(v, ctype)
            if r != v:   # an exact int stays an int (the same kernel as before)
                a[nm] = r
    return a


def _round_tensor(t: torch.Tensor, dtype) -> torch.Tensor:
    """A 0-d float tensor rounded to the half dtype and back on the device (a kernel, so adaptive
    eager records it in order, never reading a pending value)."""
    from .. import ops

    h = torch.empty((), dtype=dtype)
    ops.KERNELS["aten::_to_copy"](torch.ops.aten._to_copy.default, {"self": t}, [h])
    return _up(h, h)


def run_upcast(func, plan, a: dict, outs: list) -> None:
    from .. import ops

    a = _round_numbers(func, a, outs)
    # NOTE: temporaries are host-backed scratch, like SBUF tiles; only outputs touch HBM.
    up = {}
    for k, v in a.items():
        if isinstance(v, torch.Tensor) and v.dtype in HALF:
            up[k] = _up(v, v)
        elif isinstance(v, (list, tuple)) and v and isinstance(v[0], torch.Tensor):
            up[k] = type(v)(_up(x, x) if x.dtype in HALF else x for x in v)
        else:
            up[k] = v
    tmp_outs = []
    for o in outs:
        if isinstance(o, torch.Tensor) and o.dtype in HALF:
            tmp_outs.append(alloc_like(o, torch.float32))
        else:
            tmp_outs.append(o)
    # in-place on a half tensor: the upcast self is the float32 output
    for i, target in enumerate(plan.ret_alias):
        if target is not None and isinstance(outs[i], torch.Tensor) and outs[i].dtype in HALF:
            tmp_outs[i] = up[target]
    plan.lower(func, up, tmp_outs)
    for o, t in zip(outs, tmp_outs):
        if o is not t and isinstance(o, torch.Tensor) and o.dtype in HALF:
            ops.KERNELS["aten::_to_copy"](torch.ops.aten._to_copy.default, {"self": t}, [o])
