"""Casts and copies, including bfloat16/float16 storage.

bfloat16 <-> float32 is bit manipulation in a Numba kernel (round to nearest even, NaN kept
quiet), exactly what PyTorch's CPU does. float16 is bit arithmetic too (cast_f16: Numba has no
float16 type), bit-exact with the CPU over every float16 pattern. Every bit-level cast lives
here; lower/half.py (the float32 compute path of half-type ops) calls into this module.
"""

from __future__ import annotations

import torch

from ..context import scratch
from ..kernels.halfround import BF16_BITS, F16_TO_F32, F32_TO_F16
from ..launch import launch
from . import elementwise as ew
from .common import FP8

# NOTE: the one bfloat16 rule (kernels/halfround.py): every NaN becomes the quiet NaN 0x7FC0, as
# c10::round_to_nearest_even does (the CPU's AVX2 path writes 0xFFFF for contiguous inputs;
# either is NaN, the payload is not observable)
_F32_TO_BF16 = BF16_BITS
_BF16_TO_F32 = "(x0 & 0xFFFF) << 16"


ew.OPS["cast::f32_to_bf16"] = (_F32_TO_BF16.replace("x0", "(self & 0xFFFFFFFF)"), "none")
ew.OPS["cast::bf16_to_f32"] = (_BF16_TO_F32.replace("x0", "(self & 0xFFFF)"), "none")
ew.OPS["cast::bits"] = ("self", "none")
# float -> int8/uint8/int16: C++'s conversion is undefined out of range, and the CPU's (every
# ATEN_CPU_CAPABILITY) truncates to int32 (INT_MIN for NaN, inf and |x| >= 2**31), then keeps
# the low bits: 300.0 -> uint8 44, -1.0 -> 255, NaN -> 0. Numba's own conversion saturates or
# varies with vectorisation, so the kernel spells the CPU's out.
_VIA_I32 = "((np.int64(self) if (self > -2147483649.0 and self < 2147483648.0) else -2147483648)"
ew.OPS["cast::f_to_i8"] = (_VIA_I32 + " & 0xFF)", "none")
ew.OPS["cast::f_to_i16"] = (_VIA_I32 + " & 0xFFFF)", "none")
_SMALL_INT = {torch.int8: "cast::f_to_i8", torch.uint8: "cast::f_to_i8",
              torch.int16: "cast::f_to_i16"}
# dtypes a plain elementwise copy converts between (numpy has them; not half, complex, fp8)
_DIRECT = frozenset({torch.float32, torch.float64, torch.int64, torch.int32, torch.int16,
                     torch.int8, torch.uint8, torch.bool})

# -- float16 <-> float32 in kernels: the bit rules of kernels/halfround.py ----------------------
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
    for req in _f16_steps(src, dst):
        launch(*req)


def _f16_steps(src: torch.Tensor, dst: torch.Tensor):
    if src.dtype == torch.float16 and dst.dtype == torch.float16:
        yield from _bits("cast::bits", src.expand(dst.shape), dst, torch.int16, torch.int16)
    elif src.dtype == torch.float16:
        if dst.dtype == torch.float32:
            bits = src.expand(dst.shape).view(torch.int16)
            yield from _ew("cast::f16_to_f32", bits, dst)
        else:
            buf = _f32_buf(src)
            yield from cast_steps(src, buf)
            yield from cast_steps(buf, dst)
    else:
        if src.dtype != torch.float32:
            buf = _f32_buf(src)
            yield from cast_steps(src, buf)
            src = buf
        yield from _bits("cast::f32_to_f16", src.expand(dst.shape), dst, torch.int32,
                         torch.int16)


def _dense(t: torch.Tensor) -> bool:
    """Strides that cover the elements exactly once (torch 2.13 has no Python method for it)."""
    return torch._prims_common.is_non_overlapping_and_dense_or_false(t)


def _ew(op: str, src: torch.Tensor, dst: torch.Tensor):
    """The one launch of elementwise op `op` from src into dst, as a step (none when there is
    nothing to launch: empty, or recorded by adaptive eager)."""
    req = ew.lower_elementwise(None, {"self": src}, [dst], op, defer=True)
    if req is not None:
        yield req


def _bits(op: str, src: torch.Tensor, dst: torch.Tensor, src_int, dst_int):
    """A bit-level cast over the integer bit patterns of src into dst (both reinterpreted)."""
    s = src.view(src_int) if src.dtype != src_int else src
    d = dst.view(dst_int) if dst.dtype != dst_int else dst
    yield from _ew(op, s, d)


def _f32_buf(t: torch.Tensor) -> torch.Tensor:
    """The float32 scratch a copy of t goes to: t's strides when dense (host-backed)."""
    return scratch(torch.empty_strided(t.shape, t.stride(), dtype=torch.float32)
                   if _dense(t) else torch.empty(t.shape, dtype=torch.float32))


def _f32(t: torch.Tensor) -> torch.Tensor:
    """A float32 copy of t (host-backed scratch)."""
    out = _f32_buf(t)
    cast(t, out)
    return out


def cast(src: torch.Tensor, dst: torch.Tensor) -> None:
    """dst[...] = src, converting dtype and broadcasting src to dst's shape."""
    for req in cast_steps(src, dst):
        launch(*req)


