"""FP8 lowerings: casts to and from the float8 dtypes, and torch._scaled_mm.

fp8 tensors live on the device as their uint8 bit patterns (numpy has no fp8). Casts go through
float32, as PyTorch's CPU does (its c10 conversions take a float): to fp8, a Numba encoder
rounds to nearest even with each format's overflow rule (kernels/fp8.py); from fp8, a 256-entry
table decodes exactly. `_scaled_mm` dequantises with the scales (per-tensor, or row-wise: one
per row of `self` and one per column of `mat2`), accumulates in float64, adds the bias and rounds
once to float32 (then to out_dtype).

>>> import torch, eager_neuron
>>> x = torch.tensor([1e6, -1.0, 0.3]).to("neuron").to(torch.float8_e4m3fn)
>>> x.float().tolist()
[448.0, -1.0, 0.3125]
"""

from __future__ import annotations

from types import GeneratorType

import numpy as np
import torch

from .. import context as _context
from .. import errors
from ..adaptive import MODULE as _adaptive
from ..kernels import fp8 as kfp8
from ..launch import launch
from . import cast as _cast
from .cast import RUN
from .common import FP8
from .complex_ew import real_steps

VERSION = 1     # bump when this family's rendered source changes (disk cache key)
_NAME = {torch.float8_e4m3fn: "e4m3fn", torch.float8_e5m2: "e5m2",
         torch.float8_e4m3fnuz: "e4m3fnuz", torch.float8_e5m2fnuz: "e5m2fnuz"}
_TABLES: dict = {}


def _table(dtype: torch.dtype) -> np.ndarray:
    t = _TABLES.get(dtype)
    if t is None:
        t = _TABLES[dtype] = kfp8.decode_table(_NAME[dtype])
    return t


def _unfused(why: str) -> None:
    """These launches run now, never recorded by adaptive eager: flush what is pending first
    (the operands may be outputs of a recorded group), and launch the helper casts directly."""
    ctx = _context.current()   # these launches run now: adaptive eager may not record them
    if ctx is not None:
        ctx.recording = False
    _adaptive.flush(why)


def _decode_steps(src: torch.Tensor):
    """float32 values of an fp8 tensor (a contiguous numpy array of src's shape): the decode
    kernel's launch request, then the values."""
    codes = np.ascontiguousarray(src.view(torch.uint8).numpy()).reshape(-1)
    out = np.empty(codes.size, np.float32)
    yield (("fp8", "dec", VERSION), lambda: (kfp8.DECODE, "fp8_decode"),
           (codes, _table(src.dtype), out), 0.0, 5.0 * codes.size)
    return out.reshape(tuple(src.shape))


def cast_fp8(src: torch.Tensor, dst: torch.Tensor) -> None:
    """dst[...] = src where src or dst is an fp8 dtype (called by lower/cast.py's cast)."""
    for req in cast_fp8_steps(src, dst):
        launch(*req)


def cast_fp8_steps(src: torch.Tensor, dst: torch.Tensor):
    """cast_fp8 as a generator of launch requests (lower/cast.py's cast_steps yields them)."""
    if src.is_complex() or dst.is_complex():
        return (yield from _cast_complex(src, dst))
    _unfused("fp8 cast")
    if src.dtype == dst.dtype:      # same format: the bit patterns, copied by the uint8 kernel
        yield from _cast.cast_steps(src.view(torch.uint8), dst.view(torch.uint8))
        return
    if src.dtype in FP8:
        dec = yield from _decode_steps(src)
        yield from _cast.cast_steps(torch.from_numpy(dec), dst)   # exact to float32, then dst
        return
    if src.dtype == torch.float32:
        src32 = src
    else:
        src32 = _cast._f32_buf(src)
        yield from _cast.cast_steps(src, src32)
    x = np.ascontiguousarray(np.broadcast_to(src32.numpy(), tuple(dst.shape))).reshape(-1)
    codes = np.empty(x.size, np.uint8)
    fmt = _NAME[dst.dtype]
    yield (("fp8", "enc", fmt, VERSION), lambda: kfp8.render_encode(fmt), (x, codes), 0.0,
           5.0 * x.size)
    dst.view(torch.uint8).numpy()[...] = codes.reshape(tuple(dst.shape))


