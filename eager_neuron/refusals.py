"""Calls the CPU refuses before any kernel runs, refused here in the CPU's words.

Most refusals live in the lowerings (errors.NotImplementedForDtype). These ops reach a
decomposition or a meta function that would answer instead: PyTorch's trace decomposition sums a
bool diagonal, the `complex`/`polar` meta functions assert, the floor_divide reference raises a
RuntimeError of its own. dispatch() consults `REFUSE` on the slow path only (a refused call
never leaves a fast-path runner: it never completes).

>>> import torch, eager_neuron
>>> try:
...     torch.trace(torch.ones(2, 2, dtype=torch.bool, device="neuron"))
... except NotImplementedError as e:
...     print(e)
"trace" not implemented for 'Bool'
"""

from __future__ import annotations

import math

import torch

from .cpu_check import cpu_raises
from .errors import _SCALAR_NAME, cpu_worded

aten = torch.ops.aten


def _dtype(x):
    return x.dtype if isinstance(x, torch.Tensor) else None


def _trace(args, kwargs) -> None:
    if args and _dtype(args[0]) == torch.bool:
        raise NotImplementedError("\"trace\" not implemented for 'Bool'")


def _floor_divide(args, kwargs) -> None:
    # the CPU's div_floor kernel has no bool instance: bool // bool (also in place, out=)
    if len(args) >= 2 and _dtype(args[0]) == torch.bool and (
            _dtype(args[1]) == torch.bool or isinstance(args[1], bool)):
        raise NotImplementedError("\"div_floor_cpu\" not implemented for 'Bool'")


def _complex_inputs(first: str, second: str):
    def check(args, kwargs) -> None:
        a = args[0] if args else kwargs.get(first)
        b = args[1] if len(args) > 1 else kwargs.get(second)
        ta, tb = _dtype(a), _dtype(b)
        if ta is None or tb is None:
            return
        ok = (torch.float16, torch.float32, torch.float64)
        if ta not in ok or tb not in ok:
            raise RuntimeError("Expected both inputs to be Half, Float or Double tensors but got "
                               f"{_SCALAR_NAME.get(ta, ta)} and {_SCALAR_NAME.get(tb, tb)}")
        if ta != tb:
            raise RuntimeError(f"Expected object of scalar type {_SCALAR_NAME.get(ta, ta)} but "
                               f"got scalar type {_SCALAR_NAME.get(tb, tb)} for second argument")
    return check


# c10's names for the types in "value cannot be converted to type X without overflow"
_C10_NAME = {torch.uint8: "uint8_t", torch.int8: "int8_t", torch.int16: "int16_t",
             torch.int32: "int", torch.int64: "int64_t", torch.float16: "c10::Half",
             torch.bfloat16: "c10::BFloat16", torch.float32: "float", torch.float64: "double"}


def _range_checked(index: int, name: str):
    """fill_(x, value), masked_fill(x, mask, value), full_like(x, value, dtype=): ATen converts
    the number with c10's overflow check (Scalar::to<T>), where a kernel's cast would wrap or
    round to inf (uint8 fill_(256) filled 0). An unsigned type takes an int down to -max
    (wrapping), a float type an infinity or a NaN."""
    def check(args, kwargs) -> None:
        x = args[0] if args else kwargs.get("self")
        v = args[index] if len(args) > index else kwargs.get(name)
        if not isinstance(x, torch.Tensor) or type(v) not in (int, float):
            return
        dtype = kwargs.get("dtype") or x.dtype
        c10_name = _C10_NAME.get(dtype)
        if c10_name is None:
            return
        if dtype.is_floating_point:
            if v != v or v in (math.inf, -math.inf):
                return
            info = torch.finfo(dtype)
            bad = v < info.min or v > info.max
        else:
            info = torch.iinfo(dtype)
            low = -info.max if info.min == 0 and type(v) is int else info.min
            bad = v != v or v < low or v > info.max
        if bad:
            raise RuntimeError(f"value cannot be converted to type {c10_name} without overflow")
    return check


def _every_overload(packet, check) -> dict:
    return {getattr(packet, name): check for name in packet.overloads()}


def _convolution(func):
    # (input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    # torch's meta function and our lowering accept a dilation or stride below 1 and a
    # negative padding, which the CPU refuses; ask it (on copies) when one is there
    def check(args, kwargs) -> None:
        stride, padding, dilation = (args[i] if len(args) > i else kwargs.get(n) for i, n in
                                     ((3, "stride"), (4, "padding"), (5, "dilation")))
        if any(v < 1 for v in stride or ()) or any(v < 0 for v in padding or ()) or \
                any(v < 1 for v in dilation or ()):
            cpu = cpu_raises(func, args, kwargs)
            if cpu is not None:
                raise cpu_worded(func.name(), cpu, args, kwargs) or cpu
    return check


