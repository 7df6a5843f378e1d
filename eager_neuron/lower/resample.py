"""Resampling lowerings: upsample (nearest, nearest-exact, linear, bilinear, trilinear, bicubic)
and replication-padding backward, 1/2/3-d (the backward passes are scatters; replication
padding's forward decomposes into gathers that have kernels), and grid_sampler 2-d/3-d
forward and backward (bilinear, nearest and 2-d bicubic). One launch each; half operands'
float32 copies and the casts back are steps (lower/cast.py's cast_steps) the lowering launches
itself, as the kernel.

>>> import torch, eager_neuron
>>> x = torch.ones(1, 1, 2, device="neuron", requires_grad=True)
>>> torch.nn.functional.interpolate(x, size=4, mode="linear").sum().backward()
>>> x.grad.flatten().tolist()
[2.0, 2.0]
"""

from __future__ import annotations

import numpy as np
import torch

from .. import errors
from ..kernels import compile as kc
from ..kernels import grid_sample as kgrid
from ..kernels import grid_sample_cubic as kcubic
from ..kernels import resample as kresample
from ..launch import launch
from .cast import cast_steps, launches
from .common import NP_TYPE
from .pool import _FLOAT, PARALLEL_MIN, VERSION, _as5, _np, _numel

UP_VERSION = 4     # bump when kernels/resample.py's upsample source changes


def _upsample_half(mode: str, rank: int, half_weights: bool = True):
    """upsample_linear1d / bilinear2d / trilinear3d / bicubic2d forward on bfloat16/float16
    (handles_half): the CPU interpolates in float32 and rounds once, with each axis' weights
    stored in the half type (linear1d, trilinear3d, bicubic2d) or in float32 (bilinear2d:
    `half_weights` False), measured element by element against the CPU; the decomposition
    would round every step to the half type. float32/float64: the same kernel (one launch for
    the decomposition's gathers and blends); other dtypes decline to the decomposition."""
    scale_names = {1: ("scales",), 2: ("scales_h", "scales_w"),
                   3: ("scales_d", "scales_h", "scales_w")}[rank]

    def steps(func, a, outs):
        x, out = a["self"], outs[0]
        if x.dtype == torch.uint8 and rank == 2 and out.dtype == x.dtype:
            if out.numel():
                yield _u8_step(mode, False, x, out, a)
            return
        if not (x.dtype.is_floating_point or x.dtype.is_complex):
            _refuse_integer(func, a, x.dtype, mode, rank)
        if (x.dtype not in _HALF_RND and x.dtype not in _FLOAT) or out.dtype != x.dtype:
            raise NotImplementedError(f"upsample {mode}: the decomposition for {x.dtype}")
        rnd = _HALF_RND.get(x.dtype) if half_weights else None
        if out.numel() == 0:
            return
        inv = [1.0 / s if s is not None and s > 0 else 0.0 for s in
               (a.get(nm) for nm in scale_names)]
        inv = [0.0] * (3 - rank) + inv
        x32, o32 = (yield from _f32(x)), _scratch(out)
        parallel = out.numel() >= PARALLEL_MIN and kc.parallel_allowed()
        T = NP_TYPE[o32.dtype]
        taps = kresample.TAPS[mode] ** rank
        yield (("resample", "upsample_gather", VERSION, UP_VERSION, mode, T, rnd, parallel),
               lambda: kresample.render_upsample_backward(mode, T, parallel, "gather", rnd),
               (_np(_as5(o32, rank)), _np(_as5(x32, rank))) + tuple(inv) +
               (bool(a.get("align_corners") or False),),
               2.0 * out.numel() * taps, _numel(x, out) * x.element_size(), "vector")
        yield from _put(o32, out)
    lower = launches(steps)
    lower.handles_half = True
    return lower


# the dtypes the CPU's nearest kernels take (others: the decomposition, as before)
_NEAREST_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.uint8)