def _f32_steps(t: torch.Tensor):
    """lower/cast.py's _f32 as steps: the float32 copy's launches; returns the copy."""
    out = _cast._f32_buf(t)
    yield from _cast.cast_steps(t, out)
    return out


def _scales(s: torch.Tensor, n: int, rowwise_shape: tuple, which: str):
    """One float64 scale per row (scale_a) / column (scale_b): per-tensor or row-wise (steps:
    the float32 copy's launches; returns the scales)."""
    s32 = yield from _f32_steps(s)
    if s.numel() == 1:
        return np.full(n, float(s32.reshape(-1)[0]), np.float64)
    return s32.numpy().astype(np.float64).reshape(-1)


def _check_scaled_mm(x, w, sa, sb) -> None:
    """The CPU's _scaled_mm checks (not the meta function's, which are cuBLAS's: K and N
    divisible by 16, mat2 column-major; the CPU has neither)."""
    if x.dim() != 2 or w.dim() != 2:
        raise RuntimeError(f"self must be a matrix, got {x.dim()}-d and mat2 {w.dim()}-d")
    if x.shape[1] != w.shape[0]:
        raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({x.shape[0]}x"
                           f"{x.shape[1]} and {w.shape[0]}x{w.shape[1]})")
    m, n = x.shape[0], w.shape[1]
    tensorwise = sa.numel() == 1 and sb.numel() == 1
    rowwise = tuple(sa.shape) == (m, 1) and tuple(sb.shape) == (1, n)
    if x.dtype not in FP8 or w.dtype not in FP8 or not (tensorwise or rowwise) or \
            not sa.is_floating_point() or not sb.is_floating_point():
        raise ValueError("Invalid scaling configuration.")
    for t in (x, w):
        if t.dtype in (torch.float8_e4m3fnuz, torch.float8_e5m2fnuz):   # oneDNN's refusal
            raise RuntimeError("itensor_view_from_dense expects float/bfloat16/half/int8/fp8 "
                               f"tensor input{_CPU_NAME[t.dtype]}")


_CPU_NAME = {torch.float8_e4m3fnuz: "Float8_e4m3fnuz", torch.float8_e5m2fnuz: "Float8_e5m2fnuz"}


def dynamic_scaled_mm(func, a, index):
    """torch._scaled_mm with the CPU's checks and output: (a * scale_a) @ (b * scale_b) + bias
    in float64, rounded once to float32, divided by scale_result for an fp8 result, then cast
    to out_dtype (default: self's dtype). A DYNAMIC lowering because PyTorch's meta function
    applies CUDA's shape rules, which the CPU does not. A generator of launch requests:
    dispatch makes each (dispatch -> launch) and wraps the outputs it returns."""
    from ..buffers import alloc

    x, w = a["self"], a["mat2"]
    _unfused("fp8 _scaled_mm")
    if a.get("out") is not None:
        raise NotImplementedError("_scaled_mm.out (the counted route resizes out=)")
    _check_scaled_mm(x, w, a["scale_a"], a["scale_b"])
    m, k = x.shape
    n = w.shape[1]
    out_dtype = a.get("out_dtype") or x.dtype
    out, block = alloc(index, (m, n), (n, 1), out_dtype)
    sa = yield from _scales(a["scale_a"], m, (m, 1), "scale_a")
    sb = yield from _scales(a["scale_b"], n, (1, n), "scale_b")
    bias = a.get("bias")
    if bias is None:
        bv = np.zeros(n, np.float64)
    else:
        b32 = yield from _f32_steps(bias)
        bv = np.ascontiguousarray(np.broadcast_to(b32.numpy(), (n,)), dtype=np.float64)
    res = np.empty((m, n), np.float64)
    yield (("fp8", "scaled_mm", VERSION), lambda: (kfp8.SCALED_MM, "fp8_scaled_mm"),
           (x.view(torch.uint8).numpy(), w.view(torch.uint8).numpy(), _table(x.dtype),
            _table(w.dtype), sa, sb, bv, res),
           2.0 * m * n * k, float(m * k + k * n + 4 * m * n), "tensor", "fp8")
    # one rounding to float32 (the CPU's accumulator type), then the cast to out_dtype
    r32 = res.astype(np.float32)
    scale_result = a.get("scale_result")
    if scale_result is not None and out_dtype in FP8:
        sr32 = yield from _f32_steps(scale_result)
        r32 = r32 / np.float32(float(sr32.reshape(-1)[0]))
    yield from _cast.cast_steps(torch.from_numpy(r32), out)
    return [(out, block)]