def _same_dtype_products(func):
    """The matrix products: the CPU refuses operands of different dtypes ('expected m1 and m2
    to have the same dtype', 'self and mat2 must have the same dtype', 'addmv input tensors
    must have the same dtype'); neuron's half route computes in float32 and the float kernels
    promote, so mm(float16, float32) answered. When the operands' dtypes differ (the `out=`
    tensor aside: its own check words that), the CPU is asked, on copies, and its refusal
    raised in its words."""
    def check(args, kwargs) -> None:
        dts = {a.dtype for a in args if isinstance(a, torch.Tensor)}
        dts.update(v.dtype for k, v in kwargs.items()
                   if k != "out" and isinstance(v, torch.Tensor))
        if len(dts) > 1:
            cpu = cpu_raises(func, args, kwargs)
            if cpu is not None:
                raise cpu_worded(func.name(), cpu, args, kwargs) or cpu
    check.gated = True   # dispatch's dtype gate still asks about the dtypes themselves (bool)
    return check


def _products() -> dict:
    out = {}
    for name in ("mm", "addmm", "addmm_", "_addmm_activation", "bmm", "baddbmm", "baddbmm_",
                 "addbmm", "addbmm_", "mv", "addmv", "addmv_", "dot", "vdot", "addr",
                 "addr_"):
        packet = getattr(aten, name, None)
        if packet is not None:
            for ov in packet.overloads():
                func = getattr(packet, ov)
                out[func] = _same_dtype_products(func)
    return out


_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _resize_dtypes(func, accepted: tuple, fix: str):
    """A resize the CPU's kernel dispatches on `accepted` dtypes only: nearest/nearest-exact on
    the floating types and uint8, adaptive average pooling (interpolate's "area") on the
    floating types; neuron's decompositions would answer any dtype (int8..int64, bool, complex:
    gathers) or fail in another op's words (mean()'s). Refused before reading, empty inputs
    too, as the CPU refuses; its words (the kernel name depends on the CPU's path and layout:
    compute_indices_weights_nearest, upsample_nearest2d_channels_last) are asked of it on
    copies, only here, where the dtype is refused."""
    def check(args, kwargs) -> None:
        x = args[0] if args else kwargs.get("input", kwargs.get("self"))
        dtype = _dtype(x)
        if dtype is None:
            return
        if dtype in accepted:
            if _degenerate(args, kwargs):
                cpu = cpu_raises(func, args, kwargs)
                if cpu is not None:
                    raise cpu_worded(func.name(), cpu, args, kwargs) or cpu
            return
        cpu = cpu_raises(func, args, kwargs)
        name = func.name()
        ours = f"no {dtype} kernel on the CPU either: {fix}"
        if cpu is None:
            if x.nbytes < (1 << 26):
                return   # the CPU answered (no sweep found one): the decomposition answers
            kernel = name.split("::")[-1].lstrip("_")
            cpu = NotImplementedError(
                f'"{kernel}" not implemented for \'{_SCALAR_NAME.get(dtype, dtype)}\'')
        raise cpu_worded(name, cpu, args, kwargs, ours) or cpu
    return check


def _degenerate(args, kwargs) -> bool:
    """A resize with an empty operand or a size below 1: the CPU's shape checks ("Non-empty 4D
    data tensor expected", "Input and output sizes should be greater than 0", adaptive_avg_
    pool2d's "non-zero size for non-batch dimensions") refuse most of these, where the
    decompositions answered, a (2, 3, 0, 4) input resized to 5x5 with values read from
    nothing. Asked of the CPU (cheap: its checks run before any arithmetic, and an empty
    operand has nothing to copy); a call with no such operand or size never is."""
    for v in (*args, *kwargs.values()):
        if isinstance(v, torch.Tensor):
            if v.numel() == 0:
                return True
        elif isinstance(v, (list, tuple)) and any(type(s) is int and s < 1 for s in v):
            return True
    return False