def _upsample_nearest(mode: str, rank: int):
    """upsample_nearest / _upsample_nearest_exact 1-3d forward: one launch copying each output
    element from its source element (the CPU's index rules, shared with the backward), any
    layout; half types copied as their bits (handles_half: exact, nothing to round)."""
    scale_names = {1: ("scales",), 2: ("scales_h", "scales_w"),
                   3: ("scales_d", "scales_h", "scales_w")}[rank]

    def lower(func, a, outs):
        x, out = a["self"], outs[0]
        if x.dtype not in _NEAREST_DTYPES or out.dtype != x.dtype:
            raise NotImplementedError(f"upsample {mode} on {x.dtype}: the decomposition")
        if out.numel() == 0:
            return
        inv = [1.0 / s if s is not None and s > 0 else 0.0 for s in
               (a.get(nm) for nm in scale_names)]
        inv = [0.0] * (3 - rank) + inv
        xv, ov = _view(x, rank), _view(out, rank)
        parallel = out.numel() >= PARALLEL_MIN and kc.parallel_allowed()
        launch(("resample", "upsample_nearest", VERSION, UP_VERSION, mode, str(ov.dtype),
                parallel),
               lambda: kresample.render_upsample_backward(mode, "np.float32", parallel,
                                                          "nearest"),
               (ov, xv) + tuple(inv) + (False,),
               flops=0.0, bytes_moved=_numel(x, out) * x.element_size(), engine="vector")
    lower.handles_half = True
    return lower


def _view(t: torch.Tensor, rank: int) -> np.ndarray:
    """An (N, C, D, H, W) numpy view; a half operand's as its int16 bits."""
    t = _as5(t.detach(), rank)
    return (t.view(torch.int16) if t.dtype in _HALF_RND else t).numpy()


def _upsample_backward(mode: str, rank: int):
    scale_names = {1: ("scales",), 2: ("scales_h", "scales_w"),
                   3: ("scales_d", "scales_h", "scales_w")}[rank]

    def lower(func, a, outs):
        gi, go = outs[0], a["grad_output"]
        if gi.dtype not in _FLOAT or go.dtype != gi.dtype:
            raise NotImplementedError(f"upsample backward on {gi.dtype}")
        if gi.numel() == 0:
            return
        # 1 / scale_factor per axis (0: the sizes define the scale), unit axes in front
        inv = [1.0 / s if s is not None and s > 0 else 0.0 for s in
               (a[nm] for nm in scale_names)]
        inv = [0.0] * (3 - rank) + inv
        T = NP_TYPE[gi.dtype]
        parallel = go.numel() >= PARALLEL_MIN and kc.parallel_allowed()
        key = ("resample", "upsample_backward", VERSION, UP_VERSION, mode, T, parallel)
        taps = kresample.TAPS[mode] ** rank
        launch(key, lambda: kresample.render_upsample_backward(mode, T, parallel),
               (_np(_as5(gi, rank)), _np(_as5(go, rank))) + tuple(inv) +
               (bool(a.get("align_corners") or False),),
               flops=2.0 * go.numel() * taps, bytes_moved=_numel(gi, go) * gi.element_size(),
               engine="vector")
    return lower


class _CpuRefuses(errors.NotImplementedForDtype):
    """The CPU's NotImplementedError for a resize of an integer dtype, its words first, then
    the fix (dispatch raises it as a NotImplementedError naming the op and the user's line)."""

    def __init__(self, message: str, dtype) -> None:
        Exception.__init__(self, message)
        self.kernel, self.dtype = "", dtype


def _refuse_integer(func, a, dtype, mode: str, rank: int) -> None:
    """Refuse where the CPU refuses: its linear/bilinear/trilinear/bicubic kernels dispatch on
    the floating types and (bilinear/bicubic 2-d only) uint8, and raise before reading any
    element, empty inputs too; the decomposition would answer. The CPU's words (the kernel
    name depends on the path it takes: compute_indices_weights_*, upsample_bilinear2d_channels_
    last) are asked of the CPU, on copies; a call too large to ask gets the usual name."""
    from ..cpu_check import cpu_raises

    cpu = cpu_raises(func, (), a)
    if cpu is None and sum(t.nbytes for t in a.values() if isinstance(t, torch.Tensor)) < (
            1 << 26):
        # the CPU answered (a sweep of modes, dtypes and layouts found no such call): the
        # decomposition answers, as before
        raise NotImplementedError(f"upsample {mode} on {dtype}: the decomposition")
    name = errors._SCALAR_NAME.get(dtype, str(dtype))
    kernel = "upsample_bilinear2d_channels_last" if (mode, rank) == ("linear", 2) else \
        f"compute_indices_weights_{mode}"
    words = str(cpu).splitlines()[0] if cpu is not None else (
        f'"{kernel}" not implemented for \'{name}\'')
    op = func.name() if hasattr(func, "name") else str(func)
    fix = ("cast it to uint8 or a floating dtype first" if rank == 2 and mode in
           ("linear", "cubic") else "cast it to a floating dtype first (x.float())")
    raise _CpuRefuses(f"{words}\n  {op} has no {dtype} kernel on the CPU either: {fix}", dtype)


