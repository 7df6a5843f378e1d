"""Pooling lowerings: max (with dilation), average, adaptive and fractional pooling, 2-d and 3-d,
each with its backward; 1-d pools arrive as 2-d ones (PyTorch unsqueezes them).

Operands are viewed as (N, C, D, H, W) (unbatched inputs get N = 1, 2-d pools D = 1), so each
kind is one kernel for every rank. Every max-style backward (max, adaptive max, fractional
max) is the same indices scatter. Each op is one launch (plus, for half operands, float32 copies:
cast_steps the lowering launches itself, two calls below dispatch).

>>> import torch, eager_neuron
>>> x = torch.arange(16.0).reshape(1, 1, 4, 4).to("neuron")
>>> torch.nn.functional.max_pool2d(x, 2).flatten().tolist()
[5.0, 7.0, 13.0, 15.0]
"""

from __future__ import annotations

import torch

from ..kernels import compile as kc
from ..kernels import pool as kpool
from ..launch import launch
from .cast import cast_steps
from .common import NP_TYPE

VERSION = 3              # bump when this family's rendered source changes (disk cache key)
PARALLEL_MIN = 1 << 18   # elements of work below which a prange launch costs more than it saves
_FLOAT = frozenset({torch.float32, torch.float64})
_INT = frozenset({torch.int64, torch.int32})


def _np(t: torch.Tensor):
    """Zero-copy numpy view (a CPU operand under NeuronMode may require grad: detach it)."""
    return t.detach().numpy() if t.requires_grad else t.numpy()


def _as5(t: torch.Tensor, rank: int) -> torch.Tensor:
    """A rank-`rank` pool operand (batched or not) as an (N, C, D, H, W) view."""
    if t.dim() == rank + 1:
        t = t.unsqueeze(0)
    while t.dim() < 5:
        t = t.unsqueeze(2)
    return t


def _three(v, rank: int, fill: int, default=None) -> tuple:
    """An int[rank] schema value (int, [v] or full) as a (D, H, W) triple; empty: `default`."""
    if isinstance(v, int):
        v = (v,)
    v = tuple(v)
    if not v:
        return default
    v = v * rank if len(v) == 1 else v
    return (fill,) * (3 - rank) + v


def _launch(kind: str, arrays: tuple, scalars: tuple, dtype, work: int, nbytes: int,
            bf16: bool | str = False) -> tuple:
    """The pooling kernel's launch, as launch()'s positional arguments: the lowering makes it
    (dispatch -> lowering -> launch)."""
    floats_only = kind.startswith(("adaptive_avg", "fractional")) or kind == "avg_backward"
    ok = _FLOAT if floats_only else _FLOAT | _INT
    if dtype not in ok:
        raise NotImplementedError(f"{kind} pooling on {dtype}")
    T = NP_TYPE[dtype]
    integer = dtype in _INT
    lowest = str(int(torch.iinfo(dtype).min)) if integer else "-np.inf"
    parallel = work >= PARALLEL_MIN and kc.parallel_allowed()
    key = ("pool", kind, VERSION, T, parallel, bf16)

    def render():
        return kpool.render_pool(kind, T, lowest, parallel, integer, bf16)

    return (key, render, tuple(_np(t) for t in arrays) + scalars, work, nbytes, "vector")


def _window(a: dict, rank: int) -> tuple:
    kernel = _three(a["kernel_size"], rank, 1)
    stride = _three(a["stride"], rank, 1, kernel)
    return kernel, stride, _three(a["padding"], rank, 0)


def _numel(*ts) -> int:
    return sum(t.numel() for t in ts)


def _max_pool(rank: int):
    def lower(func, a, outs):
        x, (out, ind) = a["self"], outs
        if out.numel() == 0:
            return
        kernel, stride, padding = _window(a, rank)
        dilation = _three(a["dilation"], rank, 1)
        launch(*_launch("max", (_as5(out, rank), _as5(ind, rank), _as5(x, rank)),
                       kernel + stride + padding + dilation, x.dtype,
                       out.numel() * kernel[0] * kernel[1] * kernel[2],
                       _numel(x, out, ind) * x.element_size()))
    return lower


