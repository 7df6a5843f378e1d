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

import numpy as np
import torch

from .. import context as _context
from ..adaptive import MODULE as _adaptive
from ..kernels import fp8 as kfp8
from ..launch import launch
from . import cast as _cast
from .common import FP8

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


def _decode(src: torch.Tensor) -> np.ndarray:
    """float32 values of an fp8 tensor (a contiguous numpy array of src's shape)."""
    codes = np.ascontiguousarray(src.view(torch.uint8).numpy()).reshape(-1)
    out = np.empty(codes.size, np.float32)
    launch(("fp8", "dec", VERSION), lambda: (kfp8.DECODE, "fp8_decode"),
           (codes, _table(src.dtype), out), bytes_moved=5.0 * codes.size)
    return out.reshape(tuple(src.shape))


def cast_fp8(src: torch.Tensor, dst: torch.Tensor) -> None:
    """dst[...] = src where src or dst is an fp8 dtype (called by lower/cast.py's cast)."""
    if src.is_complex() or dst.is_complex():
        raise NotImplementedError(f"cast between {src.dtype} and {dst.dtype}")
    _unfused("fp8 cast")
    if src.dtype == dst.dtype:      # same format: the bit patterns, copied by the uint8 kernel
        _cast.cast(src.view(torch.uint8), dst.view(torch.uint8))
        return
    if src.dtype in FP8:
        _cast.cast(torch.from_numpy(_decode(src)), dst)   # exact to float32, then to dst
        return
    src32 = src if src.dtype == torch.float32 else _cast._f32(src)
    x = np.ascontiguousarray(np.broadcast_to(src32.numpy(), tuple(dst.shape))).reshape(-1)
    codes = np.empty(x.size, np.uint8)
    fmt = _NAME[dst.dtype]
    launch(("fp8", "enc", fmt, VERSION), lambda: kfp8.render_encode(fmt), (x, codes),
           bytes_moved=5.0 * x.size)
    dst.view(torch.uint8).numpy()[...] = codes.reshape(tuple(dst.shape))


def _scales(s: torch.Tensor, n: int, rowwise_shape: tuple, which: str) -> np.ndarray:
    """One float64 scale per row (scale_a) / column (scale_b): per-tensor or row-wise."""
    if s.dtype != torch.float32:
        raise RuntimeError(f"_scaled_mm: {which} must be float32, got {s.dtype}")
    if s.numel() == 1:
        return np.full(n, float(s.reshape(-1)[0]), np.float64)
    if tuple(s.shape) != rowwise_shape:
        raise RuntimeError(f"_scaled_mm: {which} of shape {tuple(s.shape)}: expected a "
                           f"per-tensor scale (one element) or a row-wise one {rowwise_shape}")
    return s.numpy().astype(np.float64).reshape(-1)


def lower_scaled_mm(func, a, outs) -> None:
    x, w, out = a["self"], a["mat2"], outs[0]
    _unfused("fp8 _scaled_mm")
    if a.get("scale_result") is not None:
        # NOTE: declined (NotImplementedError): dispatch takes the counted route, not a guess
        raise NotImplementedError("_scaled_mm with scale_result")
    if x.dtype not in FP8 or w.dtype not in FP8 or x.dim() != 2 or w.dim() != 2:
        raise RuntimeError(f"_scaled_mm: expected 2-d float8 operands, got self {x.dtype} "
                           f"{tuple(x.shape)} and mat2 {w.dtype} {tuple(w.shape)}")
    m, k = x.shape
    n = w.shape[1]
    if w.shape[0] != k:
        raise RuntimeError(f"_scaled_mm: self {tuple(x.shape)} and mat2 {tuple(w.shape)} "
                           "cannot be multiplied")
    sa = _scales(a["scale_a"], m, (m, 1), "scale_a")
    sb = _scales(a["scale_b"], n, (1, n), "scale_b")
    bias = a.get("bias")
    bv = np.zeros(n, np.float64) if bias is None else np.ascontiguousarray(np.broadcast_to(
        (bias if bias.dtype == torch.float32 else _cast._f32(bias)).numpy(), (n,)),
        dtype=np.float64)
    res = np.empty((m, n), np.float64)
    launch(("fp8", "scaled_mm", VERSION), lambda: (kfp8.SCALED_MM, "fp8_scaled_mm"),
           (x.view(torch.uint8).numpy(), w.view(torch.uint8).numpy(), _table(x.dtype),
            _table(w.dtype), sa, sb, bv, res),
           flops=2.0 * m * n * k, bytes_moved=float(m * k + k * n + 4 * m * n),
           engine="tensor", dtype_class="fp8")
    # one rounding to float32 (the CPU's accumulator type), then the cast to out_dtype
    _cast.cast(torch.from_numpy(res.astype(np.float32)), out)


lower_scaled_mm.handles_half = True   # bf16/fp16 out_dtype and bias: handled above, not upcast

LOWERINGS = {"aten::_scaled_mm": lower_scaled_mm}
_cast.FP8_CAST[0] = cast_fp8   # lower/cast.py's cast() routes every fp8 cast here