U8_VERSION = 1     # bump when kernels/resample.py's render_upsample_u8 source changes


def _u8_step(mode: str, antialias: bool, x, out, a):
    """The launch request of a uint8 bilinear/bicubic forward (antialiased or not): the CPU's
    integer arithmetic (kernels/resample.py render_upsample_u8), exact to the byte."""
    inv = [1.0 / s if s is not None and s > 0 else 0.0 for s in
           (a.get("scales_h"), a.get("scales_w"))]
    parallel = out.numel() >= PARALLEL_MIN and kc.parallel_allowed()
    return (("resample", "upsample_u8", VERSION, U8_VERSION, mode, antialias, parallel),
            lambda: kresample.render_upsample_u8(mode, antialias, parallel),
            (_np(_as5(out, 2)), _np(_as5(x, 2))) + tuple(inv) +
            (bool(a.get("align_corners") or False),),
            4.0 * (out.numel() + x.numel()), _numel(x, out), "vector")


def lower_upsample_aa(func, a, outs, mode="aa_linear"):
    """_upsample_bilinear2d_aa / _upsample_bicubic2d_aa forward: the antialiased tables
    gathered (no decomposition); uint8 in the CPU's integer arithmetic (_u8_step)."""
    x, out = a["self"], outs[0]
    if x.dtype == torch.uint8 and out.dtype == x.dtype:
        if out.numel():
            launch(*_u8_step("linear" if mode == "aa_linear" else "cubic", True, x, out, a))
        return
    if x.dtype not in _FLOAT:
        raise NotImplementedError(f"antialiased upsample on {x.dtype}")
    if out.numel() == 0:
        return
    inv = [0.0] + [1.0 / s if s is not None and s > 0 else 0.0 for s in
                   (a["scales_h"], a["scales_w"])]
    T = NP_TYPE[x.dtype]
    parallel = out.numel() >= PARALLEL_MIN and kc.parallel_allowed()
    key = ("resample", "upsample_aa", VERSION, UP_VERSION, T, parallel) + (
        (mode,) if mode != "aa_linear" else ())
    launch(key, lambda: kresample.render_upsample_backward(mode, T, parallel, forward=True),
           (_np(_as5(out, 2)), _np(_as5(x, 2))) + tuple(inv) + (bool(a["align_corners"]),),
           flops=4.0 * (out.numel() + x.numel()), engine="vector",
           bytes_moved=_numel(x, out) * x.element_size())


def _replication_pad_backward(rank: int):
    """Half types (handles_half): float32 copies, each add rounded to the half type (the CPU's
    half kernel adds in it)."""
    def steps(func, a, outs):
        gi, go = outs[0], a["grad_output"]
        rnd = _HALF_RND.get(gi.dtype)
        if (gi.dtype not in _FLOAT and rnd is None) or go.dtype != gi.dtype:
            raise NotImplementedError(f"replication_pad backward on {gi.dtype}")
        if gi.numel() == 0:
            return
        pad = tuple(a["padding"])               # (left, right, top, bottom, front, back)
        lead = (0,) * (3 - rank) + tuple(reversed(pad[0::2]))
        gi32, go32 = _scratch(gi), (yield from _f32(go))
        parallel = go.numel() >= PARALLEL_MIN and kc.parallel_allowed()
        yield (("resample", "replication_pad_backward", VERSION, parallel, rnd),
               lambda: kresample.render_replication_pad_backward(parallel, rnd),
               (_np(_as5(gi32, rank)), _np(_as5(go32, rank))) + lead, float(go.numel()),
               _numel(gi, go) * gi.element_size(), "vector")
        yield from _put(gi32, gi)
    lower = launches(steps)
    lower.handles_half = True
    return lower


def _grid_views(inp, grid, *per_input):
    """A 2-d grid_sampler's operands as depth-1 3-d ones: inp (N, C, 1, H, W), grid
    (N, 1, H, W, 2), and each of `per_input` (output / grad_output / grad_input) likewise."""
    if grid.dim() == 4:
        return (inp.unsqueeze(2), grid.unsqueeze(1)) + tuple(
            t.unsqueeze(2) if t is not None else None for t in per_input)
    return (inp, grid) + tuple(per_input)


GRID_VERSION = 5   # bump when kernels/grid_sample.py's rendered source changes
_HALF_RND = {torch.bfloat16: "bf16", torch.float16: "f16"}