def launches(steps):
    """The lowering of `steps(func, a, outs)`, a generator of launch requests: it launches each
    itself as it comes (dispatch -> lowering -> launch), however many helpers built them.

    >>> lower = launches(lambda func, a, outs: cast_steps(a["self"], outs[0]))
    >>> d = torch.empty(2, dtype=torch.bfloat16); lower(None, {"self": torch.ones(2)}, [d])
    >>> d.tolist()
    [1.0, 1.0]
    """
    def lower(func, a, outs):
        for req in steps(func, a, outs):
            launch(*req)

    lower.__name__ = getattr(steps, "__name__", "lower")
    lower.__doc__ = steps.__doc__
    return lower


# a step that is not a launch request: (RUN, lowering, func, a, outs), another family's lowering
# that launches itself; a composite's driver calls it from its own frame (lower/complex.py,
# lower/half.py), so its launches sit one call deeper than the requests'
RUN = "run a lowering"


def cast_steps(src: torch.Tensor, dst: torch.Tensor):
    """cast()'s launches as steps: a generator of launch()'s positional arguments, each built
    when the one before it has run. A composite launches them itself (`for req in
    cast_steps(s, d): launch(*req)`), so its staging copies sit one call below it, not four.

    >>> s, d = torch.tensor([1.5, -2.0]), torch.empty(2, dtype=torch.bfloat16)
    >>> [req[0][1] for req in cast_steps(s, d)]
    ['cast::f32_to_bf16']
    """
    if _direct(src, dst):   # a plain copy kernel
        yield from _ew("aten::_to_copy", src, dst)
    elif src.dtype in FP8 or dst.dtype in FP8:
        yield from _cast_fp8(src, dst)
    elif src.dtype == torch.bfloat16 or dst.dtype == torch.bfloat16 or \
            src.dtype == torch.float16 or dst.dtype == torch.float16:
        yield from _half_steps(src, dst)
    elif dst.dtype in _SMALL_INT and src.dtype in (torch.float32, torch.float64):
        yield from _ew(_SMALL_INT[dst.dtype], src, dst)
    else:
        yield from _ew("aten::_to_copy", src, dst)


# float8 casts live in lower/fp8.py (numpy has no fp8 dtype): that module imports this one and
# installs its cast_fp8_steps here when imported (by ops.py's family table, at import
# eager_neuron); importing it from here would be an import cycle
FP8_CAST: list = [None]


def _cast_fp8(src: torch.Tensor, dst: torch.Tensor):
    if FP8_CAST[0] is None:
        raise RuntimeError(f"cast from {src.dtype} to {dst.dtype}: the fp8 family "
                           "(eager_neuron/lower/fp8.py) is not loaded (see the import warning)")
    return (yield from FP8_CAST[0](src, dst))


def _half_steps(src: torch.Tensor, dst: torch.Tensor):
    if src.dtype == torch.float16 or dst.dtype == torch.float16:
        yield from _f16_steps(src, dst)
    elif src.dtype == torch.bfloat16 and dst.dtype == torch.bfloat16:
        yield from _bits("cast::bits", src.expand(dst.shape), dst, torch.int16, torch.int16)
    elif src.dtype == torch.bfloat16:
        if dst.dtype == torch.float32:
            yield from _bits("cast::bf16_to_f32", src.expand(dst.shape), dst, torch.int16,
                             torch.int32)
        else:
            buf = _f32_buf(src)
            yield from cast_steps(src, buf)
            yield from cast_steps(buf, dst)
    else:   # to bfloat16
        if src.dtype != torch.float32:
            buf = _f32_buf(src)
            yield from cast_steps(src, buf)
            src = buf
        yield from _bits("cast::f32_to_bf16", src.expand(dst.shape), dst, torch.int32,
                         torch.int16)


def _direct(src: torch.Tensor, dst: torch.Tensor) -> bool:
    """A copy between dtypes numpy has, by the plain copy kernel (not half, complex, fp8, nor
    float -> small int, which spells out the CPU's wraparound)."""
    return dst.dtype in _DIRECT and src.dtype in _DIRECT and not (
        dst.dtype in _SMALL_INT and src.dtype in (torch.float32, torch.float64))


def _copy_lowering(src_name: str):
    """The lowering of a copy op whose source argument is `src_name`: a plain copy launches
    from it (dispatch -> lowering -> launch); the other conversions take cast()'s routes."""
    def lower(func, a, outs) -> None:
        src, dst = a[src_name], outs[0]
        if _direct(src, dst):
            req = ew.lower_elementwise(None, {"self": src}, [dst], "aten::_to_copy",
                                       defer=True)
            if req is not None:
                launch(*req)
            return
        for req in cast_steps(src, dst):   # half, fp8, small int: still one call below
            launch(*req)
    lower.handles_half = True
    return lower


lower_to_copy = _copy_lowering("self")
lower_to_copy.__name__ = "lower_to_copy"
lower_copy = _copy_lowering("src")
lower_copy.__name__ = "lower_copy"

LOWERINGS = {
    "aten::_to_copy": lower_to_copy,
    "aten::copy_": lower_copy,
    "aten::clone": lower_to_copy,
}
LOWERINGS["aten::copy"] = _copy_lowering("src")   # functional copy: a fresh output
LOWERINGS["aten::copy"].__name__ = "lower_copy_functional"
