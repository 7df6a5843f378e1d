"""bfloat16 / float16: stored as such, computed in float32, rounded to nearest even.

Every half operand is cast up to float32 on the device, the float32 lowering runs, and half
outputs are cast back (round to nearest even, as PyTorch's CPU kernels do).

run_upcast launches the casts itself (lower/cast.py's cast_steps) and the float32 op's request
when its family builds one (elementwise `prepare`): dispatch -> run_upcast -> launch. Another
lowering is called from run_upcast's frame and launches one call deeper.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from ..context import rounded, scratch
from ..kernels.halfround import BF16_BITS
from ..launch import launch
from .cast import RUN, _dense, cast_steps
from .common import HALF


def _non_overlapping(t: torch.Tensor) -> bool:
    """No two indices of t reach the same element (each stride clears the previous dims' span)."""
    span = 1   # elements reachable by the dims taken so far (smaller strides first)
    for stride, size in sorted((abs(st), sz) for sz, st in zip(t.shape, t.stride()) if sz > 1):
        if stride < span:
            return False
        span += stride * (size - 1)
    return True


def _up(t: torch.Tensor, index_like: torch.Tensor = None) -> torch.Tensor:
    """_up_steps, launched (for lowerings of other families that cast half operands up)."""
    steps = _up_steps(t, index_like)
    while True:
        try:
            req = next(steps)
        except StopIteration as stop:
            return stop.value
        launch(*req)


def _up_steps(t: torch.Tensor, index_like: torch.Tensor = None):
    """t as float32 (exact): same strides where they are non-overlapping; an expanded operand
    (stride 0, e.g. from expand/meshgrid) is cast once per distinct element and expanded back,
    never written through an overlapping float32 view (ATen refuses such a write). A generator
    of the cast's launches; returns the float32 tensor."""
    if t.dtype not in HALF:
        return t
    if _dense(t):
        out = alloc_like(t, torch.float32)
    elif _non_overlapping(t):
        out = scratch(torch.empty_strided(t.shape, t.stride(), dtype=torch.float32))
    else:
        idx = tuple(slice(0, 1) if st == 0 and sz > 1 else slice(None)
                    for sz, st in zip(t.shape, t.stride()))
        base = t[idx]
        if _non_overlapping(base):
            up = scratch(torch.empty_strided(base.shape, base.stride(), dtype=torch.float32))
            yield from cast_steps(base, up)   # what lower_to_copy runs for a half source
            return up.expand(t.shape)
        out = scratch(torch.empty(t.shape, dtype=torch.float32))
    yield from cast_steps(t, out)
    return out


def alloc_like(t: torch.Tensor, dtype) -> torch.Tensor:
    return scratch(torch.empty_strided(t.shape, t.stride(), dtype=dtype))


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


# the one bfloat16 rounding rule (kernels/halfround.py), on a float32's bits in Python
_BF16_RULE = eval("lambda x0: " + BF16_BITS)   # noqa: S307 -- our own constant expression


def _half_round(v: float, dtype) -> float:
    """v rounded to nearest even in the half dtype, as a Python float (exact in float32): as
    ATen converts a double, through float32 (v as a float64 first, as torch.tensor takes it).
    numpy scalars (~1 us; a torch conversion took ~6, on every replay of `h + 0.5`); beyond
    float32's range, NaN and infinities: torch's own conversion."""
    d = float(v)
    if not -3.4e38 < d < 3.4e38:
        return float(torch.tensor(v, dtype=torch.float64).to(dtype))
    f = np.float32(d)
    if dtype == torch.bfloat16:
        bits = _BF16_RULE(int(f.view(np.uint32)))
        return float(np.uint32(bits << 16).view(np.float32))
    if -65520.0 < f < 65520.0:
        return float(np.float16(f))
    return math.copysign(math.inf, d)


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


def rounded_numbers(func, a: dict) -> list:
    """The names of the number operands (and 0-d float tensors) `_round_numbers` may round to
    the half type: which ones depends on the op and the arguments' kinds, never their values
    (marked for the fast path, context.rounded, which reads only the others at run time)."""
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
    return todo


def _round_numbers(func, a: dict, outs: list):
    """Number operands rounded to the half type where the CPU rounds them (see _ROUND_SCALAR);
    a generator of the launches rounding a 0-d tensor, returning the arguments."""
    todo = rounded_numbers(func, a)
    if not todo:
        return a
    ctype = _compute_half(a)
    # (the fast path reads a rounded number at run time through the same rounding, or not at
    # all when there is none to name: fastpath_capture._half_runtime)
    rounded(todo, None if ctype is None else functools.partial(round_number, dtype=ctype))
    if ctype is None:
        return a
    a = dict(a)
    for nm in todo:
        v = a[nm]
        if isinstance(v, torch.Tensor):
            a[nm] = yield from _round_tensor(v, ctype)
        else:
            a[nm] = round_number(v, ctype)
    return a


def round_number(v, dtype):
    """The value a kernel takes for the number v the CPU rounds to the half dtype: v itself when
    exact (an exact int stays an int: the same kernel as before), else the rounded float."""
    r = _half_round(v, dtype)
    return v if r == v else r


def _round_tensor(t: torch.Tensor, dtype):
    """A 0-d float tensor (or an integer tensor) rounded to the half dtype and back on the
    device (a kernel, so adaptive eager records it in order, never reading a pending value);
    steps, returning the tensor."""
    h = scratch(torch.empty(t.shape, dtype=dtype))
    yield from cast_steps(t, h)
    return (yield from _up_steps(h, h))


def _round_integers(func, a: dict):
    """Integer tensor operands of an elementwise op the CPU computes in a half type, cast to it
    first (as TensorIterator casts every input to the common dtype: bf16 * int64 tensor rounds
    257 to 256 before multiplying), but a one-element one of mul/div/floor_divide, which read
    its original value as they read a number's (`x * torch.tensor(257)` multiplies by 257); bool
    operands are exact and masks besides. (Not for other families: their integer operands are
    indices.) Steps, returning the arguments (the casts' float32 results, host-backed scratch,
    in place of the integers)."""
    ctype = False
    raw = func._schema.name in _RAW_WRAPPED
    for k, v in a.items():
        if isinstance(v, torch.Tensor) and v.dtype not in _EXACT and \
                not (v.dtype.is_floating_point or v.dtype.is_complex) and \
                not (raw and v.numel() == 1):
            if ctype is False:
                ctype = _compute_half(a)
                a = dict(a)
            if ctype is None:
                return a
            a[k] = yield from _round_tensor(v, ctype)
    return a


_EXACT = frozenset({torch.bool, torch.uint8, torch.int8})   # every value exact in both types
_NAN_TO_NUM = frozenset({"aten::nan_to_num", "aten::nan_to_num_"})


def run_upcast(func, plan, a: dict, outs: list) -> None:
    """A half-type op computed in float32 (dispatch routes every such kernel call here): it
    launches its steps itself, the casts and the float32 op's request (or runs its lowering)."""
    for req in upcast_steps(func, plan, a, outs):
        if req[0] is RUN:   # a lowering without a request builder: it launches itself
            req[1](*req[2:])
        else:
            launch(*req)


def upcast_steps(func, plan, a: dict, outs: list):
    """run_upcast's work as a generator of launch requests and RUN steps (the float32 lowering
    when its family builds no request). dispatch could drive it itself: the lowering would then
    launch two calls below dispatch, as a float32 op's."""
    a = yield from _round_numbers(func, a, outs)
    one = getattr(plan.lower, "prepare_half", None)   # the elementwise family
    if one is not None:
        a = yield from _round_integers(func, a)
    if func._schema.name in _NAN_TO_NUM and a.get("self") is not None and \
            a["self"].dtype in HALF:
        # the default replacements of infinities are the half type's largest finite values,
        # not float32's (which round back to inf)
        big = torch.finfo(a["self"].dtype).max
        a = dict(a, posinf=big if a.get("posinf") is None else a["posinf"],
                 neginf=-big if a.get("neginf") is None else a["neginf"])
    if one is not None:   # the route in one kernel, where it can be
        req = one(func, a, outs)
        if req is not False:
            if req is not None:
                yield req
            return
    # NOTE: temporaries are host-backed scratch, like SBUF tiles; only outputs touch HBM.
    up = {}
    for k, v in a.items():
        if isinstance(v, torch.Tensor) and v.dtype in HALF:
            up[k] = yield from _up_steps(v, v)
        elif isinstance(v, (list, tuple)) and v and isinstance(v[0], torch.Tensor):
            items = []
            for x in v:
                items.append((yield from _up_steps(x, x)) if x.dtype in HALF else x)
            up[k] = type(v)(items)
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
    prepare = getattr(plan.lower, "prepare", None)
    if prepare is None:
        yield (RUN, plan.lower, func, up, tmp_outs)
    else:   # the elementwise family: the float32 op's launch request
        req = prepare(func, up, tmp_outs)
        if req is not None:
            yield req
    for o, t in zip(outs, tmp_outs):
        if o is not t and isinstance(o, torch.Tensor) and o.dtype in HALF:
            yield from cast_steps(t, o)   # what lower_to_copy runs for a half output