def _grid_check(a, *ts) -> int:
    mode = a["interpolation_mode"]
    if mode not in (0, 1, 2) or (mode == 2 and a["grid"].dim() != 4):
        raise NotImplementedError(f"grid_sampler interpolation mode {mode}")
    dtype = a["input"].dtype
    if (dtype not in _FLOAT and dtype not in _HALF_RND) or \
            any(t is not None and t.dtype != dtype for t in ts):
        raise NotImplementedError(f"grid_sampler on {dtype}")
    return mode


def _f32(t):
    """A half operand as float32 scratch (exact); None and float32/float64 as they are.
    Steps (the copy's launches); returns the tensor."""
    if t is None or t.dtype not in _HALF_RND:
        return t
    out = torch.empty(t.shape, dtype=torch.float32)
    yield from cast_steps(t, out)
    return out


def _scratch(t):
    """Where the kernel writes a half result: float32 scratch, cast back by _put."""
    if t is None or t.dtype not in _HALF_RND:
        return t
    return torch.empty(t.shape, dtype=torch.float32)


def _put(tmp, t):
    if t is not None and tmp is not t:
        yield from cast_steps(tmp, t)   # exact: the kernel rounded every value to t's half type


def _grid_sampler(func, a, outs):
    """bfloat16/float16 (handles_half): the CPU's scalar_t = Half kernel rounds every step to
    the half type (GridSampler.cpp); the `rnd` kernel does the same in float32."""
    inp, grid, out = a["input"], a["grid"], outs[0]
    mode = _grid_check(a, grid)
    if out.numel() == 0:
        return
    rnd = _HALF_RND.get(out.dtype)
    o32 = _scratch(out)
    if mode == 2:
        return (yield from _grid_cubic(inp, grid, out, o32, a, rnd))
    inp32 = yield from _f32(inp)
    grid32 = yield from _f32(grid)
    iv, gv, ov = _grid_views(inp32, grid32, o32)
    T = NP_TYPE[o32.dtype]
    parallel = inp.shape[0] > 1 and out.numel() >= PARALLEL_MIN and kc.parallel_allowed()
    yield (("resample", "grid_sample", VERSION, GRID_VERSION, T, parallel, rnd),
           lambda: kgrid.render_grid_sample(False, T, parallel, rnd),
           (_np(ov), _np(iv), _np(gv), int(mode), int(a["padding_mode"]),
            bool(a["align_corners"])),
           16.0 * out.numel(), _numel(inp, grid, out) * out.element_size(), "vector")
    yield from _put(o32, out)


lower_grid_sampler = launches(_grid_sampler)
lower_grid_sampler.handles_half = True


def _grid_sampler_backward(func, a, outs):
    go, inp, grid = a["grad_output"], a["input"], a["grid"]
    mask = tuple(bool(m) for m in a["output_mask"])
    gi = outs[0] if mask[0] and isinstance(outs[0], torch.Tensor) else None
    gg = outs[1] if mask[1] and isinstance(outs[1], torch.Tensor) else None
    mode = _grid_check(a, go, grid, gi, gg)
    if gi is None and gg is None:
        return
    if go.numel() == 0 or inp.numel() == 0:
        for t in (gi, gg):
            if t is not None and t.numel():
                yield from cast_steps(torch.zeros((), dtype=t.dtype), t)
        return
    rnd = _HALF_RND.get(inp.dtype)
    gi32, gg32 = _scratch(gi), _scratch(gg)
    if mode == 2:
        return (yield from _grid_cubic_backward(go, inp, grid, gi, gg, gi32, gg32, a, rnd))
    inp32 = yield from _f32(inp)
    grid32 = yield from _f32(grid)
    go32 = yield from _f32(go)
    iv, gv, gov, giv = _grid_views(inp32, grid32, go32, gi32)
    ggv = (gg32.unsqueeze(1) if grid.dim() == 4 else gg32) if gg32 is not None else None
    T = NP_TYPE[iv.dtype]
    dummy = np.zeros((1,) * 5, iv.numpy().dtype)
    parallel = inp.shape[0] > 1 and go.numel() >= PARALLEL_MIN and kc.parallel_allowed()
    yield (("resample", "grid_sample_bw", VERSION, GRID_VERSION, T, parallel, rnd),
           lambda: kgrid.render_grid_sample(True, T, parallel, rnd),
           (_np(giv) if gi is not None else dummy, _np(ggv) if gg is not None else dummy,
            _np(gov), _np(iv), _np(gv), int(mode), int(a["padding_mode"]),
            bool(a["align_corners"]), gi is not None, gg is not None),
           48.0 * go.numel(), _numel(inp, grid, go, inp, grid) * go.element_size(), "vector")
    yield from _put(gi32, gi)
    yield from _put(gg32, gg)