def _cast_complex(src: torch.Tensor, dst: torch.Tensor):
    """fp8 <-> complex through float32, as the CPU's c10 conversions (complex -> fp8 keeps the
    real part, with PyTorch's warning). Steps."""

    from .complex_ew import elementwise_steps

    if src.dtype in FP8:
        dec = yield from _decode_steps(src)
        yield from elementwise_steps("aten::_to_copy", {"self": torch.from_numpy(dec)}, dst)
        return
    errors.warn("Casting complex values to real discards the imaginary part", once=True)
    real = torch.empty(dst.shape, dtype=torch.float32)
    yield from elementwise_steps("aten::_to_copy", {"self": src.expand(dst.shape)}, real)
    yield from cast_fp8_steps(real, dst)


# ---------------------------------------------------------------------------------------------
# any other op with a float8 operand or result: what the CPU runs, as the CPU runs it
# ---------------------------------------------------------------------------------------------

# ops that move fp8 values without computing on them: the op's own kernel over the uint8 bit
# patterns (Scalars in _BIT_SCALARS are encoded first; ones_like computes, 1 is not 0x01)
BITS = frozenset({
    "aten::clone", "aten::_to_copy", "aten::copy", "aten::copy_", "aten::lift_fresh_copy",
    "aten::alias_copy", "aten::cat", "aten::stack", "aten::index", "aten::_unsafe_index",
    "aten::index_select", "aten::flip", "aten::roll", "aten::constant_pad_nd", "aten::repeat",
    "aten::narrow_copy", "aten::select_scatter", "aten::slice_scatter",
    "aten::diagonal_scatter", "aten::as_strided_scatter", "aten::unfold_copy",
    "aten::expand_copy", "aten::permute_copy", "aten::t_copy", "aten::transpose_copy",
    "aten::view_copy", "aten::squeeze_copy", "aten::unsqueeze_copy", "aten::diagonal_copy",
    "aten::select_copy", "aten::slice_copy", "aten::fill", "aten::zero", "aten::zeros_like",
    "aten::full_like", "aten::new_zeros", "aten::new_full",
    "aten::where", "aten::embedding", "aten::diag_embed", "aten::diag", "aten::unfold_backward",
    "aten::_unsafe_view", "aten::index_put", "aten::_unsafe_index_put", "aten::index_put_",
})
_BIT_SCALARS = ("value", "fill_value", "self", "other")
_COPIES = frozenset({"aten::_to_copy", "aten::copy", "aten::copy_", "aten::clone",
                     "aten::lift_fresh_copy", "aten::alias_copy"})
_VERDICTS: dict = {}    # (op, operand signature) -> None (the CPU runs it) | the CPU's error


class _CpuRefuses(errors.NotImplementedForDtype):
    """The CPU's own NotImplementedError for an op on a float8 dtype, word for word."""

    def __init__(self, message: str, dtype) -> None:
        Exception.__init__(self, message)
        self.kernel, self.dtype = "", dtype


def _stand_in(v):
    if isinstance(v, torch.Tensor):
        return torch.zeros(v.shape, dtype=v.dtype)
    if isinstance(v, (list, tuple)) and v and isinstance(v[0], torch.Tensor):
        return type(v)(_stand_in(t) for t in v)
    if isinstance(v, torch.device) and v.type != "cpu":
        return torch.device("cpu")
    return v


def _sig(v):
    if isinstance(v, torch.Tensor):
        return (v.dtype, v.dim())
    if isinstance(v, (list, tuple)):
        return tuple(_sig(t) for t in v)
    if v is None or isinstance(v, (bool, int, str)):   # dims and flags can decide (flip)
        return v
    return type(v).__name__


