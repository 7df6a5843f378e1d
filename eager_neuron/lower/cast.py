"""Casts and copies, including bfloat16/float16 storage.

bfloat16 <-> float32 is bit manipulation in a Numba kernel (round to nearest even, NaN kept
quiet), exactly what PyTorch's CPU does. float16 is bit arithmetic too (lower/half.py cast_f16:
Numba has no float16 type), bit-exact with the CPU over every float16 pattern.
"""

from __future__ import annotations

import torch

from . import elementwise as ew
from .common import FP8

# NOTE: every NaN becomes the quiet NaN 0x7FC0, as c10::round_to_nearest_even does (the CPU's
# AVX2 path writes 0xFFFF for contiguous inputs; either is NaN, the payload is not observable)
_F32_TO_BF16 = ("0x7FC0 if (x0 & 0x7FFFFFFF) > 0x7F800000 else "
                "((x0 + 0x7FFF + ((x0 >> 16) & 1)) >> 16)")
_BF16_TO_F32 = "(x0 & 0xFFFF) << 16"


ew.OPS["cast::f32_to_bf16"] = (_F32_TO_BF16.replace("x0", "(self & 0xFFFFFFFF)"), "none")
ew.OPS["cast::bf16_to_f32"] = (_BF16_TO_F32.replace("x0", "(self & 0xFFFF)"), "none")
ew.OPS["cast::bits"] = ("self", "none")


def _dense(t: torch.Tensor) -> bool:
    """Strides that cover the elements exactly once (torch 2.13 has no Python method for it)."""
    return torch._prims_common.is_non_overlapping_and_dense_or_false(t)


def _bits(op: str, src: torch.Tensor, dst: torch.Tensor, src_int, dst_int) -> None:
    """Run a bit-level cast over the integer bit patterns of src into dst (both reinterpreted)."""
    s = src.view(src_int) if src.dtype != src_int else src
    d = dst.view(dst_int) if dst.dtype != dst_int else dst
    ew.lower_elementwise(None, {"self": s}, [d], op)


def _f32(t: torch.Tensor) -> torch.Tensor:
    """A float32 copy of t (host-backed scratch)."""
    out = torch.empty_strided(t.shape, t.stride(), dtype=torch.float32) \
        if _dense(t) else torch.empty(t.shape, dtype=torch.float32)
    cast(t, out)
    return out


def cast(src: torch.Tensor, dst: torch.Tensor) -> None:
    """dst[...] = src, converting dtype and broadcasting src to dst's shape."""
    if src.dtype in FP8 or dst.dtype in FP8:
        return _cast_fp8(src, dst)
    if src.dtype == torch.bfloat16 or dst.dtype == torch.bfloat16 or \
            src.dtype == torch.float16 or dst.dtype == torch.float16:
        return _cast_half(src, dst)
    ew.lower_elementwise(None, {"self": src}, [dst], "aten::_to_copy")


# float8 casts live in lower/fp8.py (numpy has no fp8 dtype): that module imports this one and
# installs its cast_fp8 here when imported (by ops.py's family table, at import eager_neuron);
# importing it from here would be an import cycle
FP8_CAST: list = [None]


def _cast_fp8(src: torch.Tensor, dst: torch.Tensor) -> None:
    if FP8_CAST[0] is None:
        raise RuntimeError(f"cast from {src.dtype} to {dst.dtype}: the fp8 family "
                           "(eager_neuron/lower/fp8.py) is not loaded (see the import warning)")
    FP8_CAST[0](src, dst)


def _cast_half(src: torch.Tensor, dst: torch.Tensor) -> None:
    if src.dtype == torch.float16 or dst.dtype == torch.float16:
        from .half import cast_f16  # float16 bit casts live with the half path (lower/half.py)

        return cast_f16(src, dst)
    if src.dtype == torch.bfloat16 and dst.dtype == torch.bfloat16:
        _bits("cast::bits", src.expand(dst.shape), dst, torch.int16, torch.int16)
        return
    if src.dtype == torch.bfloat16:
        if dst.dtype == torch.float32:
            _bits("cast::bf16_to_f32", src.expand(dst.shape), dst, torch.int16, torch.int32)
        else:
            cast(_f32(src), dst)
        return
    # to bfloat16
    if src.dtype != torch.float32:
        src = _f32(src)
    _bits("cast::f32_to_bf16", src.expand(dst.shape), dst, torch.int32, torch.int16)


def lower_to_copy(func, a, outs) -> None:
    cast(a["self"], outs[0])


def lower_copy(func, a, outs) -> None:
    cast(a["src"], outs[0])


lower_to_copy.handles_half = True
lower_copy.handles_half = True

LOWERINGS = {
    "aten::_to_copy": lower_to_copy,
    "aten::copy_": lower_copy,
    "aten::copy": lambda func, a, outs: cast(a["src"], outs[0]),
    "aten::clone": lower_to_copy,
}
LOWERINGS["aten::clone"].handles_half = True