lower_grid_sampler_backward = launches(_grid_sampler_backward)
lower_grid_sampler_backward.handles_half = True


CUBIC_VERSION = 1   # bump when kernels/grid_sample_cubic.py's rendered source changes


def _grid_cubic(inp, grid, out, o32, a, rnd):
    """2-d bicubic forward (kernels/grid_sample_cubic.py), half types rounded as the CPU."""
    iv = yield from _f32(inp)
    gv = yield from _f32(grid)
    T = NP_TYPE[o32.dtype]
    parallel = inp.shape[0] > 1 and out.numel() >= PARALLEL_MIN and kc.parallel_allowed()
    yield (("resample", "grid_cubic", VERSION, CUBIC_VERSION, T, parallel, rnd),
           lambda: kcubic.render_grid_cubic(False, T, parallel, rnd),
           (_np(o32), _np(iv), _np(gv), int(a["padding_mode"]), bool(a["align_corners"])),
           40.0 * out.numel(), _numel(inp, grid, out) * out.element_size(), "vector")
    yield from _put(o32, out)


def _grid_cubic_backward(go, inp, grid, gi, gg, gi32, gg32, a, rnd):
    iv = yield from _f32(inp)
    gv = yield from _f32(grid)
    gov = yield from _f32(go)
    T = NP_TYPE[iv.dtype]
    dummy = np.zeros((1,) * 4, iv.numpy().dtype)
    parallel = inp.shape[0] > 1 and go.numel() >= PARALLEL_MIN and kc.parallel_allowed()
    yield (("resample", "grid_cubic_bw", VERSION, CUBIC_VERSION, T, parallel, rnd),
           lambda: kcubic.render_grid_cubic(True, T, parallel, rnd),
           (_np(gi32) if gi is not None else dummy, _np(gg32) if gg is not None else dummy,
            _np(gov), _np(iv), _np(gv), int(a["padding_mode"]), bool(a["align_corners"]),
            gi is not None, gg is not None),
           160.0 * go.numel(), _numel(inp, grid, go, inp, grid) * go.element_size(), "vector")
    yield from _put(gi32, gi)
    yield from _put(gg32, gg)


LOWERINGS = {
    "aten::grid_sampler_2d": lower_grid_sampler,
    "aten::grid_sampler_3d": lower_grid_sampler,
    "aten::grid_sampler_2d_backward": lower_grid_sampler_backward,
    "aten::grid_sampler_3d_backward": lower_grid_sampler_backward,
}
for _r in (1, 2, 3):
    LOWERINGS.update({
        f"aten::upsample_nearest{_r}d_backward": _upsample_backward("nearest", _r),
        f"aten::_upsample_nearest_exact{_r}d_backward": _upsample_backward("nearest_exact", _r),
        f"aten::replication_pad{_r}d_backward": _replication_pad_backward(_r),
    })
LOWERINGS.update({
    **{f"aten::upsample_nearest{r}d": _upsample_nearest("nearest", r) for r in (1, 2, 3)},
    **{f"aten::_upsample_nearest_exact{r}d": _upsample_nearest("nearest_exact", r)
       for r in (1, 2, 3)},
    "aten::upsample_linear1d": _upsample_half("linear", 1),
    "aten::upsample_bilinear2d": _upsample_half("linear", 2, half_weights=False),
    "aten::upsample_trilinear3d": _upsample_half("linear", 3),
    "aten::upsample_bicubic2d": _upsample_half("cubic", 2),
    "aten::upsample_linear1d_backward": _upsample_backward("linear", 1),
    "aten::upsample_bilinear2d_backward": _upsample_backward("linear", 2),
    "aten::upsample_trilinear3d_backward": _upsample_backward("linear", 3),
    "aten::upsample_bicubic2d_backward": _upsample_backward("cubic", 2),
    "aten::_upsample_bilinear2d_aa": lower_upsample_aa,
    "aten::_upsample_bilinear2d_aa_backward": _upsample_backward("aa_linear", 2),
    # antialiased bicubic (F.interpolate(mode="bicubic", antialias=True)): ran on the CPU
    "aten::_upsample_bicubic2d_aa": lambda func, a, outs: lower_upsample_aa(func, a, outs,
                                                                            "aa_cubic"),
    "aten::_upsample_bicubic2d_aa_backward": _upsample_backward("aa_cubic", 2),
})