def cpu_verdict(func, args=(), kwargs=None):
    """None if PyTorch's CPU runs `func` on these operand dtypes, else the exception it raises
    (asked once per op and operand signature, on zero-filled stand-ins of the operands' shapes:
    whether an op supports float8 is the CPU kernels' dtype dispatch, which neuron mirrors).

    >>> x = torch.zeros(2, dtype=torch.float8_e4m3fn)
    >>> cpu_verdict(torch.ops.aten.abs.default, (x,)) is None
    True
    >>> print(cpu_verdict(torch.ops.aten.neg.default, (x,)))
    "neg_cpu" not implemented for 'Float8_e4m3fn'
    """
    kwargs = kwargs or {}
    key = (func, tuple(_sig(v) for v in args), tuple((k, _sig(v)) for k, v in kwargs.items()))
    if key in _VERDICTS:
        return _VERDICTS[key]
    verdict = None
    try:   # (the generator's state is kept: a probe must not move the user's random stream)
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            func(*[_stand_in(v) for v in args], **{k: _stand_in(v) for k, v in kwargs.items()})
    except NotImplementedError as exc:
        verdict = exc
    except RuntimeError as exc:
        if "Float8" in str(exc) or "not implemented for" in str(exc):
            verdict = exc
    _VERDICTS[key] = verdict
    return verdict


def refuse_like_cpu(func, args, kwargs) -> None:
    """Before a decomposition runs an op on float8 operands: raise what the CPU raises for it
    (rot90, isinf on e4m3fn, count_nonzero, ...), as the CPU's exception type."""
    dtype = _first_fp8(args) or _first_fp8(kwargs.values())
    if dtype is None:
        return
    refused = cpu_verdict(func, args, kwargs)
    if refused is not None:
        name = f"{func._schema.name}.{func._schema.overload_name}".rstrip(".")
        exc = _CpuRefuses(str(refused).splitlines()[0], dtype) \
            if isinstance(refused, NotImplementedError) else RuntimeError(
                str(refused).splitlines()[0])
        raise errors.kernel_error(name, exc, args, kwargs)


def dynamic_fp8(lower):
    """A data-dependent lowering (x[mask], masked_select, ...) for float8 operands: the CPU's
    error when it refuses the op; else the lowering over the uint8 bit patterns, its uint8
    results viewed back as the fp8 dtype. A lowering with `handles_fp8` runs as it is."""
    if getattr(lower, "handles_fp8", False):
        return lower

    def run(func, a: dict, index):
        # a generator dispatch drives: a lowering written as steps has its requests passed
        # on (dispatch makes them); a plain one launches from here
        _unfused(f"fp8 op {func._schema.name}")
        dtype = _fp8_of(a, ())
        refused = cpu_verdict(func, (), a)
        if refused is not None:
            if isinstance(refused, NotImplementedError):
                raise _CpuRefuses(str(refused).splitlines()[0], dtype)
            raise RuntimeError(str(refused).splitlines()[0])
        a2 = {k: _map(v, lambda t: t.view(torch.uint8) if t.dtype in FP8 else t)
              for k, v in a.items()}
        produced = lower(func, a2, index)
        if isinstance(produced, GeneratorType):
            produced = yield from produced
        return [(t.view(dtype) if t.dtype == torch.uint8 else t, b) for t, b in produced]

    return run


def _first_fp8(values):
    for v in values:
        if isinstance(v, torch.Tensor):
            if v.dtype in FP8:
                return v.dtype
        elif isinstance(v, (list, tuple)):
            for t in v:
                if isinstance(t, torch.Tensor) and t.dtype in FP8:
                    return t.dtype
    return None


def _fp8_of(a: dict, outs):
    for v in list(a.values()) + list(outs):
        if isinstance(v, torch.Tensor) and v.dtype in FP8:
            return v.dtype
        if isinstance(v, (list, tuple)):
            for t in v:
                if isinstance(t, torch.Tensor) and t.dtype in FP8:
                    return t.dtype
    return None


def _encode_scalar(v, dtype) -> int:
    """The fp8 bit pattern of Python number v (the CPU's conversion: via float32)."""
    src = torch.tensor([float(v)], dtype=torch.float32)
    dst = torch.empty(1, dtype=dtype)
    cast_fp8(src, dst)
    return int(dst.view(torch.uint8)[0])


def _map(v, fn):
    if isinstance(v, torch.Tensor):
        return fn(v)
    if isinstance(v, (list, tuple)) and v and isinstance(v[0], torch.Tensor):
        return type(v)(fn(t) for t in v)
    return v


