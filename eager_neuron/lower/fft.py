"""FFT lowerings: aten::_fft_r2c, _fft_c2c, _fft_c2r (torch.fft.*, stft/istft build on them).

A transform over several dims is one kernel pass per dim (kernels/fft.py); a pass sees the
tensor as (coalesced batch dims..., line) strided views, so no transposes or copies are made.

    1. r2c: the real -> complex pass along dim[-1] writes `out`; c2c passes along the other dims
       run in place on `out` (each line is read into scratch before it is written)
    2. c2c: the first pass reads `self`, the rest run in place on `out`
    3. c2r: c2c inverse passes along dim[:-1] into a complex scratch, then the c2r pass into `out`
The normalization (0 none, 1 1/sqrt(n), 2 1/n; n the product of the signal sizes) is applied
once, in the first pass.

>>> import torch, eager_neuron
>>> x = torch.tensor([1.0, 2.0, 3.0, 4.0], device="neuron")
>>> torch.fft.rfft(x).cpu()
tensor([10.+0.j, -2.+2.j, -2.+0.j])
"""

from __future__ import annotations

import math

import torch

from .. import context as _context
from .. import errors
from ..adaptive import MODULE as _adaptive
from ..kernels import compile as kc
from ..kernels import fft as kfft
from ..launch import launch
from .common import COMPLEX, HALF, coalesce, strided_np
from .complex_ew import elementwise_steps

PARALLEL_MIN = 1 << 15   # elements per pass; below this a prange launch costs more


def _pass(mode: str, src: torch.Tensor, dst: torch.Tensor, d: int, n: int, scale: float,
          inverse: bool) -> tuple | None:
    """Transform every line of src along dim d into dst (same shape except at d): the pass's
    launch (launch()'s positional arguments, for the lowering to make; None: empty)."""
    if dst.numel() == 0:
        return None
    nd = src.dim()
    batch = [k for k in range(nd) if k != d]
    bshape, (ss, ds) = coalesce(tuple(src.shape[k] for k in batch),
                                [[src.stride(k) for k in batch], [dst.stride(k) for k in batch]])
    x = strided_np(src, bshape + (src.shape[d],), ss + (src.stride(d),))
    y = strided_np(dst, bshape + (dst.shape[d],), ds + (dst.stride(d),))
    rank_b = len(bshape)
    lines = dst.numel() // max(dst.shape[d], 1)
    parallel = lines > 1 and dst.numel() >= PARALLEL_MIN and kc.parallel_allowed()
    key = ("fft", mode, rank_b, parallel, kfft.DFT_MAX, kfft.LINES_PER_CHUNK)
    logn = max(1.0, math.log2(max(n, 2)))
    return (key, lambda: kfft.render_fft(mode, rank_b, parallel),
            (y, x, int(n), float(scale), bool(inverse)),
            float(5 * n * logn * lines),
            float(src.numel() * src.element_size() + dst.numel() * dst.element_size()))


def _scale(normalization: int, n: int) -> float:
    if normalization == 0:
        return 1.0
    return 1.0 / math.sqrt(n) if normalization == 1 else 1.0 / n


def _dims(x: torch.Tensor, dim) -> list:
    nd = max(x.dim(), 1)
    return [d % nd for d in dim]


def _prepare(x: torch.Tensor) -> torch.Tensor:
    """Operand fix-ups: pending fused work is flushed; conj/neg bits are materialized by
    PyTorch's math-bits fallback before the call, which we check."""
    ctx = _context.current()   # these launches run now: adaptive eager may not record them
    if ctx is not None:
        ctx.recording = False
    _adaptive.flush("fft")
    if x.is_conj() or x.is_neg():
        raise NotImplementedError("fft of an unresolved conj/neg view")
    if x.dtype in HALF or x.dtype == torch.complex32:
        raise errors.UnsupportedOpError(
            f"fft of a {x.dtype} tensor has no neuron kernel (nor a CPU one)\n{errors.where()}\n"
            "  fix: convert to float32 / complex64 first")
    return x


def lower_r2c(func, a, outs) -> None:
    x, out = _prepare(a["self"]), outs[0]
    dims = _dims(x, a["dim"])
    if not dims:
        raise NotImplementedError("r2c over no dims")
    n_total = math.prod(x.shape[d] for d in dims)
    scale = _scale(a["normalization"], n_total)
    last = dims[-1]
    req = _pass("r2c", x, out, last, x.shape[last], scale, False)
    if req is not None:
        launch(*req)
    for d in dims[:-1]:
        req = _pass("c2c", out, out, d, out.shape[d], 1.0, False)
        if req is not None:
            launch(*req)


def lower_c2c(func, a, outs) -> None:
    x, out = _prepare(a["self"]), outs[0]
    dims = _dims(x, a["dim"])
    inverse = not a["forward"]
    if not dims:   # a copy, by the complex family's clone kernel
        for req in elementwise_steps("aten::clone", {"self": x}, out):
            launch(*req)
        return
    n_total = math.prod(x.shape[d] for d in dims)
    scale = _scale(a["normalization"], n_total)
    src = x
    for i, d in enumerate(dims):
        req = _pass("c2c", src, out, d, out.shape[d], scale if i == 0 else 1.0, inverse)
        if req is not None:
            launch(*req)
        src = out


def lower_c2r(func, a, outs) -> None:
    x, out = _prepare(a["self"]), outs[0]
    dims = _dims(x, a["dim"])
    if not dims:
        raise NotImplementedError("c2r over no dims")
    last = dims[-1]
    n_last = int(a["last_dim_size"])
    n_total = math.prod(out.shape[d] for d in dims)
    scale = _scale(a["normalization"], n_total)
    src = x
    if len(dims) > 1:
        # scratch for the complex passes: `self` must not change (like SBUF tiles, host-backed)
        tmp = torch.empty(x.shape, dtype=x.dtype if x.dtype in COMPLEX else torch.complex64)
        for i, d in enumerate(dims[:-1]):
            req = _pass("c2c", src, tmp, d, x.shape[d], scale if i == 0 else 1.0, True)
            if req is not None:
                launch(*req)
            src = tmp
        scale = 1.0
    req = _pass("c2r", src, out, last, n_last, scale, True)
    if req is not None:
        launch(*req)


for _fn in (lower_r2c, lower_c2c, lower_c2r):
    _fn.handles_complex = True

LOWERINGS = {
    "aten::_fft_r2c": lower_r2c,
    "aten::_fft_c2c": lower_c2c,
    "aten::_fft_c2r": lower_c2r,
}