def _max_backward(rank: int):
    """max, adaptive max and fractional max backward: gi.flat[indices] += grad_output."""
    def lower(func, a, outs):
        gi = outs[0]
        if gi.numel() == 0:
            return
        go, ind = a["grad_output"], a["indices"]
        half = gi.dtype in (torch.bfloat16, torch.float16)
        gi32, go32 = gi, go
        if half:   # float32 copies; each add rounds to the half type, as the CPU adds
            go32 = torch.empty(go.shape, dtype=torch.float32)
            for req in cast_steps(go, go32):
                launch(*req)
            gi32 = torch.empty(gi.shape, dtype=torch.float32)
        launch(*_launch("max_backward", (_as5(gi32, rank), _as5(go32, rank), _as5(ind, rank)),
                        (), gi32.dtype, _numel(gi, go), _numel(gi, go, ind) * gi.element_size(),
                        half and ("f16" if gi.dtype == torch.float16 else True)))
        if half:
            for req in cast_steps(gi32, gi):
                launch(*req)
    lower.handles_half = True
    return lower


def _avg_scalars(a: dict, rank: int) -> tuple:
    kernel, stride, padding = _window(a, rank)
    divisor = a["divisor_override"] or 0   # 0: none (PyTorch rejects an override of 0)
    return kernel + stride + padding + (bool(a["count_include_pad"]), int(divisor))


def _avg_pool(rank: int):
    def lower(func, a, outs):
        x, out = a["self"], outs[0]
        if out.numel() == 0:
            return
        scalars = _avg_scalars(a, rank)
        launch(*_launch("avg", (_as5(out, rank), _as5(x, rank)), scalars, x.dtype,
                       out.numel() * scalars[0] * scalars[1] * scalars[2],
                       _numel(x, out) * x.element_size()))
    return lower


def _avg_pool_backward(rank: int):
    """Half operands: float32 copies, each delta and add rounded as the CPU's half kernel."""
    def lower(func, a, outs):
        gi, go = outs[0], a["grad_output"]
        if gi.numel() == 0:
            return
        scalars = _avg_scalars(a, rank)
        half = gi.dtype in (torch.bfloat16, torch.float16)
        gi32, go32 = gi, go
        if half:
            go32 = torch.empty(go.shape, dtype=torch.float32)
            for req in cast_steps(go, go32):
                launch(*req)
            gi32 = torch.empty(gi.shape, dtype=torch.float32)
        launch(*_launch("avg_backward", (_as5(gi32, rank), _as5(go32, rank)), scalars, gi32.dtype,
                       gi.numel() + go.numel() * scalars[0] * scalars[1] * scalars[2],
                       _numel(gi, go) * gi.element_size(),
                       half and ("f16" if gi.dtype == torch.float16 else True)))
        if half:
            for req in cast_steps(gi32, gi):
                launch(*req)
    lower.handles_half = True
    return lower


def _adaptive_avg(rank: int):
    """Half inputs run in float32 (handles_half: cast here); the CPU's 3-d half kernels add
    and divide in the half type, so those cases round each step to it too."""
    def lower(func, a, outs):
        x, out = a["self"], outs[0]
        if out.numel() == 0:
            return
        half = x.dtype in (torch.bfloat16, torch.float16)
        # the CPU's 3-d kernel adds and divides in the half type (True: bfloat16)
        bf16 = rank == 3 and ("f16" if x.dtype == torch.float16 else x.dtype == torch.bfloat16)
        x32, out32 = x, out
        if half:
            x32 = torch.empty(x.shape, dtype=torch.float32)
            for req in cast_steps(x, x32):
                launch(*req)
            out32 = torch.empty(out.shape, dtype=torch.float32)
        launch(*_launch("adaptive_avg", (_as5(out32, rank), _as5(x32, rank)), (), x32.dtype,
                       _numel(x, out), _numel(x, out) * x.element_size(), bf16))
        if half:
            for req in cast_steps(out32, out):
                launch(*req)
    lower.handles_half = True
    return lower