def _with_written(plan, a2: dict, outs2: list) -> list:
    """Written arguments (in-place, out=) must be the same objects in `a` and `outs`."""
    outs2 = list(outs2)
    for j, target in enumerate(plan.ret_alias):
        if target is not None and j < len(outs2):
            outs2[j] = a2[target]
    return outs2


def _decoded(v):
    """_map(v, decode) as steps: each fp8 tensor's decode launch, in order; returns the map."""
    if isinstance(v, torch.Tensor):
        return torch.from_numpy((yield from _decode_steps(v))) if v.dtype in FP8 else v
    if isinstance(v, (list, tuple)) and v and isinstance(v[0], torch.Tensor):
        items = []
        for t in v:
            items.append(torch.from_numpy((yield from _decode_steps(t))) if t.dtype in FP8
                         else t)
        return type(v)(items)
    return v


def run_fp8(func, plan, a: dict, outs: list) -> None:
    """An op with a float8 operand or result (dispatch routes each such kernel call here):
    the CPU's error when the CPU refuses it; data movement over the bit patterns; anything else
    computed in float32 from exactly decoded values and rounded to the fp8 result, which is how
    the CPU's Float8 arithmetic computes (float(a) * float(b), rounded once). It launches its
    steps itself (dispatch -> run_fp8 -> launch); another family's lowering without a request
    builder runs from its frame (a RUN step, one call deeper)."""
    for req in fp8_steps(func, plan, a, outs):
        if req[0] is RUN:
            req[1](*req[2:])
        else:
            launch(*req)


def fp8_steps(func, plan, a: dict, outs: list):
    """run_fp8's work as a generator of launch requests and RUN steps (see lower/half.py's
    upcast_steps)."""
    _unfused(f"fp8 op {plan.name}")
    dtype = _fp8_of(a, outs)
    name = func._schema.name
    if name in _COPIES:   # every cast the CPU has: lower/cast.py, which sends fp8 to cast_fp8
        src = a["src"] if "src" in a else a["self"]
        yield from _cast.cast_steps(src.expand(outs[0].shape), outs[0])
        return
    refused = cpu_verdict(func, (), a)
    if refused is not None:
        if isinstance(refused, NotImplementedError):
            raise _CpuRefuses(str(refused).splitlines()[0], dtype)
        raise RuntimeError(str(refused).splitlines()[0])
    if name in BITS and not (name.startswith("aten::index_put") and a.get("accumulate")):
        fp8_in = {id(v) for v in a.values() if isinstance(v, torch.Tensor) and v.dtype in FP8}
        a2 = {k: _map(v, lambda t: t.view(torch.uint8) if t.dtype in FP8 else t)
              for k, v in a.items()}
        for k in _BIT_SCALARS:
            v = a2.get(k)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                a2[k] = _encode_scalar(v, dtype)
            elif isinstance(v, torch.Tensor) and v.dim() == 0 and v.dtype not in FP8 and \
                    id(a[k]) not in fp8_in and name in ("aten::fill", "aten::where"):
                a2[k] = _encode_scalar(v.item(), dtype)
        outs2 = [_map(o, lambda t: t.view(torch.uint8) if t.dtype in FP8 else t) for o in outs]
        yield from real_steps(plan.lower, func, a2, _with_written(plan, a2, outs2))
        return
    # computed: decoded float32 operands, float32 results rounded to fp8
    a2 = {}
    for k, v in a.items():
        a2[k] = yield from _decoded(v)
    outs2 = [torch.empty(o.shape, dtype=torch.float32) if isinstance(o, torch.Tensor)
             and o.dtype in FP8 else o for o in outs]
    outs2 = _with_written(plan, a2, outs2)
    yield from real_steps(plan.lower, func, a2, outs2)
    for o, t in zip(outs, outs2):
        if isinstance(o, torch.Tensor) and o.dtype in FP8 and t is not o:
            yield from cast_fp8_steps(t, o)


dynamic_scaled_mm.handles_fp8 = True
LOWERINGS: dict = {}
DYNAMIC = {"aten::_scaled_mm": dynamic_scaled_mm}
_cast.FP8_CAST[0] = cast_fp8_steps   # lower/cast.py's cast_steps yields every fp8 cast's steps