def _resizes() -> dict:
    to_float = "cast it to a floating dtype first (x.float())"
    to_u8 = "cast it to uint8 or a floating dtype first (x.float())"
    rules = {f"upsample_nearest{r}d": (_FLOATS + (torch.uint8,), to_u8) for r in (1, 2, 3)}
    rules.update({f"_upsample_nearest_exact{r}d": (_FLOATS + (torch.uint8,), to_u8)
                  for r in (1, 2, 3)})
    rules.update({f"_adaptive_avg_pool{r}d": (_FLOATS, to_float) for r in (2, 3)})
    rules.update({f"adaptive_avg_pool{r}d": (_FLOATS, to_float) for r in (2, 3)})
    rules.update({"upsample_linear1d": (_FLOATS, to_float),
                  "upsample_trilinear3d": (_FLOATS, to_float),
                  "upsample_bilinear2d": (_FLOATS + (torch.uint8,), to_u8),
                  "upsample_bicubic2d": (_FLOATS + (torch.uint8,), to_u8),
                  # the antialiased resizes: float32/float64 and uint8, not the half types
                  "_upsample_bilinear2d_aa": ((torch.float32, torch.float64, torch.uint8),
                                              "cast it to float32 first (x.float())"),
                  "_upsample_bicubic2d_aa": ((torch.float32, torch.float64, torch.uint8),
                                             "cast it to float32 first (x.float())")})
    out = {}
    for name, (accepted, fix) in rules.items():
        packet = getattr(aten, name)
        for overload in packet.overloads():
            func = getattr(packet, overload)
            out[func] = _resize_dtypes(func, accepted, fix)
    return out


def _dtype_rule(func, accepted: tuple, kernel: str, fix: str):
    """An op whose CPU kernel dispatches on `accepted` dtypes of its first tensor only, where
    neuron's kernel or decomposition answers any dtype: gelu and its backward ("GeluKernelImpl",
    floating types), adaptive max pooling (floating types), the max pools on bool. Another
    dtype is asked of the CPU (on copies; its words), or, 64 MiB and up, refused in them
    without asking. (max_pool1d and histc of integers answer, as on CUDA: a non-CPU device
    takes max_pool1d_with_indices, whose kernel takes integers; transformers' MoE layers count
    tokens per expert with an integer histc.)"""
    def check(args, kwargs) -> None:
        x = args[0] if args else next(iter(kwargs.values()), None)
        dtype = _dtype(x)
        if dtype is None or dtype in accepted:
            return
        ours = f"no {dtype} kernel on the CPU either: {fix}"
        if x.nbytes < (1 << 26):
            cpu = cpu_raises(func, args, kwargs)
            if cpu is None:
                return        # the CPU answers this call (an empty one): so does neuron
        else:
            cpu = NotImplementedError(
                f'"{kernel}" not implemented for \'{_SCALAR_NAME.get(dtype, dtype)}\'')
        raise cpu_worded(func.name(), cpu, args, kwargs, ours) or cpu
    return check


_INTS = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def _dtype_rules() -> dict:
    to_float = "cast it to a floating dtype first (x.float())"
    rules = {"gelu": (_FLOATS, "GeluKernelImpl", to_float),
             "gelu_": (_FLOATS, "GeluKernelImpl", to_float),
             "gelu_backward": (_FLOATS, "GeluBackwardKernelImpl", to_float),
             "adaptive_max_pool2d": (_FLOATS, "adaptive_max_pool2d", to_float),
             "adaptive_max_pool3d": (_FLOATS, "adaptive_max_pool3d", to_float),
             "max_pool2d_with_indices": (_FLOATS + _INTS, "max_pool2d",
                                         "cast it to an integer or floating dtype first"),
             "max_pool3d_with_indices": (_FLOATS + _INTS, "max_pool3d",
                                         "cast it to an integer or floating dtype first")}
    out = {}
    for name, (accepted, kernel, fix) in rules.items():
        packet = getattr(aten, name, None)
        for overload in (packet.overloads() if packet is not None else ()):
            func = getattr(packet, overload)
            out[func] = _dtype_rule(func, accepted, kernel, fix)
    return out


REFUSE = {
    aten.convolution.default: _convolution(aten.convolution.default),
    **_every_overload(aten.trace, _trace),
    aten.fill.Scalar: _range_checked(1, "value"),
    aten.fill_.Scalar: _range_checked(1, "value"),
    aten.masked_fill.Scalar: _range_checked(2, "value"),
    aten.masked_fill_.Scalar: _range_checked(2, "value"),
    aten.full_like.default: _range_checked(1, "fill_value"),
    **_every_overload(aten.floor_divide, _floor_divide),
    **_every_overload(aten.floor_divide_, _floor_divide),
    **_every_overload(aten.complex, _complex_inputs("real", "imag")),
    **_every_overload(aten.polar, _complex_inputs("abs", "angle")),
    **_resizes(),
    **_dtype_rules(),
    **_products(),
}