def _adaptive_avg_backward(rank: int):
    """Half operands: float32 copies; the 3-d kernels round as the forward's (see above)."""
    def lower(func, a, outs):
        gi, go = outs[0], a["grad_output"]
        if gi.numel() == 0:
            return
        half = gi.dtype in (torch.bfloat16, torch.float16)
        bf16 = rank == 3 and ("f16" if gi.dtype == torch.float16 else gi.dtype == torch.bfloat16)
        gi32, go32 = gi, go
        if half:
            go32 = torch.empty(go.shape, dtype=torch.float32)
            for req in cast_steps(go, go32):
                launch(*req)
            gi32 = torch.empty(gi.shape, dtype=torch.float32)
        launch(*_launch("adaptive_avg_backward", (_as5(gi32, rank), _as5(go32, rank)), (),
                        gi32.dtype, _numel(gi, go), _numel(gi, go) * gi.element_size(), bf16))
        if half:
            for req in cast_steps(gi32, gi):
                launch(*req)
    lower.handles_half = True
    return lower


def _adaptive_max(rank: int):
    def lower(func, a, outs):
        x, (out, ind) = a["self"], outs
        if out.numel() == 0:
            return
        launch(*_launch("adaptive_max", (_as5(out, rank), _as5(ind, rank), _as5(x, rank)), (),
                       x.dtype, _numel(x, out), _numel(x, out, ind) * x.element_size()))
    return lower


def _fractional_max(rank: int):
    """random_samples (N, C, rank) in the input's dtype: for 2-d column 0 places the width
    windows and column 1 the height ones; for 3-d columns 0, 1, 2 place depth, height, width."""
    columns = (0, 1, 0) if rank == 2 else (0, 1, 2)

    def lower(func, a, outs):
        x, rs, (out, ind) = a["self"], a["random_samples"], outs
        if out.numel() == 0:
            return
        if rs.dtype != x.dtype:     # the CPU's check (a CPU fallback only repeated it)
            raise RuntimeError("Expect _random_samples to have the same dtype as input")
        kernel = _three(a["kernel_size"], rank, 1)
        rs3 = rs.unsqueeze(0) if rs.dim() == 2 else rs
        launch(*_launch("fractional_max", (_as5(out, rank), _as5(ind, rank), _as5(x, rank), rs3),
                       kernel + columns, x.dtype, out.numel() * kernel[0] * kernel[1] * kernel[2],
                       _numel(x, out, ind) * x.element_size()))
    return lower


# NOTE: PyTorch 2.13 has no Meta kernel for this op, and dispatch learns output metadata by
# running the op on meta tensors: the gradient has the input's metadata.
_META_LIB = torch.library.Library("aten", "IMPL")
_META_LIB.impl("fractional_max_pool3d_backward",
               lambda grad_output, self, kernel_size, output_size, indices: torch.empty_like(self),
               "Meta")

LOWERINGS = {}
for _r in (2, 3):
    LOWERINGS.update({
        f"aten::max_pool{_r}d_with_indices": _max_pool(_r),
        f"aten::max_pool{_r}d_with_indices_backward": _max_backward(_r),
        f"aten::avg_pool{_r}d": _avg_pool(_r),
        f"aten::avg_pool{_r}d_backward": _avg_pool_backward(_r),
        f"aten::_adaptive_avg_pool{_r}d": _adaptive_avg(_r),
        f"aten::_adaptive_avg_pool{_r}d_backward": _adaptive_avg_backward(_r),
        f"aten::adaptive_max_pool{_r}d": _adaptive_max(_r),
        f"aten::adaptive_max_pool{_r}d_backward": _max_backward(_r),
        f"aten::fractional_max_pool{_r}d": _fractional_max(_r),
        f"aten::fractional_max_pool{_r}d_backward": _max_backward(_r),
    })
